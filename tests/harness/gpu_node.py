"""A GPU node as the roles' defaults leave it, on a real kubelet: for the container tests and ``make demo-pod``.

- containerd 2 (tools/containerd/build) with runc, and NVIDIA's own nvidia-container-runtime, nvidia-ctk and CDI
  hook built from the Go module proxy (harness.nvidia_toolkit).
- The container_toolkit role's own tasks, with their defaults, configure containerd's config.toml (the nvidia
  runtime, nvidia the default, CDI on) and NVIDIA's config.toml (isolation, cdi mode). The host's own settings,
  made before the role runs, are kept: the CDI folder and runc underneath.
- Or CRI-O instead of containerd (harness.crio, built from the Go module proxy): the role's crio.yml writes its
  runtime drop-in (the nvidia runtime, nvidia the default) into the node's crio.conf.d.
- The CDI specification is what NVIDIA's ``nvidia-ctk cdi generate`` writes for the scenario's GPUs from a driver
  root of the node's own; inside a container, NVML answers for the GPUs whose device nodes it was given.
- The real kube-scheduler and kube-controller-manager's DaemonSet, ResourceClaim and ServiceAccount controllers
  run; the device_plugin role applies its RuntimeClass and NVIDIA's device plugin DaemonSet as it renders them,
  only the image replaced (harness.gpu_images). ``dra_plugin`` gives the node the tests' DRA kubelet plugin
  (harness.dra_plugin), which prepares a claim's GPU with the edits of the node's CDI spec.

What kube-controller-manager would make and these controllers do not (the kube-root-ca.crt ConfigMap the
plugin's token volume reads), and the plugin namespace's default ServiceAccount, needed before the controller
manager starts, are made by hand.
"""

from __future__ import annotations

import json
import pathlib

from harness.ansible import recap
from harness.common import wait_until
from harness.containerd import containerd2
from harness.control_plane import read_object
from harness.controller_manager import ControllerManager
from harness.crio import CriO
from harness.dra_plugin import DRIVER, DraPlugin
from harness.gpu_images import DEVICE_PLUGIN_IMAGE, GPUS_IMAGE, container_log, gpu_images
from harness.nvidia_toolkit import CONTROL_NODES, DriverRoot, host_config, seen, toolkit, toolkit_tasks_play
from harness.paths import scenario_path
from harness.real_kubelet import Containerd, Kubelet, running_node
from harness.scheduler import Scheduler

PLUGIN_NAMESPACE = "gpu-pods-plugin"
TOOLKIT_PLAY = toolkit_tasks_play("containerd.yml", "runtime-config.yml")
CRIO_TOOLKIT_PLAY = toolkit_tasks_play("crio.yml", "runtime-config.yml")
CRIO = "cri-o"      # GpuNode(containerd=CRIO): the node runs CRI-O instead of containerd
PLUGIN_PLAY = "- hosts: localhost\n  gather_facts: false\n  roles:\n    - role: scv.gpu.device_plugin\n"


class GpuNode:
    """Node ``name`` with ``scenario``'s GPUs in ``work``, joined to ``plane``; ``ansible``: a harness.ansible.Ansible;
    ``containerd``: its binary (containerd 2 by default), or CRIO for CRI-O (harness.crio) instead.
    ``running(namespace)`` is the context in which its plugin serves and pods of ``namespace`` run."""

    def __init__(self, plane, ansible, work, name, scenario="h100_sxm_x8", containerd=None):
        self.plane, self.ansible, self.name = plane, ansible, name
        self.work = pathlib.Path(work)
        self.bin_dir = toolkit()
        self.root = DriverRoot(self.work / "driver-root", scenario_path(scenario))
        spec_dir = self.spec_dir = self.work / "cdi"
        self.scenario = scenario
        self.spec = self.root.generate(spec_dir / "nvidia.yaml", self.bin_dir)
        self.runtime_config = host_config(self.bin_dir, self.work / "nvidia-container-runtime.toml", spec_dir)
        environment = {"NVIDIA_CTK_CONFIG_FILE_PATH": str(self.runtime_config)}
        if containerd == CRIO:
            self.containerd = CriO(self.work, [spec_dir], gpu_images(self.work / "images"), environment,
                                   pod_network=True)
        else:
            # containerd 2 unless told otherwise (debian_containerd(): Debian 12's 1.6, which has no CDI of its own)
            self.containerd = Containerd(self.work, containerd or containerd2(), [spec_dir],
                                         gpu_images(self.work / "images"), environment, pod_network=True)
        self._configure()
        self.kubelet = Kubelet(plane, self.work, name, self.containerd)

    def _play(self, text, variables):
        play = self.work / ("play-%d.yml" % len(list(self.work.glob("play-*.yml"))))
        play.write_text(text)
        done = self.ansible.playbook(play, None, "-e", json.dumps(variables))
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def _configure(self):
        """The container_toolkit role's tasks for containerd (or CRI-O) and NVIDIA's runtime, with the role's
        defaults."""
        crio = isinstance(self.containerd, CriO)
        done = self._play(CRIO_TOOLKIT_PLAY if crio else TOOLKIT_PLAY, {
            "container_toolkit_crio_dropin" if crio else "container_toolkit_containerd_config":
                str(self.containerd.config),
            "container_toolkit_nvidia_config": str(self.runtime_config),
            "container_toolkit_runtime_path": str(self.bin_dir / "nvidia-container-runtime"),
            "container_toolkit_restart_runtime": False})
        assert recap(done.stdout)["changed"] == 2, done.stdout

    def plugin_output(self):
        return "\n".join(line for log in self.kubelet.pod_logs.glob("%s_*/*/*.log" % PLUGIN_NAMESPACE)
                         for line in log.read_text().splitlines())

    def running(self, namespace):
        parts = [self.containerd, self.kubelet, Scheduler(self.plane, self.work / "scheduler"),
                 ControllerManager(self.plane, self.work / "controller-manager",
                                   ["daemonset-controller", "resourceclaim-controller", "serviceaccount-controller"])]
        self.plane.kubectl("create", "namespace", PLUGIN_NAMESPACE, check=False)
        self.plane.kubectl("create", "serviceaccount", "default", "-n", PLUGIN_NAMESPACE, check=False)
        self.plane.kubectl("create", "configmap", "kube-root-ca.crt", "-n", PLUGIN_NAMESPACE,
                           "--from-file=ca.crt=%s" % self.plane.state["ca"], check=False)
        return _Running(self, running_node(self.plane, self.name, namespace, parts))

    def deploy_device_plugin(self, variables=None, allocatable=None):
        """The device_plugin role for this node, with more ``variables``, then ``allocatable`` ({resource: count};
        every GPU as nvidia.com/gpu by default) offered through the plugin's pod."""
        self.plane.kubectl("label", "node", self.name, "gpu/nvidia=%s" % "NVIDIA-GPU", "--overwrite")
        self._play(PLUGIN_PLAY, dict({
            "device_plugin_kubeconfig": str(self.plane.admin_kubeconfig), "device_plugin_node_name": self.name,
            "device_plugin_namespace": PLUGIN_NAMESPACE, "device_plugin_labels": False,
            "device_plugin_nvidia_image": DEVICE_PLUGIN_IMAGE}, **(variables or {})))
        allocatable = allocatable or {"nvidia.com/gpu": len(self.root.uuids)}
        wait_until(lambda: all(self.kubelet.allocatable(name) == str(count) for name, count in allocatable.items()),
                   120, "%s allocatable from the plugin's pod (kubelet log %s)" % (allocatable, self.kubelet.log), 0.5,
                   log=lambda: "the plugin's output:\n%s" % self.plugin_output())

    def remove_device_plugin(self):
        self.plane.kubectl("delete", "daemonset", "nvidia-device-plugin-daemonset", "-n", PLUGIN_NAMESPACE,
                           "--ignore-not-found", check=False)
        self.plane.kubectl("delete", "pods", "--all", "-n", PLUGIN_NAMESPACE, "--grace-period", "1",
                           "--timeout", "60s", check=False)

    def dra_plugin(self):
        """The tests' DRA kubelet plugin for this node (harness.dra_plugin), publishing what NVIDIA's driver
        publishes for the scenario and preparing a claim's GPU with the edits of the node's CDI spec; its
        DeviceClass ``gpu.nvidia.com`` applied. Start it once the kubelet runs; stop it to take its slices off."""
        self.plane.kubectl("apply", "-f", "-", input_text=json.dumps({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == '%s'" % DRIVER}}]}}))
        return DraPlugin(self.plane, self.kubelet, self.work / "dra", self.scenario, self.spec_dir,
                         node_spec=self.spec)

    def pod(self, namespace, name, containers, runtime_class=None, claim=None):
        """A pod on this node of GPUS_IMAGE containers: [(name, GPUs asked for, extra environment)], where the
        GPUs are a count of nvidia.com/gpu or {resource: count}; with ResourceClaim ``claim``, a container that asks
        for the GPUs ``"claim"`` uses it."""
        def resources(gpus):
            if gpus == "claim":
                return {"claims": [{"name": "gpu"}]}
            if isinstance(gpus, dict):
                return {"limits": {name: str(count) for name, count in gpus.items()}}
            return {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}

        spec = {"hostNetwork": False, "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                "tolerations": [{"operator": "Exists"}], "nodeSelector": {"kubernetes.io/hostname": self.name},
                "containers": [{"name": container, "image": GPUS_IMAGE, "imagePullPolicy": "Never",
                                "env": [{"name": key, "value": value} for key, value in env.items()],
                                "resources": resources(gpus)}
                               for container, gpus, env in containers]}
        if runtime_class:
            spec["runtimeClassName"] = runtime_class
        if claim:
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}

    def run_pod(self, manifest, keep=False):
        """{container: its output lines} of ``manifest`` once it runs and each container has printed; the pod is
        deleted afterwards unless ``keep``."""
        name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
        self.plane.kubectl("create", "-f", "-", input_text=json.dumps(manifest))
        try:
            def running():
                found = read_object(self.plane, "pod", name, namespace=namespace, missing_ok=True)
                return found and found["status"].get("phase") == "Running"

            wait_until(running, 90, "pod %s Running (kubelet log %s)" % (name, self.kubelet.log), 0.5)
            output = {}
            for container in manifest["spec"]["containers"]:
                wait_until(lambda c=container["name"]: container_log(self.kubelet, namespace, name, c), 30,
                           "the output of %s/%s" % (name, container["name"]), 0.2)
                output[container["name"]] = container_log(self.kubelet, namespace, name, container["name"])
            return output
        finally:
            if not keep:
                self.plane.kubectl("delete", "pod", name, "-n", namespace, "--grace-period", "1", "--timeout", "60s",
                                   check=False)

    def views(self, manifest):
        """{container: (device nodes, NVML's UUIDs)} that ``manifest``'s containers see."""
        return {container: seen(lines) for container, lines in self.run_pod(manifest).items()}

    def only_gpu(self, view):
        """The minor of the one GPU a container's ``view`` (views' value) holds: asserts that it sees exactly one
        GPU's device node beside the control nodes, and NVML names that GPU alone."""
        devices, uuids = view
        gpus = sorted(device for device in devices if device not in CONTROL_NODES)
        assert len(gpus) == 1 and devices == set(gpus) | CONTROL_NODES, view
        minor = int(gpus[0][len("nvidia"):])
        assert uuids == [self.root.uuids[minor]], view
        return minor


class _Running:
    def __init__(self, node, context):
        self.node, self.context = node, context

    def __enter__(self):
        self.context.__enter__()
        return self.node

    def __exit__(self, *exc):
        try:
            self.node.remove_device_plugin()
        finally:
            suppressed = self.context.__exit__(*exc)
        return suppressed


def sharing_labels(replicas, gpus):
    """kubectl label arguments for the labels scv.gpu.node_labels gives a node whose plugin config shares each of
    its ``gpus`` GPUs ``replicas`` ways (the harness deploys the plugin with device_plugin_labels false)."""
    return ["nvidia.com/gpu.replicas=%d" % replicas, "nvidia.com/gpu.count=%d" % gpus]
