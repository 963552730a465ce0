"""The dra_driver role against the real kube-apiserver: NVIDIA's DRA driver deployed per node stack.

The host is simulated (harness/dra_host.py: NVML simulator, containerd config, the real
scv-gpu-cdi-refresh with stand-in nvidia-smi and nvidia-ctk); Node objects stand for the hosts,
their status (kubelet version, allocatable) written as a kubelet reports it. There is no kubelet
or scheduler: which node each DaemonSet reaches is read from its nodeAffinity with the API
server's own label selection.
"""

from __future__ import annotations

import json

import pytest

from harness.ansible import recap
from harness.control_plane import ControlPlane, read_object
from harness.dra_host import DraHost, node_object, put_node, run_role, run_role_on_hosts, suffix

GPU_NODE = {"nvidia.com/gpu.present": "true", "gpu/nvidia": "NVIDIA-GB200"}
SCENARIO = "gb200_nvl_x4"           # driver 580.95.05


COMPUTE_DOMAIN_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "computedomains.resource.nvidia.com"},
    "spec": {"group": "resource.nvidia.com", "scope": "Namespaced",
             "names": {"kind": "ComputeDomain", "plural": "computedomains", "singular": "computedomain",
                       "listKind": "ComputeDomainList"},
             "versions": [{"name": "v1beta1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]}}


@pytest.fixture
def host(tmp_path, monkeypatch):
    made = DraHost(tmp_path, monkeypatch)
    made.generate_spec(SCENARIO)
    return made


def affinity_selector(daemonset):
    """The DaemonSet's one nodeSelectorTerm as a label selector kubectl understands."""
    spec = daemonset["spec"]["template"]["spec"]
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    parts = []
    for expression in term["matchExpressions"]:
        operator, key = expression["operator"], expression["key"]
        if operator == "Exists":
            parts.append(key)
        else:
            parts.append("%s %s (%s)" % (key, {"In": "in", "NotIn": "notin"}[operator], ",".join(expression["values"])))
    return ",".join(parts)


def selected(plane, daemonset, nodes):
    names = plane.kubectl("get", "nodes", "-l", affinity_selector(daemonset), "-o", "name").stdout.split()
    return {name.split("/", 1)[1] for name in names} & set(nodes)


def dra_objects(plane, namespace):
    return {"daemonset": read_object(plane, "daemonset", "nvidia-dra-driver-gpu-kubelet-plugin", namespace=namespace,
                                     missing_ok=True),
            "controller": read_object(plane, "deployment", "nvidia-dra-driver-gpu-controller", namespace=namespace,
                                      missing_ok=True)}


def device_classes(plane):
    listed = json.loads(plane.kubectl("get", "deviceclasses.resource.k8s.io", "-o", "json").stdout)["items"]
    return {item["metadata"]["name"]: item["spec"] for item in listed
            if (item["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "scv.gpu"}


@pytest.mark.every_ansible_line
def test_the_driver_is_deployed_as_expected_labels_its_node_and_a_rerun_changes_nothing(
        ansible, control_plane, host, tmp_path):
    plane = control_plane
    node, namespace = "dra-deploy-%s" % suffix(ansible), "dra-deploy-%s" % suffix(ansible)
    put_node(plane, node, dict(GPU_NODE, team="ml"))
    settings = host.settings(plane, node, namespace, gpu_stack="dra")

    first = run_role(ansible, tmp_path, SCENARIO, settings)
    assert first.returncode == 0, first.stdout + first.stderr
    assert node_object(plane, node)["metadata"]["labels"] == dict(GPU_NODE, team="ml", **{"scv.gpu/gpu-stack": "dra"})
    objects = dra_objects(plane, namespace)
    assert objects["controller"] is None            # no ComputeDomains asked for
    spec = objects["daemonset"]["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "nvidia-dra-driver-gpu-kubelet-plugin"
    assert spec["priorityClassName"] == "system-node-critical"
    assert [c["name"] for c in spec["containers"]] == ["gpus"]
    gpus = spec["containers"][0]
    assert gpus["image"] == settings["dra_driver_image"] and gpus["command"] == ["gpu-kubelet-plugin"]
    assert gpus["securityContext"] == {"privileged": True}
    env = {item["name"]: item.get("value") for item in gpus["env"]}
    assert env["CDI_ROOT"] == "/var/run/cdi" and env["NVIDIA_DRIVER_ROOT"] == "/"
    assert env["KUBELET_PLUGINS_DIRECTORY_PATH"] == "/var/lib/kubelet/plugins"
    assert env["KUBELET_REGISTRAR_DIRECTORY_PATH"] == "/var/lib/kubelet/plugins_registry"
    mounts = {m["name"]: m for m in gpus["volumeMounts"]}
    assert mounts["plugins"]["mountPropagation"] == "Bidirectional"
    assert {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]} == {
        "plugins-registry": "/var/lib/kubelet/plugins_registry", "plugins": "/var/lib/kubelet/plugins",
        "cdi": "/var/run/cdi", "driver-root-parent": "/", "driver-root": "/"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    rules = read_object(plane, "clusterrole", "scv-gpu-nvidia-dra-driver-gpu-kubelet-plugin")["rules"]
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
            "verbs": ["get", "list", "watch", "create", "update", "delete"]} in rules
    binding = read_object(plane, "clusterrolebinding", "scv-gpu-nvidia-dra-driver-gpu-kubelet-plugin")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "nvidia-dra-driver-gpu-kubelet-plugin",
                                    "namespace": namespace}]
    assert device_classes(plane) == {
        "gpu.nvidia.com": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                                "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}],
                           "extendedResourceName": "nvidia.com/gpu"},
        "mig.nvidia.com": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                                "device.attributes['gpu.nvidia.com'].type == 'mig'"}}]}}

    again = run_role(ansible, tmp_path, SCENARIO, settings)
    assert again.returncode == 0, again.stdout + again.stderr
    assert recap(again.stdout)["changed"] == 0, again.stdout

    # ComputeDomains and the vfio class on, then off again: what they add comes and goes with them. The
    # ComputeDomain API is served (a CRD of the tests' own, its group and version as NVIDIA's) while they are on.
    more = dict(settings, dra_driver_compute_domains=True, dra_driver_vfio_class=True)
    plane.kubectl("apply", "-f", "-", input_text=json.dumps(COMPUTE_DOMAIN_CRD))
    try:
        plane.kubectl("wait", "--for=condition=Established", "crd/%s" % COMPUTE_DOMAIN_CRD["metadata"]["name"])
        on = run_role(ansible, tmp_path, SCENARIO, more)
    finally:
        plane.kubectl("delete", "crd", COMPUTE_DOMAIN_CRD["metadata"]["name"], "--wait=true")
    assert on.returncode == 0, on.stdout + on.stderr
    objects = dra_objects(plane, namespace)
    assert objects["controller"]["spec"]["template"]["spec"]["containers"][0]["command"][0] == "compute-domain-controller"
    assert [c["name"] for c in objects["daemonset"]["spec"]["template"]["spec"]["containers"]] == [
        "gpus", "compute-domains"]
    assert set(device_classes(plane)) == {"gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com",
                                          "compute-domain-daemon.nvidia.com",
                                          "compute-domain-default-channel.nvidia.com"}
    assert run_role(ansible, tmp_path, SCENARIO, settings).returncode == 0
    assert dra_objects(plane, namespace)["controller"] is None
    assert set(device_classes(plane)) == {"gpu.nvidia.com", "mig.nvidia.com"}


def test_each_node_runs_one_stack_the_device_plugin_by_default(ansible, control_plane, host, tmp_path):
    plane = control_plane
    tag = suffix(ansible)
    namespace = "dra-excl-%s" % tag
    nodes = {"unset": "excl-unset-%s" % tag, "device-plugin": "excl-dp-%s" % tag, "dra": "excl-dra-%s" % tag}
    put_node(plane, nodes["unset"], dict(GPU_NODE))
    put_node(plane, nodes["device-plugin"], dict(GPU_NODE, **{"scv.gpu/gpu-stack": "device-plugin"}))
    put_node(plane, nodes["dra"], dict(GPU_NODE))
    done = run_role(ansible, tmp_path, SCENARIO, host.settings(plane, nodes["dra"], namespace, gpu_stack="dra"))
    assert done.returncode == 0, done.stdout + done.stderr
    plugin_play = tmp_path / "device-plugin.yml"
    plugin_play.write_text("- hosts: localhost\n  gather_facts: false\n  roles:\n    - role: scv.gpu.device_plugin\n")
    plugin = ansible.playbook(plugin_play, SCENARIO, "-e", json.dumps(
        {"device_plugin_kubeconfig": str(plane.admin_kubeconfig), "device_plugin_labels": False,
         "device_plugin_namespace": namespace}))
    assert plugin.returncode == 0, plugin.stdout + plugin.stderr

    device_plugin = read_object(plane, "daemonset", "nvidia-device-plugin-daemonset", namespace=namespace)
    dra = dra_objects(plane, namespace)["daemonset"]
    assert selected(plane, device_plugin, nodes.values()) == {nodes["unset"], nodes["device-plugin"]}
    assert selected(plane, dra, nodes.values()) == {nodes["dra"]}


IMPORT_CDI = 'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n  enable_cdi = %s\n'
REFUSALS = {
    "driver": ("a100_mig", {}, "the NVIDIA driver is 550.54.15 and NVIDIA's DRA driver needs 565 or newer"),
    "kubelet": (SCENARIO, {"kubelet": "v1.33.5"},
                "its kubelet is v1.33.5 and DRA through resource.k8s.io/v1 needs 1.34.2 or newer"),
    "cdi-off": (SCENARIO, {"containerd": 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "p"\n'},
                "does not enable CDI (io.containerd.grpc.v1.cri.enable_cdi); run scv.gpu.container_toolkit with "
                "container_toolkit_cdi: true"),
    "cdi-dirs": (SCENARIO, {"containerd": 'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n'
                                          '  cdi_spec_dirs = ["/etc/cdi"]\n'},
                 "sets cdi_spec_dirs to ['/etc/cdi'], without /var/run/cdi where the DRA driver writes"),
    "cdi-stale": (SCENARIO, {"toolkit": "1.19.1"}, "nvidia.yaml is missing or stale (the driver, toolkit or MIG layout "
                                                   "changed since it was generated)"),
    # containerd 2.x runs with its drop-ins merged over the main file: one of them turns CDI off
    "cdi-import": (SCENARIO, {"containerd": 'version = 3\nimports = ["conf.d/*.toml"]\n',
                              "imports": {"conf.d/10-site.toml": IMPORT_CDI % "true",
                                          "conf.d/99-off.toml": IMPORT_CDI % "false"}},
                   "{etc}/conf.d/99-off.toml (imported by {etc}/config.toml) turns CDI off "
                   "(io.containerd.cri.v1.runtime.enable_cdi = false), and containerd merges it over the main file"),
    # CRI-O reads its drop-ins after crio.conf, in name order: the last that sets cdi_spec_dirs leaves /var/run/cdi out
    "crio-dirs": (SCENARIO, {"crio": {"crio.conf": '[crio.runtime]\ncdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]\n',
                                      "crio.conf.d/10-site.conf": '[crio.runtime]\n'
                                                                  'cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]\n',
                                      "crio.conf.d/50-cdi.conf": '[crio.runtime]\ncdi_spec_dirs = ["/etc/cdi"]\n',
                                      "crio.conf.d/99-nvidia.toml": '[crio.runtime.runtimes.nvidia]\n'
                                                                    'runtime_path = "/usr/bin/nvidia-container-runtime"\n'}},
                  "{crio}/crio.conf.d/50-cdi.conf sets cdi_spec_dirs ([crio.runtime]) to ['/etc/cdi'], without "
                  "/var/run/cdi where the DRA driver writes its CDI specifications, and no later drop-in sets it"),
    "stack": (SCENARIO, {"labels": {"scv.gpu/gpu-stack": "device-plugin"}, "gpus": 4},
              "it runs the device-plugin stack and gpu_stack asks for dra; switching needs its GPU pods drained: "
              "run playbooks/gpu_stack.yml for it"),
    "running-plugin": (SCENARIO, {"gpus": 4}, "it runs the device-plugin stack (no scv.gpu/gpu-stack label)"),
    # this API server has no ComputeDomain CRD
    "compute-domains": (SCENARIO, {"settings": {"dra_driver_compute_domains": True}},
                        "dra_driver_compute_domains is true and the API server does not serve "
                        "resource.nvidia.com/v1beta1 ComputeDomain; install NVIDIA's ComputeDomain CRDs first"),
}


@pytest.fixture(scope="module")
def refused(ansible, control_plane, tmp_path_factory):
    """The role run once over one host per refusal, each its own Node: {refusal: (node, namespace, before)}
    and the run. The nodes' checks are independent, and any one refused stops the run before anything changes."""
    plane, cases, hosts = control_plane, {}, {}
    for refusal, (scenario, change, _message) in REFUSALS.items():
        node = "dra-refuse-%s-%s" % (refusal, suffix(ansible))
        host = DraHost(tmp_path_factory.mktemp(refusal))
        put_node(plane, node, dict(GPU_NODE, **change.get("labels", {})), kubelet=change.get("kubelet", "v1.37.1"),
                 gpus=change.get("gpus"))
        if "containerd" in change:
            host.containerd.write_text(change["containerd"])
        host.imports(change.get("imports", {}))
        host.crio_files(change.get("crio", {}))
        if "toolkit" in change:
            host.toolkit(change["toolkit"])
        else:
            host.generate_spec(scenario)
        runtime = "crio" if "crio" in change else "containerd"
        hosts[node] = (host.settings(plane, node, node, gpu_stack="dra", dra_driver_runtime=runtime,
                                     **change.get("settings", {})), host.environment(scenario))
        cases[refusal] = (node, host, node_object(plane, node))
    done = run_role_on_hosts(ansible, tmp_path_factory.mktemp("refused"), hosts)
    return cases, done


def failure(output, host):
    """The message of ``host``'s failed task in a run's output."""
    head = "fatal: [%s]: FAILED! => " % host
    assert head in output, output
    result, _end = json.JSONDecoder().raw_decode(output[output.index(head) + len(head):])
    return " ".join(result["msg"].split())


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_a_node_that_cannot_run_dra_is_refused_by_name_and_nothing_changes(control_plane, refused, refusal):
    plane = control_plane
    cases, done = refused
    node, host, before = cases[refusal]
    assert done.returncode != 0
    message = failure(done.stdout, node)
    expected = REFUSALS[refusal][2].format(etc=host.containerd.parent, crio=host.crio)
    assert "node %s: " % node in message and expected in message, message
    assert message.endswith("Nothing was changed."), message
    after = node_object(plane, node)
    assert after["metadata"]["labels"] == before["metadata"]["labels"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert plane.kubectl("get", "namespace", node, check=False).returncode != 0


def test_an_import_that_enables_cdi_lets_the_node_run_dra_in_check_mode_and_for_real(
        ansible, control_plane, host, tmp_path):
    """containerd 1.7 keeps CDI off unless enable_cdi says so: here only an import (its own import, found
    through a glob) says so, and the main file alone would be refused."""
    plane = control_plane
    node, namespace = "dra-cdi-import-%s" % suffix(ansible), "dra-cdi-import-%s" % suffix(ansible)
    put_node(plane, node, dict(GPU_NODE))
    host.containerd.write_text('version = 2\nimports = ["conf.d/*.toml"]\n[plugins."io.containerd.grpc.v1.cri"]\n'
                               '  sandbox_image = "registry.example.com/pause:3.10"\n')
    host.imports({"conf.d/50-nvidia.toml": 'version = 2\nimports = ["../cdi/cdi.toml"]\n',
                  "cdi/cdi.toml": 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n'
                                  '  sandbox_image = "registry.example.com/pause:3.10"\n  enable_cdi = true\n'})
    settings = host.settings(plane, node, namespace, gpu_stack="dra")

    checked = run_role(ansible, tmp_path, SCENARIO, settings, "--check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "scv.gpu/gpu-stack" not in node_object(plane, node)["metadata"]["labels"]
    done = run_role(ansible, tmp_path, SCENARIO, settings)
    assert done.returncode == 0, done.stdout + done.stderr
    assert node_object(plane, node)["metadata"]["labels"]["scv.gpu/gpu-stack"] == "dra"


@pytest.fixture(scope="module")
def plane_without_v1(tmp_path_factory):
    """A second API server that does not serve resource.k8s.io/v1 (as a cluster older than 1.34)."""
    plane = ControlPlane(tmp_path_factory.mktemp("no-resource-v1") / "plane",
                         apiserver_args=["--runtime-config=resource.k8s.io/v1=false"], ready_excludes=["informer-sync"])
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()


def stale_discovery(ansible, served, plane, folder):
    """kubernetes.core's discovery cache in ``folder`` for ``plane``'s address, holding what ``served`` serves
    of resource.k8s.io/v1: as another API server at the same address leaves it."""
    def cache(kubeconfig, query):
        before = set(folder.iterdir())
        done, result = ansible.module(dict(query, kubeconfig=str(kubeconfig)), name="kubernetes.core.k8s_info",
                                      simulator=False)
        assert done, result
        (made,) = set(folder.iterdir()) - before
        return made
    full = cache(served.admin_kubeconfig, {"api_version": "resource.k8s.io/v1", "kind": "DeviceClass"})
    assert "DeviceClass" in full.read_text()
    cache(plane.admin_kubeconfig, {"kind": "Namespace", "name": "default"}).write_bytes(full.read_bytes())


def test_an_api_server_without_resource_v1_is_refused(ansible, control_plane, plane_without_v1, host, tmp_path,
                                                      monkeypatch):
    plane = plane_without_v1
    node, namespace = "dra-old-api", "dra-old-api"
    put_node(plane, node, dict(GPU_NODE))
    # the check asks the server itself, not a discovery cache that says the API is served
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    stale_discovery(ansible, control_plane, plane, tmp_path / "tmp")
    done = run_role(ansible, tmp_path, SCENARIO, host.settings(plane, node, namespace, gpu_stack="dra"))
    assert done.returncode != 0
    output = " ".join((done.stdout + done.stderr).split())
    assert "node %s: the API server does not serve resource.k8s.io/v1 (DeviceClass)" % node in output, output
    assert "scv.gpu/gpu-stack" not in node_object(plane, node)["metadata"]["labels"]
    assert plane.kubectl("get", "namespace", namespace, check=False).returncode != 0


def test_drift_covers_the_dra_stack(ansible, control_plane, host, tmp_path):
    plane = control_plane
    node, namespace = "dra-drift-%s" % suffix(ansible), "dra-drift-%s" % suffix(ansible)
    put_node(plane, node, dict(GPU_NODE))
    settings = host.settings(plane, node, namespace, gpu_stack="dra")
    assert run_role(ansible, tmp_path, SCENARIO, settings).returncode == 0
    drift = dict(settings, scv_gpu_hosts="localhost", k8s_node_name=node,
                 scv_gpu_kubeconfig=str(plane.admin_kubeconfig))

    def drift_run():
        return ansible.playbook("playbooks/drift.yml", SCENARIO, "--check", "--diff", "--tags", "dra",
                                "-e", json.dumps(drift))

    clean = drift_run()
    assert clean.returncode == 0 and '"msg": "no drift"' in clean.stdout, clean.stdout + clean.stderr

    plane.kubectl("delete", "deviceclass", "mig.nvidia.com")
    plane.kubectl("label", "node", node, "scv.gpu/gpu-stack-")
    drifted = drift_run()
    assert drifted.returncode == 2, drifted.stdout + drifted.stderr
    assert ("localhost has drifted from the desired state: dra: the node has no scv.gpu/gpu-stack label (it runs "
            "the device plugin); dra: NVIDIA's DRA driver's objects (kubelet plugin, RBAC, DeviceClasses) differ "
            "from the role's") in drifted.stdout, drifted.stdout
    assert plane.kubectl("get", "deviceclass", "mig.nvidia.com", check=False).returncode != 0    # check mode only
