"""A real Prometheus (built from its Go module, tools/prometheus) scraping a real agent: every default counter of
dcgm-exporter is stored, NVIDIA's Grafana dashboard answers every query, and pod labels arrive through it."""

from __future__ import annotations

import pytest

from harness.agent import DASHBOARD_QUERIES, DCGM_DEFAULT_COUNTERS, AgentProcess, change_scenario, every_counter, node_for
from harness.kubelet_podresources import StandInKubelet, generate, pod
from harness.paths import scenario_uuids
from harness.prometheus import Prometheus


@pytest.fixture
def scraped(access, agent_command, prometheus_bin, tmp_path, request):
    """An agent on 8 simulated H100s with every counter answering and pods on two GPUs, scraped every second."""
    node = node_for(request)
    access.kubectl("delete", "scv", node, "--ignore-not-found")
    generated = generate(tmp_path / "generated")
    uuids = scenario_uuids("h100_sxm_x8")
    with StandInKubelet(generated, tmp_path / "kubelet.sock") as kubelet:
        kubelet.pods = [pod("train", "ml", ("trainer", [("nvidia.com/gpu", [uuids[0], uuids[1]])]))]
        agent = AgentProcess(agent_command, access, node, tmp_path, scenario="h100_sxm_x8",
                             extra=("--counters-interval", "1", "--pod-resources-socket", kubelet.socket,
                                    "--pod-resources-interval", "1"))
        change_scenario(agent, every_counter)
        prometheus = Prometheus(prometheus_bin, tmp_path, "127.0.0.1:%d" % agent.port)
        try:
            yield agent, prometheus, kubelet
        finally:
            prometheus.stop()
            agent.stop()
            access.kubectl("delete", "scv", node, "--ignore-not-found")


def test_prometheus_stores_every_default_counter_and_the_dashboard_answers_every_query(scraped):
    agent, prometheus, _kubelet = scraped
    instance = "127.0.0.1:%d" % agent.port
    wanted = '{__name__=~"%s"}' % "|".join(DCGM_DEFAULT_COUNTERS)
    prometheus.wait_for(lambda: len(prometheus.query("count by (__name__) (%s) == 8" % wanted))
                        == len(DCGM_DEFAULT_COUNTERS), 60)
    # the driver version, dcgm-exporter's one "label" counter, is a label of each series
    drivers = prometheus.query('count by (DCGM_FI_DRIVER_VERSION) (DCGM_FI_DEV_GPU_TEMP)')
    assert [(row["metric"], row["value"][1]) for row in drivers] == [({"DCGM_FI_DRIVER_VERSION": "550.54.15"}, "8")]

    queries = [line for line in DASHBOARD_QUERIES.read_text().splitlines() if line and not line.startswith("#")]
    assert len(queries) >= 8
    for line in queries:
        if line.startswith("label_values("):
            metric, label = [part.strip() for part in line[len("label_values("):-1].split(",")]
            values = prometheus.api("label/%s/values" % label, **{"match[]": metric})
            assert values, line
            assert instance in values if label == "instance" else set(values) == {str(gpu) for gpu in range(8)}
            continue
        # Grafana's template variables as a user picks them: this node, every GPU
        expression = line.replace("$instance", instance).replace("$gpu", ".*")
        result = prometheus.query(expression)
        assert result, "the dashboard's query finds nothing: %s" % expression
        assert all(float(row["value"][1]) == float(row["value"][1]) for row in result)   # no NaN
    # the panels' numbers are the agent's: 8 GPUs' power summed, the tensor pipe as DCGM's ratio
    power = prometheus.query('sum(DCGM_FI_DEV_POWER_USAGE{instance="%s"})' % instance)[0]["value"][1]
    each = prometheus.query('DCGM_FI_DEV_POWER_USAGE{instance="%s"}' % instance)
    assert float(power) == pytest.approx(sum(float(row["value"][1]) for row in each)) and len(each) == 8
    tensor = prometheus.query('DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance="%s"}' % instance)
    assert {float(row["value"][1]) for row in tensor} == {0.42}


def test_pod_labels_reach_prometheus_and_leave_when_the_pod_ends(scraped):
    _agent, prometheus, kubelet = scraped
    prometheus.wait_for(lambda: prometheus.query('DCGM_FI_DEV_GPU_UTIL{pod="train"}'), 60)
    by_gpu = {row["metric"]["gpu"]: row["metric"] for row in prometheus.query('DCGM_FI_DEV_GPU_UTIL{pod="train"}')}
    assert sorted(by_gpu) == ["0", "1"]
    assert {(labels["namespace"], labels["container"]) for labels in by_gpu.values()} == {("ml", "trainer")}
    # the GPU power a team burns, as people ask dcgm-exporter's series
    team = prometheus.query('sum by (namespace) (DCGM_FI_DEV_POWER_USAGE{namespace!=""})')
    assert [row["metric"] for row in team] == [{"namespace": "ml"}]
    kubelet.pods = []
    # The series that named the pod vanish from the scrape, and Prometheus marks them stale at once.
    prometheus.wait_for(lambda: not prometheus.query('DCGM_FI_DEV_GPU_UTIL{pod="train"}')
                        and prometheus.query('count(DCGM_FI_DEV_GPU_UTIL{pod=""})')[0]["value"][1] == "8", 30)
