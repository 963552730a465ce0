"""The modules' credential messages: an expired client certificate and another cluster's CA are named as such, with
their files, not reported as a bare 401 or as an unreachable API server."""

from __future__ import annotations

import datetime

from harness.control_plane import CertificateAuthority, write_kubeconfig


def test_an_expired_client_certificate_is_named(ansible, control_plane, tmp_path):
    ca = CertificateAuthority.load(control_plane.directory / "pki")
    cert, key = ca.issue("expired-admin", "expired-admin", "system:masters", lifetime=datetime.timedelta(seconds=-60))
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", control_plane.server, control_plane.state["ca"], cert, key)
    ok, result = ansible.module({"name": "node-x", "state": "cordoned", "kubeconfig": str(kubeconfig)},
                                name="scv.gpu.node_cordon", simulator=False)
    assert not ok
    assert "does not accept these credentials (401)" in result["msg"]
    assert "the client certificate %s expired on 20" % cert in result["msg"]


def test_another_clusters_ca_is_named_not_the_network(ansible, control_plane, tmp_path):
    (tmp_path / "other").mkdir()
    other = CertificateAuthority(tmp_path / "other")
    cert, key = CertificateAuthority.load(control_plane.directory / "pki").issue("admin-x", "admin-x", "system:masters")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", control_plane.server, other.cert_path, cert, key)
    ok, result = ansible.module({"name": "node-x", "state": "cordoned", "kubeconfig": str(kubeconfig)},
                                name="scv.gpu.node_cordon", simulator=False)
    assert not ok
    assert "is not vouched for by %s (" % other.cert_path in result["msg"]
    assert "is that this cluster's CA?" in result["msg"] and "unreachable" not in result["msg"]
