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

from harness.component import Component


class Scheduler(Component):
    """kube-scheduler for ``plane``; its log is ``directory``/kube-scheduler.log."""

    name, option = "kube-scheduler", "--scheduler"

    def arguments(self):
        kubeconfig = self.plane.kubeconfig("kube-scheduler", "system:kube-scheduler")
        return ["--kubeconfig", str(kubeconfig), "--leader-elect=false", "--secure-port=0", "--v=2"]

    def started(self, text):
        return "Starting Kubernetes Scheduler" in text
