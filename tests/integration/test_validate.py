"""playbooks/validate.yml on a real node that the roles built: it passes there, writes its three reports, and fails
on each fault injected, naming the node and the cause, leaving no pod behind.

The node is harness.gpu_node's: the real kubelet on containerd 2 with runc and NVIDIA's own runtime, configured by
the container_toolkit role's defaults, a CDI spec that NVIDIA's nvidia-ctk wrote for h100_sxm_x8's GPUs, and NVIDIA's
device plugin DaemonSet as the device_plugin role renders it. The host checks read the node's driver root (its
device nodes, the driver's /proc/driver/nvidia/gpus) and a sysfs of its own holding the loaded module's version.
The workload and the probes are the tests' GPUS_IMAGE: ``gpus --require 1`` exits 0 only when it reaches exactly
one GPU (its device node and NVML), ``gpus --require 0`` only when it reaches none, and ``gpus --wait`` holds the
metrics check's GPU until its pod is deleted. The node's agent is the real one, reading the kubelet's
pod-resources socket every second and serving its metrics on a loopback port.

The node shares its GPUs by time-slicing, as the device_plugin role configures it: one config in
device_plugin_configs makes nvidia.com/gpu 2 replicas of each GPU. The role applies the configs' ConfigMap, labels
the node nvidia.com/device-plugin.config with the config's name, and renders the DaemonSet with NVIDIA's config
manager (an init container and a sidecar, from the plugin's image) writing /config/config.yaml, the plugin's
CONFIG_FILE. Only the image is replaced: the tests' plugin (tools/device-plugin-image) reads that file and offers
<UUID>::0 and <UUID>::1 for each GPU, as NVIDIA's does; run as config-manager, it links the DaemonSet's
DEFAULT_CONFIG (the pods cannot reach the API server to read the node's label, which names the same config here).
The labels GFD would give such a node (nvidia.com/gpu.replicas, nvidia.com/gpu.count) are set by the fixture.
"""

from __future__ import annotations

import datetime
import json
import shutil
from xml.etree import ElementTree

import pytest
import yaml

from harness.agent import AgentProcess
from harness.common import wait_until
from harness.control_plane import read_object
from harness.gpu_images import GPUS_IMAGE, container_log
from harness.gpu_node import PLUGIN_NAMESPACE, GpuNode, sharing_labels
from harness.paths import scenario_path

NODE = "validate-node"
NAMESPACE = "validate-workloads"
VALIDATION_NAMESPACE = "scv-gpu-validation"
HOST_CHECKS = ["driver", "device_nodes", "dev_char_links", "cdi_spec", "fabric", "container_runtime",
               "runtime_isolation"]
POD_CHECKS = ["workload", "second_container", "no_request", "sharing", "metrics"]
CONFIG = "ts-2"
SLICING = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}


def start_agent(node):
    """The node's agent, as the scv_agent role runs it, reading the kubelet's pod-resources every second."""
    folder = node.work / ("agent-%d" % len(list(node.work.glob("agent-*"))))
    folder.mkdir()
    node.agent = AgentProcess(node.agent_command, node.plane, NODE, folder, scenario="h100_sxm_x8", extra=(
        "--pod-resources-socket", str(node.kubelet.pod_resources_socket), "--pod-resources-interval", "1"))
    node.agent.wait_for(lambda: "DCGM_FI_DEV_GPU_UTIL" in node.agent.metrics_text(), 60)


@pytest.fixture(scope="module")
def node(access, ansible, agent_command, tmp_path_factory):
    work = tmp_path_factory.mktemp("validate")
    gpu_node = GpuNode(access, ansible, work, NODE)
    sysfs = work / "sysfs"
    (sysfs / "module" / "nvidia").mkdir(parents=True)
    (sysfs / "module" / "nvidia" / "version").write_text(gpu_node.root.driver_version + "\n")
    gpu_node.sysfs = sysfs
    gpu_node.agent_command = agent_command
    # what NVML says on the host (gpu_facts' fabric subset): the node's scenario, in a copy a test may change
    gpu_node.nvml_scenario = work / "nvml-scenario.json"
    shutil.copy(scenario_path(gpu_node.scenario), gpu_node.nvml_scenario)
    with gpu_node.running(NAMESPACE):
        deploy_shared_plugin(gpu_node)
        gpu_node.plane.kubectl("label", "node", NODE, *sharing_labels(2, len(gpu_node.root.uuids)), "--overwrite")
        _make_links(gpu_node)
        start_agent(gpu_node)
        try:
            yield gpu_node
        finally:
            gpu_node.agent.stop()


def deploy_shared_plugin(node):
    """The device plugin under the time-slicing config, its 16 replicas allocatable."""
    # the MPS root the DaemonSet mounts for every config, in the test's folder rather than the host's /run
    node.deploy_device_plugin({"device_plugin_configs": {CONFIG: SLICING},
                               "device_plugin_mps_root": str(node.work / "mps")},
                              {"nvidia.com/gpu": 2 * len(node.root.uuids)})


def _make_links(node):
    """The /dev/char links the container_toolkit role makes, in the driver root's dev."""
    done = node.ansible.modules([("scv.gpu.nvidia_dev_char_links", {"dev": str(node.root.dev)})], node.work)
    assert done[0][0], done


def validate(node, tmp_path, extra=None, *arguments):
    """(ansible-playbook's result, {file name: text} of the report) of validate.yml for the node."""
    variables = {
        "scv_gpu_hosts": "localhost", "k8s_node_name": NODE, "scv_gpu_kubeconfig": str(node.plane.admin_kubeconfig),
        "nvidia_driver_version": node.root.driver_version, "scv_gpu_validation_dest": str(tmp_path / "report"),
        "scv_gpu_validation_workload_image": GPUS_IMAGE, "scv_gpu_validation_probe_image": GPUS_IMAGE,
        "scv_gpu_validation_workload_command": ["/usr/bin/gpus", "--require", "1"],
        "scv_gpu_validation_probe_command": ["/usr/bin/gpus", "--require", "0"],
        "scv_gpu_validation_image_pull_policy": "Never", "scv_gpu_validation_timeout": 60,
        "scv_gpu_validation_metrics_url": "http://127.0.0.1:%d/metrics" % node.agent.port,
        "scv_gpu_validation_holder_command": ["/usr/bin/gpus", "--wait"], "scv_gpu_validation_metrics_hold": 20,
        "container_toolkit_runtime": "containerd",
        "scv_gpu_validation_paths": {"dev": str(node.root.dev), "sysfs": str(node.sysfs),
                                     "proc_driver": str(node.root.proc_driver),
                                     "cdi_spec": str(node.spec_dir / "nvidia.yaml"),
                                     "runtime_config": str(node.runtime_config),
                                     "container_config": str(node.containerd.config)}}
    variables.update(extra or {})
    done = node.ansible.playbook("playbooks/validate.yml", node.nvml_scenario, "-e", json.dumps(variables), *arguments)
    report = tmp_path / "report"
    files = {path.name: path.read_text() for path in report.iterdir()} if report.is_dir() else {}
    leftover = node.plane.kubectl("get", "pods", "-n", VALIDATION_NAMESPACE, "-o", "name", check=False).stdout
    assert not leftover.strip(), "validation pods left behind: %s" % leftover
    return done, files


def outcomes(files):
    """{check: (outcome, reason)} of the node, from the JUnit report."""
    suite = ElementTree.fromstring(files["validation.junit.xml"]).find("testsuite")
    assert suite.get("name") == NODE
    found = {}
    for case in suite.findall("testcase"):
        failure, skipped = case.find("failure"), case.find("skipped")
        found[case.get("name")] = ("failed", failure.get("message")) if failure is not None else (
            ("skipped", skipped.get("message")) if skipped is not None else ("passed", ""))
    return found


def test_a_node_the_roles_built_passes_and_the_report_says_so_three_ways(node, tmp_path):
    done, files = validate(node, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(files) == ["validation.conformance.json", "validation.junit.xml", "validation.md"]
    assert outcomes(files) == {name: ("passed", "") for name in HOST_CHECKS + POD_CHECKS}
    rows = [line for line in files["validation.md"].splitlines() if line.startswith("| %s |" % NODE)]
    assert rows == ["| %s | %s |" % (NODE, " | ".join(["pass"] * 12))], files["validation.md"]
    evidence = json.loads(files["validation.conformance.json"])["requirements"]
    assert evidence["secure_accelerator_access"]["passed"] is True
    assert {item["check"] for item in evidence["secure_accelerator_access"]["evidence"]} == {
        "container_runtime", "runtime_isolation", "workload", "second_container", "no_request"}
    assert evidence["accelerator_metrics"]["passed"] is True
    assert [item["check"] for item in evidence["gpu_sharing"]["evidence"]] == ["sharing"]
    assert evidence["gpu_sharing"]["passed"] is True
    assert [item["check"] for item in evidence["accelerator_metrics"]["evidence"]] == ["metrics"]

    again, files_again = validate(node, tmp_path)
    assert again.returncode == 0 and files_again == files
    assert "changed=0" in again.stdout.split("PLAY RECAP")[-1], again.stdout
    # the node is marked only where asked (validate_mark_nodes)
    annotations = read_object(node.plane, "node", NODE)["metadata"].get("annotations") or {}
    assert not [key for key in annotations if key.startswith("scv.gpu/valid")], annotations


def _fails(node, tmp_path, expected, extra=None):
    """validate.yml fails, the play's message and the report naming the node and each check in ``expected``
    ({check: text its reason holds}); returns the outcomes."""
    done, files = validate(node, tmp_path, extra)
    assert done.returncode != 0, done.stdout
    found = outcomes(files)
    for name, text in expected.items():
        assert found[name][0] == "failed" and text in found[name][1], (name, found)
        assert "%s %s:" % (NODE, name) in done.stdout, done.stdout
    return found


def test_a_missing_nvidia_uvm_fails_the_device_node_check(node, tmp_path):
    uvm = node.root.dev / "nvidia-uvm"
    uvm.rename(uvm.with_name("nvidia-uvm.away"))
    try:
        _fails(node, tmp_path, {"device_nodes": "%s/nvidia-uvm" % node.root.dev})
    finally:
        uvm.with_name("nvidia-uvm.away").rename(uvm)


def test_a_runtime_that_honours_the_variable_fails_on_the_host_and_in_the_probe_pod(node, tmp_path):
    config = node.runtime_config
    saved = config.read_text()
    config.write_text(saved.replace("accept-nvidia-visible-devices-envvar-when-unprivileged = false",
                                    "accept-nvidia-visible-devices-envvar-when-unprivileged = true"))
    assert config.read_text() != saved
    try:
        found = _fails(node, tmp_path, {"runtime_isolation": "envvar-when-unprivileged is not false",
                                        "no_request": "exited 1"})
        assert "8 GPU device nodes" in found["no_request"][1], found
    finally:
        config.write_text(saved)


def test_runc_as_the_default_with_no_way_to_nvidias_runtime_fails_on_the_host_and_in_the_workload(node, tmp_path):
    """containerd restarted on a configuration whose default is runc and which has no runtime of NVIDIA's: the
    device plugin gives the workload its GPU as a volume-mount list, which only NVIDIA's runtime turns into
    devices, so the workload finds none."""
    config = node.containerd.config
    saved = config.read_text()
    broken = saved.replace('default_runtime_name = "nvidia"', 'default_runtime_name = "runc"')
    broken = broken.split('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]')[0]
    assert broken != saved and "nvidia-container-runtime" not in broken
    config.write_text(broken)
    node.containerd.restart()
    try:
        found = _fails(node, tmp_path, {"container_runtime": "no runtime runs nvidia-container-runtime",
                                        "workload": "exited 1"})
        assert "the default is runc" in found["container_runtime"][1], found
    finally:
        config.write_text(saved)
        node.containerd.restart()


def test_labels_that_promise_more_than_the_plugin_offers_fail_the_sharing_check_at_once(node, tmp_path):
    """The node's labels say 16 GPUs, each shared 2 ways, but its plugin offers 16 replicas in all: the 17 pods the
    check would run can never run at once, which the node's allocatable tells without starting one."""
    node.plane.kubectl("label", "node", NODE, *sharing_labels(2, 16), "--overwrite")
    try:
        found = _fails(node, tmp_path, {"sharing": "the node offers 16 nvidia.com/gpu (its allocatable), fewer than "
                                                   "the 17 pods asking for one each that its labels promise to run "
                                                   "at once (16 GPUs shared 2 ways)"})
        assert [name for name, (outcome, _reason) in found.items() if outcome == "failed"] == ["sharing"], found
    finally:
        node.plane.kubectl("label", "node", NODE, *sharing_labels(2, len(node.root.uuids)), "--overwrite")


def test_a_stopped_agent_fails_the_metrics_check(node, tmp_path):
    node.agent.stop()
    try:
        found = _fails(node, tmp_path, {"metrics": "cannot be read"})
        assert "127.0.0.1:%d/metrics" % node.agent.port in found["metrics"][1], found
        assert [name for name, (outcome, _reason) in found.items() if outcome == "failed"] == ["metrics"], found
    finally:
        start_agent(node)


def test_a_gpu_whose_nvlink_fabric_is_not_trained_fails_the_fabric_check(node, tmp_path):
    """As NVML reports a Hopper HGX board on which Fabric Manager has not finished (or not started)."""
    saved = node.nvml_scenario.read_text()
    scenario = json.loads(saved)
    scenario["devices"][3]["fabric"]["state"] = 2          # NVML_GPU_FABRIC_STATE_IN_PROGRESS
    node.nvml_scenario.write_text(json.dumps(scenario))
    try:
        found = _fails(node, tmp_path, {"fabric": "GPU 3 (%s): its NVLink fabric is in progress" % (
            scenario["devices"][3]["uuid"])})
        assert "nvidia-fabricmanager" in found["fabric"][1], found
    finally:
        node.nvml_scenario.write_text(saved)


def test_a_cdi_spec_naming_a_gpu_no_longer_there_fails(node, tmp_path):
    spec_path = node.spec_dir / "nvidia.yaml"
    saved = spec_path.read_text()
    spec = yaml.safe_load(saved)
    gone = "GPU-00000000-dead-4d3c-8b4a-9e8d7c6b5a4f"
    spec["devices"].append({"name": gone, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia9"}]}})
    spec_path.write_text(yaml.safe_dump(spec))
    try:
        _fails(node, tmp_path, {"cdi_spec": gone})
    finally:
        spec_path.write_text(saved)


def test_a_workload_that_exits_non_zero_fails_with_its_output_and_marks_the_node_where_asked(node, tmp_path):
    _fails(node, tmp_path, {"workload": "exited 1"},
           {"scv_gpu_validation_workload_command": ["/usr/bin/gpus", "--require", "2"], "validate_mark_nodes": True})
    annotations = read_object(node.plane, "node", NODE)["metadata"]["annotations"]
    try:
        assert annotations["scv.gpu/validation"] == "failed: workload", annotations
        marked = datetime.datetime.strptime(annotations["scv.gpu/validated-at"], "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc)
        assert abs(datetime.datetime.now(datetime.timezone.utc) - marked) < datetime.timedelta(minutes=5), annotations
    finally:
        node.plane.kubectl("annotate", "node", NODE, "scv.gpu/validation-", "scv.gpu/validated-at-")


def test_without_the_device_plugin_the_workload_is_never_placed_and_no_other_pod_asks(node, tmp_path):
    """One timeout is waited: where the workload's pod was not placed, the sharing and metrics checks' would not be."""
    node.remove_device_plugin()
    try:
        unplaced = "not tried: the workload pod %s/" % VALIDATION_NAMESPACE
        found = _fails(node, tmp_path, {"workload": "", "sharing": unplaced, "metrics": unplaced},
                       {"scv_gpu_validation_timeout": 10})
        # the scheduler places it nowhere (its message names the nodes of the whole test cluster), or, while the
        # node's status still offers the plugin's, the kubelet refuses the pod at once (no healthy device)
        assert "within 10 s: not scheduled: " in found["workload"][1] or \
            "UnexpectedAdmissionError: Pod was rejected: Allocate failed" in found["workload"][1], found
        assert found["no_request"] == ("passed", ""), found
    finally:
        deploy_shared_plugin(node)


def test_a_dra_node_is_validated_through_a_resource_claim(node, tmp_path):
    """With gpu_stack dra, the workload pod uses a ResourceClaim for one device of class gpu.nvidia.com, which the
    scheduler allocates and the node's DRA plugin prepares from the node's CDI spec, and so does the metrics
    check's pod, which the agent names on its GPU's series from the claim; the claims are deleted after."""
    plugin = node.dra_plugin().start()
    try:
        done, files = validate(node, tmp_path, {"gpu_stack": "dra"})
        assert done.returncode == 0, done.stdout + done.stderr
        assert outcomes(files) == dict({name: ("passed", "") for name in HOST_CHECKS + POD_CHECKS}, sharing=(
            "skipped", "on a DRA node GPUs are shared through a claim that several pods use, which this check does "
                       "not run"))
        prepared = [uid for verb, uid in plugin.calls if verb == "prepare"]
        assert len(prepared) == 2, plugin.calls          # the workload's claim, then the metrics check's
        # the kubelet unprepares a claim once the pod that used it is gone
        wait_until(lambda: all(("unprepare", uid) in plugin.calls for uid in prepared), 60, "the claims unprepared",
                   0.5)
        claims = node.plane.kubectl("get", "resourceclaims", "-n", VALIDATION_NAMESPACE, "-o", "name").stdout
        assert not claims.strip(), claims
    finally:
        plugin.stop()


def test_check_mode_starts_no_pod(node, tmp_path):
    namespace = "scv-gpu-validation-check"
    done, files = validate(node, tmp_path, {"scv_gpu_validation_namespace": namespace}, "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert files == {}
    assert node.plane.kubectl("get", "namespace", namespace, check=False).returncode != 0


def test_the_plugin_offers_two_replicas_of_every_gpu_from_the_chosen_config(node):
    assert read_object(node.plane, "node", NODE)["metadata"]["labels"]["nvidia.com/device-plugin.config"] == CONFIG
    (plugin,) = json.loads(node.plane.kubectl("get", "pods", "-n", PLUGIN_NAMESPACE, "-o", "json").stdout)["items"]
    lines = container_log(node.kubelet, PLUGIN_NAMESPACE, plugin["metadata"]["name"], "nvidia-device-plugin-ctr")
    assert "registered nvidia.com/gpu (16 devices, 2 replicas each)" in lines, lines
    assert node.kubelet.allocatable("nvidia.com/gpu") == "16"


def test_a_pod_given_one_replica_sees_exactly_one_gpu(node):
    node.only_gpu(node.views(node.pod(NAMESPACE, "one-replica", [("trainer", 1, {})]))["trainer"])


@pytest.fixture(autouse=True)
def _report_folder(tmp_path):
    yield
    shutil.rmtree(tmp_path / "report", ignore_errors=True)
