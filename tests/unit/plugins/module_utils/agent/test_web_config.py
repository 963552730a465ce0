"""The web configuration file (exporter-toolkit's format): what it asks for, and every refusal naming the file
and the key."""

from __future__ import annotations

import ssl
import subprocess
import sys

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent import web_config
from harness.paths import ROOT
from harness.tls_certs import TestPki, bcrypt_hash


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return TestPki(tmp_path_factory.mktemp("pki"))


def write(tmp_path, text, name="web.yml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def tls(pki, **extra):
    lines = ["tls_server_config:", "  cert_file: %s" % pki.server[0], "  key_file: %s" % pki.server[1]]
    lines += ["  %s: %s" % item for item in extra.items()]
    return "\n".join(lines) + "\n"


def test_tls_with_verified_client_certificates_users_and_headers(pki, tmp_path):
    hashed = bcrypt_hash("secret")
    path = write(tmp_path, tls(pki, client_ca_file=pki.ca, client_auth_type="RequireAndVerifyClientCert",
                               min_version="TLS13")
                 + "basic_auth_users:\n  prometheus: '%s'\n" % hashed
                 + "http_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n"
                   "    Content-Security-Policy: ''\n")
    web = web_config.load(path)
    assert web.tls.verify_mode == ssl.CERT_REQUIRED and web.tls.minimum_version == ssl.TLSVersion.TLSv1_3
    assert web.users == {"prometheus": hashed.encode()}
    assert web.headers == {"X-Frame-Options": "deny"}           # blank: unset
    assert web.decoy and web.decoy != hashed.encode()
    assert web.describe() == ("TLS (client certificates: RequireAndVerifyClientCert), basic authentication for "
                              "1 user(s)")


def test_relative_paths_are_read_from_the_files_folder(pki):
    path = write(pki.directory, "tls_server_config:\n  cert_file: %s\n  key_file: %s\n  client_ca: |\n%s"
                 % (pki.server[0].name, pki.server[1].name,
                    "".join("    " + line for line in pki.ca.read_text().splitlines(True)))
                 + "  client_auth_type: VerifyClientCertIfGiven\n")
    web = web_config.load(path)
    assert web.tls.verify_mode == ssl.CERT_OPTIONAL and not web.users


@pytest.mark.parametrize("text", ["", "{}\n", "tls_server_config: {}\nbasic_auth_users:\n"])
def test_an_empty_file_or_empty_sections_serve_plain_http_to_anyone(tmp_path, text):
    web = web_config.load(write(tmp_path, text))
    assert web.tls is None and web.users == {} and web.describe() == "plain HTTP, no basic authentication"


REFUSALS = [
    # (file text, or a function of the PKI giving it; the key the refusal must name)
    ("tls_config:\n  cert_file: a\n", "tls_config: unknown key"),
    ("- tls_server_config\n", "the whole file: expected a mapping"),
    ("basic_auth_users: [a]\n", "basic_auth_users: expected a mapping"),
    ("tls_server_config: {cert_file: [", "is not YAML"),
    ("rate_limit:\n  interval: 1s\n", "rate_limit: exporter-toolkit reads it but this agent does not"),
    ("tls_server_config:\n  cert: abc\n", "tls_server_config.cert: exporter-toolkit reads it"),
    ("tls_server_config:\n  key: abc\n", "tls_server_config.key: exporter-toolkit reads it"),
    ("tls_server_config:\n  client_allowed_sans: [a]\n", "tls_server_config.client_allowed_sans: exporter-toolkit"),
    ("tls_server_config:\n  cipher_suites: [a]\n", "tls_server_config.cipher_suites: exporter-toolkit"),
    ("tls_server_config:\n  curve_preferences: [a]\n", "tls_server_config.curve_preferences: exporter-toolkit"),
    ("tls_server_config:\n  prefer_server_cipher_suites: true\n", "tls_server_config.prefer_server_cipher_suites"),
    ("tls_server_config:\n  cert_flie: a\n", "tls_server_config.cert_flie: unknown key"),
    (lambda pki: "tls_server_config:\n  cert_file: %s\n" % pki.server[0], "tls_server_config.key_file: missing"),
    (lambda pki: "tls_server_config:\n  key_file: %s\n" % pki.server[1], "tls_server_config.cert_file: missing"),
    ("tls_server_config:\n  client_auth_type: RequireAndVerifyClientCert\n", "tls_server_config.cert_file: missing"),
    (lambda pki: tls(pki, client_ca_file=pki.ca), "tls_server_config.client_auth_type: a client CA is given"),
    (lambda pki: tls(pki, client_ca_file=pki.ca, client_auth_type="NoClientCert"),
     "tls_server_config.client_auth_type: a client CA is given"),
    (lambda pki: tls(pki, client_auth_type="RequireAndVerifyClientCert"),
     "tls_server_config.client_ca_file: RequireAndVerifyClientCert needs the CA"),
    (lambda pki: tls(pki, client_auth_type="VerifyClientCertIfGiven"), "tls_server_config.client_ca_file"),
    (lambda pki: tls(pki, client_ca_file=pki.ca, client_auth_type="RequireAnyClientCert"),
     "tls_server_config.client_auth_type: RequireAnyClientCert takes a client certificate without checking"),
    (lambda pki: tls(pki, client_ca_file=pki.ca, client_auth_type="RequestClientCert"),
     "tls_server_config.client_auth_type: RequestClientCert"),
    (lambda pki: tls(pki, client_auth_type="Required"), "tls_server_config.client_auth_type: 'Required' is none of"),
    (lambda pki: tls(pki, client_ca_file=pki.ca, client_ca="x", client_auth_type="RequireAndVerifyClientCert"),
     "tls_server_config.client_ca: give client_ca_file or client_ca, not both"),
    (lambda pki: tls(pki, client_ca_file=pki.server[1], client_auth_type="RequireAndVerifyClientCert"),
     "tls_server_config.client_ca_file: cannot load the client CA"),
    (lambda pki: tls(pki, min_version="TLS14"), "tls_server_config.min_version: 'TLS14' is none of"),
    (lambda pki: tls(pki, max_version="TLS11"), "tls_server_config.min_version: is above max_version"),
    (lambda pki: tls(pki, max_version=5), "tls_server_config.max_version: expected text, got number"),
    (lambda pki: "tls_server_config:\n  cert_file: %s\n  key_file: %s\n" % (pki.server[0], pki.client[1]),
     "tls_server_config.cert_file: cannot load"),
    (lambda pki: "tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: %s\n" % pki.server[1],
     "tls_server_config.cert_file: cannot load /nonexistent.crt"),
    ("basic_auth_users:\n  john: doe\n", "basic_auth_users.john: the value is not a bcrypt hash"),
    ("basic_auth_users:\n  john: 5\n", "basic_auth_users.john: the value is not a bcrypt hash"),
    ("basic_auth_users:\n  john: '$2$10$%s'\n" % ("a" * 53), "basic_auth_users.john: the value is not a bcrypt hash"),
    # a cost bcrypt does not take: the agent stopped with a traceback at start, and on SIGHUP
    ("basic_auth_users:\n  john: '$2b$99$%s'\n" % ("a" * 53), "basic_auth_users.john: the hash's cost is 99, and "
                                                              "bcrypt's costs go from 4 to 31"),
    ("basic_auth_users:\n  john: '$2b$03$%s'\n" % ("a" * 53), "basic_auth_users.john: the hash's cost is 3"),
    ("basic_auth_users:\n  'jo:hn': '%s'\n" % bcrypt_hash("x"), "basic_auth_users.jo:hn: a user name is text"),
    ("basic_auth_users:\n  '': '%s'\n" % bcrypt_hash("x"), "basic_auth_users.: a user name is text"),
    ("basic_auth_users:\n  5: '%s'\n" % bcrypt_hash("x"), "basic_auth_users.5: a user name is text"),
    ("http_server_config:\n  headers:\n    Content-Security-Policy: \"a\\nb\"\n",
     "http_server_config.headers.Content-Security-Policy: a header value is one line"),
    ("http_server_config:\n  headers:\n    Content-Security-Policy: \"a\\rb\"\n",
     "http_server_config.headers.Content-Security-Policy: a header value is one line"),
    (lambda pki: "tls_server_config:\n  cert_file: \"a\\0b\"\n  key_file: %s\n" % pki.server[1],
     "tls_server_config.cert_file: expected a file path"),
    ("http_server_config:\n  http2: true\n", "http_server_config.http2: the agent serves HTTP/1.1 only"),
    ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
     "http_server_config.headers.X-Frame-Options: 'allow' is none of deny, sameorigin"),
    ("http_server_config:\n  headers:\n    Server: mine\n", "http_server_config.headers.Server: not a header"),
    ("http_server_config:\n  keepalive: true\n", "http_server_config.keepalive: unknown key"),
]


@pytest.mark.parametrize("text, named", REFUSALS,
                         ids=[named.split(":")[0] + str(index) for index, (_t, named) in enumerate(REFUSALS)])
def test_every_refusal_names_the_file_and_the_key(pki, tmp_path, text, named):
    path = write(tmp_path, text(pki) if callable(text) else text)
    with pytest.raises(web_config.WebConfigError) as raised:
        web_config.load(path)
    assert path in str(raised.value) and named in str(raised.value), str(raised.value)


def test_a_file_that_cannot_be_read_is_named(tmp_path):
    with pytest.raises(web_config.WebConfigError, match="cannot read the web configuration file %s" % tmp_path):
        web_config.load(str(tmp_path / "missing.yml"))


def test_sighup_refuses_a_file_that_would_turn_off_tls_or_basic_authentication(pki, tmp_path):
    path = write(tmp_path, tls(pki) + "basic_auth_users:\n  p: '%s'\n" % bcrypt_hash("x"))
    old = web_config.load(path)
    write(tmp_path, "basic_auth_users:\n  p: '%s'\n" % bcrypt_hash("x"))
    with pytest.raises(web_config.WebConfigError, match="tls_server_config: no longer asks for TLS"):
        web_config.replacement(old, path)
    write(tmp_path, tls(pki))
    with pytest.raises(web_config.WebConfigError, match="basic_auth_users: no longer names users"):
        web_config.replacement(old, path)
    write(tmp_path, tls(pki) + "basic_auth_users:\n  q: '%s'\n" % bcrypt_hash("y"))
    assert set(web_config.replacement(old, path).users) == {"q"}


def test_bcrypt_is_imported_only_when_the_file_names_users(pki, tmp_path):
    plain = write(tmp_path, tls(pki), "plain.yml")
    users = write(tmp_path, "basic_auth_users:\n  p: '%s'\n" % bcrypt_hash("x"), "users.yml")
    probe = ("import sys; from ansible_collections.scv.gpu.plugins.module_utils.agent import server, web_config; "
             "web_config.load(sys.argv[1]); print('bcrypt' in sys.modules)")
    for path, loaded in ((plain, "False"), (users, "True")):
        done = subprocess.run([sys.executable, "-c", probe, path], capture_output=True, text=True, check=True,
                              env={"PYTHONPATH": str(ROOT / "build" / "collections")})
        assert done.stdout.strip() == loaded, done.stderr
