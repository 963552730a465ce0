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

from harness.component import Component


class ControllerManager(Component):
    """kube-controller-manager for ``plane`` running ``controllers``; its log is
    ``directory``/kube-controller-manager.log."""

    name, option = "kube-controller-manager", "--controller-manager"

    def __init__(self, plane, directory, controllers):
        super().__init__(plane, directory)
        self.controllers = list(controllers)

    def arguments(self):
        return ["--kubeconfig", str(self.plane.admin_kubeconfig), "--leader-elect=false", "--secure-port=0",
                "--use-service-account-credentials=false", "--controllers", ",".join(self.controllers), "--v=2"]

    def started(self, text):
        return all('"Controller starting..." controller="%s"' % name in text for name in self.controllers)

    def describe(self):
        return "kube-controller-manager to start %s (%s)" % (", ".join(self.controllers), self.log_path)
