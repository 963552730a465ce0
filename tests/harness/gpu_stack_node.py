"""The GPU plugins of a real test node, run where the DaemonSet controller places their pods.

On a real GPU node the collection's two stacks are DaemonSets: NVIDIA's device plugin (``scv.gpu.device_plugin``)
and NVIDIA's DRA kubelet plugin (``scv.gpu.dra_driver``), each selecting nodes by the ``scv.gpu/gpu-stack`` label.
Their images cannot run here, so their pods never start (the DRA plugin's image is absent and pulled Never; the
device plugin's pod runs the tests' idle image). ``StackFollower`` stands in for the processes those pods would
run: while a pod of the device plugin's DaemonSet is bound to the node, a ``DevicePlugin`` offers the scenario's
GPUs as ``nvidia.com/gpu``; while a pod of the DRA plugin's DaemonSet is, a ``DraPlugin`` publishes the scenario's
ResourceSlices and prepares claims. Which plugin runs is therefore decided by the real kube-controller-manager's
DaemonSet controller, the real kube-scheduler and the node's labels, as on a real node; a pod being deleted counts
as gone, as its container would be stopped.
"""

from __future__ import annotations

import json
import threading

from harness.dra_plugin import DraPlugin
from harness.paths import scenario_uuids
from harness.real_kubelet import DevicePlugin

DEVICE_PLUGIN_DAEMONSET = "nvidia-device-plugin-daemonset"
DRA_DAEMONSET = "nvidia-dra-driver-gpu-kubelet-plugin"
GPU_RESOURCE = "nvidia.com/gpu"


class StackFollower:
    """Runs the node's device plugin or DRA plugin as the DaemonSets' pods on ``kubelet``'s node come and go.

    ``dra`` is the running DraPlugin (None while none runs), ``device_plugin`` the running DevicePlugin;
    ``seen`` records, for each plugin started, the Node as it was when its pod was found: (plugin, Node object);
    ``stopped``, for each plugin stopped, the Node and the names of the other pods on it when its pod went:
    (plugin, Node object, [pod names]).
    """

    def __init__(self, plane, kubelet, work, scenario, cdi_dir, interval=1.0):
        self.plane, self.kubelet, self.work, self.scenario, self.cdi_dir = plane, kubelet, work, scenario, cdi_dir
        self.interval = interval
        self.dra = self.device_plugin = None
        self.seen, self.stopped, self.errors = [], [], []
        self._stopping = threading.Event()
        self._thread = None

    def start(self):
        self._stopping.clear()
        self._thread = threading.Thread(target=self._follow, name="stack-follower", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stopping.set()
        if self._thread:
            self._thread.join(timeout=60)
        self._stop_dra()
        self._stop_device_plugin()

    def _follow(self):
        while not self._stopping.is_set():
            try:
                self.sync()
            except Exception as error:  # pylint: disable=broad-except  # kept for the test to show
                self.errors.append(repr(error))
            self._stopping.wait(self.interval)

    def _pods(self):
        done = self.plane.kubectl("get", "pods", "--all-namespaces", "-o", "json", "--field-selector",
                                  "spec.nodeName=%s" % self.kubelet.node)
        return json.loads(done.stdout)["items"]

    @staticmethod
    def _daemonset(pod):
        return next((owner["name"] for owner in pod["metadata"].get("ownerReferences") or ()
                     if owner.get("kind") == "DaemonSet"), None)

    def placed(self, pods=None):
        """The names of the DaemonSets with a live pod (not being deleted) bound to the node."""
        return {self._daemonset(pod) for pod in (self._pods() if pods is None else pods)
                if self._daemonset(pod) and not pod["metadata"].get("deletionTimestamp")}

    def sync(self):
        """Starts or stops each plugin as its DaemonSet's pod is on the node or not."""
        pods = self._pods()
        owners = self.placed(pods)
        # the pods that are not a plugin's, even those being deleted: they hold GPUs until they are gone
        workloads = sorted(pod["metadata"]["name"] for pod in pods if not self._daemonset(pod))
        if DEVICE_PLUGIN_DAEMONSET not in owners and self.device_plugin is not None:
            self.stopped.append(("device-plugin", self._node(), workloads))
            self._stop_device_plugin()
        if DRA_DAEMONSET not in owners and self.dra is not None:
            self.stopped.append(("dra", self._node(), workloads))
            self._stop_dra()
        if DEVICE_PLUGIN_DAEMONSET in owners and self.device_plugin is None:
            self.seen.append(("device-plugin", self._node()))
            self.device_plugin = DevicePlugin(self.work, GPU_RESOURCE, scenario_uuids(self.scenario)).start()
        if DRA_DAEMONSET in owners and self.dra is None:
            self.seen.append(("dra", self._node()))
            plugin = DraPlugin(self.plane, self.kubelet, self.work, self.scenario, self.cdi_dir)
            self.dra = plugin.start()

    def _node(self):
        return json.loads(self.plane.kubectl("get", "node", self.kubelet.node, "-o", "json").stdout)

    def _stop_dra(self):
        plugin, self.dra = self.dra, None
        if plugin:
            plugin.stop()

    def _stop_device_plugin(self):
        plugin, self.device_plugin = self.device_plugin, None
        if plugin:
            plugin.stop()
