"""A real kube-scheduler against the test control plane, for tests that let it place pods.

Built beside the API server (``tools/control-plane/build --scheduler``) and run with the identity
the bootstrap RBAC rules grant a scheduler (user ``system:kube-scheduler``), without leader
election and without its HTTPS endpoint (nothing here reads its metrics). It schedules with its
default profile, so Dynamic Resource Allocation (GA since Kubernetes 1.34) is on. Stopped by PID.

    scheduler = Scheduler(plane, directory).start()
    ...
    scheduler.stop()
"""

from __future__ import annotations

import pathlib
import subprocess

from harness.common import wait_until
from harness.control_plane import BUILD_SCRIPT, _alive, terminate_group

STARTUP_TIMEOUT = 60


def build_scheduler():
    """The kube-scheduler binary, built once per pin beside kube-apiserver."""
    done = subprocess.run([str(BUILD_SCRIPT), "--scheduler"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError("building kube-scheduler failed (%s --scheduler):\n%s"
                           % (BUILD_SCRIPT, done.stderr[-4000:]))
    return pathlib.Path(done.stdout.strip().splitlines()[-1]) / "kube-scheduler"


class Scheduler:
    """kube-scheduler for ``plane`` (a harness.control_plane.ControlPlane); its log is ``directory``/kube-scheduler.log."""

    def __init__(self, plane, directory):
        self.plane = plane
        self.directory = pathlib.Path(directory)
        self.log_path = self.directory / "kube-scheduler.log"
        self.pid = None

    def start(self):
        binary = build_scheduler()
        self.directory.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.plane.kubeconfig("kube-scheduler", "system:kube-scheduler")
        with open(self.log_path, "ab") as log:
            process = subprocess.Popen([  # pylint: disable=consider-using-with
                str(binary), "--kubeconfig", str(kubeconfig), "--leader-elect=false", "--secure-port=0", "--v=2",
            ], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = process.pid
        try:
            wait_until(self._synced, STARTUP_TIMEOUT, "kube-scheduler to start (%s)" % self.log_path,
                       step=0.2, gone=self._ended, log=self.log)
        except BaseException:
            self.stop()
            raise
        return self

    def _synced(self):
        return b"Starting Kubernetes Scheduler" in self.log_path.read_bytes()

    def _ended(self):
        return None if _alive(self.pid) else "kube-scheduler exited"

    def log(self, tail=6000):
        return self.log_path.read_text(errors="replace")[-tail:] if self.log_path.exists() else ""

    def stop(self):
        """Stops the scheduler by its PID; safe to call twice."""
        if self.pid:
            terminate_group(self.pid)
            self.pid = None
