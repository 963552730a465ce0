"""Processes that look, to whoever reads /proc/<pid>/cgroup, like a pod's containers' (tests and benchmarks).

Each is a sleeping child put in a cgroup whose path is the one the kubelet's cgroupfs driver gives a pod's
container (``.../kubepods/besteffort/pod<uid>/<container>``), under a top group of its own that ``stop``
removes. It needs root and a writable cgroup hierarchy: cgroup v2's, else v1's pids controller.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import uuid


def cgroup_root():
    """A cgroup hierarchy processes may be put in groups of: v2's, else v1's pids controller; None if none is."""
    if os.geteuid() != 0:
        return None
    for root in (pathlib.Path("/sys/fs/cgroup"), pathlib.Path("/sys/fs/cgroup/pids")):
        if (root / "cgroup.procs").exists() and os.access(root, os.W_OK):
            return root
    return None


class PodProcesses:
    """Sleeping processes, each in a cgroup named as the kubelet names a pod's container's."""

    def __init__(self, root):
        self.top = root / ("scv-test-%s" % uuid.uuid4().hex[:8])
        self.processes = []

    def start(self, uid, container="ctr"):
        """A new process in pod ``uid``'s container ``container``; its PID."""
        group = self.top / "kubepods" / "besteffort" / ("pod%s" % uid) / container
        group.mkdir(parents=True)
        process = subprocess.Popen(["sleep", "3600"])
        (group / "cgroup.procs").write_text(str(process.pid))
        self.processes.append(process)
        return process.pid

    def stop(self):
        for process in self.processes:
            process.send_signal(signal.SIGKILL)
            process.wait()
        for group in sorted(self.top.rglob("*"), key=lambda path: -len(path.parts)):
            if group.is_dir():
                group.rmdir()
        if self.top.exists():
            self.top.rmdir()


def time_slice(data, processes, logs, pods_per_gpu):
    """Shares every GPU of scenario ``data`` among ``pods_per_gpu`` pods of namespace ``bench``, as benchmarks do:
    each pod gets a process (from ``processes``, a PodProcesses) on its GPU in ``data``, holding 1, 2, ... GiB
    and sampled busy, and an entry in the pod logs directory ``logs``. Returns (pod, GPU UUID, replica) of each."""
    held = []
    for index, device in enumerate(data["devices"]):
        device["utilization"]["gpu"] = 60
        device["processes"] = []
        for replica in range(pods_per_gpu):
            name, uid = "job-%d-%d" % (index, replica), str(uuid.uuid4())
            (logs / ("bench_%s_%s" % (name, uid))).mkdir(parents=True)
            device["processes"].append({"pid": processes.start(uid), "usedGpuMemory": (replica + 1) << 30,
                                        "smUtil": 10 + 5 * replica})
            held.append((name, device["uuid"], replica))
    return held
