"""The agent's endpoint behind its web configuration file (exporter-toolkit's format), run as the role installs
it: a real Prometheus scrapes it over TLS with a client certificate and a password, and the scrapes it must
refuse fail in Prometheus with their reason and store nothing; SIGHUP reads the file again; a bad file stops the
agent at start."""

from __future__ import annotations

import base64
import http.client
import os
import re
import signal
import ssl
import subprocess

import pytest

from harness.agent import AgentProcess, node_for
from harness.prometheus import REQUIRE_CERT, Prometheus, scrape_job as job, write_web_config
from harness.tls_certs import TestPki


@pytest.fixture
def secured(access, agent_command, tmp_path, request):
    """An agent whose endpoint asks for TLS, a client certificate of the test's CA and the password "first"."""
    node = node_for(request)
    access.kubectl("delete", "scv", node, "--ignore-not-found")
    pki = TestPki(tmp_path / "pki")
    web = pki.directory / "web.yml"            # relative paths: beside the file, as exporter-toolkit reads them
    write_web_config(web, pki, "first")
    agent = AgentProcess(agent_command, access, node, tmp_path, extra=("--web-config-file", str(web)))
    try:
        yield agent, pki, web
    finally:
        agent.stop()
        access.kubectl("delete", "scv", node, "--ignore-not-found")


def stored(prometheus, name):
    """The agent's own series that Prometheus stored for job ``name`` (not up and scrape_*, which it writes)."""
    return prometheus.query('count({job="%s", __name__=~"DCGM_.*|scv_.*"})' % name)


def get(agent, pki, path="/metrics", password="first"):
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(str(pki.client[0]), str(pki.client[1]))
    connection = http.client.HTTPSConnection("127.0.0.1", agent.port, context=context, timeout=10)
    try:
        credentials = base64.b64encode(b"prometheus:" + password.encode()).decode()
        connection.request("GET", path, headers={"Authorization": "Basic " + credentials})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_prometheus_scrapes_over_tls_with_a_client_certificate_and_the_refused_scrapes_store_nothing(
        secured, prometheus_bin, tmp_path):
    agent, pki, _web = secured
    prometheus = Prometheus(prometheus_bin, tmp_path, jobs=[
        job("allowed", agent, pki), job("wrong-password", agent, pki, password="second"),
        job("no-client-certificate", agent, pki, certificate=False), job("plain-http", agent, pki, scheme="http")])
    try:
        prometheus.wait_for(lambda: prometheus.query('DCGM_FI_DEV_GPU_TEMP{job="allowed"}')
                            and all(error for job_name, (_h, error) in prometheus.targets().items()
                                    if job_name != "allowed"), 60)
        targets = prometheus.targets()
        assert targets["allowed"] == ("up", "")
        assert targets["wrong-password"][0] == "down" and "401" in targets["wrong-password"][1]
        assert targets["no-client-certificate"][0] == "down"
        # TLS 1.3: the agent's alert for the missing certificate reaches Prometheus as such, or, on a loaded
        # machine where Prometheus has already sent its request, as the connection reset
        refusal = targets["no-client-certificate"][1]
        assert "certificate" in refusal or "connection reset by peer" in refusal, refusal
        assert targets["plain-http"][0] == "down" and "400" in targets["plain-http"][1]
        assert stored(prometheus, "allowed")
        for refused in ("wrong-password", "no-client-certificate", "plain-http"):
            assert not stored(prometheus, refused), refused
            assert prometheus.query('up{job="%s"} == 0' % refused)
    finally:
        prometheus.stop()
    log = agent.log.read_text()
    assert "TLS (client certificates: RequireAndVerifyClientCert), basic authentication for 1 user(s)" in log


def test_sighup_reads_the_file_again_and_a_broken_one_keeps_the_last_that_worked(secured):
    agent, pki, web = secured
    agent.wait_for(lambda: get(agent, pki, "/health") == (200, b"OK"), 60)
    write_web_config(web, pki, "second")
    os.kill(agent.process.pid, signal.SIGHUP)
    agent.wait_for(lambda: get(agent, pki, "/health", "second")[0] == 200, 30)
    assert get(agent, pki, "/health", "first")[0] == 401
    # a file half written, or wrong: the agent keeps serving as before, and says which key
    web.write_text(web.read_text().replace(REQUIRE_CERT, "RequireAnyClientCert"))
    os.kill(agent.process.pid, signal.SIGHUP)
    agent.wait_for(lambda: "keeping the web configuration in use" in agent.log.read_text(), 30)
    assert "tls_server_config.client_auth_type" in agent.log.read_text()
    assert get(agent, pki, "/health", "second")[0] == 200 and get(agent, pki, "/health", "first")[0] == 401
    web.write_text("")   # an empty file would turn TLS and passwords off: refused as well
    os.kill(agent.process.pid, signal.SIGHUP)
    agent.wait_for(lambda: "no longer asks for TLS" in agent.log.read_text(), 30)
    assert get(agent, pki, "/metrics", "second")[0] == 200 and agent.process.poll() is None
    # a hash whose cost bcrypt does not take once stopped the agent here with a traceback
    write_web_config(web, pki, "second")
    web.write_text(re.sub(r"\$2b\$\d\d\$", "$2b$99$", web.read_text()))
    os.kill(agent.process.pid, signal.SIGHUP)
    agent.wait_for(lambda: "the hash's cost is 99" in agent.log.read_text(), 30)
    assert get(agent, pki, "/metrics", "second")[0] == 200 and agent.process.poll() is None
    assert "Traceback" not in agent.log.read_text()


@pytest.mark.parametrize("text, key", [
    ("tls_server_config:\n  cert_file: server.crt\n", "tls_server_config.key_file"),
    ("basic_auth_users:\n  prometheus: not-a-hash\n", "basic_auth_users.prometheus"),
    ("basic_auth_users:\n  prometheus: '$2b$99$%s'\n" % ("a" * 53), "basic_auth_users.prometheus: the hash's cost"),
    ("tls_server_confg: {}\n", "tls_server_confg"),
])
def test_a_bad_file_stops_the_agent_at_start_naming_the_key(agent_command, tmp_path, text, key):
    web = tmp_path / "web.yml"
    web.write_text(text)
    done = subprocess.run(agent_command + ["--kubeconfig", str(tmp_path / "none"), "--node-name", "n",
                                           "--metrics-address", "127.0.0.1:9", "--web-config-file", str(web)],
                          capture_output=True, text=True, timeout=60, check=False, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert str(web) in done.stderr and key in done.stderr and "does not start" in done.stderr, done.stderr
