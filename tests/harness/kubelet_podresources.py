"""A stand-in for the kubelet's pod-resources API: the real protobuf and gRPC, on a temporary unix socket.

The Python code is generated with grpcio-tools from ``pkg/apis/podresources/v1/api.proto`` (and, for the
test device plugin of ``real_kubelet``, ``pkg/apis/deviceplugin/v1beta1/api.proto``) of the
``k8s.io/kubelet`` Go module, at the version the test control plane is built from (tools/control-plane/go.mod),
taken from Go's module cache, or from the Go module proxy the first time. Nothing of the kubelet is
kept in this repository.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import shutil
import subprocess
import sys
import threading
from concurrent import futures

from harness.common import wait_until
from harness.paths import ROOT

CONTROL_PLANE = ROOT / "tools" / "control-plane"


def _go():
    for candidate in (shutil.which("go"), "/usr/local/go/bin/go", os.path.expanduser("~/go/bin/go"),
                      "/usr/lib/go/bin/go"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise AssertionError("Go is needed to fetch the kubelet's api.proto (the control plane needs it too)")


def kubelet_version():
    for line in (CONTROL_PLANE / "go.mod").read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["k8s.io/kubelet"] and len(parts) >= 2:
            return parts[1]
        if parts[:2] == ["k8s.io/kubelet", "=>"]:
            return parts[-1]
    raise AssertionError("tools/control-plane/go.mod names no k8s.io/kubelet version")


PODRESOURCES = "pkg/apis/podresources/v1/api.proto"
DEVICEPLUGIN = "pkg/apis/deviceplugin/v1beta1/api.proto"


def api_proto(relative=PODRESOURCES):
    """The path of one of the kubelet's published protos (the pod-resources v1 API unless told)."""
    import json

    done = subprocess.run([_go(), "mod", "download", "-json", "k8s.io/kubelet@%s" % kubelet_version()],
                          cwd=str(CONTROL_PLANE), capture_output=True, text=True, check=False, timeout=300,
                          env=dict(os.environ, GOFLAGS="-mod=mod"))
    assert done.returncode == 0, "go mod download k8s.io/kubelet failed:\n%s%s" % (done.stdout, done.stderr)
    proto = pathlib.Path(json.loads(done.stdout)["Dir"]) / relative
    assert proto.is_file(), "no %s" % proto
    return proto


def generate(work, relative=PODRESOURCES, stem="podresources"):
    """(STEM_pb2, STEM_pb2_grpc) generated from the kubelet's proto ``relative`` into ``work``."""
    from grpc_tools import protoc

    proto = api_proto(relative)
    work = pathlib.Path(work)
    include = work / "proto"
    include.mkdir(parents=True, exist_ok=True)
    shutil.copy(proto, include / ("%s.proto" % stem))
    out = work / "generated"
    out.mkdir(exist_ok=True)
    import grpc_tools
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    status = protoc.main(["protoc", "-I%s" % include, "-I%s" % well_known, "--python_out=%s" % out,
                          "--grpc_python_out=%s" % out, str(include / ("%s.proto" % stem))])
    assert status == 0, "protoc failed on %s" % proto
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("%s_pb2" % stem), importlib.import_module("%s_pb2_grpc" % stem)
    finally:
        sys.path.remove(str(out))


class StandInKubelet:
    """Serves ``v1.PodResourcesLister`` on ``socket``; ``pods`` is what List answers, changeable at any time.

    Each pod is a dict: name, namespace, containers: [{name, devices: [(resource, [ids])], cpu_ids, memory}].
    ``delay`` seconds are waited before each answer; ``status`` (a grpc.StatusCode) makes List fail.
    """

    def __init__(self, generated, socket):
        import grpc

        self.pb2, self.pb2_grpc = generated
        self.socket = str(socket)
        self.pods, self.delay, self.status, self.calls = [], 0.0, None, 0
        self._released = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        servicer = type("Lister", (self.pb2_grpc.PodResourcesListerServicer,), {"List": self._list})()
        self.pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, self.server)
        self.server.add_insecure_port("unix:%s" % self.socket)

    def __enter__(self):
        self.server.start()
        return self

    def __exit__(self, *_exc):
        self._released.set()
        # stop() returns before the shutdown is done; gRPC closes the listener and unlinks the socket file after.
        # A test that binds the same path next (a hostile peer) must find it gone, so wait for both.
        self.server.stop(0).wait(30)
        wait_until(lambda: not os.path.exists(self.socket), 10, "the stand-in kubelet's socket %s to go" % self.socket)

    def answer(self):
        pb2 = self.pb2
        pods = []
        for pod in self.pods:
            containers = []
            for container in pod["containers"]:
                containers.append(pb2.ContainerResources(
                    name=container["name"],
                    devices=[pb2.ContainerDevices(resource_name=resource, device_ids=ids,
                                                  topology=pb2.TopologyInfo(nodes=[pb2.NUMANode(ID=1)]))
                             for resource, ids in container.get("devices", ())],
                    cpu_ids=container.get("cpu_ids", ()),
                    memory=[pb2.ContainerMemory(memory_type="memory", size=size)
                            for size in container.get("memory", ())],
                    dynamic_resources=self._claims(container.get("dynamic"), pod["namespace"])))
            pods.append(pb2.PodResources(name=pod["name"], namespace=pod["namespace"], containers=containers,
                                         cpu_ids=pod.get("cpu_ids", ())))
        return pb2.ListPodResourcesResponse(pod_resources=pods)

    def _claims(self, dynamic, namespace):
        """The DynamicResource messages of a container's ``dynamic``: True (one claim of a GPU), or a list of
        (claim name, claim namespace, [(driver, pool, device name, [CDI device names])])."""
        pb2 = self.pb2
        if dynamic is True:
            dynamic = [("claim", namespace, [("gpu.nvidia.com", "", "gpu-0", ["nvidia.com/gpu=0"])])]
        return [pb2.DynamicResource(claim_name=name, claim_namespace=claim_namespace, claim_resources=[
            pb2.ClaimResource(driver_name=driver, pool_name=pool, device_name=device,
                              cdi_devices=[pb2.CDIDevice(name=cdi) for cdi in cdis])
            for driver, pool, device, cdis in devices]) for name, claim_namespace, devices in dynamic or ()]

    def _list(self, _request, context):
        self.calls += 1
        if self.delay:
            self._released.wait(self.delay)
        if self.status is not None:
            context.abort(self.status, "stand-in kubelet told to fail")
        return self.answer()


def claim_pod(name, namespace, *containers):
    """A pod for StandInKubelet.pods whose containers got devices through DRA claims: containers as (name, [(claim
    name, [(driver, pool, device name)])]), each claim in the pod's namespace, each device with one CDI device."""
    return {"name": name, "namespace": namespace, "containers": [
        {"name": cname, "devices": [], "dynamic": [
            (claim, namespace, [(driver, pool, device, ["k8s.%s/claim=%s-%s" % (driver, claim, device)])
                                for driver, pool, device in devices]) for claim, devices in claims]}
        for cname, claims in containers]}


def pod(name, namespace, *containers):
    """A pod for StandInKubelet.pods: containers as (name, [(resource, [device ids])])."""
    return {"name": name, "namespace": namespace,
            "containers": [{"name": cname, "devices": devices, "cpu_ids": [2, 3], "memory": [1 << 30]}
                           for cname, devices in containers]}
