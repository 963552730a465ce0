"""The images of the container tests' GPU pods, made here (no registry is reachable) and imported into containerd.

- ``GPUS_IMAGE`` runs gpus.c's program, which lists the NVIDIA device nodes its container has and the GPUs NVML
  answers for from inside, then waits. Its image sets ``NVIDIA_VISIBLE_DEVICES=all``, as CUDA base images do.
- ``DEVICE_PLUGIN_IMAGE`` replaces NVIDIA's in the device plugin DaemonSet the device_plugin role renders: the tests'
  device plugin (tools/device-plugin-image), which loads NVML in its container and serves the GPUs it finds the way
  NVIDIA's plugin does for its device list strategy and its config file's time-slicing. Its image sets
  ``NVIDIA_VISIBLE_DEVICES=all`` as NVIDIA's does, and has the program as /usr/bin/config-manager too, the stand-in
  for NVIDIA's config manager that the DaemonSet runs from the plugin's image when the role has device plugin configs.

Both programs are dynamically linked (they load libnvidia-ml.so.1 with dlopen), so each image holds the C library
and an /etc/ld.so.conf, which the toolkit's update-ldcache hook reads to make the driver's libraries loadable.
"""

from __future__ import annotations

import io
import os
import pathlib
import subprocess
import tarfile

from harness.paths import ROOT
from harness.real_kubelet import docker_archive

GPUS_PROGRAM = pathlib.Path(__file__).with_name("gpus.c")
GPUS_IMAGE = "scv.test/gpus:1"
DEVICE_PLUGIN_IMAGE = "scv.test/nvidia-device-plugin:1"
LIBC = {"lib/x86_64-linux-gnu/libc.so.6": "/lib/x86_64-linux-gnu/libc.so.6",
        "lib64/ld-linux-x86-64.so.2": "/lib64/ld-linux-x86-64.so.2"}
FOLDERS = ("etc", "lib/x86_64-linux-gnu", "lib64", "usr/bin", "usr/lib/x86_64-linux-gnu", "tmp", "var/run", "dev",
           "proc", "sys")


def _layer(files, texts, links=None):
    """A tar layer: FOLDERS, ``files`` ({path in the image: host path}), ``texts`` ({path: text}) and ``links``
    ({path: the symbolic link's target})."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        for folder in FOLDERS:
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for inside, outside in files.items():
            outside = os.path.realpath(outside)        # the file, not a link (/lib64's loader is one)
            info = tar.gettarinfo(outside, arcname=inside)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(outside, "rb") as handle:
                tar.addfile(info, handle)
        for inside, text in texts.items():
            data = text.encode()
            info = tarfile.TarInfo(inside)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        for inside, target in (links or {}).items():
            info = tarfile.TarInfo(inside)
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            tar.addfile(info)
    return layer.getvalue()


LD_SO_CONF = {"etc/ld.so.conf": "/usr/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n"}


def gpus_layer(work):
    """The layer of GPUS_IMAGE (gpus.c's program at /usr/bin/gpus, the C library, /etc/ld.so.conf), compiled in
    ``work``: also the root file system of harness.nvidia_toolkit's OCI bundles."""
    work = pathlib.Path(work)
    work.mkdir(parents=True, exist_ok=True)
    gpus = work / "gpus"
    subprocess.run(["gcc", "-O2", "-o", str(gpus), str(GPUS_PROGRAM), "-ldl"], check=True, capture_output=True)
    return _layer(dict(LIBC, **{"usr/bin/gpus": gpus}), LD_SO_CONF)


def gpu_images(work):
    """[docker-archive tars] of GPUS_IMAGE and DEVICE_PLUGIN_IMAGE, made in ``work``."""
    work = pathlib.Path(work)
    gpus = gpus_layer(work)
    done = subprocess.run([str(ROOT / "tools" / "device-plugin-image" / "build")], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, "building the tests' device plugin failed:\n%s" % done.stderr[-4000:]
    plugin = pathlib.Path(done.stdout.strip().splitlines()[-1]) / "device-plugin"
    environment = ["PATH=/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=all"]
    return [
        docker_archive(work / "gpus.tar", gpus,
                       {"Entrypoint": ["/usr/bin/gpus", "--wait"], "Env": environment}, [GPUS_IMAGE]),
        docker_archive(work / "device-plugin.tar",
                       _layer(dict(LIBC, **{"usr/bin/nvidia-device-plugin": plugin}), LD_SO_CONF,
                              {"usr/bin/config-manager": "nvidia-device-plugin"}),
                       {"Entrypoint": ["/usr/bin/nvidia-device-plugin"], "Env": environment}, [DEVICE_PLUGIN_IMAGE]),
    ]


def container_log(kubelet, namespace, pod, container):
    """The lines ``container`` of ``pod`` wrote to its standard output, from the kubelet's log files."""
    lines = []
    for log in sorted(kubelet.pod_logs.glob("%s_%s_*/%s/*.log" % (namespace, pod, container))):
        for line in log.read_text().splitlines():
            parts = line.split(" ", 3)               # CRI's format: time, stream, tag, text
            if len(parts) == 4 and parts[1] == "stdout":
                lines.append(parts[3])
    return lines
