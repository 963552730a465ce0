"""The scv_agent role's protection of the metrics endpoint (tasks/web_config_checks.yml and web_config.yml) on this
host: the web configuration file it writes is one the agent itself loads, with a self-signed certificate made once,
modes 0600, check mode that writes nothing, a second run that changes nothing, a reload of the agent for new
certificates, and refusals naming the variable before anything changes. The whole role, with the service, runs in
molecule (extensions/molecule/scv_agent).

systemctl is a stand-in, first in PATH, that says the unit is running and logs what it is asked.
"""

from __future__ import annotations

import json
import os
import ssl
import socket
import stat
import threading

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent import web_config
from harness.ansible import recap
from harness.tls_certs import TestPki, bcrypt_hash

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Check the role's variables as tasks/main.yml does
      ansible.builtin.include_role:
        name: scv.gpu.scv_agent
        tasks_from: web_config_checks
    - name: Protect the endpoint as tasks/present.yml does
      ansible.builtin.include_role:
        name: scv.gpu.scv_agent
        tasks_from: web_config
"""

SYSTEMCTL = """#!/bin/sh
echo "$@" >> "$SCV_TEST_SYSTEMCTL_LOG"
if [ "$1" = show ]; then
  printf 'Id=scv-gpu-agent.service\\nNames=scv-gpu-agent.service\\nLoadState=loaded\\nActiveState=active\\n'
  printf 'SubState=running\\nUnitFileState=enabled\\nMainPID=1\\n'
fi
exit 0
"""


@pytest.fixture
def role(ansible, tmp_path, monkeypatch):
    """Runs the play with the role's variables given; returns (returncode, stdout, systemctl calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(SYSTEMCTL)
    (bin_dir / "systemctl").chmod(0o755)
    log = tmp_path / "systemctl.log"
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    monkeypatch.setenv("SCV_TEST_SYSTEMCTL_LOG", str(log))
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAY)

    def run(variables, *extra):
        log.write_text("")
        variables = dict({"scv_agent_config_file": str(tmp_path / "etc" / "agent.yml"),
                          "scv_agent_node_name": "gpu-node-1", "scv_agent_metrics_address": "10.0.0.7:9400",
                          "scv_agent_unit": {"changed": False}}, **variables)
        (tmp_path / "etc").mkdir(exist_ok=True)
        done = ansible.playbook(str(playbook), "titan_xp", "-e", json.dumps(variables), *extra)
        return done.returncode, done.stdout + done.stderr, log.read_text().splitlines()
    return run


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_a_self_signed_pair_made_once_and_a_web_config_the_agent_loads(role, tmp_path):
    etc = tmp_path / "etc"
    users = {"prometheus": bcrypt_hash("pw")}
    wanted = {"scv_agent_web_tls": True, "scv_agent_web_basic_auth_users": users}
    code, out, calls = role(wanted, "--check")
    assert code == 0, out
    assert recap(out)["changed"] >= 2 and not (etc / "web.yml").exists() and not (etc / "web-tls.crt").exists()
    assert not [call for call in calls if call.startswith(("reload", "restart"))]

    code, out, calls = role(wanted)
    assert code == 0, out
    assert mode(etc / "web.yml") == 0o600 and mode(etc / "web-tls.key") == 0o600
    assert (etc / "web.yml").stat().st_uid == os.getuid()
    web = web_config.load(str(etc / "web.yml"))           # the agent's own reading of what the role wrote
    assert web.users == {"prometheus": users["prometheus"].encode()} and web.tls is not None
    assert "restart scv-gpu-agent" in calls and "reload scv-gpu-agent" not in calls   # a restart reads it all
    certificate = (etc / "web-tls.crt").read_bytes()
    assert handshake_names(web.tls, etc / "web-tls.crt") == {"gpu-node-1", "localhost", "10.0.0.7"}

    code, out, calls = role(wanted)
    assert code == 0 and recap(out)["changed"] == 0, out
    assert (etc / "web-tls.crt").read_bytes() == certificate and not [c for c in calls if c.startswith(("reload", "restart"))]


def handshake_names(server_context, ca):
    """The names the self-signed certificate holds, read by a client that trusts it, over a real handshake."""
    client = ssl.create_default_context(cafile=str(ca))
    client.verify_flags &= ~ssl.VERIFY_X509_STRICT     # a self-signed leaf is its own CA
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        connection = socket.create_connection(listener.getsockname(), timeout=5)
        accepted, _address = listener.accept()
        serving = threading.Thread(target=lambda: server_context.wrap_socket(accepted, server_side=True).close())
        serving.start()
        with client.wrap_socket(connection, server_hostname="localhost") as secured:
            names = {value for _kind, value in secured.getpeercert()["subjectAltName"]}
        serving.join(5)
    return names & {"gpu-node-1", "localhost", "10.0.0.7"}


def test_given_certificates_and_a_client_ca_are_written_and_a_new_one_reloads_the_agent(role, tmp_path):
    pki, etc = TestPki(tmp_path / "pki"), tmp_path / "etc"
    wanted = {"scv_agent_web_tls": True, "scv_agent_web_tls_cert": pki.server[0].read_text(),
              "scv_agent_web_tls_key": pki.server[1].read_text(), "scv_agent_web_client_ca": pki.ca.read_text(),
              "scv_agent_web_client_auth_type": "RequireAndVerifyClientCert", "scv_agent_web_tls_min_version": "TLS13"}
    code, out, _calls = role(wanted)
    assert code == 0, out
    assert pki.server[1].read_text() not in out                 # the key is never logged
    web = web_config.load(str(etc / "web.yml"))
    assert web.client_auth == "RequireAndVerifyClientCert" and web.tls.minimum_version == ssl.TLSVersion.TLSv1_3
    assert mode(etc / "web-tls.key") == 0o600 and not web.users
    renewed = pki.issue("renewed", server=True)
    code, out, calls = role(dict(wanted, scv_agent_web_tls_cert=renewed[0].read_text(),
                                 scv_agent_web_tls_key=renewed[1].read_text()))
    assert code == 0 and recap(out)["changed"] == 3, out   # the two files and the reload
    assert "reload scv-gpu-agent" in calls and "restart scv-gpu-agent" not in calls


@pytest.mark.parametrize("variables, named", [
    ({"scv_agent_web_basic_auth_users": {"prometheus": "plain-password", "ok": bcrypt_hash("x")}},
     "scv_agent_web_basic_auth_users: prometheus: each value must be a bcrypt hash"),
    ({"scv_agent_web_tls": True, "scv_agent_web_client_auth_type": "RequireAndVerifyClientCert"},
     "scv_agent_web_client_auth_type RequireAndVerifyClientCert needs the CA"),
    ({"scv_agent_web_tls": True, "scv_agent_web_client_ca": "x"}, "scv_agent_web_client_auth_type is NoClientCert"),
    ({"scv_agent_web_tls": True, "scv_agent_web_tls_cert_file": "/etc/ssl/a.crt"},
     "scv_agent_web_tls_cert(_file) and scv_agent_web_tls_key(_file): give both"),
    ({"scv_agent_web_tls_cert_file": "/a.crt", "scv_agent_web_tls_key_file": "/a.key"},
     "scv_agent_web_tls is false"),
])
def test_wrong_variables_are_refused_naming_them_before_anything_changes(role, tmp_path, variables, named):
    code, out, _calls = role(variables)
    assert code != 0 and named in out, out
    assert not (tmp_path / "etc" / "web.yml").exists()
