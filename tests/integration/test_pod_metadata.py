"""dcgm-exporter's Kubernetes options in the agent: pod_uid and the pod's own labels on the series of the GPU it
holds, read from a real kube-apiserver with the node's own credentials (the Node authorizer, NodeRestriction),
Pod objects bound to the node, and a stand-in kubelet's pod-resources answer; and GPUs named by device name."""

from __future__ import annotations

import json
import re

import pytest

from harness.agent import AgentProcess
from harness.common import Clock
from harness.kubelet_podresources import claim_pod, pod
from harness.paths import scenario_uuids

GPU = "nvidia.com/gpu"
# the labels every DCGM series has, whoever holds the GPU
BASE = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname", "DCGM_FI_DRIVER_VERSION"}
# kubectl's own requests are counted too: the checks of which agent requests reached the API server take none
ALLOWLIST = ("--kubernetes-pod-label-allowlist-regex", r"^app$,^team\.example\.com/",
             "--kubernetes-pod-label-allowlist-regex", "^gpu$,^pod$")


@pytest.fixture
def namespace(access, node):
    """A namespace of the test's own (with its default service account: no controller manager runs here)."""
    access.kubectl("create", "namespace", node)
    access.kubectl("create", "serviceaccount", "default", "-n", node, check=False)
    yield node
    access.kubectl("delete", "namespace", node, "--wait=false")


def bound_pod(plane, name, namespace, node, labels):
    """A Pod bound to ``node`` (spec.nodeName: no scheduler, no kubelet); its UID."""
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"nodeName": node, "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "scv.test/none:1"}]}}
    plane.kubectl("create", "-f", "-", input_text=json.dumps(body))
    return json.loads(plane.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)["metadata"]["uid"]


def pod_labels(agent, metric="DCGM_FI_DEV_GPU_TEMP"):
    """{gpu index: [the non-empty labels of each of its series but those every series has]}."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families(agent.metrics_text()):
        for sample in family.samples:
            if sample.name == metric:
                found.setdefault(int(sample.labels["gpu"]), []).append(
                    {key: value for key, value in sample.labels.items() if value and key not in BASE})
    return found


def logs_entry(logs, namespace, name, uid):
    (logs / ("%s_%s_%s" % (namespace, name, uid))).mkdir(parents=True)


def test_the_node_authorizer_lets_a_node_list_only_the_pods_bound_to_it(access, node, namespace):
    """What the agent's read rests on, asked as the node: a list of its own pods, nothing wider, no other's pod."""
    bound_pod(access, "elsewhere", namespace, "other-" + node, {})
    own = access.node_kubeconfig(node)
    listed = access.kubectl("get", "pods", "-A", "--field-selector", "spec.nodeName=%s" % node, "-o", "name",
                            kubeconfig=own)
    assert listed.stdout == ""
    for wider in (("get", "pods", "-A"), ("get", "pods", "-A", "--field-selector", "spec.nodeName=other-" + node),
                  ("get", "pod", "elsewhere", "-n", namespace)):
        refused = access.kubectl(*wider, kubeconfig=own, check=False)
        assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), wider


def test_pod_uid_and_allowed_pod_labels_come_with_the_nodes_own_credentials_and_never_cost_a_scrape_a_request(
        access, agent_command, node, namespace, tmp_path, kubelet, api_requests):
    uuids, logs = scenario_uuids("h100_sxm_x8"), tmp_path / "pod-logs"
    logs.mkdir()
    labels = {"app": "trainer", "team.example.com/owner": "alice", "tier": "gold", "gpu": "7", "pod": "spoof"}
    train = bound_pod(access, "train", namespace, node, labels)
    notebook = bound_pod(access, "notebook", namespace, node, {"app": "notebook"})
    bound_pod(access, "foreign", namespace, "other-" + node, {"app": "foreign"})   # another node's
    logs_entry(logs, namespace, "train", train)
    logs_entry(logs, namespace, "notebook", notebook)
    kubelet.pods = [pod("train", namespace, ("main", [(GPU, ["nvidia0"])])),
                    pod("notebook", namespace, ("main", [(GPU, ["nvidia1/vgpu3"])])),     # GKE's shared GPU
                    pod("foreign", namespace, ("main", [(GPU, ["nvidia2"])])),            # a kubelet's error
                    pod("by-uuid", namespace, ("main", [(GPU, [uuids[3]])]))]             # no device name
    before = api_requests.snapshot("pods")
    agent = AgentProcess(agent_command, access, node, tmp_path, scenario="h100_sxm_x8", extra=(
        "--pod-resources-socket", kubelet.socket, "--pod-resources-interval", "1", "--pod-logs-dir", str(logs),
        "--kubernetes-enable-pod-uid", "--kubernetes-enable-pod-labels", "--kubernetes-gpu-id-type", "device-name",
        "--no-node-condition")   # no Node here: its condition would be looked for every 10 s
        + ALLOWLIST)
    try:
        agent.wait_for(lambda: pod_labels(agent)[0][0].get("pod_uid") == train, 20)
        found = pod_labels(agent)
        assert found[0] == [{"pod": "train", "namespace": namespace, "container": "main", "pod_uid": train,
                             "app": "trainer", "team_example_com_owner": "alice"}]
        assert found[1] == [{"pod": "notebook", "namespace": namespace, "container": "main", "vgpu": "3",
                             "pod_uid": notebook, "app": "notebook"}]
        assert found[2] == [{"pod": "foreign", "namespace": namespace, "container": "main"}]
        assert all(found[gpu] == [{}] for gpu in range(3, 8))      # device-name: a UUID names no GPU
        assert 'gpu="0"' in agent.metrics_text()                   # the pod's own "gpu" label is left off
        counters = agent.metrics()
        reads = counters["scv_agent_pod_metadata_reads_total"]
        requests = counters["scv_agent_api_requests_total"]
        # the node's own pods were listed, by one request each read: no other pod was asked for
        assert api_requests.delta(before, api_requests.snapshot("pods")) == {("LIST", "", ""): reads}
        assert counters["scv_agent_pod_metadata_failures_total"] == 0 and "left off" not in agent.log.read_text()
        for _scrape in range(20):
            agent.metrics_text()
        counters = agent.metrics()
        assert counters["scv_agent_pod_metadata_reads_total"] == reads
        assert counters["scv_agent_api_requests_total"] == requests

        # the same pod name again: the kubelet's answer is the same, its pod logs entry names the new UID
        access.kubectl("delete", "pod", "train", "-n", namespace, "--grace-period=0", "--force")
        (logs / ("%s_train_%s" % (namespace, train))).rmdir()
        again = bound_pod(access, "train", namespace, node, {"app": "trainer-2"})
        logs_entry(logs, namespace, "train", again)
        agent.wait_for(lambda: pod_labels(agent)[0][0].get("pod_uid") == again, 10)
        assert pod_labels(agent)[0] == [{"pod": "train", "namespace": namespace, "container": "main",
                                         "pod_uid": again, "app": "trainer-2"}]
    finally:
        agent.stop()


def test_with_the_options_off_no_new_label_appears_and_no_pod_is_read(
        access, agent_command, node, namespace, tmp_path, kubelet, api_requests):
    uuids = scenario_uuids("titan_xp")
    bound_pod(access, "train", namespace, node, {"app": "trainer"})
    kubelet.pods = [pod("train", namespace, ("main", [(GPU, [uuids[0]])]))]
    before = api_requests.snapshot("pods")
    agent = AgentProcess(agent_command, access, node, tmp_path, scenario="titan_xp", extra=(
        "--pod-resources-socket", kubelet.socket, "--pod-resources-interval", "1") + ALLOWLIST)
    try:
        agent.wait_for(lambda: pod_labels(agent)[0][0].get("pod") == "train", 20)
        agent.wait_for(lambda: agent.metrics()["scv_agent_pod_resources_reads_total"] >= 3, 10)
        assert pod_labels(agent)[0] == [{"pod": "train", "namespace": namespace, "container": "main"}]
        text = agent.metrics_text()
        assert "app=" not in text and "pod_metadata" not in text
        # pod_uid only where it was before: the per-pod series of a shared GPU (none here), with no value
        assert {line.split("{")[0] for line in text.splitlines() if "pod_uid" in line and not line.startswith("#")} \
            == {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL"}
        assert 'pod_uid=""' in text and not re.search('pod_uid="[^"]', text)
        assert api_requests.delta(before, api_requests.snapshot("pods")) == {}
    finally:
        agent.stop()


def test_pods_that_cannot_be_read_leave_the_pod_labels_on_and_the_extra_ones_off_said_once(
        access, agent_command, node, namespace, tmp_path, kubelet):
    """Another node's credentials: the Node authorizer refuses the list of this node's pods."""
    uuids = scenario_uuids("titan_xp")
    bound_pod(access, "train", namespace, node, {"app": "trainer"})
    kubelet.pods = [pod("train", namespace, ("main", [(GPU, [uuids[0]])]))]
    agent = AgentProcess(agent_command, access, node, tmp_path, scenario="titan_xp",
                         kubeconfig=access.node_kubeconfig("other-" + node), extra=(
                             "--pod-resources-socket", kubelet.socket, "--pod-resources-interval", "1",
                             "--kubernetes-enable-pod-uid", "--kubernetes-enable-pod-labels"))
    try:
        agent.wait_for(lambda: agent.metrics()["scv_agent_pod_metadata_failures_total"] >= 2, 30)
        assert pod_labels(agent)[0] == [{"pod": "train", "namespace": namespace, "container": "main"}]
        log = agent.log.read_text()
        assert log.count("pod UID and labels left off GPU series") == 1
        assert "HTTP 403" in log and "is the kubeconfig the kubelet's, of Node %s?" % node in log
    finally:
        agent.stop()


# ------------------------------------------------- the reader in this process, step by step


@pytest.fixture
def reading(control_plane, kubelet, tmp_path, request):
    """A PodMetadata reading the real API server as node ``node`` (its own kubeconfig), on the pods a real
    PodAttribution learns from the stand-in kubelet; stepped by hand, on a clock of the test's."""
    import threading

    from ansible_collections.scv.gpu.plugins.module_utils.agent.pod_metadata import PodMetadata
    from ansible_collections.scv.gpu.plugins.module_utils.agent.pod_attribution import PodAttribution
    from ansible_collections.scv.gpu.plugins.module_utils.kube.rest_client import RestClient

    node = "reader-" + request.node.name.replace("_", "-")[5:30].strip("-")
    control_plane.kubectl("create", "namespace", node)
    control_plane.kubectl("create", "serviceaccount", "default", "-n", node, check=False)
    pods = PodAttribution(kubelet.socket, 10, threading.Event())
    pods.learn([{"id": 0, "uuid": "GPU-0"}, {"id": 1, "uuid": "GPU-1"}], dict)
    clock, logs = Clock(), tmp_path / "pod-logs"
    logs.mkdir()
    client = RestClient.from_file(str(control_plane.node_kubeconfig(node)))
    reader = PodMetadata(client, node, pods, threading.Event(), uid=True, labels=True, patterns=["^app$"],
                         logs_dir=str(logs), refresh_s=300, clock=clock)
    reader.node_name, reader.logs, reader.clock_at = node, logs, clock
    yield reader
    control_plane.kubectl("delete", "namespace", node, "--wait=false")


def test_the_pods_are_read_when_the_pods_holding_gpus_change_and_when_due_never_else(control_plane, kubelet,
                                                                                     reading):
    node, clock, logs = reading.node_name, reading.clock_at, reading.logs
    train = bound_pod(control_plane, "train", node, node, {"app": "trainer", "tier": "gold"})
    reading.step()
    assert reading.reads == 0 and reading.extra({}) == ((), {})     # no pod holds a GPU: nothing read
    kubelet.pods = [pod("train", node, ("main", [(GPU, ["GPU-0"])]))]
    reading.pods.refresh()
    reading.step()
    held = {0: [("train", node, "main")]}
    assert reading.reads == 1 and reading.extra(held) == (("app", "pod_uid"), {("train", node): ["trainer", train]})
    clock.now += 299
    for _tick in range(3):
        reading.pods.refresh()
        reading.step()
    assert reading.reads == 1                                          # the same pods, not due yet
    logs_entry(logs, node, "train", train)
    reading.step()
    assert reading.reads == 2                                          # the pod logs directory names its UID
    control_plane.kubectl("label", "pod", "train", "-n", node, "app=trainer-2", "--overwrite")
    reading.step()
    assert reading.reads == 2 and reading.extra(held)[1][("train", node)][0] == "trainer"
    clock.now += 300
    reading.step()
    assert reading.reads == 3 and reading.extra(held)[1][("train", node)][0] == "trainer-2"   # due
    notebook = bound_pod(control_plane, "notebook", node, node, {})
    kubelet.pods.append(pod("notebook", node, ("main", [(GPU, ["GPU-1"])])))
    reading.pods.refresh()
    reading.step()
    assert reading.reads == 4                                          # another pod holds a GPU
    assert reading.extra({1: [("notebook", node, "main")]}) == (("pod_uid",), {("notebook", node): [notebook]})
    assert reading.failures == 0 and reading.problem is None
    # what each read asked for: the pods' metadata, not their spec and status
    from ansible_collections.scv.gpu.plugins.module_utils.agent.pod_metadata import METADATA_ONLY

    answer = reading.client.request("GET", "list", "pods", reading.client.url(
        "/api/v1/pods", fieldSelector="spec.nodeName=%s" % node), accept=METADATA_ONLY)
    assert answer["kind"] == "PartialObjectMetadataList" and len(answer["items"]) == 2
    assert "spec" not in answer["items"][0] and answer["items"][0]["metadata"]["uid"] in (train, notebook)


def test_a_pod_holding_its_gpu_through_a_dra_claim_alone_is_read_too(control_plane, kubelet, reading):
    node = reading.node_name
    infer = bound_pod(control_plane, "infer", node, node, {"app": "server"})
    kubelet.pods = [claim_pod("infer", node, ("main", [("gpu", [("gpu.nvidia.com", node, "gpu-0")])]))]
    reading.pods.refresh()
    reading.step()
    assert reading.reads == 1
    assert reading.extra({0: [("infer", node, "main")]}) == (("app", "pod_uid"), {("infer", node): ["server", infer]})


def test_a_failed_read_takes_the_extra_labels_away_and_is_tried_again_after_a_pause_said_once(
        control_plane, kubelet, reading, caplog):
    import logging

    node, clock = reading.node_name, reading.clock_at
    bound_pod(control_plane, "train", node, node, {"app": "trainer"})
    kubelet.pods = [pod("train", node, ("main", [(GPU, ["GPU-0"])]))]
    reading.pods.refresh()
    reading.step()
    assert reading.reads == 1
    reading.client = type(reading.client).from_file(str(control_plane.node_kubeconfig("other-" + node)))
    clock.now += 300
    with caplog.at_level(logging.INFO, logger="scv-gpu-agent"):
        reading.step()
        assert reading.failures == 1 and reading.extra({0: [("train", node, "main")]}) == ((), {})
        kubelet.pods.append(pod("gone", node, ("main", [(GPU, ["GPU-1"])])))
        reading.pods.refresh()
        clock.now += 2.4                                               # the first retry comes 2.5 to 5 s later
        reading.step()
        assert reading.failures == 1                                   # a change does not hurry it
        clock.now += 2.6
        reading.step()
        assert reading.failures == 2
        clock.now += 10
        reading.step()
        assert reading.failures == 3
        reading.client = type(reading.client).from_file(str(control_plane.node_kubeconfig(node)))
        clock.now += 20
        reading.step()
    assert reading.reads == 2 and reading.extra({0: [("train", node, "main")]})[0] == ("app", "pod_uid")
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2 and "pod UID and labels left off GPU series: cannot list the pods of Node" in \
        messages[0] and "HTTP 403" in messages[0] and messages[1] == (
            "pod UID and labels back on GPU series: the pods of Node %s are read again" % node)
