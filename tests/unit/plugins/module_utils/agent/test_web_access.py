"""Who may read the agent's endpoint: basic authentication and its cache, and the server behind TLS with client
certificates (the agent's own server, in this process, answering /health and /healthz)."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import time

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent import server, web_access, web_config
from ansible_collections.scv.gpu.plugins.module_utils.agent.loop import Agent
from ansible_collections.scv.gpu.plugins.module_utils.agent.web_access import Authenticator, parse_basic
from ansible_collections.scv.gpu.plugins.module_utils.nvml.session import Session
from harness.agent_samples import QuietClient
from harness.tls_certs import TestPki, bcrypt_hash


def basic(user, password):
    return "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode()


def users_config(tmp_path, **users):
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users:\n" + "".join("  %s: '%s'\n" % item for item in users.items()))
    return web_config.load(str(path))


def test_a_right_password_is_checked_by_bcrypt_once_then_served_from_the_cache(tmp_path):
    web, auth = users_config(tmp_path, prometheus=bcrypt_hash("old")), Authenticator()
    assert auth.allows(web, basic("prometheus", "old")) and auth.allows(web, basic("prometheus", "old"))
    assert auth.bcrypt_checks == 1
    assert not auth.allows(web, basic("prometheus", "wrong")) and not auth.allows(web, basic("prometheus", "wrong"))
    assert auth.bcrypt_checks == 2                     # a failure is remembered too


def test_a_changed_hash_never_meets_an_old_answer(tmp_path):
    auth = Authenticator()
    before = users_config(tmp_path, prometheus=bcrypt_hash("old"))
    assert auth.allows(before, basic("prometheus", "old"))
    after = users_config(tmp_path, prometheus=bcrypt_hash("new"))
    assert not auth.allows(after, basic("prometheus", "old"))   # the old success is not reused
    assert auth.allows(after, basic("prometheus", "new")) and auth.bcrypt_checks == 3
    # and a failure remembered under the old hash does not refuse a password the new hash takes
    again = users_config(tmp_path, prometheus=bcrypt_hash("old"))
    assert auth.allows(again, basic("prometheus", "old")) and auth.bcrypt_checks == 4


def test_an_unknown_user_costs_a_bcrypt_check_and_is_refused(tmp_path):
    web, auth = users_config(tmp_path, prometheus=bcrypt_hash("pw")), Authenticator()
    assert not auth.allows(web, basic("grafana", "pw")) and auth.bcrypt_checks == 1


def test_a_crowd_of_wrong_passwords_does_not_push_out_the_scrapers_success(tmp_path):
    web, auth = users_config(tmp_path, prometheus=bcrypt_hash("pw")), Authenticator(size=3)
    assert auth.allows(web, basic("prometheus", "pw"))
    for attempt in range(10):
        assert not auth.allows(web, basic("prometheus", "guess%d" % attempt))
    checks = auth.bcrypt_checks
    assert auth.allows(web, basic("prometheus", "pw")) and auth.bcrypt_checks == checks
    assert not auth.allows(web, basic("prometheus", "guess0")) and auth.bcrypt_checks == checks + 1   # pushed out


def test_failed_handshakes_are_logged_once_a_minute_each_kind(caplog, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(web_access.time, "monotonic", lambda: clock[0])
    log = web_access.HandshakeLog()
    for _attempt in range(3):
        log.failed(("10.0.0.9", 4000), "plain HTTP to the TLS port (answered 400)")
    log.failed(("10.0.0.9", 4001), "PEER_DID_NOT_RETURN_A_CERTIFICATE")
    clock[0] += 59.0
    log.failed(("10.0.0.9", 4002), "PEER_DID_NOT_RETURN_A_CERTIFICATE")
    clock[0] += 1.0
    log.failed(("10.0.0.9", 4003), "PEER_DID_NOT_RETURN_A_CERTIFICATE")
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3 and all("from 10.0.0.9 failed" in line for line in lines), lines
    assert sum("PEER_DID_NOT_RETURN_A_CERTIFICATE" in line for line in lines) == 2


@pytest.mark.parametrize("header", [None, "", "Bearer abc", "Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode()])
def test_what_is_not_basic_credentials_is_refused_without_bcrypt(tmp_path, header):
    web, auth = users_config(tmp_path, prometheus=bcrypt_hash("pw")), Authenticator()
    assert parse_basic(header) is None and not auth.allows(web, header) and auth.bcrypt_checks == 0


def test_without_users_anyone_is_let_in(tmp_path):
    (tmp_path / "web.yml").write_text("")
    assert Authenticator().allows(web_config.load(str(tmp_path / "web.yml")), None)


# ------------------------------------------------------------------ the server


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return TestPki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def endpoint(pki, tmp_path, monkeypatch):
    """The agent's server on a free port, TLS with verified client certificates, one user, a header."""
    monkeypatch.setattr(server, "IDLE_POLL_S", 0.1)   # so that shutdown() is heard at once
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config:\n  cert_file: %s\n  key_file: %s\n  client_ca_file: %s\n"
                    "  client_auth_type: RequireAndVerifyClientCert\nbasic_auth_users:\n  prometheus: '%s'\n"
                    "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
                    % (pki.server[0], pki.server[1], pki.ca, bcrypt_hash("pw")))
    agent = Agent(QuietClient(), "gpu-1", Session(),
                  node_condition=False)
    bound = server.serve(agent, "127.0.0.1", 0, web_config.load(str(path)))
    bound.test_agent = agent
    yield bound
    bound.shutdown()
    bound.server_close()


def client_context(pki, certificate=True):
    context = ssl.create_default_context(cafile=str(pki.ca))
    if certificate:
        context.load_cert_chain(str(pki.client[0]), str(pki.client[1]))
    return context


def get(bound, context, path="/health", headers=None):
    connection = http.client.HTTPSConnection("127.0.0.1", bound.server_address[1], context=context, timeout=5)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_a_client_with_a_certificate_and_the_password_reads_health(endpoint, pki):
    status, headers, body = get(endpoint, client_context(pki), headers={"Authorization": basic("prometheus", "pw")})
    assert (status, body) == (200, b"OK")   # "starting": healthy, as dcgm-exporter's /health answers
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "deny"
    status, _headers, body = get(endpoint, client_context(pki), "/healthz", {"Authorization": basic("prometheus", "pw")})
    assert status == 200 and b'"status": "ok"' in body


def test_health_fails_when_healthz_does(endpoint, pki):
    endpoint.test_agent.last_tick_at = time.monotonic() - 1000
    status, headers, body = get(endpoint, client_context(pki), headers={"Authorization": basic("prometheus", "pw")})
    assert status == 503 and body.startswith(b"failing: no tick for 1000 s") and headers["X-Frame-Options"] == "deny"


@pytest.mark.parametrize("path", ["/metrics", "/health", "/healthz", "/nothing-here"])
def test_every_path_asks_for_the_password(endpoint, pki, path):
    for headers in ({}, {"Authorization": basic("prometheus", "wrong")}):
        status, answer, _body = get(endpoint, client_context(pki), path, headers)
        assert status == 401 and answer["WWW-Authenticate"] == "Basic"


def test_a_client_without_a_certificate_is_refused_in_the_handshake(endpoint, pki):
    with pytest.raises((ssl.SSLError, ConnectionError)):
        get(endpoint, client_context(pki, certificate=False), headers={"Authorization": basic("prometheus", "pw")})
    # a certificate of another CA is refused as well
    stranger = TestPki(pki.directory / "stranger", "stranger")
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(str(stranger.client[0]), str(stranger.client[1]))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        get(endpoint, context, headers={"Authorization": basic("prometheus", "pw")})


def test_plain_http_to_the_tls_port_is_told_to_use_https(endpoint):
    with socket.create_connection(endpoint.server_address, timeout=5) as connection:
        connection.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = connection.recv(4096)
    assert answer.startswith(b"HTTP/1.0 400 Bad Request") and b"https" in answer


def test_a_new_configuration_applies_to_the_next_connection(endpoint, pki, tmp_path):
    path = tmp_path / "web.yml"
    path.write_text(path.read_text().replace("RequireAndVerifyClientCert", "VerifyClientCertIfGiven"))
    endpoint.web = web_config.replacement(endpoint.web, str(path))
    status, _headers, _body = get(endpoint, client_context(pki, certificate=False),
                                  headers={"Authorization": basic("prometheus", "pw")})
    assert status == 200
