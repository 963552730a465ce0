"""A DRA kubelet plugin of the tests' own for the driver ``gpu.nvidia.com``, on a real kubelet.

NVIDIA's plugin cannot be built where the tests run, so this one stands in for it, speaking the kubelet's
published protobufs (generated as ``kubelet_podresources.generate`` generates the pod-resources one):

- registration (``pkg/apis/pluginregistration/v1``): a socket ``gpu.nvidia.com-reg.sock`` in the kubelet's
  ``plugins_registry`` folder answers GetInfo with type ``DRAPlugin``, the driver's name, the DRA socket and the
  gRPC services served (``v1.DRAPlugin``), and hears NotifyRegistrationStatus;
- the DRA service (``pkg/apis/dra/v1``) on ``plugins/gpu.nvidia.com/dra.sock``: NodePrepareResources reads each
  claim's allocation, writes a CDI spec for the claim's devices of this driver into containerd's CDI
  folder and answers their CDI device IDs; NodeUnprepareResources removes that spec. A device's container edits
  are ``NVIDIA_VISIBLE_DEVICES=<uuid>`` and ``SCV_TEST_DRA_CLAIM=<claim uid>``, proof that preparation reached
  the container, and a device node ``/dev/nvidia<minor>`` made from the host's ``/dev/null``. Given the node's
  CDI spec as NVIDIA's ``nvidia-ctk cdi generate`` wrote it (``node_spec``), a device's edits are instead what
  NVIDIA's driver gives a claim: that GPU's edits from the spec (its device node, its hooks) and the spec's common
  ones (control nodes, the driver's libraries, the CDI hook's hooks, ``NVIDIA_VISIBLE_DEVICES=void``), with
  ``SCV_TEST_DRA_CLAIM``. NVIDIA's driver keeps the common edits in a spec of their own; one spec serves here;
- the ResourceSlices NVIDIA's plugin published for a scenario (``tests/fixtures/dra/<scenario>.json``), renamed
  to the node (pool = node name) and published with the node's own credentials, once the kubelet has registered
  the plugin (the kubelet deletes the node's slices of drivers not registered).
"""

from __future__ import annotations

import copy
import json
import pathlib
import threading
from concurrent import futures

from harness.common import wait_until
from harness.control_plane import read_object
from harness.kubelet_podresources import generate
from harness.paths import ROOT

DRIVER = "gpu.nvidia.com"
DRA_PROTO = "pkg/apis/dra/v1/api.proto"
REGISTRATION_PROTO = "pkg/apis/pluginregistration/v1/api.proto"
DRA_SERVICE = "v1.DRAPlugin"        # k8s.io/kubelet/pkg/apis/dra/v1.DRAPluginService
CDI_KIND = "k8s.gpu.nvidia.com/claim"
FIXTURES = ROOT / "tests" / "fixtures" / "dra"


def node_slices(scenario, node, node_uid, edit=None):
    """The ResourceSlices recorded for ``scenario``, made the node's: its name, pool and owner. ``edit``, if
    given, is called with each device (a dict) and may change it: how a test makes the plugin lie."""
    path = FIXTURES / ("%s.json" % scenario)
    recorded = json.loads(path.read_text())
    slices = []
    for index, recorded_slice in enumerate(recorded.get("resourceSlices") or ()):
        body = copy.deepcopy(recorded_slice)
        body["metadata"] = {
            "name": "%s-%s-%d" % (node, DRIVER, index),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                 "controller": True}]}
        body["spec"]["nodeName"] = node
        body["spec"]["pool"]["name"] = node
        for device in body["spec"].get("devices", ()):
            if edit:
                edit(device)
        slices.append(body)
    assert slices, "%s records no ResourceSlice (the plugin refused to start there)" % path
    return slices


def _uuid_and_minor(device):
    """(uuid, minor) of a published whole GPU (device ``gpu-<minor>``), from its attributes and name."""
    return device["attributes"]["uuid"]["string"], int(device["name"].split("-")[1])


class DraPlugin:
    """The plugin for ``kubelet`` (a harness.real_kubelet.Kubelet), publishing ``scenario``'s devices.

    ``prepared``: {claim uid: [device names]} of the claims prepared and not unprepared since; ``calls``: each
    call as ("prepare" | "unprepare", claim uid); ``registered``: set once the kubelet reported registration.
    """

    def __init__(self, plane, kubelet, work, scenario, cdi_dir, edit=None, node_spec=None):
        import grpc

        self.plane, self.kubelet, self.scenario, self.edit = plane, kubelet, scenario, edit
        self.node_spec = node_spec
        self.work, self.cdi_dir = pathlib.Path(work), pathlib.Path(cdi_dir)
        self.dra = generate(self.work / "dra-proto", DRA_PROTO, "draplugin")
        self.registration = generate(self.work / "registration-proto", REGISTRATION_PROTO, "pluginregistration")
        self.socket = kubelet.root / "plugins" / DRIVER / "dra.sock"
        self.registration_socket = kubelet.root / "plugins_registry" / ("%s-reg.sock" % DRIVER)
        self.prepared, self.calls, self.statuses = {}, [], []
        self.registered = threading.Event()
        self.devices = {}      # device name: its published dict
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dra_pb2_grpc = self.dra[1]
        registration_pb2_grpc = self.registration[1]
        dra = type("Plugin", (dra_pb2_grpc.DRAPluginServicer,), {
            "NodePrepareResources": self._prepare, "NodeUnprepareResources": self._unprepare})()
        dra_pb2_grpc.add_DRAPluginServicer_to_server(dra, self.server)
        registrar = type("Registrar", (registration_pb2_grpc.RegistrationServicer,), {
            "GetInfo": self._info, "NotifyRegistrationStatus": self._notified})()
        registration_pb2_grpc.add_RegistrationServicer_to_server(registrar, self.server)

    def start(self, timeout=60):
        """Serves both sockets, waits for the kubelet to register the plugin, then publishes the slices."""
        for socket in (self.socket, self.registration_socket):
            socket.parent.mkdir(parents=True, exist_ok=True)
            socket.unlink(missing_ok=True)
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        self.server.add_insecure_port("unix:%s" % self.socket)
        self.server.add_insecure_port("unix:%s" % self.registration_socket)
        self.server.start()
        wait_until(self.registered.is_set, timeout, "the kubelet to register DRA plugin %s (statuses %s; see %s)" % (
            DRIVER, self.statuses, self.kubelet.log), 0.2)
        self.publish()
        return self

    def publish(self):
        """Creates (or replaces) the node's ResourceSlices, as the node."""
        node_uid = read_object(self.plane, "node", self.kubelet.node)["metadata"]["uid"]
        slices = node_slices(self.scenario, self.kubelet.node, node_uid, self.edit)
        self.devices = {device["name"]: device for body in slices for device in body["spec"].get("devices", ())}
        self.unpublish()
        for body in slices:
            self.plane.kubectl("create", "-f", "-", kubeconfig=self.plane.node_kubeconfig(self.kubelet.node),
                               input_text=json.dumps(body))

    def unpublish(self):
        """Deletes the node's slices of this driver, as the node."""
        for name in self.published():
            self.plane.kubectl("delete", "resourceslice", name, "--ignore-not-found",
                               kubeconfig=self.plane.node_kubeconfig(self.kubelet.node))

    def published(self):
        """The names of the ResourceSlices of this driver on the node, as the API server has them."""
        done = self.plane.kubectl("get", "resourceslices", "-o", "json", "--field-selector",
                                  "spec.nodeName=%s,spec.driver=%s" % (self.kubelet.node, DRIVER))
        return [item["metadata"]["name"] for item in json.loads(done.stdout)["items"]]

    def stop(self):
        """Takes the node's slices off the API server, then stops serving."""
        self.unpublish()
        self.server.stop(0).wait()
        for socket in (self.socket, self.registration_socket):
            # gRPC unlinks its own Unix sockets as it shuts down, and may do so after a check of ours.
            socket.unlink(missing_ok=True)

    def cdi_spec(self, claim_uid):
        return self.cdi_dir / ("scv-test-%s.json" % claim_uid)

    # ------------------------------------------------------------ registration

    def _info(self, _request, _context):
        pb2 = self.registration[0]
        return pb2.PluginInfo(type="DRAPlugin", name=DRIVER, endpoint=str(self.socket),
                              supported_versions=[DRA_SERVICE])

    def _notified(self, request, _context):
        self.statuses.append((request.plugin_registered, request.error))
        if request.plugin_registered:
            self.registered.set()
        return self.registration[0].RegistrationStatusResponse()

    # ---------------------------------------------------------------------- DRA

    def _prepare(self, request, _context):
        pb2 = self.dra[0]
        answer = pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            with self._lock:
                self.calls.append(("prepare", claim.uid))
            try:
                devices = self._prepare_claim(claim)
            except Exception as error:  # pylint: disable=broad-except  # the kubelet shows it on the pod
                answer.claims[claim.uid].CopyFrom(pb2.NodePrepareResourceResponse(error=str(error)))
                continue
            answer.claims[claim.uid].CopyFrom(pb2.NodePrepareResourceResponse(devices=devices))
        return answer

    def _prepare_claim(self, claim):
        """Writes the claim's CDI spec; returns its Device messages."""
        pb2 = self.dra[0]
        body = read_object(self.plane, "resourceclaim", claim.name, namespace=claim.namespace)
        assert body["metadata"]["uid"] == claim.uid, "claim %s/%s is another one now" % (claim.namespace, claim.name)
        results = [result for result in body["status"]["allocation"]["devices"]["results"]
                   if result["driver"] == DRIVER]
        answered, cdi_devices = [], []
        for result in results:
            assert result["pool"] == self.kubelet.node, \
                "claim %s: pool %s is not this node's" % (claim.name, result["pool"])
            uuid, minor = _uuid_and_minor(self.devices[result["device"]])
            cdi_name = "%s-%s" % (claim.uid, result["device"])
            cdi_devices.append({"name": cdi_name, "containerEdits": self._edits(uuid, minor, claim.uid)})
            answered.append(pb2.Device(request_names=[result["request"]], pool_name=result["pool"],
                                       device_name=result["device"], cdi_device_ids=["%s=%s" % (CDI_KIND, cdi_name)]))
        spec = self.cdi_spec(claim.uid)
        staged = spec.with_suffix(".new")
        version = self.node_spec["cdiVersion"] if self.node_spec else "0.6.0"     # the edits' own version
        staged.write_text(json.dumps({"cdiVersion": version, "kind": CDI_KIND, "devices": cdi_devices}))
        staged.rename(spec)
        with self._lock:
            self.prepared[claim.uid] = [result["device"] for result in results]
        return answered

    def _edits(self, uuid, minor, claim_uid):
        """The container edits of GPU ``uuid`` (``/dev/nvidia<minor>``) for claim ``claim_uid``."""
        if self.node_spec is None:
            return {"env": ["NVIDIA_VISIBLE_DEVICES=%s" % uuid, "SCV_TEST_DRA_CLAIM=%s" % claim_uid],
                    "deviceNodes": [{"path": "/dev/nvidia%d" % minor, "hostPath": "/dev/null"}]}
        (device,) = [item for item in self.node_spec["devices"] if item["name"] == uuid]
        edits = {}
        for part in (self.node_spec.get("containerEdits", {}), device["containerEdits"],
                     {"env": ["SCV_TEST_DRA_CLAIM=%s" % claim_uid]}):
            for key, values in part.items():
                edits.setdefault(key, []).extend(values)
        return edits

    def _unprepare(self, request, _context):
        pb2 = self.dra[0]
        answer = pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            with self._lock:
                self.calls.append(("unprepare", claim.uid))
                self.prepared.pop(claim.uid, None)
            spec = self.cdi_spec(claim.uid)
            if spec.exists():
                spec.unlink()
            answer.claims[claim.uid].CopyFrom(pb2.NodeUnprepareResourceResponse())
        return answer
