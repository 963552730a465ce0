"""A real Prometheus scraping the agent of a MIG node over TLS, with a client certificate and a password: it stores
one series per GPU instance, labelled GPU_I_PROFILE and GPU_I_ID, and NVIDIA's Grafana dashboard answers every
panel as it does for dcgm-exporter on such a node (the GPU Utilization panel empty, as NVML has no utilization for
a GPU with MIG on). GPUs from the simulator; the agent as the role installs it."""

from __future__ import annotations

import json

import pytest

from harness.agent import DASHBOARD_QUERIES, AgentProcess, change_scenario, every_counter, node_for
from harness.paths import scenario_path
from harness.prometheus import Prometheus, scrape_job, write_web_config
from harness.tls_certs import TestPki

# The panels NVML cannot answer on a GPU with MIG on, exactly as dcgm-exporter leaves them empty there.
NOT_ON_MIG = ("DCGM_FI_DEV_GPU_UTIL",)


def _instances(name):
    """{(gpu, GPU_I_ID): GPU_I_PROFILE} of a scenario's GPU instances."""
    data = json.loads(scenario_path(name).read_text())
    return {(str(index), str(entry["gpuInstanceId"])): entry["name"].rsplit(" MIG ", 1)[1]
            for index, device in enumerate(data["devices"]) for entry in device["migDevices"]}


@pytest.mark.parametrize("scenario", ["h100_mig_all_1g", "h100_mig_mixed"])
def test_prometheus_stores_a_series_per_gpu_instance_over_tls_and_the_dashboard_answers(
        access, agent_command, prometheus_bin, tmp_path, request, scenario):
    node = node_for(request)
    access.kubectl("delete", "scv", node, "--ignore-not-found")
    pki = TestPki(tmp_path / "pki")
    web = pki.directory / "web.yml"
    write_web_config(web, pki, "scrape")
    agent = AgentProcess(agent_command, access, node, tmp_path, scenario=scenario,
                         extra=("--web-config-file", str(web), "--counters-interval", "1"))
    change_scenario(agent, every_counter)   # clocks, energy and the rest answer, as on a real H100
    prometheus = Prometheus(prometheus_bin, tmp_path, jobs=[scrape_job("gpu-metrics", agent, pki, password="scrape")])
    want = _instances(scenario)
    instance = "127.0.0.1:%d" % agent.port
    try:
        prometheus.wait_for(lambda: len(prometheus.query("DCGM_FI_PROF_GR_ENGINE_ACTIVE")) == len(want), 60)
        for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"):
            stored = {(row["metric"]["gpu"], row["metric"]["GPU_I_ID"]): row["metric"]["GPU_I_PROFILE"]
                      for row in prometheus.query(name)}
            assert stored == want, name
        assert prometheus.targets()["gpu-metrics"] == ("up", "")

        queries = [line for line in DASHBOARD_QUERIES.read_text().splitlines() if line and not line.startswith("#")]
        for line in queries:
            if line.startswith("label_values("):
                metric, label = [part.strip() for part in line[len("label_values("):-1].split(",")]
                values = prometheus.api("label/%s/values" % label, **{"match[]": metric})
                assert set(values) == ({instance} if label == "instance" else {gpu for gpu, _id in want}), line
                continue
            expression = line.replace("$instance", instance).replace("$gpu", ".*")
            result = prometheus.query(expression)
            if any(name in line for name in NOT_ON_MIG):
                assert result == [], expression
            else:
                assert result, "the dashboard's query finds nothing: %s" % expression
    finally:
        prometheus.stop()
        agent.stop()
        access.kubectl("delete", "scv", node, "--ignore-not-found")
