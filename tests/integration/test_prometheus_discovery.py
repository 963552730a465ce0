"""A real Prometheus finds the agents by itself: given only the scrape configuration of docs/examples, it lists
the Nodes of a real kube-apiserver, keeps the GPU nodes, and scrapes the agent on each, one instance per node.

Three GPU nodes (127.0.0.2 and 127.0.0.3 run agents on one port, 127.0.0.4 runs none) and a node without the
GPU label (127.0.0.5, never scraped). The agent of the second node has seen XID 79 on one GPU, so the fleet
has an unhealthy GPU and an agent that is down: every panel of the fleet dashboard has something to show.
"""

from __future__ import annotations

import json
import time

import pytest

from harness.agent import change_scenario
from harness.discovery import (EXAMPLES, SdFleet, active_targets, dashboard_queries, dropped_nodes, example_job,
                               variable_queries)
from harness.prometheus import Prometheus, write_web_config
from harness.tls_certs import TestPki

JOB = "scv-gpu-agents"
GPU_NODES = {"a": "127.0.0.2", "b": "127.0.0.3", "down": "127.0.0.4"}
PLAIN_NODES = {"cpu": "127.0.0.5"}
PROTECTED_NODES = {"a": "127.0.0.6", "b": "127.0.0.7"}
DASHBOARD = EXAMPLES / "grafana-scv-gpu-fleet.json"


def ours(prometheus, prefix="sd-"):
    """{instance: health} of the job's targets on this module's nodes named ``prefix``...: the session's control
    plane may hold GPU nodes of other tests."""
    return {instance: health for instance, (health, _url, _labels) in active_targets(prometheus, JOB).items()
            if instance.startswith(prefix)}


@pytest.fixture(scope="module")
def fleet(access, agent_command, tmp_path_factory):
    """The Nodes, agents on nodes a and b (b's GPU 5 unhealthy after XID 79), and Prometheus's identity."""
    work = tmp_path_factory.mktemp("discovery")
    fleet = SdFleet(access, "sd", GPU_NODES, PLAIN_NODES)
    try:
        fleet.create_nodes()
        fleet.start_agents(agent_command, work, ["sd-a", "sd-b"])
        change_scenario(fleet.agents["sd-b"],
                        lambda scenario: scenario["devices"][5].update(xids=[{"xid": 79, "afterMs": 0}]))
        fleet.kubeconfig = fleet.prometheus_kubeconfig()
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture(scope="module")
def discovered(fleet, prometheus_bin, tmp_path_factory):
    """Prometheus running only the example's job, the agents found by it."""
    work = tmp_path_factory.mktemp("prometheus-sd")
    prometheus = Prometheus(prometheus_bin, work, jobs=[example_job("prometheus-scv-agents.yml", fleet.port,
                                                                    fleet.kubeconfig)])
    try:
        yield prometheus
    finally:
        prometheus.stop()


def test_prometheus_finds_every_gpu_node_and_scrapes_its_agent_by_itself(fleet, discovered):
    prometheus = discovered
    expected = {"sd-a": "up", "sd-b": "up", "sd-down": "down"}
    prometheus.wait_for(lambda: ours(prometheus) == expected, 60)
    targets = active_targets(prometheus, JOB)
    # each node at its own address and the agents' port, named as the node, with the node's zone
    for name, address in fleet.gpu.items():
        _health, url, labels = targets[name]
        assert url == "http://%s:%d/metrics" % (address, fleet.port)
        assert labels["zone"] == "zone-a"
    assert "sd-cpu" in dropped_nodes(prometheus)
    # the series of both agents are stored, under their node's instance
    prometheus.wait_for(lambda: len(prometheus.query(
        'count by (instance) (DCGM_FI_DEV_GPU_TEMP{job="%s", instance=~"sd-.*"})' % JOB)) == 2, 30)
    stored = prometheus.query('count by (instance, zone) (DCGM_FI_DEV_GPU_TEMP{job="%s", instance=~"sd-.*"})' % JOB)
    assert sorted((row["metric"]["instance"], row["metric"]["zone"], row["value"][1]) for row in stored) == [
        ("sd-a", "zone-a", "8"), ("sd-b", "zone-a", "8")]
    # the agent's own node label stays the agent's: no target label takes its name
    nodes = prometheus.query('count by (instance, node) (scv_gpu_healthy{job="%s", instance=~"sd-.*"})' % JOB)
    assert sorted((row["metric"]["instance"], row["metric"]["node"]) for row in nodes) == [
        ("sd-a", "sd-a"), ("sd-b", "sd-b")]
    assert prometheus.query('up{job="%s", instance="sd-down"}' % JOB)[0]["value"][1] == "0"


# What the fleet dashboard's panels show of this fleet: (instance, gpu, xid, value) of each row, for the panels
# whose numbers the fleet fixes (rates and ages are only asked to answer).
PANEL_ANSWERS = {
    "Agents up": [("", "", "", "2"), ("sd-a", "", "", "1"), ("sd-b", "", "", "1"), ("sd-down", "", "", "0")],
    "Agents not up": [("", "", "", "1"), ("sd-down", "", "", "0")],
    "GPUs healthy": [("", "", "", "15")],
    "GPUs unhealthy": [("", "", "", "1")],
    "Nodes with an unhealthy GPU": [("", "", "", "1")],
    "Healthy GPUs per node": [("sd-a", "", "", "8"), ("sd-b", "", "", "7")],
    "Unhealthy GPUs per node": [("sd-b", "", "", "1")],
    "Unhealthy GPUs": [("sd-b", "5", "", "0")],
    "XID errors by code": [("sd-b", "", "79", "1")],
}


def panel_answers(prometheus, queries):
    """{panel title: sorted (instance, gpu, xid, value) of its queries' rows}, the dashboard's variables set as a user
    picks them: the example's job, this fleet's nodes, and Grafana's smallest rate interval at a 1 s scrape."""
    answers = {}
    for title, expression in queries:
        expression = (expression.replace("$job", JOB).replace("$instance", "sd-.*")
                      .replace("$__rate_interval", "4s"))
        rows = prometheus.query(expression)
        assert all(float(row["value"][1]) == float(row["value"][1]) for row in rows), expression   # no NaN
        answers.setdefault(title, []).extend(
            tuple(row["metric"].get(label, "") for label in ("instance", "gpu", "xid")) + (row["value"][1],)
            for row in rows)
    return {title: sorted(rows) for title, rows in answers.items()}


def test_every_panel_of_the_fleet_dashboard_answers_from_the_discovered_agents(fleet, discovered):
    prometheus = discovered
    dashboard = json.loads(DASHBOARD.read_text())
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 12
    variables = variable_queries(dashboard)
    assert sorted(variables) == ["instance", "job"]
    # the panels answer once the agents have been scraped for a few seconds
    deadline = time.monotonic() + 60
    answers = panel_answers(prometheus, queries)
    while not all(answers.values()) and time.monotonic() < deadline:
        time.sleep(1)
        answers = panel_answers(prometheus, queries)
    empty = [title for title, rows in answers.items() if not rows]
    assert not empty, "panels with nothing to show: %s" % empty
    for title, expected in PANEL_ANSWERS.items():
        assert answers[title] == expected, title
    # both agents published their Scv within the last ticks
    assert [row[0] for row in answers["Scv freshness"]] == ["sd-a", "sd-b"]
    assert all(0 <= float(row[3]) < 30 for row in answers["Scv freshness"] + answers["Oldest Scv publication"])
    for name, (selector, label) in variables.items():
        values = prometheus.api("label/%s/values" % label, **{"match[]": selector.replace("$job", JOB)})
        assert (JOB in values if name == "job" else [value for value in values if value.startswith("sd-")]
                == sorted(fleet.gpu)), name


@pytest.fixture
def protected(access, agent_command, prometheus_bin, tmp_path_factory):
    """Two GPU nodes whose agents ask for TLS, a client certificate and a password (their certificate names the
    nodes' addresses), and Prometheus running only the protected example's job, with this test's files."""
    work = tmp_path_factory.mktemp("discovery-tls")
    pki = TestPki(work / "pki")
    pki.server = pki.issue("test-server", server=True, addresses=tuple(PROTECTED_NODES.values()))
    web = pki.directory / "web.yml"
    write_web_config(web, pki, "fleet-secret")
    password = work / "password"
    password.write_text("fleet-secret")
    fleet = SdFleet(access, "sdtls", PROTECTED_NODES, {})
    prometheus = None
    try:
        fleet.create_nodes()
        fleet.start_agents(agent_command, work, list(fleet.gpu), extra=("--web-config-file", str(web)))
        job = example_job("prometheus-scv-agents-tls.yml", fleet.port, fleet.prometheus_kubeconfig())
        # the example's file paths, this test's files: every one the example names, and no other
        files = {"ca_file": pki.ca, "cert_file": pki.client[0], "key_file": pki.client[1]}
        assert sorted(job["tls_config"]) == sorted(files)
        job["tls_config"] = {key: str(path) for key, path in files.items()}
        assert "password_file" in job["basic_auth"]
        job["basic_auth"]["password_file"] = str(password)
        prometheus = Prometheus(prometheus_bin, work, jobs=[job])
        yield fleet, prometheus
    finally:
        if prometheus is not None:
            prometheus.stop()
        fleet.stop()


def test_prometheus_finds_the_protected_agents_and_scrapes_them_over_tls_with_a_password(protected):
    fleet, prometheus = protected

    prometheus.wait_for(lambda: ours(prometheus, "sdtls-") == {name: "up" for name in fleet.gpu}, 60)
    targets = active_targets(prometheus, JOB)
    for name, address in fleet.gpu.items():
        assert targets[name][1] == "https://%s:%d/metrics" % (address, fleet.port)
    prometheus.wait_for(lambda: len(prometheus.query(
        'count by (instance) (DCGM_FI_DEV_GPU_TEMP{job="%s", instance=~"sdtls-.*"})' % JOB)) == 2, 30)


def test_a_label_selector_has_the_api_server_send_only_the_gpu_nodes(fleet, prometheus_bin, tmp_path):
    """docs/monitoring.md's option for large clusters: the example's job with a selector on the GPU label."""
    job = example_job("prometheus-scv-agents.yml", fleet.port, fleet.kubeconfig)
    job["kubernetes_sd_configs"][0]["selectors"] = [{"role": "node", "label": "nvidia.com/gpu.present=true"}]
    prometheus = Prometheus(prometheus_bin, tmp_path, jobs=[job])
    try:
        prometheus.wait_for(lambda: ours(prometheus) == {"sd-a": "up", "sd-b": "up", "sd-down": "down"}, 60)
        assert "sd-cpu" not in dropped_nodes(prometheus)   # never sent, so never dropped
    finally:
        prometheus.stop()


def test_a_gpu_node_that_joins_is_scraped_and_one_that_leaves_is_dropped_with_no_config_change(fleet, discovered):
    prometheus = discovered
    late = SdFleet(fleet.plane, "sdlate", {"gpu": "127.0.0.8"}, {})
    try:
        late.create_nodes()
        prometheus.wait_for(lambda: ours(prometheus, "sdlate-") == {"sdlate-gpu": "down"}, 30)   # no agent there
    finally:
        late.stop()
    prometheus.wait_for(lambda: not ours(prometheus, "sdlate-"), 30)
