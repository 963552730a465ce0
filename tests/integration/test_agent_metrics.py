"""What the agent serves on /metrics: its own per-GPU gauges, dcgm-exporter's default counters, the series
NVIDIA's Grafana dashboard queries, and a site's own choice of counters. A real agent process against the real
kube-apiserver, GPUs from the simulator.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.nvml.series import SERIES
from harness.agent import DASHBOARD_QUERIES, DCGM_DEFAULT_COUNTERS, AgentProcess, change_scenario, every_counter
from harness.scenario_expectations import BY_SCENARIO


def test_metrics_carry_per_gpu_gauges(agent):
    labels = '{gpu="0",node="%s",uuid="GPU-8d3c1f0a-6b2e-4a1d-9c7e-2f4b6a8d0c1e"}' % agent.node
    agent.wait_for(lambda: agent.metrics().get("scv_gpu_memory_total_mib" + labels) == 12194, 20)
    metrics = agent.metrics()
    assert metrics["scv_gpu_temperature_celsius" + labels] == 38
    assert metrics["scv_gpu_power_draw_watts" + labels] == 15
    assert metrics["scv_gpu_healthy" + labels] == 1


@pytest.mark.parametrize("agent_on_node", [("--counters-interval", "1")], indirect=True)
def test_every_default_counter_of_dcgm_exporter_is_served(agent_on_node):
    from prometheus_client.parser import text_string_to_metric_families

    agent = agent_on_node
    change_scenario(agent, every_counter)
    agent.wait_for(lambda: 'DCGM_FI_PROF_PCIE_RX_BYTES{' in agent.metrics_text(), 10)
    families = {family.name: family for family in text_string_to_metric_families(agent.metrics_text())}
    for name in DCGM_DEFAULT_COUNTERS:
        samples = families[name].samples
        assert len(samples) == 8, name
        assert all(sample.labels["DCGM_FI_DRIVER_VERSION"] == "550.54.15" for sample in samples), name

    def by_gpu(name):
        return {sample.labels["gpu"]: sample.value for sample in families[name].samples}
    assert by_gpu("DCGM_FI_DEV_MEMORY_TEMP")["3"] == 43
    assert by_gpu("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")["1"] == 2742791
    assert by_gpu("DCGM_FI_DEV_DEC_UTIL")["4"] == 8
    assert by_gpu("DCGM_FI_DEV_VGPU_LICENSE_STATUS")["0"] == 1
    assert by_gpu("DCGM_FI_PROF_GR_ENGINE_ACTIVE")["0"] == 0.6                # GPM's percent as DCGM's ratio
    assert by_gpu("DCGM_FI_PROF_PCIE_TX_BYTES")["0"] == 2 * 1048576          # MiB/s as bytes/s
    # FB_USED is nvidia-smi's Used: used + free + reserved = total
    used, free = by_gpu("DCGM_FI_DEV_FB_USED"), by_gpu("DCGM_FI_DEV_FB_FREE")
    reserved = by_gpu("DCGM_FI_DEV_FB_RESERVED")
    total = {sample.labels["gpu"]: sample.value for sample in families["scv_gpu_memory_total_mib"].samples}
    assert all(used[gpu] + free[gpu] + reserved[gpu] == total[gpu] for gpu in total)
    assert reserved["0"] == 535


@pytest.mark.parametrize("agent_on_node", [("--counters-interval", "1")], indirect=True)
def test_an_hgx_h100_node_serves_every_default_counter_a_bare_metal_card_has(agent_on_node):
    """The shipped h100_sxm_x8 as it stands, NVLink included: all of dcgm-exporter's default counters but the
    vGPU licence, which only a vGPU guest has."""
    from prometheus_client.parser import text_string_to_metric_families

    agent = agent_on_node
    agent.wait_for(lambda: 'DCGM_FI_PROF_PCIE_RX_BYTES{' in agent.metrics_text(), 10)
    families = {family.name: family for family in text_string_to_metric_families(agent.metrics_text())}
    served = {name for name in DCGM_DEFAULT_COUNTERS if name in families and len(families[name].samples) == 8}
    assert set(DCGM_DEFAULT_COUNTERS) - served == {"DCGM_FI_DEV_VGPU_LICENSE_STATUS"}
    assert {sample.value for sample in families["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"].samples} == {0}
    # every row of the series table whose card fact the scenario's hand-worked expectations hold is served on each
    # GPU with that value, in DCGM's unit
    cards, checked = BY_SCENARIO["h100_sxm_x8"]["cardList"], []
    for row in SERIES:
        expected = [_fact(card, row.fact) for card in cards]
        if any(not isinstance(value, (int, float)) for value in expected):
            continue
        times, over = row.scale or (1, 1)
        assert {sample.labels["gpu"]: sample.value for sample in families[row.name].samples} == {
            str(card["id"]): value * times / over for card, value in zip(cards, expected)}, row.name
        checked.append(row.name)
    assert len(checked) >= 25 and "DCGM_FI_DEV_POWER_VIOLATION" in checked, checked
    # the units, which the loop takes from the table: NVML's ns as DCGM's us
    power_capped = {sample.labels["gpu"]: sample.value for sample in families["DCGM_FI_DEV_POWER_VIOLATION"].samples}
    assert power_capped["3"] == 3000


def _fact(card, path):
    for key in path:
        card = card.get(key) if isinstance(card, dict) else None
    return card


@pytest.mark.parametrize("agent_on_node", [("--counters-interval", "1")], indirect=True)
def test_nvidias_dcgm_dashboard_finds_every_series_it_queries(agent_on_node):
    import re

    from prometheus_client.parser import text_string_to_metric_families

    agent = agent_on_node
    # current clocks, and GPM (Hopper's performance counters) with the tensor pipe busy 42 % of the time
    change_scenario(agent, lambda scenario: [device.update(clocks={"sm": 1980, "memory": 2619},
                                                           gpm={"anyTensorUtil": 42})
                                             for device in scenario["devices"]])
    agent.wait_for(lambda: agent.metrics().get(
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{DCGM_FI_DRIVER_VERSION="550.54.15",UUID="GPU-5a7c0007-1f2e-4d3c-8b4a-9e8d7c6b5a47",device="nvidia7",'
        'gpu="7",hostname="%s",modelName="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:DB:00.0"}' % agent.node) == 0.42, 10)
    agent.wait_for(lambda: agent.metrics().get(
        'DCGM_FI_DEV_SM_CLOCK{DCGM_FI_DRIVER_VERSION="550.54.15",UUID="GPU-5a7c0000-1f2e-4d3c-8b4a-9e8d7c6b5a40",device="nvidia0",'
        'gpu="0",hostname="%s",modelName="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:18:00.0"}' % agent.node) == 1980, 10)
    families = {family.name: family for family in text_string_to_metric_families(agent.metrics_text())}
    queried = set()
    for line in DASHBOARD_QUERIES.read_text().splitlines():
        if line and not line.startswith("#"):
            queried |= set(re.findall(r"\bDCGM_[A-Z0-9_]+", line))
    assert queried, "no query read from %s" % DASHBOARD_QUERIES
    for metric in sorted(queried):
        samples = families[metric].samples
        assert len(samples) == 8, metric                      # one series per GPU
        assert {sample.labels["gpu"] for sample in samples} == {str(index) for index in range(8)}
        assert all(sample.labels["modelName"] == "NVIDIA H100 80GB HBM3" and sample.labels["hostname"] == agent.node
                   for sample in samples)
    tensor = {sample.labels["gpu"]: sample.value for sample in families["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].samples}
    assert tensor == {str(index): 0.42 for index in range(8)}   # dcgm-exporter's ratio, from GPM's percent
    temperature = {sample.labels["gpu"]: sample.value for sample in families["DCGM_FI_DEV_GPU_TEMP"].samples}
    assert temperature["0"] == 30                            # h100_sxm_x8's first card


def test_a_counters_file_chooses_the_series(access, agent_command, tmp_path):
    plane = access
    node = "counters-file-%d" % os.getpid()
    plane.kubectl("delete", "node", node, "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    counters = tmp_path / "counters.csv"
    counters.write_text("# a site's own list\nDCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"
                        "DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\n"
                        "DCGM_FI_DEV_THERMAL_VIOLATION, counter, Throttling duration due to thermal constraints (in us).\n")
    agent = AgentProcess(agent_command, plane, node, tmp_path, scenario="h100_sxm_x8",
                         extra=("--counters-file", str(counters)))
    try:
        agent.wait_for(lambda: "DCGM_FI_DEV_GPU_TEMP{" in agent.metrics_text(), 10)
        served = {line.split("{")[0] for line in agent.metrics_text().splitlines() if line.startswith("DCGM_")}
        assert served == {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED"}
        log = agent.log.read_text()
        assert "DCGM_FI_DEV_THERMAL_VIOLATION" in log and "does not serve" in log
        counters.write_text("# every line left out\n")              # a file naming nothing serves nothing
        agent.process.send_signal(signal.SIGHUP)
        agent.wait_for(lambda: agent.metrics()["scv_agent_reloads_total"] == 1, 10)
        assert not [line for line in agent.metrics_text().splitlines() if line.startswith("DCGM_")]
        assert "names no series this agent serves: no DCGM series is served" in agent.log.read_text()
        assert 'scv_gpu_healthy{' in agent.metrics_text()            # the agent's own series stay
    finally:
        agent.stop()
        plane.kubectl("delete", "node", node, "--ignore-not-found")
