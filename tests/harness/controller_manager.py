"""A real kube-controller-manager against the test control plane, running only the controllers a test names.

Built beside the API server (``tools/control-plane/build --controller-manager``). The DRA tests run its
``resourceclaim-controller``: it makes a pod's ResourceClaims from their ResourceClaimTemplates, records them in
the pod's status, takes an ended pod out of its claims' ``reservedFor`` and deletes the claims it made for it.
It runs as the control plane's admin (the bootstrap roles give each controller a ServiceAccount of its own, which
would need the token controllers too), without leader election and without its HTTPS endpoint. Stopped by PID.

    manager = ControllerManager(plane, directory, ["resourceclaim-controller"]).start()
    ...
    manager.stop()
"""

from __future__ import annotations

import pathlib
import subprocess

from harness.common import wait_until
from harness.control_plane import BUILD_SCRIPT, _alive, terminate_group

STARTUP_TIMEOUT = 60


def build_controller_manager():
    """The kube-controller-manager binary, built once per pin beside kube-apiserver."""
    done = subprocess.run([str(BUILD_SCRIPT), "--controller-manager"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError("building kube-controller-manager failed (%s --controller-manager):\n%s" % (
            BUILD_SCRIPT, done.stderr[-4000:]))
    return pathlib.Path(done.stdout.strip().splitlines()[-1]) / "kube-controller-manager"


class ControllerManager:
    """kube-controller-manager for ``plane`` running ``controllers``; its log is
    ``directory``/kube-controller-manager.log."""

    def __init__(self, plane, directory, controllers):
        self.plane = plane
        self.directory = pathlib.Path(directory)
        self.controllers = list(controllers)
        self.log_path = self.directory / "kube-controller-manager.log"
        self.pid = None

    def start(self):
        binary = build_controller_manager()
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            process = subprocess.Popen([  # pylint: disable=consider-using-with
                str(binary), "--kubeconfig", str(self.plane.admin_kubeconfig), "--leader-elect=false",
                "--secure-port=0", "--use-service-account-credentials=false",
                "--controllers", ",".join(self.controllers), "--v=2",
            ], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = process.pid
        try:
            wait_until(self._started, STARTUP_TIMEOUT, "kube-controller-manager to start %s (%s)" % (
                ", ".join(self.controllers), self.log_path), step=0.2, gone=self._ended, log=self.log)
        except BaseException:
            self.stop()
            raise
        return self

    def _started(self):
        text = self.log_path.read_text(errors="replace")
        return all('"Controller starting..." controller="%s"' % name in text for name in self.controllers)

    def _ended(self):
        return None if _alive(self.pid) else "kube-controller-manager exited"

    def log(self, tail=6000):
        return self.log_path.read_text(errors="replace")[-tail:] if self.log_path.exists() else ""

    def stop(self):
        """Stops the controller manager by its PID; safe to call twice."""
        if self.pid:
            terminate_group(self.pid)
            self.pid = None
