"""CRI-O for the real kubelet's tests: the kubelet's container runtime in place of containerd (harness.real_kubelet).

- ``crio`` and its ``pinns`` are built from the Go module proxy (tools/crio/build, once, into ~/.cache/scv-gpu); conmon
  is Debian's (podman's dependency, which tests/molecule/prepare-host installs), the runtime underneath Debian's runc.
- Everything CRI-O keeps is in the test's folder: its storage (the vfs driver, which needs no overlay), run root,
  socket, exits, attach sockets, pinned namespaces, version and shutdown files. Its main file, crio.conf, holds the
  host's own settings; the drop-in folder next to it, crio.conf.d, is where the container_toolkit role writes
  ``config``, its runtime drop-in.
- CRI-O cannot import an image over CRI, so the test images (the docker-archive tars, the sandbox image among them)
  are loaded into the same storage by podman before CRI-O starts.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

from harness.common import wait_until
from harness.paths import ROOT
from harness.real_kubelet import CNI_PLUGINS, PAUSE_IMAGE, image_archive, stop_runtime

BUILD = ROOT / "tools" / "crio" / "build"
MONITOR_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# runc, as CRI-O and NVIDIA's runtime run it: Debian's, behind a wrapper that adapts a container's spec to these
# machines where CRI-O, unlike containerd, has no setting for it:
# - the OOM score: these machines withhold CAP_SYS_RESOURCE, so no process may lower its OOM score, and the kubelet
#   asks -997 for a critical or Guaranteed pod (NVIDIA's plugin is system-node-critical). The wrapper raises it to
#   the runtime's own, as containerd's restrict_oom_score_adj does.
# - hugetlb: the kernel has the controller (/proc/cgroups, where CRI-O looks) but no cgroup v1 hierarchy mounts it,
#   so runc refuses the kubelet's hugepage limits. The wrapper drops them where ``drop_hugetlb`` says so, as
#   containerd does by default (disable_hugetlb_controller).
RUNC_WRAPPER = """#!%(python)s
import json, os, sys

args = sys.argv[1:]
if "create" in args:
    rest = args[args.index("create") + 1:]
    bundle = "."
    for index, arg in enumerate(rest):
        if arg in ("--bundle", "-b"):
            bundle = rest[index + 1]
        elif arg.startswith(("--bundle=", "-b=")):
            bundle = arg.split("=", 1)[1]
    path = os.path.join(bundle, "config.json")
    with open(path) as handle:
        spec = json.load(handle)
    before = json.dumps(spec)
    with open("/proc/self/oom_score_adj") as handle:
        own = int(handle.read())
    if spec.get("process", {}).get("oomScoreAdj", own) < own:
        spec["process"]["oomScoreAdj"] = own
    if %(drop_hugetlb)r:
        spec.get("linux", {}).get("resources", {}).pop("hugepageLimits", None)
    if json.dumps(spec) != before:
        with open(path, "w") as handle:
            json.dump(spec, handle)
os.execv(%(runc)r, [%(runc)r] + args)
"""


def _hugetlb_mounted():
    """Whether runc can set hugepage limits here: a cgroup v1 hierarchy with hugetlb, or cgroup v2 alone."""
    with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
        for line in mounts:
            fields = line.split()
            kind, options = fields[fields.index("-") + 1], fields[-1].split(",")
            if (kind == "cgroup" and "hugetlb" in options) or (kind == "cgroup2" and fields[4] == "/sys/fs/cgroup"):
                return True
    return False


def crio_bin():
    """The folder holding crio and pinns, built once from the release pinned in tools/crio/go.mod."""
    done = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, "tools/crio/build failed:\n%s" % done.stderr[-4000:]
    return pathlib.Path(done.stdout.strip().splitlines()[-1])


def _program(name, package):
    found = shutil.which(name)
    assert found, "no %s on PATH: install Debian's %s (tests/molecule/prepare-host installs podman, which brings " \
                  "conmon and runc)" % (name, package)
    return found


class CriO:
    """CRI-O with its own configuration, storage, run root and socket, the test images loaded.

    ``cdi_spec_dirs``: where CRI-O reads CDI specs; ``images``: more docker-archive tars to load; ``environment``:
    what the runtimes run with (conmon and every runtime CRI-O calls get it); ``pod_network``: pods off the host's
    network get an interface of their own (cni-isolated), as on harness.real_kubelet.Containerd.
    """

    def __init__(self, work, cdi_spec_dirs=(), images=(), environment=None, pod_network=False):
        self.work = pathlib.Path(work)
        self.state = self.work / "crio"
        self.images = list(images)
        self.environment = dict(environment or {})
        self.bin = crio_bin()
        self.conmon, self.runc = _program("conmon", "conmon"), _program("runc", "runc")
        self.podman = _program("podman", "podman")
        self.socket = self.state / "crio.sock"
        self.log = self.work / "crio.log"
        self.main_config = self.work / "crio.conf"
        self.config = self.work / "crio.conf.d" / "99-nvidia.toml"     # the role's drop-in
        self.process = None
        self.storage = ["--root", str(self.state / "storage"), "--runroot", str(self.state / "run"),
                        "--storage-driver", "vfs"]
        self.network = self._network(pod_network)
        runtime_bin = self.state / "runtime-bin"
        runtime_bin.mkdir(parents=True, exist_ok=True)
        wrapper = runtime_bin / "runc"
        wrapper.write_text(RUNC_WRAPPER % {"python": sys.executable, "runc": self.runc,
                                           "drop_hugetlb": not _hugetlb_mounted()})
        wrapper.chmod(0o755)
        # CRI-O runs conmon and the runtimes with conmon_env and then its own PATH, which wins
        self.path = "%s:%s" % (runtime_bin, MONITOR_PATH)
        conmon_env = ["PATH=%s" % self.path] + ["%s=%s" % item for item in sorted(self.environment.items())]
        quoted = json.dumps
        self.main_config.write_text("\n".join([
            "[crio]",
            "root = %s" % quoted(str(self.state / "storage")),
            "runroot = %s" % quoted(str(self.state / "run")),
            'storage_driver = "vfs"',
            "storage_option = []",
            "log_dir = %s" % quoted(str(self.state / "pods")),
            "version_file = %s" % quoted(str(self.state / "version")),
            "version_file_persist = %s" % quoted(str(self.state / "version-persist")),
            "clean_shutdown_file = %s" % quoted(str(self.state / "clean.shutdown")),
            "[crio.api]",
            "listen = %s" % quoted(str(self.socket)),
            "[crio.runtime]",
            'default_runtime = "runc"',
            'cgroup_manager = "cgroupfs"',
            "conmon = %s" % quoted(self.conmon),
            "conmon_env = %s" % quoted(conmon_env),
            "pinns_path = %s" % quoted(str(self.bin / "pinns")),
            "namespaces_dir = %s" % quoted(str(self.state / "namespaces")),
            "container_exits_dir = %s" % quoted(str(self.state / "exits")),
            "container_attach_socket_dir = %s" % quoted(str(self.state / "attach")),
            "cdi_spec_dirs = %s" % quoted([str(folder) for folder in cdi_spec_dirs]),
            "hooks_dir = []",
            'irqbalance_config_file = %s' % quoted(str(self.state / "irqbalance")),
            'irqbalance_config_restore_file = "disable"',
            "[crio.runtime.runtimes.runc]",
            "runtime_path = %s" % quoted(str(wrapper)),
            'runtime_type = "oci"',
            "[crio.image]",
            "pause_image = %s" % quoted(PAUSE_IMAGE),
            'pause_command = ""',        # the sandbox image's own entrypoint
            "signature_policy = %s" % quoted(str(self._policy())),
            "[crio.network]",
            "network_dir = %s" % quoted(str(self.network[0])),
            "plugin_dirs = %s" % quoted([str(self.network[1])]),
            "[crio.nri]",
            "enable_nri = false",
            ""]))
        self.config.parent.mkdir(parents=True, exist_ok=True)

    def _network(self, pod_network):
        """(CNI configuration folder, plugin folder), as harness.real_kubelet.Containerd writes them."""
        assert (CNI_PLUGINS / "loopback").exists(), (
            "no CNI loopback plugin at %s: install containernetworking-plugins (tests/molecule/prepare-host does)"
            % CNI_PLUGINS)
        cni = self.work / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        if not pod_network:
            (cni / "10-loopback.conf").write_text(json.dumps(
                {"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}))
            return cni, CNI_PLUGINS
        cni_bin = self.work / "cni-bin"
        cni_bin.mkdir(exist_ok=True)
        for plugin in (CNI_PLUGINS / "loopback", pathlib.Path(__file__).with_name("cni-isolated")):
            if not (cni_bin / plugin.name).exists():
                (cni_bin / plugin.name).symlink_to(plugin)
        (cni / "10-pods.conflist").write_text(json.dumps({"cniVersion": "1.0.0", "name": "pods", "plugins": [
            {"type": "cni-isolated", "stateFile": str(self.work / "cni-addresses")}]}))
        return cni, cni_bin

    def _policy(self):
        """An image signature policy of the test's own: no image is pulled, but CRI-O reads one."""
        policy = self.work / "policy.json"
        policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        return policy

    def _load(self, archive):
        command = [self.podman] + self.storage + ["--tmpdir", str(self.state / "podman"), "load", "--input",
                                                  str(archive)]
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
        assert done.returncode == 0, "podman load of %s failed:\n%s%s" % (archive, done.stdout, done.stderr)

    def start(self):
        for archive in [image_archive(self.work)] + self.images:
            self._load(archive)
        env = dict(os.environ, **self.environment)
        env["PATH"] = self.path
        command = [str(self.bin / "crio"), "--config", str(self.main_config), "--config-dir", str(self.config.parent)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        wait_until(lambda: self.socket.exists() or self.process.poll() is not None, 60, "CRI-O's socket", 0.2)
        if self.process.poll() is not None:
            raise AssertionError("crio exited %s:\n%s" % (self.process.returncode, self.log.read_text()[-4000:]))
        return self

    def stop(self):
        """CRI-O, its conmons and whatever they still run, stopped."""
        stop_runtime(self.process, self.work, "conmon", str(self.state))
