"""The Scv agent, run for real (a subprocess) against the real kube-apiserver, GPUs from the simulator.

It authenticates as the node (system:node:<name>) after the scv_publish role installed the RBAC
and the admission policy, as on a cluster. Request counts come from the agent's own metrics and
from kube-apiserver's apiserver_request_total.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import time
import urllib.request

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent.loop import XID_WAIT_MS
from support import SIMULATOR_DIR, scenario_path


def free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class AgentProcess:
    def __init__(self, command, plane, node, directory, scenario="titan_xp", watch_timeout=60, kubeconfig=None,
                 extra=()):
        self.plane, self.node = plane, node
        self.scenario = directory / "scenario.json"
        shutil.copy(scenario_path(scenario), self.scenario)
        self.port = free_port()
        env = dict(os.environ, LD_LIBRARY_PATH=str(SIMULATOR_DIR), NVMLSIM_CONFIG=str(self.scenario))
        env.pop("PYTHONPATH", None)
        self.log = directory / "agent.log"
        command = list(command) + [
            "--kubeconfig", str(kubeconfig or plane.node_kubeconfig(node)), "--node-name", node,
            "--watch-timeout", str(watch_timeout), "--metrics-address", "127.0.0.1:%d" % self.port] + list(extra)
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def metrics_text(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port, timeout=5) as response:
            return response.read().decode()

    def metrics(self):
        """{'name{label="value",...}': value}, labels sorted by name, parsed by Prometheus's own text parser."""
        from prometheus_client.parser import text_string_to_metric_families

        samples = {}
        for family in text_string_to_metric_families(self.metrics_text()):
            for sample in family.samples:
                labels = ",".join('%s="%s"' % item for item in sorted(sample.labels.items()))
                samples[sample.name + ("{%s}" % labels if labels else "")] = sample.value
        return samples

    def scv(self):
        done = self.plane.kubectl("get", "scv", self.node, "-o", "json", check=False)
        return json.loads(done.stdout) if done.returncode == 0 else None

    def wait_for(self, predicate, timeout, step=0.05):
        """Seconds until predicate() held; fails after ``timeout``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.process.poll() is not None:
                pytest.fail("the agent exited (%s):\n%s" % (self.process.returncode, self.log.read_text()))
            try:
                if predicate():
                    return time.monotonic() - start
            except (OSError, ValueError, KeyError, TypeError):
                pass
            time.sleep(step)
        pytest.fail("not within %.1f s; agent log:\n%s" % (timeout, self.log.read_text()))

    def set_free_memory(self, free_bytes):
        scenario = json.loads(self.scenario.read_text())
        scenario["devices"][0]["memory"]["free"] = free_bytes
        staged = self.scenario.with_suffix(".new")
        staged.write_text(json.dumps(scenario))
        staged.rename(self.scenario)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=15)
        return self.process.returncode


def node_for(request):
    return "agent-%s" % request.node.name.split("[")[0].replace("_", "-")[5:40].strip("-")


@pytest.fixture
def agent(access, agent_command, tmp_path, request):
    plane = access
    node = node_for(request)
    plane.kubectl("delete", "scv", node, "--ignore-not-found")
    started = AgentProcess(agent_command, plane, node, tmp_path)
    yield started
    started.stop()
    plane.kubectl("delete", "scv", node, "--ignore-not-found")


def test_publishes_then_an_unchanged_interval_makes_no_request(agent, api_requests):
    agent.wait_for(lambda: agent.scv()["status"]["cardList"][0]["model"] == "TITAN Xp", 20)
    scv = agent.scv()
    assert scv["spec"] == {"updateInterval": 1000}
    assert scv["status"]["freeMemorySum"] == 11950
    agent.wait_for(lambda: agent.metrics()["scv_agent_ticks_total"] >= 2, 10)

    before_agent, before_server = agent.metrics(), api_requests.snapshot()
    time.sleep(3.5)
    after_agent, after_server = agent.metrics(), api_requests.snapshot()
    assert after_agent["scv_agent_ticks_total"] - before_agent["scv_agent_ticks_total"] >= 3
    assert after_agent["scv_agent_api_requests_total"] == before_agent["scv_agent_api_requests_total"]
    writes = {key: count for key, count in api_requests.delta(before_server, after_server).items()
              if key[0] not in ("GET", "LIST", "WATCH")}
    assert writes == {}


def test_a_memory_change_is_published_within_one_interval(agent):
    agent.wait_for(lambda: agent.scv()["status"]["freeMemorySum"] == 11950, 20)
    agent.set_free_memory(6 * 2 ** 30)   # 6144 MiB free
    took = agent.wait_for(lambda: agent.scv()["status"]["freeMemorySum"] == 6144, 5)
    assert took < 1.0 + 0.5, took       # one interval, plus kubectl's own start-up
    assert agent.scv()["status"]["cardList"][0]["freeMemory"] == 6144


def test_a_deleted_scv_is_created_again_within_one_interval(agent):
    agent.wait_for(lambda: agent.scv() is not None and agent.scv().get("status"), 20)
    agent.wait_for(lambda: agent.metrics()["scv_agent_api_requests_total"] >= 4, 10)  # the watch is up
    first_uid = agent.scv()["metadata"]["uid"]
    agent.plane.kubectl("delete", "scv", agent.node)
    took = agent.wait_for(lambda: agent.scv()["metadata"]["uid"] != first_uid and agent.scv().get("status"), 5)
    assert took < 1.0 + 0.5, took
    assert agent.metrics()["scv_agent_creates_total"] == 2


def test_a_changed_update_interval_is_honoured(agent):
    agent.wait_for(lambda: agent.scv() is not None, 20)
    agent.plane.kubectl("patch", "scv", agent.node, "--type=merge", "-p", '{"spec": {"updateInterval": 3000}}')
    time.sleep(1.0)  # the watch brings the new interval
    before = agent.metrics()["scv_agent_ticks_total"]
    time.sleep(6.2)
    ticks = agent.metrics()["scv_agent_ticks_total"] - before
    assert 2 <= ticks <= 3, ticks
    agent.plane.kubectl("patch", "scv", agent.node, "--type=merge", "-p", '{"spec": {"updateInterval": 500}}')
    time.sleep(1.0)
    before = agent.metrics()["scv_agent_ticks_total"]
    time.sleep(3.0)
    ticks = agent.metrics()["scv_agent_ticks_total"] - before
    assert 5 <= ticks <= 7, ticks


def test_survives_an_api_server_outage_and_publishes_when_it_returns(agent):
    agent.wait_for(lambda: agent.scv()["status"]["freeMemorySum"] == 11950, 20)
    agent.plane.stop_apiserver()
    try:
        agent.set_free_memory(2 * 2 ** 30)   # changes while the server is away
        time.sleep(4)
        assert agent.process.poll() is None, agent.log.read_text()
        assert agent.metrics()["scv_agent_errors_total"] >= 1
    finally:
        agent.plane.start_apiserver()
    agent.wait_for(lambda: agent.scv()["status"]["freeMemorySum"] == 2048, 40)


def test_gpu_errors_make_the_card_unhealthy_not_the_agent_stop(agent):
    agent.wait_for(lambda: agent.scv()["status"]["cardList"][0]["health"] == "Healthy", 20)
    scenario = json.loads(agent.scenario.read_text())
    scenario["devices"][0]["errors"] = {"nvmlDeviceGetMemoryInfo": "UNKNOWN"}
    staged = agent.scenario.with_suffix(".new")
    staged.write_text(json.dumps(scenario))
    staged.rename(agent.scenario)
    # an unusable card leaves cardList (what schedulers count) for unhealthyCardList
    agent.wait_for(lambda: agent.scv()["status"]["unhealthyCardList"][0]["health"] == "Unhealthy", 5)
    status = agent.scv()["status"]
    assert "reading the memory information failed" in status["unhealthyCardList"][0]["healthReasons"][0]
    assert status.get("cardList", []) == [] and status.get("cardNumber", 0) == 0


def change_scenario(agent, change):
    scenario = json.loads(agent.scenario.read_text())
    change(scenario)
    staged = agent.scenario.with_suffix(".new")
    staged.write_text(json.dumps(scenario))
    staged.rename(agent.scenario)


def test_nvml_stays_initialised_and_starts_anew_after_a_driver_change(agent):
    agent.wait_for(lambda: agent.metrics()["scv_agent_ticks_total"] >= 4, 20)
    metrics = agent.metrics()
    assert (metrics["scv_agent_nvml_inits_total"], metrics["scv_agent_nvml_static_reads_total"]) == (1, 1)
    assert metrics["scv_agent_nvml_seconds_total"] > 0

    def upgrade(scenario):
        scenario["driverVersion"] = "550.54.15"
        scenario["devices"][0]["maxClocks"]["memory"] = 5000   # a static reading: read again only in a new session
    change_scenario(agent, upgrade)
    took = agent.wait_for(lambda: agent.scv()["status"]["cardList"][0]["clock"] == 5000, 10)
    # one interval, plus the event waiter's current wait (up to XID_WAIT_MS: NVML is not shut down under it),
    # plus kubectl's own start-up
    assert took < 1.0 + XID_WAIT_MS / 1000.0 + 0.5, took
    assert agent.metrics()["scv_agent_nvml_inits_total"] == 2
    assert "NVML initialised anew: RM has detected an NVML/RM version mismatch" in agent.log.read_text()


def test_a_transient_uninitialized_answer_is_retried_in_a_new_session_not_published(agent, api_requests):
    agent.wait_for(lambda: agent.scv()["status"]["cardList"][0]["health"] == "Healthy", 20)
    agent.wait_for(lambda: agent.metrics()["scv_agent_ticks_total"] >= 2, 10)
    before = api_requests.snapshot()
    change_scenario(agent, lambda scenario: scenario["devices"][0].update(
        errors={"nvmlDeviceGetMemoryInfo": {"error": "UNINITIALIZED", "times": 1}}))
    agent.wait_for(lambda: agent.metrics()["scv_agent_nvml_inits_total"] == 2, 5)
    time.sleep(1.5)
    writes = {key: count for key, count in api_requests.delta(before, api_requests.snapshot()).items()
              if key[0] not in ("GET", "LIST", "WATCH")}
    assert writes == {}                 # the card never looked Unhealthy
    assert agent.scv()["status"]["cardList"][0]["health"] == "Healthy"


def gpu_condition_of(plane, node):
    status = json.loads(plane.kubectl("get", "node", node, "-o", "json").stdout)["status"]
    return next((c for c in status.get("conditions", []) if c["type"] == "GPUHealthy"), None)


def node_events(plane, node):
    events = json.loads(plane.kubectl("get", "events", "-n", "default", "-o", "json",
                                      "--field-selector", "involvedObject.name=%s" % node).stdout)["items"]
    return [(event["type"], event["reason"]) for event in sorted(events, key=lambda e: e["metadata"]["creationTimestamp"])]


@pytest.fixture
def agent_on_node(access, agent_command, tmp_path, request):
    """An agent whose Node exists (created as the kubelet would have), on 8 simulated H100s.

    Tests marked ``agent_args`` add their own arguments.
    """
    plane = access
    node = node_for(request)
    plane.kubectl("delete", "node", node, "--ignore-not-found")
    plane.kubectl("delete", "events", "-n", "default", "--field-selector", "involvedObject.name=%s" % node)
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    extra = getattr(request, "param", ())
    started = AgentProcess(agent_command, plane, node, tmp_path, scenario="h100_sxm_x8", extra=extra)
    yield started
    started.stop()
    plane.kubectl("delete", "scv", node, "--ignore-not-found")
    plane.kubectl("delete", "node", node, "--ignore-not-found")


def test_an_unhealthy_gpu_sets_the_node_condition_and_recovery_clears_it(agent_on_node):
    agent, plane = agent_on_node, agent_on_node.plane
    agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 20)
    healthy = gpu_condition_of(plane, agent.node)
    assert (healthy["reason"], healthy["message"]) == ("GPUsHealthy", "all 8 GPUs are healthy")
    assert node_events(plane, agent.node) == []          # starting healthy is no transition

    change_scenario(agent, lambda scenario: scenario["devices"][3].update(errors={"*": "GPU_IS_LOST"}))
    took = agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "False", 5)
    assert took < 1.0 + 0.5, took
    lost = gpu_condition_of(plane, agent.node)
    assert lost["reason"] == "GPUUnhealthy"
    assert lost["message"].startswith("1 of 8 GPUs unhealthy. GPU 3") and "GPU is lost" in lost["message"]
    assert lost["lastTransitionTime"] >= healthy["lastTransitionTime"]
    agent.wait_for(lambda: node_events(plane, agent.node) == [("Warning", "GPUUnhealthy")], 5)

    change_scenario(agent, lambda scenario: scenario["devices"][3].pop("errors"))
    agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 5)
    agent.wait_for(lambda: node_events(plane, agent.node) == [("Warning", "GPUUnhealthy"), ("Normal", "GPUsHealthy")], 5)
    metrics = agent.metrics()
    assert metrics["scv_agent_events_total"] == 2
    # healthy, lost (the message may change once: the first read still knew the card's UUID), healthy
    assert 3 <= metrics["scv_agent_condition_writes_total"] <= 4


def test_the_scv_definition_deleted_and_installed_again(agent):
    """The CRD goes (and every Scv with it) and comes back: the agent backs off, then creates its Scv again."""
    plane = agent.plane
    agent.wait_for(lambda: agent.scv()["status"]["cardList"][0]["model"] == "TITAN Xp", 20)
    definition = json.loads(plane.kubectl("get", "crd", "scvs.core.run-linux.com", "-o", "json").stdout)
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        definition["metadata"].pop(key, None)
    definition.pop("status", None)
    plane.kubectl("delete", "crd", "scvs.core.run-linux.com")
    try:
        time.sleep(4)
        assert agent.process.poll() is None
        failing = agent.metrics()
        assert failing["scv_agent_errors_total"] >= 1
    finally:
        plane.kubectl("create", "-f", "-", input_text=json.dumps(definition))
    took = agent.wait_for(lambda: agent.scv()["status"]["cardList"][0]["model"] == "TITAN Xp", 40)
    assert took < 35, took          # within the longest backoff
    assert agent.metrics()["scv_agent_creates_total"] >= 2


def test_an_agent_started_before_the_driver_publishes_no_gpu_then_every_gpu(access, agent_command, tmp_path):
    """nvmlInit fails (the driver is not loaded yet): the Scv offers nothing, the condition says why, the agent
    keeps trying, and the GPUs appear once the driver answers."""
    plane, node = access, "agent-before-driver"
    plane.kubectl("delete", "scv", node, "--ignore-not-found")
    plane.kubectl("delete", "node", node, "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    agent = AgentProcess(agent_command, plane, node, tmp_path, scenario="driver_not_loaded")
    try:
        agent.wait_for(lambda: "status" in agent.scv(), 20)
        status = agent.scv()["status"]
        assert status.get("cardNumber", 0) == 0, status
        assert status.get("cardList", []) == [] and status.get("healthyCardNumber", 0) == 0
        assert status.get("totalMemorySum", 0) == 0
        condition = gpu_condition_of(plane, node)
        assert (condition["status"], condition["reason"]) == ("False", "NVMLUnavailable")
        assert "driver" in condition["message"].lower()
        shutil.copy(scenario_path("h100_sxm_x8"), agent.scenario)
        took = agent.wait_for(lambda: agent.scv()["status"]["cardNumber"] == 8, 10)
        assert took < 3, took
        agent.wait_for(lambda: gpu_condition_of(plane, node)["status"] == "True", 5)
        assert agent.process.poll() is None
    finally:
        agent.stop()
        plane.kubectl("delete", "scv", node, "--ignore-not-found")
        plane.kubectl("delete", "node", node, "--ignore-not-found")


def test_two_agents_for_one_node_make_no_write_storm(access, agent_command, tmp_path):
    """A second agent started for the same node by mistake: both publish the same status, so after the
    first round neither writes while nothing changes, and a change is written about once, not in a loop."""
    plane, node = access, "agent-twice"
    plane.kubectl("delete", "scv", node, "--ignore-not-found")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = AgentProcess(agent_command, plane, node, tmp_path / "a")
    second = AgentProcess(agent_command, plane, node, tmp_path / "b")
    try:
        first.wait_for(lambda: first.scv()["status"]["cardList"][0]["model"] == "TITAN Xp", 20)
        time.sleep(3)

        def writes():
            return sum(agent.metrics()["scv_agent_writes_total"] + agent.metrics()["scv_agent_creates_total"]
                       for agent in (first, second))
        settled = writes()
        time.sleep(5)
        assert writes() == settled                    # nothing changed: nobody wrote
        first.set_free_memory(2 ** 30)
        second.set_free_memory(2 ** 30)
        first.wait_for(lambda: first.scv()["status"]["freeMemorySum"] == 1024, 5)
        time.sleep(3)
        assert writes() - settled <= 2, writes() - settled
        for agent in (first, second):
            assert agent.process.poll() is None
    finally:
        first.stop()
        second.stop()
        plane.kubectl("delete", "scv", node, "--ignore-not-found")


def test_a_deleted_node_is_looked_for_not_written_at_every_tick_and_gets_its_condition_back(agent_on_node):
    """The Node is deleted, then a GPU fails: the condition's write meets 404. The agent then looks for the
    Node every 10 s instead of writing at every tick, and sets the condition once the Node is back."""
    agent, plane = agent_on_node, agent_on_node.plane
    agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 20)
    plane.kubectl("delete", "node", agent.node)
    change_scenario(agent, lambda scenario: scenario["devices"][3].update(errors={"*": "GPU_IS_LOST"}))
    agent.wait_for(lambda: "there is no Node %s" % agent.node in agent.log.read_text(), 5)
    before = agent.metrics()["scv_agent_api_requests_total"]
    time.sleep(5)
    # Five ticks with a changed condition and no Node: at most one look for it, not a PATCH at every tick.
    assert agent.metrics()["scv_agent_api_requests_total"] - before <= 1
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": agent.node}}))
    took = agent.wait_for(lambda: (gpu_condition_of(plane, agent.node) or {}).get("status") == "False", 15)
    assert took < 10 + 1.5, took
    assert gpu_condition_of(plane, agent.node)["message"].startswith("1 of 8 GPUs unhealthy. GPU 3")


@pytest.mark.parametrize("agent_on_node", [("--default-interval", "5000", "--xid-hold", "3")], indirect=True)
def test_an_xid_reaches_the_scv_and_the_node_within_a_second_not_an_interval(agent_on_node):
    agent, plane = agent_on_node, agent_on_node.plane
    agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 20)
    agent.wait_for(lambda: agent.scv()["spec"]["updateInterval"] == 5000, 5)
    time.sleep(0.5)
    change_scenario(agent, lambda scenario: scenario["devices"][5].update(xids=[{"xid": 79, "afterMs": 0}]))
    took = agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "False", 5)
    assert took < 1.0, took            # the tick is 5 s: only the event can have brought it
    message = gpu_condition_of(plane, agent.node)["message"]
    assert "GPU 5 (GPU-5a7c0005-1f2e-4d3c-8b4a-9e8d7c6b5a45)" in message
    assert "XID 79 at " in message and "GPU has fallen off the bus; reboot the node" in message
    status = agent.scv()["status"]
    assert [card["id"] for card in status["unhealthyCardList"]] == [5] and status["cardNumber"] == 7
    agent.wait_for(lambda: node_events(plane, agent.node) == [("Warning", "GPUUnhealthy")], 5)
    assert agent.metrics()["scv_agent_xid_events_total"] == 1
    # --xid-hold 3: the card counts as healthy again 3 s after the XID, at the next tick (5 s)
    agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 12)
    assert agent.scv()["status"]["cardNumber"] == 8


@pytest.mark.parametrize("agent_on_node", [("--xid-action", "79=none")], indirect=True)
def test_an_xid_whose_action_is_none_leaves_the_card_healthy(agent_on_node):
    agent, plane = agent_on_node, agent_on_node.plane
    agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 20)
    change_scenario(agent, lambda scenario: scenario["devices"][5].update(xids=[{"xid": 79, "afterMs": 0}]))
    agent.wait_for(lambda: agent.metrics()["scv_agent_xid_events_total"] == 1, 5)
    time.sleep(1.5)
    assert gpu_condition_of(plane, agent.node)["status"] == "True"
    assert agent.scv()["status"]["cardNumber"] == 8


DASHBOARD_QUERIES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "dcgm-exporter-dashboard-queries.txt"


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


def test_a_node_cannot_set_another_nodes_condition(access, tmp_path):
    from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
    from ansible_collections.scv.gpu.plugins.module_utils.kube.rest_client import RestClient
    from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import SCV
    from ansible_collections.scv.gpu.plugins.module_utils.agent.condition import condition_patch

    plane = access
    for name in ("condition-own", "condition-victim"):
        plane.kubectl("delete", "node", name, "--ignore-not-found")
        plane.kubectl("create", "-f", "-", input_text=json.dumps(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
    try:
        client = RestClient.from_file(str(plane.node_kubeconfig("condition-own")), resource=SCV)
        patch = condition_patch("False", "GPUUnhealthy", "test", "2026-11-22T00:00:00Z", "2026-11-22T00:00:00Z")
        client.patch_node_status("condition-own", patch)
        assert gpu_condition_of(plane, "condition-own")["status"] == "False"
        with pytest.raises(ApiError) as denied:
            client.patch_node_status("condition-victim", patch)
        assert denied.value.status == 403
        assert gpu_condition_of(plane, "condition-victim") is None
    finally:
        for name in ("condition-own", "condition-victim"):
            plane.kubectl("delete", "node", name, "--ignore-not-found")


def test_what_a_node_identity_may_do_to_its_own_taints(access):
    """NodeRestriction lets a kubelet write its Node's status, not its taints: a taint needs another identity."""
    from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
    from ansible_collections.scv.gpu.plugins.module_utils.kube.rest_client import RestClient
    from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import SCV

    plane = access
    plane.kubectl("delete", "node", "taint-own", "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "taint-own"}}))
    try:
        client = RestClient.from_file(str(plane.node_kubeconfig("taint-own")), resource=SCV)
        taint = {"spec": {"taints": [{"key": "scv.gpu/unhealthy", "effect": "NoSchedule"}]}}
        with pytest.raises(ApiError) as denied:
            client.patch_node("taint-own", taint)
        assert denied.value.status == 403
        assert "is not allowed to modify taints" in str(denied.value)
        plane.kubectl("taint", "node", "taint-own", "scv.gpu/unhealthy=:NoSchedule")   # the admin may
        node = json.loads(plane.kubectl("get", "node", "taint-own", "-o", "json").stdout)
        assert node["spec"]["taints"][0]["key"] == "scv.gpu/unhealthy"
    finally:
        plane.kubectl("delete", "node", "taint-own", "--ignore-not-found")


def test_with_an_identity_allowed_to_taint_the_agent_taints_an_unhealthy_node_and_untaints_it(
        access, agent_command, tmp_path, request):
    plane = access
    node = node_for(request)
    plane.kubectl("delete", "node", node, "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
         "spec": {"taints": [{"key": "site/maintenance", "effect": "PreferNoSchedule"}]}}))
    plane.kubectl("apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "scv-gpu-tainter"},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "scv-gpu-tainter"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "scv-gpu-tainter"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "scv-gpu-tainter"}]}]}))
    tainter = plane.kubeconfig("tainter", "scv-gpu-tainter", "scv-gpu-tainters")
    agent = AgentProcess(agent_command, plane, node, tmp_path, scenario="h100_sxm_x8",
                         extra=("--taint-kubeconfig", str(tainter)))

    def taints():
        """Our taint and the site's; the API server's own not-ready taint is kept by the agent too (asserted)."""
        spec = json.loads(plane.kubectl("get", "node", node, "-o", "json").stdout)["spec"]
        keys = [(taint["key"], taint["effect"]) for taint in spec.get("taints", [])]
        assert ("node.kubernetes.io/not-ready", "NoSchedule") in keys
        return sorted(key for key in keys if not key[0].startswith("node.kubernetes.io/"))
    try:
        agent.wait_for(lambda: gpu_condition_of(plane, agent.node)["status"] == "True", 20)
        assert taints() == [("site/maintenance", "PreferNoSchedule")]
        change_scenario(agent, lambda scenario: scenario["devices"][1].update(errors={"*": "GPU_IS_LOST"}))
        agent.wait_for(lambda: taints() == [("scv.gpu/gpu-unhealthy", "NoSchedule"),
                                            ("site/maintenance", "PreferNoSchedule")], 5)
        change_scenario(agent, lambda scenario: scenario["devices"][1].pop("errors"))
        agent.wait_for(lambda: taints() == [("site/maintenance", "PreferNoSchedule")], 10)
        assert agent.metrics()["scv_agent_taint_changes_total"] == 2
    finally:
        agent.stop()
        plane.kubectl("delete", "scv", node, "--ignore-not-found")
        plane.kubectl("delete", "node", node, "--ignore-not-found")


def test_sigterm_exits_cleanly(agent):
    agent.wait_for(lambda: agent.scv() is not None, 20)
    assert agent.stop() == 0
    assert "stopped" in agent.log.read_text()


def test_metrics_carry_per_gpu_gauges(agent):
    labels = '{gpu="0",node="%s",uuid="GPU-8d3c1f0a-6b2e-4a1d-9c7e-2f4b6a8d0c1e"}' % agent.node
    agent.wait_for(lambda: agent.metrics().get("scv_gpu_memory_total_mib" + labels) == 12194, 20)
    metrics = agent.metrics()
    assert metrics["scv_gpu_temperature_celsius" + labels] == 38
    assert metrics["scv_gpu_power_draw_watts" + labels] == 15
    assert metrics["scv_gpu_healthy" + labels] == 1


def test_a_node_cannot_publish_another_nodes_scv(access, agent_command, tmp_path):
    plane = access
    victim = "agent-victim"
    plane.kubectl("delete", "scv", victim, "--ignore-not-found")
    env = dict(os.environ, LD_LIBRARY_PATH=str(SIMULATOR_DIR), NVMLSIM_CONFIG=str(scenario_path("titan_xp")))
    process = subprocess.Popen(
        agent_command + ["--kubeconfig", str(plane.node_kubeconfig("agent-intruder")), "--node-name", victim],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(4)
    process.terminate()
    output = process.communicate(timeout=15)[0]
    assert "may only write its own Scv" in output or "forbidden" in output.lower(), output
    assert plane.kubectl("get", "scv", victim, check=False).returncode != 0


def test_rest_client_reads_inline_kubeconfig_data(access, tmp_path):
    """Kubelet kubeconfigs carry the CA (and often the keys) inline, base64-encoded."""
    import base64
    import glob

    from ansible_collections.scv.gpu.plugins.module_utils.kube.rest_client import RestClient
    from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import SCV

    plane = access
    config = json.loads(pathlib.Path(plane.node_kubeconfig("agent-inline")).read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    for entry, key in ((cluster, "certificate-authority"), (user, "client-certificate"), (user, "client-key")):
        entry[key + "-data"] = base64.b64encode(pathlib.Path(entry.pop(key)).read_bytes()).decode()
    before = set(glob.glob("/tmp/scv-agent-*"))
    client = RestClient(config, resource=SCV)
    assert set(glob.glob("/tmp/scv-agent-*")) == before   # the inline keys left no files behind
    plane.kubectl("delete", "scv", "agent-inline", "--ignore-not-found")
    assert client.get("agent-inline") is None
    created = client.create({"apiVersion": "core.run-linux.com/v1", "kind": "Scv",
                             "metadata": {"name": "agent-inline"}, "spec": {"updateInterval": 1000}})
    assert created["metadata"]["name"] == "agent-inline"
    assert client.get("agent-inline")["spec"] == {"updateInterval": 1000}
    assert client.requests == 3
    plane.kubectl("delete", "scv", "agent-inline")


# The counters dcgm-exporter serves by default (etc/default-counters.csv of NVIDIA/dcgm-exporter at
# d5e5f51, the lines not commented out): 25 series, and the driver version as a label of each.
DCGM_DEFAULT_COUNTERS = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
)


def _every_counter(scenario):
    """H100s as a vGPU guest with NVLink would show them: every default counter has a value."""
    for index, device in enumerate(scenario["devices"]):
        device.update(clocks={"sm": 1980, "memory": 2619}, fields={"82": 40 + index, "83": 2742790 + index, "94": index, "66": 1000 * index},
                      encoderUtilization=index, decoderUtilization=2 * index, virtualizationMode=2,
                      vgpuLicensed=1, gpm={"anyTensorUtil": 42, "graphicsUtil": 60, "dramBwUtil": 25,
                                           "pcieTxMiBPerSecond": 2, "pcieRxMiBPerSecond": 3})


@pytest.mark.parametrize("agent_on_node", [("--counters-interval", "1")], indirect=True)
def test_every_default_counter_of_dcgm_exporter_is_served(agent_on_node):
    from prometheus_client.parser import text_string_to_metric_families

    agent = agent_on_node
    change_scenario(agent, _every_counter)
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


def test_a_counters_file_chooses_the_series(access, agent_command, tmp_path):
    plane = access
    node = "counters-file-%d" % os.getpid()
    plane.kubectl("delete", "node", node, "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    counters = tmp_path / "counters.csv"
    counters.write_text("# a site's own list\nDCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"
                        "DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\n"
                        "DCGM_FI_DEV_POWER_VIOLATION, counter, Throttling duration due to power constraints (in ns).\n")
    agent = AgentProcess(agent_command, plane, node, tmp_path, scenario="h100_sxm_x8",
                         extra=("--counters-file", str(counters)))
    try:
        agent.wait_for(lambda: "DCGM_FI_DEV_GPU_TEMP{" in agent.metrics_text(), 10)
        served = {line.split("{")[0] for line in agent.metrics_text().splitlines() if line.startswith("DCGM_")}
        assert served == {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED"}
        log = agent.log.read_text()
        assert "DCGM_FI_DEV_POWER_VIOLATION" in log and "does not serve" in log
    finally:
        agent.stop()
        plane.kubectl("delete", "node", node, "--ignore-not-found")
