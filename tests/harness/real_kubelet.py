"""A real Kubernetes node for the tests that need a kubelet: pod-resources, device plugins, allocatable.

- The kubelet is built from the control plane's Go module (``tools/control-plane/build --kubelet``) and
  joins the test control plane with the node identity ``system:node:<name>``.
- Its container runtime is Debian's containerd (unpacked from its package, as ``harness.containerd.debian_containerd``
  does) with runc, run with a configuration, root, state and socket of its own, and a CNI configuration
  holding only the loopback plugin: pods use the host's network and bind nothing.
- No image registry is reachable, so the sandbox image is made here: a statically linked program that
  waits for a signal, packed as an image and imported. Test pods run the same image.
- ``DevicePlugin`` is a device plugin of the test's own. It speaks the kubelet's published deviceplugin
  v1beta1 protobuf (generated as ``kubelet_podresources.generate`` generates the pod-resources one) and
  advertises ``nvidia.com/gpu`` with the simulator's GPU UUIDs as device IDs, as NVIDIA's plugin does.

The kubelet registers device plugins at ``/var/lib/kubelet/device-plugins/kubelet.sock`` whatever its
root directory, so one such node runs at a time on a machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import pathlib
import signal
import subprocess
import tarfile
import threading
from concurrent import futures

from harness.common import free_port, wait_until
from harness.containerd import debian_containerd
from harness.control_plane import build_binaries, read_object, terminate_group
from harness.kubelet_podresources import DEVICEPLUGIN, generate

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
WORKLOAD_IMAGE = "scv.test/idle:1"
DEVICE_PLUGINS = pathlib.Path("/var/lib/kubelet/device-plugins")
CNI_PLUGINS = pathlib.Path("/usr/lib/cni")
IDLE_PROGRAM = r"""
#include <signal.h>
#include <unistd.h>
static void leave(int sig) { (void)sig; _exit(0); }
int main(void) { signal(SIGTERM, leave); signal(SIGINT, leave); for (;;) pause(); }
"""


def image_archive(work):
    """A docker-archive tar of one layer, a static program that waits for a signal, tagged as the sandbox
    image and as the workload image; returns its path."""
    source, program = work / "idle.c", work / "idle"
    source.write_text(IDLE_PROGRAM)
    subprocess.run(["gcc", "-static", "-O2", "-o", str(program), str(source)], check=True, capture_output=True)
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tar.gettarinfo(str(program), arcname="idle")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        with open(program, "rb") as handle:
            tar.addfile(info, handle)
    return docker_archive(work / "images.tar", layer.getvalue(), {"Entrypoint": ["/idle"]},
                          [PAUSE_IMAGE, WORKLOAD_IMAGE])


def docker_archive(archive, layer_bytes, config, tags):
    """``archive``, a docker-archive tar of one layer (a tar's bytes) with the image ``config`` (Entrypoint,
    Env, ...), tagged ``tags``, for ``ctr images import``; returns its path."""
    config = json.dumps({
        "architecture": "amd64", "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer_bytes).hexdigest()]},
    }).encode()
    manifest = json.dumps([{"Config": "config.json", "RepoTags": list(tags), "Layers": ["layer.tar"]}]).encode()
    with tarfile.open(str(archive), mode="w") as tar:
        for name, data in (("layer.tar", layer_bytes), ("config.json", config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


class Containerd:
    """Debian's containerd with its own configuration, root, state and socket, the test images imported.

    ``binary``: another containerd (whose folder holds its runc shim and ``ctr``), such as containerd 2 from
    tools/containerd/build; ``cdi_spec_dirs``: CDI enabled, with specs read from those folders (containerd 1.7+);
    ``images``: more docker-archive tars to import; ``environment``: what containerd runs with (its shims and the
    runtimes they start inherit it); ``pod_network``: pods off the host's network get an interface of their own.
    """

    def __init__(self, work, binary=None, cdi_spec_dirs=(), images=(), environment=None, pod_network=False):
        self.work = pathlib.Path(work)
        self.images = list(images)          # more docker-archive tars to import
        self.environment = dict(environment or {})   # for containerd, its shims and the runtimes they run
        self.binary = pathlib.Path(binary) if binary else debian_containerd()
        self.socket = self.work / "containerd.sock"
        self.log = self.work / "containerd.log"
        self.process = None
        assert (CNI_PLUGINS / "loopback").exists(), (
            "no CNI loopback plugin at %s: install containernetworking-plugins (tests/molecule/prepare-host does)"
            % CNI_PLUGINS)
        cni = self.work / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        cni_bin = CNI_PLUGINS
        if pod_network:
            # an interface of their own for pods off the host's network, which containerd wants an address on,
            # made inside the pod's namespace alone (cni-isolated), where no traffic can reach it
            cni_bin = self.work / "cni-bin"
            cni_bin.mkdir(exist_ok=True)
            for plugin in (CNI_PLUGINS / "loopback", pathlib.Path(__file__).with_name("cni-isolated")):
                if not (cni_bin / plugin.name).exists():
                    (cni_bin / plugin.name).symlink_to(plugin)
            (cni / "10-pods.conflist").write_text(json.dumps({"cniVersion": "1.0.0", "name": "pods", "plugins": [
                {"type": "cni-isolated", "stateFile": str(self.work / "cni-addresses")}]}))
        else:
            (cni / "10-loopback.conf").write_text(json.dumps(
                {"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}))
        self.config = self.work / "containerd.toml"
        # restrict_oom_score_adj: these machines refuse a pod's OOM score below the runtime's own.
        self.config.write_text("\n".join([
            "version = 2",
            'root = "%s"' % (self.work / "root"),
            'state = "%s"' % (self.work / "state"),
            "[grpc]",
            '  address = "%s"' % self.socket,
            '[plugins."io.containerd.grpc.v1.cri"]',
            '  sandbox_image = "%s"' % PAUSE_IMAGE,
            "  restrict_oom_score_adj = true",
            "  enable_cdi = true" if cdi_spec_dirs else "",
            "  cdi_spec_dirs = %s" % json.dumps([str(folder) for folder in cdi_spec_dirs]) if cdi_spec_dirs else "",
            '[plugins."io.containerd.grpc.v1.cri".containerd]',
            '  snapshotter = "native"',
            '[plugins."io.containerd.grpc.v1.cri".cni]',
            '  bin_dir = "%s"' % cni_bin,
            '  conf_dir = "%s"' % cni,
            ""]))
        if binary:
            # containerd 2 reads this file as version 2, but keeps its images' snapshotter in a plugin of its
            # own, and ctr's import unpacks through its transfer service, for the platforms listed there only
            with open(self.config, "a", encoding="utf-8") as config:
                config.write('[plugins."io.containerd.cri.v1.images"]\n  snapshotter = "native"\n'
                             '[[plugins."io.containerd.transfer.v1.local".unpack_config]]\n'
                             '  platform = "linux/amd64"\n  snapshotter = "native"\n')

    def start(self, load_images=True):
        env = dict(os.environ, PATH="%s:%s" % (self.binary.parent, os.environ.get("PATH", "/usr/sbin:/usr/bin")),
                   **self.environment)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([str(self.binary), "--config", str(self.config)], env=env,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: self.socket.exists() or self.process.poll() is not None, 30, "containerd's socket", 0.2)
        if self.process.poll() is not None:
            raise AssertionError("containerd exited %s:\n%s" % (self.process.returncode, self.log.read_text()))
        for archive in ([image_archive(self.work)] + self.images) if load_images else []:
            done = subprocess.run([str(self.binary.parent / "ctr"), "--address", str(self.socket), "-n", "k8s.io",
                                   "images", "import", "--snapshotter", "native", str(archive)],
                                  capture_output=True, text=True, check=False, timeout=120)
            assert done.returncode == 0, "ctr images import of %s failed:\n%s%s" % (archive, done.stdout, done.stderr)
        return self

    def restart(self):
        """containerd alone restarted, as ``systemctl restart containerd`` does after its configuration changed: its
        shims (each in a process group of its own) and their containers keep running, and it finds them again."""
        self.process.terminate()
        self.process.wait(timeout=30)
        self.socket.unlink(missing_ok=True)
        return self.start(load_images=False)

    def stop(self):
        """containerd, its shims and whatever they still run, stopped."""
        stop_runtime(self.process, self.work, "containerd-shim", str(self.socket))


def stop_runtime(process, work, monitor, marker):
    """A container runtime's daemon ``process`` stopped, after its per-container monitors (processes whose command
    line holds ``monitor`` and ``marker``, such as containerd's shims or CRI-O's conmons) and whatever they still
    run were killed; the mounts under ``work`` undone."""
    monitors = [pid for pid, command in _processes() if monitor in command and marker in command]
    for pid in _descendants(monitors) + monitors:
        _kill(pid, signal.SIGKILL)
    if process:
        terminate_group(process.pid)
    unmount_under(work)


def _processes():
    """[(pid, command line)] of every process."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
            except OSError:
                pass
    return found


def _descendants(pids):
    children = {}
    for pid, _command in _processes():
        try:
            parent = int((pathlib.Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(pid)
    found, todo = [], list(pids)
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def unmount_under(path):
    """Unmounts every mount point under ``path``, deepest first: the kubelet makes its root directory a
    shared bind mount, and a container's root file system stays mounted under containerd's state when
    its shim is killed."""
    prefix = str(path).rstrip("/") + "/"
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
        for line in mounts:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix.rstrip("/") or point.startswith(prefix):
                points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False, timeout=30)


def _kill(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class Kubelet:
    """A kubelet for ``node`` on ``containerd``, joined to ``plane``: start() returns once the Node is Ready."""

    def __init__(self, plane, work, node, containerd):
        self.plane, self.node, self.containerd = plane, node, containerd
        self.work = pathlib.Path(work)
        self.root = self.work / "kubelet"
        self.log = self.work / "kubelet.log"
        self.process = self._lock = None
        self.binary = build_binaries(kubelet=True) / "kubelet"
        self.config = self.work / "kubelet.yaml"
        self.pod_logs = self.work / "pod-logs"     # <namespace>_<pod>_<uid> per pod: how the agent names pods
        self.config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": "127.0.0.1", "port": free_port(), "readOnlyPort": 0, "healthzPort": 0,
            "authentication": {"x509": {"clientCAFile": plane.state["ca"]}, "webhook": {"enabled": False},
                               "anonymous": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False,
            "evictionHard": {}, "enforceNodeAllocatable": [], "resolvConf": "",
            "containerRuntimeEndpoint": "unix://%s" % containerd.socket,
            "podLogsDir": str(self.pod_logs),
            "registerWithTaints": [],
        }, indent=2))

    @property
    def pod_resources_socket(self):
        return self.root / "pod-resources" / "kubelet.sock"

    def start(self):
        # Every kubelet registers device plugins in the one host folder DEVICE_PLUGINS, whatever its root: a second
        # test process's kubelet waits here for the first to stop, rather than taking its plugins away.
        DEVICE_PLUGINS.mkdir(parents=True, exist_ok=True)
        lock = DEVICE_PLUGINS.parent / ".scv-test-kubelet.lock"
        self._lock = open(lock, "w", encoding="utf-8")  # pylint: disable=consider-using-with  # held until stop()
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.root.mkdir(parents=True, exist_ok=True)
        command = [str(self.binary), "--config", str(self.config), "--kubeconfig",
                   str(self.plane.node_kubeconfig(self.node)), "--root-dir", str(self.root),
                   "--hostname-override", self.node, "--v", "2"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_until(lambda: self._ready() or self.process.poll() is not None, 120, "Node %s Ready" % self.node, 0.5)
        except AssertionError:
            raise AssertionError("the kubelet did not make Node %s Ready; its log ends:\n%s" % (
                self.node, self.log.read_text()[-4000:])) from None
        if self.process.poll() is not None:
            raise AssertionError("the kubelet exited %s:\n%s" % (self.process.returncode, self.log.read_text()[-4000:]))
        # No kube-controller-manager here: the taint it would lift once the node is ready goes by hand,
        # and the default ServiceAccount it would create is made for the pods' namespace.
        self.plane.kubectl("taint", "node", self.node, "node.kubernetes.io/not-ready-", check=False)
        return self

    def _ready(self):
        node = read_object(self.plane, "node", self.node, missing_ok=True)   # until the kubelet registers it
        conditions = node["status"].get("conditions", []) if node else []
        return any(item["type"] == "Ready" and item["status"] == "True" for item in conditions)

    def allocatable(self, resource):
        return read_object(self.plane, "node", self.node)["status"].get("allocatable", {}).get(resource)

    def stop(self):
        if self.process:
            terminate_group(self.process.pid)
        unmount_under(self.root)
        if self._lock:
            self._lock.close()          # releases the host's kubelet lock
            self._lock = None


class DevicePlugin:
    """A device plugin for ``resource`` with device IDs ``ids``, registered with the kubelet.

    ``allocated`` holds the device IDs of each Allocate call; ``set_devices`` advertises others.
    """

    def __init__(self, work, resource, ids):
        import grpc

        self.pb2, self.pb2_grpc = generate(pathlib.Path(work) / "deviceplugin", DEVICEPLUGIN, "deviceplugin")
        self.resource = resource
        self.health = {device: "Healthy" for device in ids}
        self.allocated = []
        # NVIDIA's failRequestsGreaterThanOne: an Allocate of several replicas is refused (set by ConfigFollower)
        self.one_replica_each = False
        self.endpoint = "scv-test-%d-%s.sock" % (os.getpid(), resource.replace("/", "-"))
        self._changed = threading.Condition()
        self._stopped, self._version = False, 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        methods = {"GetDevicePluginOptions": self._options, "ListAndWatch": self._list_and_watch,
                   "Allocate": self._allocate, "GetPreferredAllocation": self._preferred,
                   "PreStartContainer": self._pre_start}
        servicer = type("Plugin", (self.pb2_grpc.DevicePluginServicer,), methods)()
        self.pb2_grpc.add_DevicePluginServicer_to_server(servicer, self.server)

    def start(self):
        """Serves, then registers with the kubelet (whose registration socket must exist)."""
        import grpc

        wait_until((DEVICE_PLUGINS / "kubelet.sock").exists, 30, "the kubelet's device plugin socket", 0.2)
        self.server.add_insecure_port("unix:%s" % (DEVICE_PLUGINS / self.endpoint))
        self.server.start()
        with grpc.insecure_channel("unix:%s" % (DEVICE_PLUGINS / "kubelet.sock")) as channel:
            self.pb2_grpc.RegistrationStub(channel).Register(self.pb2.RegisterRequest(
                version="v1beta1", endpoint=self.endpoint, resource_name=self.resource), timeout=10)
        return self

    def stop(self):
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        self.server.stop(0)
        try:
            (DEVICE_PLUGINS / self.endpoint).unlink()
        except FileNotFoundError:
            pass

    def set_devices(self, ids):
        """Advertises ``ids``, all healthy, instead of what was advertised."""
        with self._changed:
            self.health = {device: "Healthy" for device in ids}
            self._version += 1
            self._changed.notify_all()

    def _options(self, _request, _context):
        return self.pb2.DevicePluginOptions()

    def _list_and_watch(self, _request, context):
        sent = None
        while True:
            with self._changed:
                while self._version == sent and not self._stopped and context.is_active():
                    self._changed.wait(1)
                if self._stopped or not context.is_active():
                    return
                sent = self._version
                devices = [self.pb2.Device(ID=device, health=health) for device, health in self.health.items()]
            yield self.pb2.ListAndWatchResponse(devices=devices)

    def _allocate(self, request, context):
        import grpc

        responses = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            if self.one_replica_each and len(ids) > 1 and any("::" in device for device in ids):
                # the words of NVIDIA's plugin (tests/fixtures/device-plugin/sharing)
                context.abort(grpc.StatusCode.UNKNOWN, 'invalid allocation request for "%s": invalid request: '
                              "maximum request size for shared resources is 1; found %d" % (self.resource, len(ids)))
            self.allocated.append(list(container.devices_ids))
            responses.append(self.pb2.ContainerAllocateResponse(
                envs={"NVIDIA_VISIBLE_DEVICES": ",".join(container.devices_ids)}))
        return self.pb2.AllocateResponse(container_responses=responses)

    def _preferred(self, request, _context):
        return self.pb2.PreferredAllocationResponse(container_responses=[
            self.pb2.ContainerPreferredAllocationResponse(
                deviceIDs=list(container.available_deviceIDs)[:container.allocation_size])
            for container in request.container_requests])

    def _pre_start(self, _request, _context):
        return self.pb2.PreStartContainerResponse()


def one_replica_each(config):
    """Whether NVIDIA's plugin refuses a container several replicas under ``config``: its
    ``failRequestsGreaterThanOne``, which MPS turns on and time-slicing leaves off unless the config sets it."""
    sharing = (config or {}).get("sharing") or {}
    block = (sharing.get("mps") if "mps" in sharing else sharing.get("timeSlicing")) or {}
    return bool(block.get("failRequestsGreaterThanOne", "mps" in sharing))


class ConfigFollower:
    """NVIDIA's config manager and device plugin, as far as the kubelet can tell, for a node of the test's.

    ``sync`` reads the node's ``nvidia.com/device-plugin.config`` label and that config from the ConfigMap the
    device_plugin role wrote, as the config manager does, and has this node's device plugins (one per resource,
    started as needed) offer what NVIDIA's plugin offers for the node's GPUs under that config:
    node.device_plugin.offered_devices, which test_gfd_fixtures holds to what NVIDIA's plugin advertised on the
    same GPUs. A resource the config no longer offers is advertised with no device, as when NVIDIA's plugin
    stops serving it.
    """

    LABEL = "nvidia.com/device-plugin.config"

    def __init__(self, plane, work, node, fact, configmap, namespace, mig_strategy="none", plugins=None):
        self.plane, self.work, self.node, self.fact = plane, work, node, fact
        self.configmap, self.namespace, self.mig_strategy = configmap, namespace, mig_strategy
        self.plugins = dict(plugins or {})     # {resource: DevicePlugin} already registered, to reuse
        self.config_name = None

    def sync(self):
        """Offers what the node's chosen config makes NVIDIA's plugin offer; returns {resource: [IDs]}."""
        import yaml

        from ansible_collections.scv.gpu.plugins.module_utils.node.device_plugin import offered_devices

        self.config_name = (read_object(self.plane, "node", self.node)["metadata"].get("labels") or {}).get(self.LABEL)
        data = read_object(self.plane, "configmap", self.configmap, namespace=self.namespace)["data"]
        config = yaml.safe_load(data[self.config_name])
        offered = offered_devices(self.fact, self.mig_strategy, config)
        for resource in set(offered) | set(self.plugins):
            plugin = self.plugins.get(resource)
            if plugin is None:
                plugin = self.plugins[resource] = DevicePlugin(self.work, resource, offered[resource]).start()
            plugin.one_replica_each = one_replica_each(config)
            plugin.set_devices(offered.get(resource, []))
        return offered

    def stop(self, keep=()):
        """Stops the device plugins this follower started (not those of ``keep``)."""
        for resource, plugin in self.plugins.items():
            if resource not in keep:
                plugin.stop()


@contextlib.contextmanager
def running_node(access, node, namespace, parts):
    """``parts`` (containerd, the kubelet, plugins, ...) started in order for the tests of ``node``, with
    ``namespace`` and its default ServiceAccount made first (without kube-controller-manager's ServiceAccount
    controller nobody makes it). Afterwards the namespace's pods are deleted, every part is stopped in the reverse
    order, and the node's Node and Scv are deleted."""
    access.kubectl("create", "namespace", namespace, check=False)
    access.kubectl("create", "serviceaccount", "default", "-n", namespace, check=False)
    try:
        for part in parts:
            part.start()
        yield
    finally:
        access.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period", "1", "--timeout", "60s",
                       check=False)
        for part in reversed(parts):
            part.stop()
        access.kubectl("delete", "node", node, "--ignore-not-found", check=False)
        access.kubectl("delete", "scv", node, "--ignore-not-found", check=False)


def gpu_pod(name, namespace, node, gpus, resource="nvidia.com/gpu"):
    """A pod on ``node`` (no scheduler runs here) whose one container asks for ``gpus`` of ``resource``."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node, "hostNetwork": True, "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1, "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "trainer", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                            "resources": {"limits": {resource: str(gpus)}}}],
        },
    }
