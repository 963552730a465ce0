"""The agent's credentials as kubelets have them, against the real kube-apiserver.

A kubelet's client certificate rotates: /var/lib/kubelet/pki/kubelet-client-current.pem is a
symlink that the kubelet points at a new file, and the old certificate then expires. The
agent must keep publishing through that. Kubeconfigs it cannot honour (credential plugins)
are refused with a message, inline keys never outlive the client's start, and a server that
accepts connections and never answers makes requests fail within the timeout.
"""

from __future__ import annotations

import base64
import datetime
import glob
import json
import os
import pathlib
import subprocess
import time

import pytest
import yaml

from harness.agent import AgentProcess, node_for
from harness.control_plane import CertificateAuthority, write_kubeconfig
from harness.stalled_server import stalled_kubeconfig

from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.kube.rest_client import RestClient
from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import SCV


class KubeletPki:
    """A kubelet's pki folder: kubelet-client-<n>.pem files and the kubelet-client-current.pem symlink."""

    def __init__(self, plane, node, directory):
        self.plane, self.node = plane, node
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.current = directory / "kubelet-client-current.pem"
        self.issued = 0

    def issue(self, lifetime):
        """A new certificate and key for system:node:<node>, in one PEM file as the kubelet writes it."""
        self.issued += 1
        ca = CertificateAuthority.load(self.plane.directory / "pki")
        cert, key = ca.issue("rotation-%s-%d" % (self.node, self.issued), "system:node:%s" % self.node,
                             "system:nodes", lifetime=lifetime)
        return cert.read_bytes() + key.read_bytes()

    def rotate(self, lifetime):
        """Writes a new kubelet-client-<n>.pem and points the symlink at it, as the kubelet does."""
        target = self.directory / ("kubelet-client-%d.pem" % (self.issued + 1))
        target.write_bytes(self.issue(lifetime))
        target.chmod(0o600)
        staged = self.directory / "kubelet-client-current.pem.new"
        staged.symlink_to(target.name)
        staged.replace(self.current)
        return target

    def kubeconfig(self, path):
        """The kubelet.conf shape: the CA inline, the client certificate and key from the rotating symlink."""
        ca = pathlib.Path(self.plane.state["ca"]).read_bytes()
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "default-cluster", "cluster": {
                "server": self.plane.server, "certificate-authority-data": base64.b64encode(ca).decode()}}],
            "users": [{"name": "default-auth", "user": {
                "client-certificate": str(self.current), "client-key": str(self.current)}}],
            "contexts": [{"name": "default-context", "context": {"cluster": "default-cluster", "user": "default-auth"}}],
            "current-context": "default-context",
        }))
        return path


def test_the_agent_keeps_publishing_after_its_certificate_rotates_and_the_old_one_expires(
        access, agent_command, tmp_path, request):
    plane = access
    node = node_for(request)
    plane.kubectl("delete", "scv", node, "--ignore-not-found")
    pki = KubeletPki(plane, node, tmp_path / "pki")
    first_lifetime = 15
    pki.rotate(datetime.timedelta(seconds=first_lifetime))
    expires = time.monotonic() + first_lifetime
    kubeconfig = pki.kubeconfig(tmp_path / "kubelet.conf")
    agent = AgentProcess(agent_command, plane, node, tmp_path, kubeconfig=kubeconfig)
    try:
        agent.wait_for(lambda: agent.scv()["status"]["freeMemorySum"] == 11950, 20)
        assert agent.metrics()["scv_agent_credential_reloads_total"] == 0

        pki.rotate(datetime.timedelta(days=1))
        time.sleep(max(0.0, expires - time.monotonic()) + 2)   # the first certificate has expired now
        agent.set_free_memory(3 * 2 ** 30)
        agent.wait_for(lambda: agent.scv()["status"]["freeMemorySum"] == 3072, 10)
        metrics = agent.metrics()
        assert metrics["scv_agent_credential_reloads_total"] == 1
        assert metrics["scv_agent_errors_total"] == 0, agent.log.read_text()

        # And again, with the agent's watch and writes carrying on after a second rotation.
        pki.rotate(datetime.timedelta(days=1))
        agent.set_free_memory(4 * 2 ** 30)
        agent.wait_for(lambda: agent.scv()["status"]["freeMemorySum"] == 4096, 10)
        assert agent.metrics()["scv_agent_credential_reloads_total"] == 2
    finally:
        agent.stop()
        plane.kubectl("delete", "scv", node, "--ignore-not-found")


def test_a_401_reads_the_credentials_again_when_the_change_was_not_seen(access, tmp_path):
    """A certificate rewritten in place with its size and time kept: only the 401 tells; one retry follows."""
    plane = access
    node = "agent-unseen-rotation"
    pki = KubeletPki(plane, node, tmp_path / "pki")
    target = pki.rotate(datetime.timedelta(seconds=6))
    expires = time.monotonic() + 6
    client = RestClient.from_file(str(pki.kubeconfig(tmp_path / "kubelet.conf")), timeout=5, resource=SCV)
    plane.kubectl("delete", "scv", node, "--ignore-not-found")
    assert client.get(node) is None

    before = os.stat(target)
    while True:   # an EC signature varies in length: issue until the file keeps its size
        fresh = pki.issue(datetime.timedelta(days=1))
        if len(fresh) == before.st_size:
            break
    with open(target, "r+b") as handle:
        handle.write(fresh)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (os.stat(target).st_ino, os.stat(target).st_size, os.stat(target).st_mtime_ns) == (
        before.st_ino, before.st_size, before.st_mtime_ns)
    time.sleep(max(0.0, expires - time.monotonic()) + 1)

    requests = client.requests
    assert client.get(node) is None
    assert client.requests == requests + 2      # the 401, then the retry with the new certificate
    assert client.reloads == 1


def _kubeconfig_with_user(plane, user):
    config = json.loads(plane.node_kubeconfig("agent-plugin").read_text())
    config["users"][0]["user"] = user
    return config


@pytest.mark.parametrize("user, named", [
    ({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws-iam-authenticator"}},
     "a credential plugin (users[].user.exec)"),
    ({"auth-provider": {"name": "oidc", "config": {"idp-issuer-url": "https://example.invalid"}}},
     "an auth-provider plugin (users[].user.auth-provider)"),
    ({"username": "admin", "password": "secret"}, "basic authentication (users[].user.username)"),
], ids=["exec", "auth-provider", "basic"])
def test_credential_plugins_are_refused_not_sent_without_credentials(access, agent_command, tmp_path, user, named):
    path = tmp_path / "plugin.kubeconfig"
    path.write_text(json.dumps(_kubeconfig_with_user(access, user)))
    with pytest.raises(ApiError) as caught:
        RestClient.from_file(str(path), resource=SCV)
    assert named in str(caught.value) and str(path) in str(caught.value)

    done = subprocess.run(agent_command + ["--kubeconfig", str(path), "--node-name", "agent-plugin"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    assert named in done.stderr and "client certificate or a token" in done.stderr


def test_inline_keys_never_outlive_the_client_start(access, tmp_path, monkeypatch):
    """Decoded keys go to a private folder that is gone on every path, failures included."""
    import tempfile

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    config = json.loads(access.node_kubeconfig("agent-inline-keys").read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    for entry, key in ((cluster, "certificate-authority"), (user, "client-certificate"), (user, "client-key")):
        entry[key + "-data"] = base64.b64encode(pathlib.Path(entry.pop(key)).read_bytes()).decode()
    other_key = pathlib.Path(access.node_kubeconfig("agent-other-key").parent / "pki" / "node-agent-other-key.key")

    broken = {
        "a key that is not base64": ("client-key-data", "not base64 at all!"),
        "a key that does not match the certificate": (
            "client-key-data", base64.b64encode(other_key.read_bytes()).decode()),
        "a CA that is not a certificate": ("certificate-authority-data", base64.b64encode(b"garbage").decode()),
    }
    for problem, (key, value) in broken.items():
        bad = json.loads(json.dumps(config))
        (bad["clusters"][0]["cluster"] if key.startswith("certificate") else bad["users"][0]["user"])[key] = value
        with pytest.raises(ApiError):
            RestClient(bad, resource=SCV)
        assert list(scratch.iterdir()) == [], problem
    client = RestClient(config, resource=SCV)
    assert list(scratch.iterdir()) == []
    access.kubectl("delete", "scv", "agent-inline-keys", "--ignore-not-found")
    assert client.get("agent-inline-keys") is None


def test_rest_client_reads_inline_kubeconfig_data(access, tmp_path):
    """Kubelet kubeconfigs carry the CA (and often the keys) inline, base64-encoded."""
    plane = access
    config = json.loads(pathlib.Path(plane.node_kubeconfig("agent-inline")).read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    for entry, key in ((cluster, "certificate-authority"), (user, "client-certificate"), (user, "client-key")):
        entry[key + "-data"] = base64.b64encode(pathlib.Path(entry.pop(key)).read_bytes()).decode()
    before = set(glob.glob("/tmp/scv-agent-*"))
    client = RestClient(config, resource=SCV)
    assert set(glob.glob("/tmp/scv-agent-*")) == before   # the inline keys left no files behind
    plane.kubectl("delete", "scv", "agent-inline", "--ignore-not-found")
    assert client.get("agent-inline") is None
    created = client.create({"apiVersion": "core.run-linux.com/v1", "kind": "Scv",
                             "metadata": {"name": "agent-inline"}, "spec": {"updateInterval": 1000}})
    assert created["metadata"]["name"] == "agent-inline"
    assert client.get("agent-inline")["spec"] == {"updateInterval": 1000}
    assert client.requests == 3
    plane.kubectl("delete", "scv", "agent-inline")


def test_the_agents_requests_give_up_on_a_server_that_never_answers(access, stalled_server, tmp_path):
    client = RestClient.from_file(str(stalled_kubeconfig(access, stalled_server, tmp_path / "k")), timeout=1.5, resource=SCV)
    # A watch of 300 s too: a server that takes the request and never begins its answer (an API server that is
    # starting) is given up on within the request timeout, not after the watch's 300 s.
    for tries, call in enumerate((lambda: client.get("stalled"), lambda: list(client.watch("stalled", "1", 1)),
                                  lambda: list(client.watch("stalled", None, 300))), start=1):
        start = time.monotonic()
        with pytest.raises(ApiError, match=r"did not answer within (1\.5|2\.5) s"):
            call()
        took = time.monotonic() - start
        # One connection per call, which waited the whole request timeout: no retry, and not the watch's 300 s
        # (the upper bound only tells those apart; a loaded machine can slow the call, never speed it up).
        assert len(stalled_server.held) == tries, len(stalled_server.held)
        assert 1.4 < took < 60, took


def test_an_expired_client_certificate_is_named_with_its_file_and_expiry(access, tmp_path):
    plane = access
    ca = CertificateAuthority.load(plane.directory / "pki")
    cert, key = ca.issue("expired-node", "system:node:expired-node", "system:nodes",
                         lifetime=datetime.timedelta(seconds=-60))   # not valid after a minute ago
    expired = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=60)
    kubeconfig = write_kubeconfig(tmp_path / "kubelet.conf", plane.server, plane.state["ca"], cert, key)
    client = RestClient.from_file(str(kubeconfig), timeout=5, resource=SCV)
    with pytest.raises(ApiError) as refused:
        client.get("expired-node")
    message = str(refused.value)
    assert "HTTP 401" in message and "the client certificate %s expired on " % cert in message
    stamp = message.rsplit("expired on ", 1)[1][:19]
    assert abs(datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.timezone.utc)
               - expired) < datetime.timedelta(seconds=5)


def test_another_clusters_ca_is_named_not_taken_for_the_network(access, tmp_path):
    plane = access
    (tmp_path / "other").mkdir()
    other = CertificateAuthority(tmp_path / "other")          # a CA that did not sign this API server
    ours = CertificateAuthority.load(plane.directory / "pki")
    cert, key = ours.issue("other-ca-node", "system:node:other-ca-node", "system:nodes")
    kubeconfig = write_kubeconfig(tmp_path / "kubelet.conf", plane.server, other.cert_path, cert, key)
    client = RestClient.from_file(str(kubeconfig), timeout=5, resource=SCV)
    with pytest.raises(ApiError) as refused:
        client.get("other-ca-node")
    message = str(refused.value)
    assert "is not vouched for by %s (unable to get local issuer certificate)" % other.cert_path in message
    assert "Check certificate-authority in %s" % kubeconfig in message
    assert "unreachable" not in message
