"""NVIDIA's container toolkit in the tests: its own runtime, nvidia-ctk and CDI hook, on the NVML simulator.

``toolkit`` builds the three programs from the Go module proxy (tools/nvidia-container-toolkit/build, once, into
~/.cache/scv-gpu). ``DriverRoot`` is a stand-in for the host's driver, in a folder of the test's own, holding what
NVIDIA's ``nvidia-ctk cdi generate`` reads, and why:

- ``usr/lib/x86_64-linux-gnu/libnvidia-ml.so.<driver version>``, a copy of the NVML simulator, and its
  ``libnvidia-ml.so.1`` link: nvidia-ctk finds the driver's libraries by the version NVML reports, loads NVML from
  the driver root, and names both in the spec as mounts. The copy carries the root's scenario after its code, so
  that inside a container, where CDI mounts the library alone, NVML answers for this root's GPUs, and only for
  those whose device node the container was given (tests/nvml_simulator/README.md).
- ``libcuda.so.<driver version>``, any shared object: nvidia-ctk refuses to write a spec without it ('failed to
  locate "libcuda.so."'). A one-function library built here serves.
- ``dev/nvidia<N>`` for each GPU, ``dev/nvidiactl``, ``dev/nvidia-uvm`` and ``dev/nvidia-uvm-tools``, made
  with mknod: nvidia-ctk puts each
  GPU's node in its device's edits and the control nodes in the common edits, and leaves out a node it does not
  find. They are made in the test's folder, never under the host's /dev; the GPUs' major is the driver's (195),
  nvidia-uvm's is dynamic on a real host, so any number serves.

- for MIG, ``/proc/driver/nvidia-caps/mig-minors``, which the driver writes and nvidia-ctk reads from the host's
  /proc whatever the driver root (it maps each GPU instance and compute instance to the minor of its
  ``/dev/nvidia-caps/nvidia-cap<N>`` node), and those nodes. ``namespaced`` runs a command in a mount namespace of
  its own where this root's ``proc-driver`` folder is bind-mounted over /proc/driver: the host's /proc is never
  touched. The file lists every GPU, GPU instance (0 to 14) and compute instance (0 to 7), as the driver's does.
- ``proc-driver/nvidia/gpus/<bus>/information`` for each GPU, as the driver writes it (its UUID and device
  minor): the validation's host checks read the driver's own list of its GPUs there.

It warns about every other library a real driver has (Vulkan, X.Org, nvvm); none of them stops it. The
simulator answers for the scenario named by ``NVMLSIM_CONFIG``, which ``env`` sets, with no modelled latency.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import shutil
import subprocess
import tarfile
import tomllib

from harness.gpu_images import gpus_layer
from harness.paths import ROOT, SIMULATOR_DIR

BUILD = ROOT / "tools" / "nvidia-container-toolkit" / "build"
NVIDIA_SMI = ROOT / "tests" / "molecule" / "standin" / "nvidia-smi.c"
LIBRARIES = pathlib.Path("usr/lib/x86_64-linux-gnu")
GPU_MAJOR = 195          # the NVIDIA driver's character device major (nvidia0.., nvidiactl at minor 255)
UVM_MAJOR = 235          # dynamic on a real host
CAPS_MAJOR = 236         # nvidia-caps, dynamic too
EMBEDDED_MARKER = b"\n#nvml-simulator-scenario\n"     # tests/nvml_simulator/README.md
# the device nodes every container given a GPU also gets (nvidia-ctk puts them in the spec's common edits)
CONTROL_NODES = {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
# /proc/driver/nvidia/gpus/<bus>/information, as the driver writes it (the fields the collection reads)
INFORMATION = ("Model: \t\t %s\nIRQ:   \t\t 0\nGPU UUID: \t %s\nVideo BIOS: \t ??.??.??.??.??\n"
               "Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t %s\n"
               "Device Minor: \t %d\nGPU Excluded:\t No\n")
CUDA_STUB = "int cuInit(unsigned int flags) { (void)flags; return 0; }\n"


def toolkit(version=None):
    """The folder holding nvidia-container-runtime, nvidia-ctk and nvidia-cdi-hook: the release pinned in
    tools/nvidia-container-toolkit/go.mod, or ``version`` (built from the proxy with the release's own go.mod)."""
    done = subprocess.run([str(BUILD)] + ([version] if version else []), capture_output=True, text=True, check=False)
    assert done.returncode == 0, "building NVIDIA's container toolkit failed:\n%s" % done.stderr[-4000:]
    return pathlib.Path(done.stdout.strip().splitlines()[-1])


def install_toolkit(bin_dir, version=None):
    """NVIDIA's nvidia-ctk and CDI hook of ``version`` (None: the pinned release) copied into ``bin_dir``: copies, so
    that a test may replace one there without touching the cached build."""
    built = toolkit(version)
    for name in ("nvidia-ctk", "nvidia-cdi-hook"):
        (bin_dir / name).unlink(missing_ok=True)
        shutil.copy2(built / name, bin_dir / name)


def host_bin(bin_dir, version=None):
    """``bin_dir`` as a GPU host's programs: the driver's nvidia-smi (the stand-in that asks NVML, since the driver's
    own cannot be built) and NVIDIA's nvidia-ctk and CDI hook; returns it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-O2", "-o", str(bin_dir / "nvidia-smi"), str(NVIDIA_SMI), "-ldl"], check=True,
                   capture_output=True)
    install_toolkit(bin_dir, version)
    return bin_dir


class DriverRoot:
    """A driver root and dev root in ``folder`` for the GPUs of ``scenario`` (a scenario file's path), which the
    simulator serves from a copy in ``folder`` that ``edit`` changes."""

    def __init__(self, folder, scenario):
        self.path = pathlib.Path(folder)
        self.path.mkdir(parents=True, exist_ok=True)
        self.scenario = self.path / "scenario.json"
        shutil.copyfile(scenario, self.scenario)
        data = json.loads(self.scenario.read_text())
        self.driver_version = data["driverVersion"]
        self.uuids = [device["uuid"] for device in data["devices"]]
        libraries = self.path / LIBRARIES
        libraries.mkdir(parents=True, exist_ok=True)
        self._write_nvml()
        source = self.path / "cuda-stub.c"
        source.write_text(CUDA_STUB)
        cuda = libraries / ("libcuda.so.%s" % self.driver_version)
        subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(cuda), str(source)],
                       check=True, capture_output=True)
        _link(libraries / "libcuda.so.1", cuda.name)
        self.dev = self.path / "dev"
        self.dev.mkdir(exist_ok=True)
        nodes = [("nvidia%d" % index, GPU_MAJOR, index) for index in range(len(self.uuids))]
        nodes += [("nvidiactl", GPU_MAJOR, 255), ("nvidia-uvm", UVM_MAJOR, 0), ("nvidia-uvm-tools", UVM_MAJOR, 1)]
        self.proc_driver = self.path / "proc-driver"
        (self.proc_driver / "nvidia-caps").mkdir(parents=True, exist_ok=True)
        for index, device in enumerate(data["devices"]):
            bus = device.get("pciBusId", "00000000:%02x:00.0" % (index + 1))[4:].lower()
            gpu = self.proc_driver / "nvidia" / "gpus" / bus
            gpu.mkdir(parents=True, exist_ok=True)
            (gpu / "information").write_text(INFORMATION % (device.get("name", "NVIDIA GPU"), device["uuid"], bus,
                                                            device.get("minorNumber", index)))
        (self.dev / "nvidia-caps").mkdir(exist_ok=True)
        minors = ["config 1", "monitor 2"]
        for gpu in range(len(self.uuids)):
            for instance in range(15):
                minors.append("gpu%d/gi%d/access %d" % (gpu, instance, len(minors) + 1))
                minors += ["gpu%d/gi%d/ci%d/access %d" % (gpu, instance, compute, len(minors) + 1 + compute)
                           for compute in range(8)]
        (self.proc_driver / "nvidia-caps" / "mig-minors").write_text("\n".join(minors) + "\n")
        nodes += [("nvidia-caps/nvidia-cap%d" % minor, CAPS_MAJOR, minor) for minor in range(1, len(minors) + 1)]
        for name, major, minor in nodes:
            node = self.dev / name
            if not node.exists():
                os.mknod(node, 0o666 | 0o020000, os.makedev(major, minor))

    def _write_nvml(self):
        """The simulator with this root's scenario after its code, replacing the library by a rename."""
        libraries = self.path / LIBRARIES
        nvml = libraries / ("libnvidia-ml.so.%s" % self.driver_version)
        partial = libraries / ".libnvidia-ml.partial"
        partial.write_bytes(SIMULATOR_DIR.joinpath("libnvidia-ml.so.1").read_bytes() + EMBEDDED_MARKER
                            + self.scenario.read_bytes())
        partial.rename(nvml)
        _link(libraries / "libnvidia-ml.so.1", nvml.name)

    def upgrade(self, version):
        """The driver at ``version``: its libraries replace the old ones, and NVML reports it."""
        libraries = self.path / LIBRARIES
        (libraries / ("libnvidia-ml.so.%s" % self.driver_version)).unlink()
        (libraries / ("libcuda.so.%s" % self.driver_version)).rename(libraries / ("libcuda.so.%s" % version))
        _link(libraries / "libcuda.so.1", "libcuda.so.%s" % version)
        self.driver_version = version
        self.edit(lambda scenario: scenario.update(driverVersion=version))

    def edit(self, change):
        """``change(scenario dict)`` applied to the simulated GPUs."""
        data = json.loads(self.scenario.read_text())
        change(data)
        self.scenario.write_text(json.dumps(data))
        self._write_nvml()

    def env(self, base=None):
        """An environment in which NVML is the simulator of this root's GPUs, and nvidia-ctk reads this root."""
        env = dict(os.environ if base is None else base)
        env.update(NVMLSIM_CONFIG=str(self.scenario), NVMLSIM_LATENCY="none",
                   NVIDIA_CTK_DRIVER_ROOT=str(self.path), NVIDIA_CTK_DEV_ROOT=str(self.path))
        return env

    def namespaced(self, command):
        """``command`` in a mount namespace of its own, where /proc/driver is this root's ``proc-driver``."""
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount --bind "$0" /proc/driver && exec "$@"', str(self.proc_driver)] + [str(part) for part in command]

    def generate(self, output, bin_dir):
        """NVIDIA's ``nvidia-ctk cdi generate`` for this root, written to ``output``; returns the spec, parsed."""
        import yaml

        env = self.env()
        env["PATH"] = "%s:%s" % (bin_dir, env.get("PATH", "/usr/bin:/bin"))
        done = subprocess.run(self.namespaced([pathlib.Path(bin_dir) / "nvidia-ctk", "cdi", "generate", "--output",
                                               output]), env=env, capture_output=True, text=True, check=False,
                              timeout=120)
        assert done.returncode == 0, "nvidia-ctk cdi generate failed:\n%s" % done.stderr[-4000:]
        return yaml.safe_load(pathlib.Path(output).read_text())


def toolkit_tasks_play(*files):
    """A play on localhost running the container_toolkit role's ``files`` (containerd.yml, runtime-config.yml, ...)
    in order, as the role runs them, with its defaults."""
    tasks = "".join("    - name: The role's %s\n      ansible.builtin.include_role:\n"
                    "        name: scv.gpu.container_toolkit\n        tasks_from: %s\n" % (name, name) for name in files)
    return "- hosts: localhost\n  gather_facts: false\n  tasks:\n" + tasks


def nvidia_config(bin_dir, path):
    """The configuration NVIDIA's runtime reads from ``path``, as its own ``nvidia-ctk config`` reports it."""
    done = subprocess.run([str(bin_dir / "nvidia-ctk"), "config", "--config-file", str(path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return tomllib.loads(done.stdout)


def host_config(bin_dir, path, spec_dir):
    """NVIDIA's default file (``nvidia-ctk config default``, what its packages install), with this host's own
    settings made by ``nvidia-ctk config --set``: its CDI folder, runc underneath, the log beside the file."""
    done = subprocess.run([str(bin_dir / "nvidia-ctk"), "config", "default", "--output", str(path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    sets = ["nvidia-container-runtime.modes.cdi.spec-dirs=%s" % spec_dir, "nvidia-container-runtime.runtimes=runc",
            "nvidia-container-runtime.debug=%s" % path.with_name("nvidia-container-runtime.log")]
    done = subprocess.run([str(bin_dir / "nvidia-ctk"), "config", "--config-file", str(path), "--in-place"]
                          + ["--set=%s" % item for item in sets], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return path


def _link(path, target):
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target)


RUNC = shutil.which("runc") or "/usr/sbin/runc"


class Bundles:
    """OCI bundles in ``work`` whose process is gpus.c's program, run through NVIDIA's nvidia-container-runtime
    (``bin_dir``'s) with the runtime configuration file ``config`` and Debian's runc underneath.

    The root file system is GPUS_IMAGE's layer (harness.gpu_images): the program, the C library and an
    /etc/ld.so.conf (the update-ldcache hook needs one); each run gets a fresh copy, since the runtime and its hooks write into the bundle. The process sees the
    GPUs through the driver root's NVML, which the runtime mounts, as a process in a container sees the driver:
    only the GPUs whose /dev/nvidia<minor> the runtime gave it.
    """

    def __init__(self, work, bin_dir, root, config):
        self.work, self.bin_dir, self.root, self.config = pathlib.Path(work), pathlib.Path(bin_dir), root, config
        self.template = self.work / "rootfs"
        with tarfile.open(fileobj=io.BytesIO(gpus_layer(self.work / "gpus-image"))) as layer:
            layer.extractall(self.template, filter="tar")
        self.runs = 0

    def run(self, env=(), annotations=None, mounts=(), privileged=False):
        """The program's lines and the runtime's output (and its log, nvidia-container-runtime.log beside
        ``config``, where the configuration puts it), for a container with ``env`` (["NAME=value"]),
        ``annotations`` and extra bind ``mounts`` ([(host path, container path)])."""
        self.runs += 1
        bundle = self.work / ("bundle-%d" % self.runs)
        shutil.copytree(self.template, bundle / "rootfs", symlinks=True)
        done = subprocess.run([RUNC, "spec", "--bundle", str(bundle)], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        spec = json.loads((bundle / "config.json").read_text())
        spec["process"].update(args=["/usr/bin/gpus"], terminal=False)
        spec["process"]["env"] += ["NVMLSIM_LATENCY=none"] + list(env)
        spec["root"]["readonly"] = False
        spec["mounts"] += [{"destination": inside, "type": "bind", "source": str(outside), "options": ["rbind", "ro"]}
                           for outside, inside in mounts]
        if annotations:
            spec["annotations"] = dict(annotations)
        if privileged:
            # What a privileged container is to the runtime: every capability (runc spec's defaults are few).
            names = ("SYS_ADMIN", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
                     "NET_BIND_SERVICE", "NET_RAW", "SYS_CHROOT", "MKNOD", "AUDIT_WRITE", "SETFCAP")
            capabilities = ["CAP_%s" % name for name in names]
            spec["process"]["capabilities"] = {kind: capabilities for kind in
                                               ("bounding", "effective", "permitted")}
        (bundle / "config.json").write_text(json.dumps(spec))
        name = "scv-test-%d-%d" % (os.getpid(), self.runs)
        out, log = bundle / "out.txt", bundle / "runtime.log"
        env_vars = dict(os.environ, NVIDIA_CTK_CONFIG_FILE_PATH=str(self.config),
                        PATH="%s:%s" % (self.bin_dir, os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")))
        try:
            with open(out, "wb") as stdout, open(log, "wb") as stderr:
                created = subprocess.run([str(self.bin_dir / "nvidia-container-runtime"), "create", "--bundle",
                                          str(bundle), name], stdout=stdout, stderr=stderr, env=env_vars,
                                         check=False, timeout=60)
            assert created.returncode == 0, "nvidia-container-runtime create failed:\n%s" % log.read_text()[-4000:]
            subprocess.run([RUNC, "start", name], check=True, capture_output=True, timeout=30)
            _wait_stopped(name)
        finally:
            subprocess.run([RUNC, "delete", "--force", name], capture_output=True, check=False, timeout=30)
        runtime_log = self.config.with_name("nvidia-container-runtime.log")
        return out.read_text().splitlines(), log.read_text() + (runtime_log.read_text() if runtime_log.exists() else "")


def _wait_stopped(name):
    from harness.common import wait_until

    def stopped():
        done = subprocess.run([RUNC, "state", name], capture_output=True, text=True, check=False)
        return done.returncode != 0 or json.loads(done.stdout).get("status") == "stopped"

    wait_until(stopped, 30, "container %s to stop" % name, 0.1)


def seen(lines):
    """(device nodes, NVML's GPU UUIDs) in gpus.c's output."""
    return ({line.split(" ", 1)[1] for line in lines if line.startswith("dev ")},
            [line.split(" ")[2] for line in lines if line.startswith("nvml ")])
