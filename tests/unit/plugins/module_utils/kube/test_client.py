"""kube/client.py, the modules' client: each failure of the kubernetes client explained (built from the kubernetes
and urllib3 packages' own exceptions), the deadline around a call, the connection a message names, and NodeClient's
read-decide-patch cycle.

The same client against a real kube-apiserver (a stalled one, a wrong CA, an expired certificate) is in
tests/integration/test_api_timeouts.py and test_module_credentials.py; here each branch fails fast.
"""

from __future__ import annotations

import json
import signal
import ssl
import threading
import time

import pytest
from kubernetes.client.rest import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError, api_exception
from urllib3.connectionpool import HTTPSConnectionPool
from urllib3.exceptions import MaxRetryError, NewConnectionError, SSLError

from ansible_collections.kubernetes.core.plugins.module_utils.k8s.exceptions import CoreException
from ansible_collections.scv.gpu.plugins.module_utils.kube import client
from ansible_collections.scv.gpu.plugins.module_utils.kube.api_resource import NODE
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import SCV

SERVER = "https://10.0.0.1:6443"


def api_error(status, message="", causes=()):
    """What the kubernetes client raises for an HTTP ``status`` answer carrying a Status object."""
    raw = ApiException(status=status, reason="Reason")
    status_body = {"kind": "Status", "message": message, "code": status}
    if causes:
        status_body["details"] = {"causes": [{"field": field, "message": text} for field, text in causes]}
    raw.body = json.dumps(status_body)
    return api_exception(raw)


def explained(error, **more):
    return str(client.explain(error, "update", "Scv gpu-1", SERVER, **more))


@pytest.mark.parametrize("status, expected", [
    (401, "cannot update Scv gpu-1: the API server at https://10.0.0.1:6443 does not accept these credentials (401)"),
    (403, "cannot update Scv gpu-1: forbidden (403): "),
    (500, "cannot update Scv gpu-1: HTTP 500 from https://10.0.0.1:6443: "),
])
def test_an_http_answer_is_named_with_its_status_and_what_the_server_said(status, expected):
    text = explained(api_error(status, "etcd said no"))
    assert text.startswith(expected) and "etcd said no" in text


def test_a_refused_client_certificate_that_has_expired_says_when(tmp_path):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from harness.tls_certs import TestPki

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "admin")])
    ended = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    old = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
           .serial_number(1).not_valid_before(ended - datetime.timedelta(days=365)).not_valid_after(ended)
           .sign(key, hashes.SHA256()))
    path = tmp_path / "admin.crt"
    path.write_bytes(old.public_bytes(serialization.Encoding.PEM))
    text = explained(api_error(401, "Unauthorized"), connection=(SERVER, "ca.crt", str(path)))
    assert text.endswith("; the client certificate %s expired on 2026-01-02 03:04:05 UTC" % path)
    current = TestPki(tmp_path / "pki").issue("admin")[0]
    assert "expired" not in explained(api_error(401, "Unauthorized"), connection=(SERVER, "ca.crt", str(current)))


def test_a_conflict_is_marked_so_that_the_cycle_starts_over():
    error = client.explain(api_error(409, "the object has been modified"), "update", "Scv gpu-1", SERVER)
    assert error.conflict and str(error).startswith("cannot update Scv gpu-1: conflict (409): ")


def test_an_invalid_object_lists_each_field_the_server_named():
    text = explained(api_error(422, "Scv is invalid", [("spec.updateInterval", "must be at least 1")]))
    assert text.startswith("cannot update Scv gpu-1: the API server rejected it as invalid (422): ")
    assert text.endswith("\n  - spec.updateInterval: must be at least 1")


def test_a_definition_the_server_no_longer_serves_says_to_install_it():
    gone = ResourceNotFoundError("No matches found for {'kind': 'Scv'}")
    with_crd = explained(gone, resource=SCV)
    assert "scvs.core.run-linux.com" in with_crd
    # a 404 that is not "this object is missing" (the API group is gone) says the same
    assert explained(api_error(404, "the server could not find the requested resource"), resource=SCV) == with_crd
    # a Node has no definition to install: a plain 404; and an answer other than 404 is itself, CRD or not
    assert explained(api_error(404, "nothing here"), resource=NODE).startswith("cannot update Scv gpu-1: HTTP 404")
    assert explained(api_error(403, "no"), resource=SCV).startswith("cannot update Scv gpu-1: forbidden (403)")


def test_an_unreachable_server_is_named_from_the_connection_pool():
    pool = HTTPSConnectionPool("10.9.9.9", 6443)
    refused = MaxRetryError(pool, "/apis", NewConnectionError(pool, "Connection refused"))
    assert explained(refused).startswith("cannot update Scv gpu-1: the Kubernetes API at https://10.9.9.9:6443 is "
                                         "unreachable: ")


def test_a_certificate_the_ca_does_not_vouch_for_is_found_however_deep_urllib3_wraps_it():
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    verify.verify_message = "unable to get local issuer certificate"
    wrapped = MaxRetryError(HTTPSConnectionPool("10.0.0.1", 6443), "/api", SSLError(verify))
    connection = (SERVER, "/etc/kubernetes/pki/ca.crt", None)
    assert explained(wrapped, connection=connection) == (
        "cannot update Scv gpu-1: the API server at https://10.0.0.1:6443 is not vouched for by "
        "/etc/kubernetes/pki/ca.crt (unable to get local issuer certificate): is that this cluster's CA?")


def test_a_deadline_and_a_configuration_problem_say_what_to_do():
    assert explained(client.DeadlinePassed(), timeout=5.0) == (
        "cannot update Scv gpu-1: the Kubernetes API at https://10.0.0.1:6443 did not answer within 5 s (raise "
        "request_timeout if the server is slow rather than stalled)")
    assert explained(CoreException("no kubeconfig")) == (
        "cannot update Scv gpu-1: no usable Kubernetes client configuration: no kubeconfig")
    assert explained(ValueError("odd")) == "cannot update Scv gpu-1: odd"


def test_the_deadline_interrupts_a_call_in_the_main_thread_and_puts_the_old_alarm_back():
    def mine(_signum, _frame):
        raise AssertionError("not expected")

    previous = signal.signal(signal.SIGALRM, mine)
    try:
        started = time.monotonic()
        with pytest.raises(client.DeadlinePassed):
            with client.deadline(0.2):
                time.sleep(30)
        assert time.monotonic() - started < 15         # interrupted, not slept out
        assert signal.getsignal(signal.SIGALRM) is mine
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_outside_the_main_thread_the_deadline_leaves_the_call_alone():
    outcome = []

    def run():
        with client.deadline(0.01):
            time.sleep(0.1)
        outcome.append(signal.getitimer(signal.ITIMER_REAL))

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(5)
    assert outcome == [(0.0, 0.0)]


def test_the_connection_named_is_the_kubeconfigs_context_with_its_files_beside_it(tmp_path):
    path = tmp_path / "admin.conf"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "a",
        "clusters": [{"name": "a", "cluster": {"server": "https://a:6443", "certificate-authority": "ca.crt"}},
                     {"name": "b", "cluster": {"server": "https://b:6443", "certificate-authority-data": "eA=="}}],
        "contexts": [{"name": "a", "context": {"cluster": "a", "user": "a"}},
                     {"name": "b", "context": {"cluster": "b", "user": "b"}}],
        "users": [{"name": "a", "user": {"client-certificate": "admin.crt", "client-key": "admin.key"}},
                  {"name": "b", "user": {"token": "t"}}]}))
    assert client._connection_of({"kubeconfig": str(path)}) == (  # pylint: disable=protected-access
        "https://a:6443", str(tmp_path / "ca.crt"), str(tmp_path / "admin.crt"))
    assert client._connection_of({"kubeconfig": str(path), "context": "b"}) == (  # pylint: disable=protected-access
        "https://b:6443", "the kubeconfig's certificate-authority-data", None)
    assert client._connection_of({"host": "https://c:6443"}) == (  # pylint: disable=protected-access
        "https://c:6443", "the system's CA certificates", None)
    path.write_text("not: [a kubeconfig")
    assert client._connection_of({"kubeconfig": str(path)}) == (  # pylint: disable=protected-access
        "the API server", "the kubeconfig's certificate-authority", None)


class Answer(dict):
    def to_dict(self):
        return dict(self)


class Nodes:
    """The dynamic client's Node resource for one Node; ``moved`` patches answer 409 first."""

    def __init__(self, moved=0):
        self.node = {"metadata": {"name": "gpu-1", "resourceVersion": "7", "labels": {}}}
        self.moved, self.patches = moved, []

    def get(self, name):
        return Answer(json.loads(json.dumps(self.node)))

    def patch(self, body, name, content_type, **options):
        self.patches.append((body, content_type, options))
        if self.moved:
            self.moved -= 1
            self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)
            raise api_error(409, "the object has been modified")
        self.node["metadata"]["labels"].update(body["metadata"].get("labels") or {})
        return Answer(self.node)


def node_client(nodes):
    """A NodeClient whose dynamic client's Node resource is ``nodes`` (no connection made)."""
    made = client.NodeClient.__new__(client.NodeClient)
    made.resource_type, made.server, made.timeout = NODE, SERVER, None
    vars(made).update(_auth=None, _resource=nodes)
    return made


def test_update_patches_what_decide_asks_with_the_resource_version_it_read_and_again_after_a_conflict():
    nodes = Nodes(moved=1)
    before, after, patch = node_client(nodes).update(
        "gpu-1", lambda node: {"metadata": {"labels": {"a": "1"}}}, "the labels")
    assert before["metadata"]["resourceVersion"] == "8" and after["metadata"]["labels"] == {"a": "1"}
    assert [body["metadata"]["resourceVersion"] for body, _type, _options in nodes.patches] == ["7", "8"]
    assert nodes.patches[-1][1:] == ("application/merge-patch+json", {"field_manager": "scv.gpu"})
    assert patch == {"metadata": {"labels": {"a": "1"}}}


def test_update_with_nothing_to_change_writes_nothing_and_check_mode_is_a_dry_run():
    nodes = Nodes()
    before, after, patch = node_client(nodes).update("gpu-1", lambda node: None, "the labels")
    assert before == after and patch is None and nodes.patches == []
    node_client(nodes).update("gpu-1", lambda node: {"metadata": {"labels": {"b": "2"}}}, "the labels",
                              check_mode=True)
    assert nodes.patches[-1][2] == {"field_manager": "scv.gpu", "dry_run": "All"}


def test_a_node_that_does_not_exist_is_named_with_what_to_set():
    missing = api_error(404, "")
    missing.body = json.dumps({"kind": "Status", "reason": "NotFound", "details": {"name": "gpu-9", "kind": "nodes"},
                               "code": 404})

    class NoNodes(Nodes):
        def get(self, name):
            raise missing

    with pytest.raises(ApiError, match=r"^Node gpu-9 does not exist on https://10.0.0.1:6443: is the host's "
                                       r"Kubernetes node name right\?"):
        node_client(NoNodes()).get("gpu-9")
