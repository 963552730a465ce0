"""The device_plugin role against the real kube-apiserver, with GPUs from the NVML simulator.

Node objects stand for the simulated hosts (there is no kubelet): the role labels them from
gpu_facts through the API, and applies each flavor's manifests, which the API server validates.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest

from harness.ansible import recap
from harness.control_plane import read_object
from harness.label_expectations import LABELS
from harness.pci_sysfs import add_function as add_pci_function
from harness.paths import ROOT

PLAY = """
- hosts: localhost
  gather_facts: false
  roles:
    - role: scv.gpu.device_plugin
"""

FOREIGN = {"team": "ml", "nvidia.com/gpu.deploy.dcgm": "true", "topology.kubernetes.io/zone": "lab-1"}


def suffix(ansible):
    return re.sub(r"[^a-z0-9]+", "-", ansible.venv.name.lower()).strip("-")


def put_node(plane, name, labels):
    plane.kubectl("delete", "node", name, "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}))


def node_labels(plane, name):
    labels = read_object(plane, "node", name)["metadata"].get("labels") or {}
    return {key: value for key, value in labels.items() if not key.startswith("kubernetes.io/")}


def diff_lines(stdout, sign):
    """The removed (-) or added (+) lines of a --diff, without the sign, indentation and comma."""
    return {line[1:].strip().rstrip(",") for line in stdout.splitlines()
            if line.startswith(sign) and not line.startswith(sign * 3)}


def run(ansible, tmp_path, plane, scenario, *extra, **settings):
    play = tmp_path / "device-plugin.yml"
    play.write_text(PLAY)
    empty_sysfs = tmp_path / "sys-without-gpus"     # this host's own bus must not decide the labels
    empty_sysfs.mkdir(exist_ok=True)
    variables = {"device_plugin_kubeconfig": str(plane.admin_kubeconfig), "device_plugin_sysfs": str(empty_sysfs)}
    variables.update(settings)
    return ansible.playbook(play, scenario, "-e", json.dumps(variables), *extra)


@pytest.mark.parametrize("scenario", sorted(LABELS))
def test_labels_match_the_gpus_keep_foreign_and_a_rerun_writes_nothing(
        ansible, control_plane, api_requests, tmp_path, scenario):
    plane = control_plane
    node = "labels-%s-%s" % (scenario.replace("_", "-"), suffix(ansible))
    stale = {"nvidia.com/gpu.count": "4", "nvidia.com/cuda.runtime-version.full": "11.8", "gpu/nvidia": "Tesla-T4"}
    put_node(plane, node, dict(FOREIGN, **stale))

    first = run(ansible, tmp_path, plane, scenario, device_plugin_node_name=node, device_plugin_deploy=False)
    assert first.returncode == 0, first.stdout + first.stderr
    assert recap(first.stdout)["changed"] == 1
    assert node_labels(plane, node) == dict(FOREIGN, **LABELS[scenario])

    before = api_requests.snapshot("nodes")
    second = run(ansible, tmp_path, plane, scenario, device_plugin_node_name=node, device_plugin_deploy=False)
    assert second.returncode == 0, second.stdout + second.stderr
    assert recap(second.stdout)["changed"] == 0
    requests = api_requests.delta(before, api_requests.snapshot("nodes"))
    assert requests == {("GET", "", ""): 1}, requests


def test_a_changed_gpu_changes_only_the_labels_that_differ(ansible, control_plane, tmp_path):
    plane = control_plane
    node = "labels-swap-%s" % suffix(ansible)
    put_node(plane, node, dict(FOREIGN))
    assert run(ansible, tmp_path, plane, "a100_mig", device_plugin_node_name=node, device_plugin_deploy=False).returncode == 0
    swapped = run(ansible, tmp_path, plane, "h100_sxm_x8", "--diff", device_plugin_node_name=node, device_plugin_deploy=False)
    assert swapped.returncode == 0, swapped.stdout + swapped.stderr
    assert node_labels(plane, node) == dict(FOREIGN, **LABELS["h100_sxm_x8"])
    assert diff_lines(swapped.stdout, "-") == {
        '"gpu/nvidia": "NVIDIA-A100-SXM4-40GB"', '"nvidia.com/gpu.compute.major": "8"', '"nvidia.com/gpu.count": "2"',
        '"nvidia.com/gpu.family": "ampere"', '"nvidia.com/gpu.memory": "40960"',
        '"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"'}
    assert '"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"' in diff_lines(swapped.stdout, "+")


def test_a_node_without_a_driver_is_labelled_from_its_pci_bus(ansible, control_plane, tmp_path):
    """The driver-installer DaemonSet's nodes: no driver, so no NVML; the PCI bus still has the cards."""
    plane = control_plane
    node = "labels-pci-%s" % suffix(ansible)
    put_node(plane, node, dict(FOREIGN))
    sysfs = tmp_path / "sys"
    for address in ("0000:18:00.0", "0000:2a:00.0"):
        add_pci_function(sysfs, address, 0x10DE, 0x2330, 0x030200)
    add_pci_function(sysfs, "0000:c5:00.0", 0x10DE, 0x22A3, 0x068000)     # an NVSwitch is no GPU
    driverless = run(ansible, tmp_path, plane, "driver_not_loaded", device_plugin_node_name=node,
                     device_plugin_deploy=False, device_plugin_sysfs=str(sysfs))
    assert driverless.returncode == 0, driverless.stdout + driverless.stderr
    assert node_labels(plane, node) == dict(FOREIGN, **{"nvidia.com/gpu.present": "true",
                                                        "gpu/nvidia": "NVIDIA-H100-80GB-HBM3"})
    # the installer DaemonSet's selector (the key exists) now reaches the node
    selected = plane.kubectl("get", "nodes", "-l", "gpu/nvidia", "-o", "name").stdout.split()
    assert "node/%s" % node in selected

    # the driver comes up: the full labels, and the site's key keeps its value
    running = run(ansible, tmp_path, plane, "h100_sxm_x8", "--diff", device_plugin_node_name=node,
                  device_plugin_deploy=False, device_plugin_sysfs=str(sysfs))
    assert running.returncode == 0, running.stdout + running.stderr
    assert node_labels(plane, node) == dict(FOREIGN, **LABELS["h100_sxm_x8"])
    assert not any("gpu/nvidia" in line for line in diff_lines(running.stdout, "-"))


@pytest.mark.every_ansible_line
def test_check_mode_reports_labels_without_writing(ansible, control_plane, tmp_path):
    plane = control_plane
    node = "labels-check-%s" % suffix(ansible)
    put_node(plane, node, dict(FOREIGN))
    done = run(ansible, tmp_path, plane, "titan_xp", "--check", "--diff", device_plugin_node_name=node,
               device_plugin_deploy=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert recap(done.stdout)["changed"] == 1
    assert '"nvidia.com/gpu.product": "TITAN-Xp"' in diff_lines(done.stdout, "+")
    assert node_labels(plane, node) == FOREIGN


def test_a_node_that_does_not_exist_is_named(ansible, control_plane, tmp_path):
    done = run(ansible, tmp_path, control_plane, "titan_xp", device_plugin_node_name="no-such-node",
               device_plugin_deploy=False)
    assert done.returncode != 0
    assert "Node no-such-node does not exist" in done.stdout


FLAVORS = {
    "nvidia": ("nvidia-device-plugin-daemonset", {}),
    "gke": ("nvidia-gpu-device-plugin", {"device_plugin_gke_image": "registry.example.com/nvidia-gpu-device-plugin:v1",
                                         "device_plugin_gke_metrics": True}),
    "volcano_vgpu": ("volcano-device-plugin", {
        "device_plugin_volcano_image": "registry.example.com/volcano-vgpu-device-plugin:v1",
        "device_plugin_volcano_monitor_image": "registry.example.com/volcano-vgpu-monitor:v1"}),
}


# on ansible-core 2.19 too for one flavor: the others differ in their templates, not in how Ansible runs them
@pytest.mark.parametrize("flavor", [
    pytest.param(flavor, marks=[pytest.mark.every_ansible_line] if flavor == "nvidia" else [])
    for flavor in sorted(FLAVORS)])
def test_each_flavor_is_accepted_and_selects_the_labelled_nodes(ansible, control_plane, tmp_path, flavor):
    plane = control_plane
    namespace = "dp-%s-%s" % (flavor.replace("_", "-"), suffix(ansible))
    plane.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")
    plane.kubectl("create", "namespace", namespace, check=False)
    gpu_node, cpu_node = "dp-gpu-%s" % suffix(ansible), "dp-cpu-%s" % suffix(ansible)
    put_node(plane, gpu_node, {})
    put_node(plane, cpu_node, {})
    daemon_json = tmp_path / "daemon.json"
    daemon_json.write_text(json.dumps({"default-runtime": "nvidia", "runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}}}))
    name, images = FLAVORS[flavor]
    settings = dict(images, device_plugin_flavor=flavor, device_plugin_namespace=namespace,
                    device_plugin_node_name=gpu_node, device_plugin_docker_daemon_json=str(daemon_json))

    first = run(ansible, tmp_path, plane, "titan_xp", **settings)
    assert first.returncode == 0, first.stdout + first.stderr
    daemonset = read_object(plane, "daemonset", name, namespace=namespace)
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    expressions = term["matchExpressions"]
    assert expressions[0] == {"key": "gpu/nvidia", "operator": "Exists"}
    # every flavor stays off the nodes whose GPU stack is dra (NVIDIA's DRA kubelet plugin runs there)
    assert expressions[1] == {"key": "scv.gpu/gpu-stack", "operator": "NotIn", "values": ["dra"]}
    assert expressions[2:] == ([{"key": "scv.gpu/mig-layout", "operator": "NotIn", "values": ["applying"]}]
                               if flavor == "nvidia" else [])
    selected = plane.kubectl("get", "nodes", "-l", "gpu/nvidia", "-o", "name").stdout.split()
    assert "node/%s" % gpu_node in selected and "node/%s" % cpu_node not in selected
    mounts = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    assert mounts["device-plugin"] == "/var/lib/kubelet/device-plugins"
    container = spec["containers"][0]
    if flavor == "nvidia":
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        assert container["env"] == [{"name": "MIG_STRATEGY", "value": "none"},
                                    {"name": "DEVICE_LIST_STRATEGY", "value": "volume-mounts"}]
        # through NVIDIA's runtime, unprivileged, asking for every GPU by the one request an isolated runtime honours
        assert spec["runtimeClassName"] == "nvidia"
        assert mounts["nvidia-devices-all"] == "/dev/null"
        assert {"name": "nvidia-devices-all", "mountPath": "/var/run/nvidia-container-devices/all",
                "readOnly": True} in container["volumeMounts"]
        runtime_class = json.loads(plane.kubectl("get", "runtimeclass", "nvidia", "-o", "json").stdout)
        assert runtime_class["handler"] == "nvidia"
    elif flavor == "gke":
        assert "--enable-container-gpu-metrics" in container["command"]
        assert container["ports"] == [{"name": "metrics", "containerPort": 2112, "protocol": "TCP"}]
    else:
        assert mounts["vgpu"] == "/usr/local/vgpu"
        assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}} in container["env"]
        assert spec["containers"][1]["ports"][0]["containerPort"] == 9394
        assert spec["serviceAccountName"] == "volcano-device-plugin"
        for kind, object_name in (("configmap", "volcano-vgpu-device-config"), ("configmap", "volcano-vgpu-node-config"),
                                  ("serviceaccount", "volcano-device-plugin")):
            assert plane.kubectl("get", kind, "-n", namespace, object_name, check=False).returncode == 0
        assert plane.kubectl("get", "clusterrolebinding", "volcano-device-plugin", check=False).returncode == 0

    second = run(ansible, tmp_path, plane, "titan_xp", **settings)
    assert second.returncode == 0, second.stdout + second.stderr
    assert recap(second.stdout)["changed"] == 0


def gfd_labels(scenario, strategy):
    """What NVIDIA's GFD wrote for this scenario and strategy (tests/fixtures/gfd), less the DMI machine
    type and the PCI-derived gpu.mode (this test's hosts have neither)."""
    path = ROOT / "tests" / "fixtures" / "gfd" / ("%s-%s.txt" % (scenario, strategy))
    labels = dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return {key: value for key, value in labels.items() if not re.match(r"^nvidia\.com/gpu\.(machine|mode)$", key)}


def test_the_mig_strategy_reaches_the_labels_and_the_plugin(ansible, control_plane, tmp_path):
    """A node switched none -> single -> mixed -> none carries GFD's labels for each strategy, and
    loses the labels of the one before; the DaemonSet gets the strategy."""
    plane = control_plane
    node, namespace = "mig-%s" % suffix(ansible), "dp-mig-%s" % suffix(ansible)
    put_node(plane, node, dict(FOREIGN))
    plane.kubectl("create", "namespace", namespace, check=False)
    for strategy in ("none", "single", "mixed", "none"):
        result = run(ansible, tmp_path, plane, "h100_mig_mixed", device_plugin_node_name=node,
                     device_plugin_namespace=namespace, device_plugin_mig_strategy=strategy,
                     device_plugin_nvidia_image="registry.example.com/k8s-device-plugin:v0.17.4")
        assert result.returncode == 0, result.stdout + result.stderr
        labels = node_labels(plane, node)
        ours = {key: value for key, value in labels.items() if key not in FOREIGN}
        assert ours.pop("nvidia.com/gpu.mode") == "unknown"
        assert ours.pop("nvidia.com/gpu.present") == "true"
        assert ours.pop("gpu/nvidia") == "NVIDIA-H100-80GB-HBM3"
        assert ours == gfd_labels("h100_mig_mixed", strategy), strategy
        assert {key: labels[key] for key in FOREIGN} == FOREIGN
        daemonset = json.loads(plane.kubectl("get", "daemonset", "-n", namespace, "nvidia-device-plugin-daemonset",
                                             "-o", "json").stdout)
        assert daemonset["spec"]["template"]["spec"]["containers"][0]["env"] == [
            {"name": "MIG_STRATEGY", "value": strategy}, {"name": "DEVICE_LIST_STRATEGY", "value": "volume-mounts"}]


@pytest.mark.every_ansible_line
def test_an_unknown_mig_strategy_is_refused_before_anything_runs(ansible, control_plane, tmp_path):
    result = run(ansible, tmp_path, control_plane, "a100_mig", device_plugin_mig_strategy="mixd")
    assert result.returncode != 0
    assert "device_plugin_mig_strategy" in result.stdout and "mixd" in result.stdout


def volcano_node(ansible, plane, prefix):
    """(namespace, node) for a Volcano refusal test: both named ``prefix`` and the ansible line, the Node unlabelled."""
    name = "%s-%s" % (prefix, suffix(ansible))
    plane.kubectl("create", "namespace", name, check=False)
    put_node(plane, name, {})
    return name, name


@pytest.mark.parametrize("content, says", [
    (None, "does not exist"),
    ({"runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}}}, "sets default-runtime to nothing"),
    ({"default-runtime": "runc"}, "sets default-runtime to runc"),
])
def test_volcano_refuses_a_node_whose_default_runtime_is_not_nvidia(ansible, control_plane, tmp_path, content, says):
    plane = control_plane
    namespace, node = volcano_node(ansible, plane, "dp-refused")
    daemon_json = tmp_path / "daemon.json"
    if content is not None:
        daemon_json.write_text(json.dumps(content))
    settings = dict(FLAVORS["volcano_vgpu"][1], device_plugin_flavor="volcano_vgpu", device_plugin_namespace=namespace,
                    device_plugin_node_name=node, device_plugin_docker_daemon_json=str(daemon_json))
    done = run(ansible, tmp_path, plane, "titan_xp", **settings)
    assert done.returncode != 0
    assert "on node %s %s %s" % (node, daemon_json, says) in done.stdout.replace("\n", " ")
    assert plane.kubectl("get", "daemonset", "-n", namespace, "volcano-device-plugin", check=False).returncode != 0
    assert node_labels(plane, node) == {}


def test_volcano_refuses_a_node_whose_nvidia_runtime_refuses_the_variable(ansible, control_plane, tmp_path):
    """The plugin hands out GPUs through NVIDIA_VISIBLE_DEVICES only; under container_toolkit's isolation (its
    default) its pods would get none, and turning isolation off is a risk the refusal names."""
    plane = control_plane
    namespace, node = volcano_node(ansible, plane, "dp-isolated")
    daemon_json = tmp_path / "daemon.json"
    daemon_json.write_text(json.dumps({"default-runtime": "nvidia"}))
    runtime_config = tmp_path / "config.toml"
    runtime_config.write_text("accept-nvidia-visible-devices-envvar-when-unprivileged = false  # isolated\n"
                              "[nvidia-container-runtime]\nmode = \"cdi\"\n")
    settings = dict(FLAVORS["volcano_vgpu"][1], device_plugin_flavor="volcano_vgpu", device_plugin_namespace=namespace,
                    device_plugin_node_name=node, device_plugin_docker_daemon_json=str(daemon_json),
                    device_plugin_nvidia_runtime_config=str(runtime_config))
    done = run(ansible, tmp_path, plane, "titan_xp", **settings)
    said = done.stdout.replace("\n", " ")
    assert done.returncode != 0
    assert "on node %s %s sets accept-nvidia-visible-devices-envvar-when-unprivileged = false" % (
        node, runtime_config) in said
    assert "container_toolkit_isolate: false" in said and "every GPU of the node" in said
    assert plane.kubectl("get", "daemonset", "-n", namespace, "volcano-device-plugin", check=False).returncode != 0

    runtime_config.write_text("accept-nvidia-visible-devices-envvar-when-unprivileged = true\n")
    assert run(ansible, tmp_path, plane, "titan_xp", **settings).returncode == 0


def test_a_flavor_without_its_image_says_which_variable(ansible, control_plane, tmp_path):
    done = run(ansible, tmp_path, control_plane, "titan_xp", device_plugin_flavor="gke", device_plugin_labels=False)
    assert done.returncode != 0
    assert "device_plugin_flavor gke needs device_plugin_gke_image" in done.stdout


LONG_NAMED_MIG = {"nvml_available": True, "driver_version": "580.95.05", "cardList": [
    {"model": "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "totalMemory": 97887, "migEnabled": True,
     "migDevices": [{"profile": "1g.24gb", "attributes": {"multiprocessorCount": 46}}] * 4}]}


def test_a_label_the_api_server_refuses_is_left_out_and_the_node_gets_every_other(control_plane, capsys):
    """The API server is the judge: sent with the others, the 67-character MIG product fails the whole patch;
    node_labels leaves it out, warns naming it, and sets the rest."""
    from ansible_collections.scv.gpu.plugins.modules import node_labels as module
    from harness.in_process import run_module

    plane, node = control_plane, "labels-long-name"
    put_node(plane, node, dict(FOREIGN))
    long_product = "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition-MIG-1g.24gb"
    patch = {"metadata": {"labels": {"nvidia.com/mig-1g.24gb.product": long_product,
                                     "nvidia.com/mig-1g.24gb.count": "4"}}}
    refused = plane.kubectl("patch", "node", node, "--type", "merge", "-p", json.dumps(patch), check=False)
    assert refused.returncode != 0 and "must be no more than 63 " in refused.stderr   # characters or bytes
    assert node_labels(plane, node) == FOREIGN                     # one bad value: nothing was set
    args = dict(name=node, gpu_facts=LONG_NAMED_MIG, mig_strategy="mixed", kubeconfig=str(plane.admin_kubeconfig))
    code, result = run_module(capsys, module, args)
    assert code == 0 and result["changed"] is True, result
    reason = "the value %r is 67 characters long, over the 63 a label value may have" % long_product
    assert result["left_out"] == {"nvidia.com/mig-1g.24gb.product": reason}
    warned = [str(warning) for warning in result["warnings"]]
    assert any("the label nvidia.com/mig-1g.24gb.product is left out" in warning for warning in warned), warned
    labels = node_labels(plane, node)
    assert "nvidia.com/mig-1g.24gb.product" not in labels and labels["nvidia.com/mig-1g.24gb.count"] == "4"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition"
    assert labels["team"] == "ml"
    code, result = run_module(capsys, module, args)
    assert code == 0 and result["changed"] is False, result       # a rerun writes nothing


SHARING_PLAY = """
- hosts: gpu
  gather_facts: false
  roles:
    - role: scv.gpu.device_plugin
"""
TS4 = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
MPS2 = {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
SHARING = {"ts-4": TS4, "mps-2": MPS2}
CONFIG_LABEL = "nvidia.com/device-plugin.config"


def run_hosts(ansible, tmp_path, plane, scenario, choices, *extra, **settings):
    """The role on one inventory host per node (all local), each host's choice in its host vars."""
    inventory = tmp_path / "gpu-hosts.yml"
    hosts = {node: ({"device_plugin_config": choice} if choice else {}) for node, choice in choices.items()}
    for variables in hosts.values():
        variables.update(ansible_connection="local", ansible_python_interpreter=str(ansible.python))
    inventory.write_text(json.dumps({"gpu": {"hosts": hosts}}))
    play = tmp_path / "sharing.yml"
    play.write_text(SHARING_PLAY)
    empty_sysfs = tmp_path / "sys-without-gpus"
    empty_sysfs.mkdir(exist_ok=True)
    variables = {"device_plugin_kubeconfig": str(plane.admin_kubeconfig), "device_plugin_sysfs": str(empty_sysfs),
                 "device_plugin_configs": SHARING, "device_plugin_default_config": "ts-4"}
    variables.update(settings)
    return ansible.playbook(play, scenario, "-i", str(inventory), "-e", json.dumps(variables), *extra)


def changed_tasks(stdout):
    """The names of the tasks that reported a change."""
    names, task = [], None
    for line in stdout.splitlines():
        if line.startswith("TASK ["):
            task = line[line.index(" : ") + 3:line.rindex("]")] if " : " in line else None
        elif line.startswith("changed: [") and task and task not in names:
            names.append(task)
    return names


def changed(result, hosts):
    return sum(recap(result.stdout, host)["changed"] for host in hosts)


def sharing_objects(plane, namespace):
    """What the role applied in the namespace: {kind/name: resourceVersion}."""
    found = {}
    for kind in ("configmap", "daemonset", "serviceaccount"):
        listed = json.loads(plane.kubectl("get", kind, "-n", namespace, "-o", "json").stdout)["items"]
        found.update({"%s/%s" % (kind, item["metadata"]["name"]): item["metadata"]["resourceVersion"]
                      for item in listed if item["metadata"]["name"] != "default"})
    return found


def sharing_setup(plane, ansible, tag):
    """A new namespace (none is ever deleted: no controller finishes a deletion here) and two nodes."""
    namespace = "dp-share-%s-%s-%s" % (tag, suffix(ansible), uuid.uuid4().hex[:6])
    plane.kubectl("create", "namespace", namespace)
    nodes = ["share-%s-a-%s" % (tag, suffix(ansible)), "share-%s-b-%s" % (tag, suffix(ansible))]
    for node in nodes:
        put_node(plane, node, dict(FOREIGN))
    return namespace, nodes


def config_manager_env(container):
    """A container's env as {name: value}; the API server leaves out an empty value."""
    return {item["name"]: item["valueFrom"] if "valueFrom" in item else item.get("value", "")
            for item in container["env"]}


def test_named_configs_reach_the_configmap_the_plugin_and_each_node(ansible, control_plane, tmp_path):
    plane = control_plane
    namespace, (node_a, node_b) = sharing_setup(plane, ansible, "cfg")

    # check mode first: it says what would change, and writes nothing
    checked = run_hosts(ansible, tmp_path, plane, "titan_xp", {node_a: "", node_b: "ts-4"}, "--check",
                        device_plugin_namespace=namespace)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert changed(checked, (node_a, node_b)) >= 3                   # labels of both nodes, the plugin's objects
    assert sharing_objects(plane, namespace) == {}
    assert node_labels(plane, node_a) == FOREIGN and node_labels(plane, node_b) == FOREIGN

    first = run_hosts(ansible, tmp_path, plane, "titan_xp", {node_a: "", node_b: "ts-4"},
                      device_plugin_namespace=namespace)
    assert first.returncode == 0, first.stdout + first.stderr
    configmap = read_object(plane, "configmap", "nvidia-device-plugin-configs", namespace=namespace)
    assert sorted(configmap["data"]) == ["mps-2", "ts-4"]
    import yaml
    assert yaml.safe_load(configmap["data"]["ts-4"]) == dict(TS4, flags={"migStrategy": "none"})
    assert yaml.safe_load(configmap["data"]["mps-2"]) == dict(MPS2, flags={"migStrategy": "none"})
    assert configmap["data"]["ts-4"].startswith("version: v1\nflags:\n  migStrategy: none\n")

    spec = read_object(plane, "daemonset", "nvidia-device-plugin-daemonset", namespace=namespace)["spec"]["template"]["spec"]
    assert spec["shareProcessNamespace"] is True and spec["serviceAccountName"] == "nvidia-device-plugin"
    (init,) = spec["initContainers"]
    plugin, sidecar = spec["containers"]
    assert init["command"] == sidecar["command"] == ["config-manager"]
    for container, oneshot, signal in ((init, "true", ""), (sidecar, "false", "nvidia-device-plugin")):
        env = config_manager_env(container)
        assert env["ONESHOT"] == oneshot and env["PROCESS_TO_SIGNAL"] == signal
        assert env["NODE_LABEL"] == CONFIG_LABEL and env["DEFAULT_CONFIG"] == "ts-4"
        assert env["CONFIG_FILE_SRCDIR"] == "/available-configs" and env["CONFIG_FILE_DST"] == "/config/config.yaml"
        assert env["NODE_NAME"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}
        assert env["SIGNAL"] == ("1" if signal else "")
        assert {m["name"]: m["mountPath"] for m in container["volumeMounts"]} == {
            "available-configs": "/available-configs", "config": "/config"}
    assert plugin["name"] == "nvidia-device-plugin-ctr" and plugin["command"] == ["nvidia-device-plugin"]
    assert config_manager_env(plugin) == {"MIG_STRATEGY": "none", "DEVICE_LIST_STRATEGY": "volume-mounts",
                                          "CONFIG_FILE": "/config/config.yaml", "MPS_ROOT": "/run/nvidia/mps"}
    assert {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]} == {
        "device-plugin": "/var/lib/kubelet/device-plugins",
        "nvidia-devices-all": "/var/run/nvidia-container-devices/all", "available-configs": "/available-configs",
        "config": "/config", "mps-shm": "/dev/shm", "mps-root": "/mps"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["available-configs"]["configMap"]["name"] == "nvidia-device-plugin-configs"
    assert volumes["config"]["emptyDir"] == {}
    # the config manager reads its node's label through the API, as the plugin's service account
    assert plane.kubectl("auth", "can-i", "watch", "nodes", "--as",
                         "system:serviceaccount:%s:nvidia-device-plugin" % namespace, check=False).stdout.strip() == "yes"
    assert node_labels(plane, node_a)[CONFIG_LABEL] == "ts-4"        # the default, written out
    assert node_labels(plane, node_b)[CONFIG_LABEL] == "ts-4"
    assert plane.kubectl("get", "daemonset", "-n", namespace, "nvidia-device-plugin-mps-control-daemon",
                         check=False).returncode != 0                 # no node uses MPS yet

    # node b switches to MPS: its label changes and the MPS control daemon comes
    switched = run_hosts(ansible, tmp_path, plane, "titan_xp", {node_a: "", node_b: "mps-2"},
                         device_plugin_namespace=namespace)
    assert switched.returncode == 0, switched.stdout + switched.stderr
    assert node_labels(plane, node_b)[CONFIG_LABEL] == "mps-2" and node_labels(plane, node_a)[CONFIG_LABEL] == "ts-4"
    mps = read_object(plane, "daemonset", "nvidia-device-plugin-mps-control-daemon", namespace=namespace)
    mps_spec = mps["spec"]["template"]["spec"]
    assert mps_spec["nodeSelector"] == {"nvidia.com/mps.capable": "true"} and mps_spec["hostPID"] is True
    assert [c["name"] for c in mps_spec["initContainers"]] == ["mps-control-daemon-mounts", "mps-control-daemon-init"]
    assert [c["command"] for c in mps_spec["containers"]] == [["/usr/bin/mps-control-daemon"], ["config-manager"]]
    assert config_manager_env(mps_spec["containers"][1])["PROCESS_TO_SIGNAL"] == "/usr/bin/mps-control-daemon"
    assert mps_spec["containers"][0]["image"] == plugin["image"]
    # the daemon's selector reaches the MPS node only (node_labels writes mps.capable from the node's config)
    capable = plane.kubectl("get", "nodes", "-l", "nvidia.com/mps.capable=true", "-o", "name").stdout.split()
    assert "node/%s" % node_b in capable and "node/%s" % node_a not in capable

    # node a switches too: only its labels change, nothing the plugin runs
    before = sharing_objects(plane, namespace)
    again = run_hosts(ansible, tmp_path, plane, "titan_xp", {node_a: "mps-2", node_b: "mps-2"}, "--diff",
                      device_plugin_namespace=namespace)
    assert again.returncode == 0, again.stdout + again.stderr
    assert recap(again.stdout, node_b)["changed"] == 0, again.stdout
    # the config label, and GFD's sharing labels where node_labels is given the config
    label_tasks = {"Label node %s" % node_a, "Label with its device plugin config the node %s" % node_a}
    assert set(changed_tasks(again.stdout)) <= label_tasks
    assert "Label with its device plugin config the node %s" % node_a in changed_tasks(again.stdout)
    assert sharing_objects(plane, namespace) == before
    assert node_labels(plane, node_a) == dict(node_labels(plane, node_a), **{CONFIG_LABEL: "mps-2"})
    assert {key: value for key, value in node_labels(plane, node_a).items() if key in FOREIGN} == FOREIGN

    rerun = run_hosts(ansible, tmp_path, plane, "titan_xp", {node_a: "mps-2", node_b: "mps-2"},
                      device_plugin_namespace=namespace)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert changed(rerun, (node_a, node_b)) == 0

    # no configs any more: the plugin runs without, and the ConfigMap and the MPS daemon go
    plain = run_hosts(ansible, tmp_path, plane, "titan_xp", {node_a: "", node_b: ""}, device_plugin_namespace=namespace,
                      device_plugin_configs={}, device_plugin_default_config="")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    objects = sharing_objects(plane, namespace)
    assert "configmap/nvidia-device-plugin-configs" not in objects
    assert "daemonset/nvidia-device-plugin-mps-control-daemon" not in objects
    spec = read_object(plane, "daemonset", "nvidia-device-plugin-daemonset", namespace=namespace)["spec"]["template"]["spec"]
    assert "initContainers" not in spec and [c["name"] for c in spec["containers"]] == ["nvidia-device-plugin-ctr"]


@pytest.mark.every_ansible_line
@pytest.mark.parametrize("configs, choices, says", [
    (dict(SHARING, **{"mps-2": {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 1}]}}}}),
     ("", "mps-2"), "device_plugin_configs['mps-2'].sharing.mps.resources[0].replicas: 1 is fewer than 2"),
    (SHARING, ("", "mps-3"), "device_plugin_config: 'mps-3' is not a config of device_plugin_configs (mps-2, ts-4)"),
    (dict(SHARING, **{"ts-4": dict(TS4, flags={"migStrategy": "mixed"})}), ("", ""),
     "device_plugin_configs['ts-4'].flags.migStrategy: 'mixed' differs from device_plugin_mig_strategy (none)"),
])
def test_a_bad_config_or_choice_is_refused_before_anything_changes(ansible, control_plane, tmp_path, configs, choices,
                                                                   says):
    plane = control_plane
    namespace, nodes = sharing_setup(plane, ansible, "bad")
    done = run_hosts(ansible, tmp_path, plane, "titan_xp", dict(zip(nodes, choices)),
                     device_plugin_namespace=namespace, device_plugin_configs=configs)
    assert done.returncode != 0
    assert says in done.stdout.replace("\n", " "), done.stdout
    assert "Nothing was changed." in done.stdout
    assert sharing_objects(plane, namespace) == {}
    assert [node_labels(plane, node) for node in nodes] == [FOREIGN, FOREIGN]


def test_mps_is_refused_on_a_host_with_mig_enabled(ansible, control_plane, tmp_path):
    plane = control_plane
    namespace, nodes = sharing_setup(plane, ansible, "mig")
    done = run_hosts(ansible, tmp_path, plane, "a100_mig", dict(zip(nodes, ("", "mps-2"))),
                     device_plugin_namespace=namespace, device_plugin_mig_strategy="single")
    assert done.returncode != 0
    assert ("node %s: config 'mps-2' shares its GPUs with MPS, but MIG is enabled on GPU 0" % nodes[1]
            in done.stdout.replace("\n", " ")), done.stdout
    assert sharing_objects(plane, namespace) == {}
    assert [node_labels(plane, node) for node in nodes] == [FOREIGN, FOREIGN]


def test_a_config_for_a_node_that_does_not_exist_is_an_error(ansible, control_plane, tmp_path):
    done = run_hosts(ansible, tmp_path, control_plane, "titan_xp", {"no-such-shared-node": "mps-2"},
                     device_plugin_labels=False, device_plugin_deploy=False)
    assert done.returncode != 0
    assert "Node no-such-shared-node does not exist" in done.stdout, done.stdout


def test_a_runtime_class_name_kubernetes_refuses_is_refused_before_anything_changes(ansible, control_plane, tmp_path):
    plane = control_plane
    namespace, node = volcano_node(ansible, plane, "dp-runtime-class")
    done = run(ansible, tmp_path, plane, "titan_xp", device_plugin_namespace=namespace, device_plugin_node_name=node,
               device_plugin_runtime_class="NVIDIA_gpu")
    said = " ".join(done.stdout.split())
    assert done.returncode != 0
    assert "device_plugin_runtime_class: 'NVIDIA_gpu'" in said and "Nothing was changed." in said, said
    assert plane.kubectl("get", "daemonset", "-n", namespace, "nvidia-device-plugin-daemonset",
                         check=False).returncode != 0
    assert node_labels(plane, node) == {}
