# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The web configuration file of the agent's HTTP endpoint: TLS, client certificates and basic authentication,
in the format (and with the meaning) of the Prometheus exporter-toolkit's web configuration file, which
dcgm-exporter takes as ``--web-config-file`` (private).

``load(path)`` reads and checks the whole file, or raises WebConfigError naming the file and the key. What
exporter-toolkit has and the agent does not is refused by name, never ignored. Relative paths in the file
are relative to the file's folder, as exporter-toolkit reads them. bcrypt is imported only when the file
names users.
"""

from __future__ import annotations

import os
import re
import ssl

from ansible_collections.scv.gpu.plugins.module_utils.common.value_kinds import json_kind

# exporter-toolkit's client_auth_type names: what Python's ssl does for each, or None where it cannot.
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
    "RequestClientCert": None,
    "RequireAnyClientCert": None,
    "RequireClientCert": None,   # exporter-toolkit's older name of RequireAnyClientCert
}
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# The headers exporter-toolkit lets a file add to every answer, and the values it allows (None: any).
HEADERS = {"Strict-Transport-Security": None, "X-Content-Type-Options": ("nosniff",),
           "X-Frame-Options": ("deny", "sameorigin"), "X-XSS-Protection": None, "Content-Security-Policy": None}
SECTIONS = ("tls_server_config", "http_server_config", "basic_auth_users")
TLS_KEYS = ("cert_file", "key_file", "client_ca_file", "client_ca", "client_auth_type", "min_version",
            "max_version")
HTTP_KEYS = ("headers", "http2")
# What exporter-toolkit reads and this agent does not, and what to do instead.
UNSUPPORTED = {
    "rate_limit": "the agent serves at most 8 requests at once; remove rate_limit",
    "tls_server_config.cert": "write the certificate to a file and name it in cert_file",
    "tls_server_config.key": "write the key to a file (mode 0600) and name it in key_file",
    "tls_server_config.cipher_suites": "the agent uses OpenSSL's default cipher suites; remove cipher_suites",
    "tls_server_config.curve_preferences": "the agent uses OpenSSL's default curves; remove curve_preferences",
    "tls_server_config.prefer_server_cipher_suites": "the agent uses OpenSSL's default order; remove it",
    "tls_server_config.client_allowed_sans": "give the agent a client CA that signs only the clients allowed "
                                             "(client_ca_file), and remove client_allowed_sans",
}
# A bcrypt hash that the bcrypt package checks: $2a$, $2b$, $2x$ or $2y$, a cost, 53 characters. (Go's
# library, exporter-toolkit's, also reads the first version's $2$, which no current tool writes.)
BCRYPT_HASH = re.compile(r"\$2[abxy]\$(\d\d)\$[./A-Za-z0-9]{53}\Z")
# The costs bcrypt takes, as Go's golang.org/x/crypto/bcrypt (exporter-toolkit's) and the bcrypt package check them.
BCRYPT_MIN_COST, BCRYPT_MAX_COST = 4, 31
HASH_HOWTO = ("write a bcrypt hash of the password (htpasswd -nBC 10 '' | tr -d ':\\n', or python3 -c "
              "\"import bcrypt, getpass; print(bcrypt.hashpw(getpass.getpass().encode(), bcrypt.gensalt()).decode())\")")


class WebConfigError(Exception):
    """A web configuration file that cannot be used; the message names the file, the key and what to do."""


class WebConfig:
    """A checked web configuration: ``tls`` (an ssl.SSLContext, or None for plain HTTP), ``users``
    ({name: bcrypt hash as bytes}, empty for no authentication), ``headers`` added to every answer,
    and ``decoy``: a hash of the users' cost that an unknown user's password is checked against, so
    that the time an answer takes does not tell which users exist."""

    def __init__(self, path, tls=None, client_auth="NoClientCert", users=None, headers=None):
        self.path, self.tls, self.client_auth = path, tls, client_auth
        self.users = dict(users or {})
        self.headers = dict(headers or {})
        self.decoy = None
        if self.users:
            import bcrypt   # only when the file names users: agents without basic auth never load it
            cost = max(int(BCRYPT_HASH.match(value.decode()).group(1)) for value in self.users.values())
            self.decoy = bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(max(cost, 4)))

    def describe(self):
        if self.tls is None:
            served = "plain HTTP"
        else:
            served = "TLS (client certificates: %s)" % self.client_auth
        return "%s, %s" % (served, "basic authentication for %d user(s)" % len(self.users) if self.users
                           else "no basic authentication")


def _fail(path, key, problem):
    raise WebConfigError("the web configuration file %s: %s: %s" % (path, key, problem))


def _mapping(path, key, value):
    if value is None:
        return {}
    if not isinstance(value, dict):
        _fail(path, key, "expected a mapping, got %s" % json_kind(value))
    return value


def _text(path, key, value):
    if not isinstance(value, str):
        _fail(path, key, "expected text, got %s" % json_kind(value))
    return value


def _check_keys(path, section, mapping, known):
    for key in mapping:
        name = "%s.%s" % (section, key) if section else str(key)
        if name in UNSUPPORTED:
            _fail(path, name, "exporter-toolkit reads it but this agent does not: %s" % UNSUPPORTED[name])
        if key not in known:
            _fail(path, name, "unknown key; known here: %s" % ", ".join(known))


def _read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise WebConfigError("cannot read the web configuration file %s: %s; fix the path in web-config-file, "
                             "or its permissions" % (path, error.strerror)) from error
    except UnicodeDecodeError as error:
        raise WebConfigError("the web configuration file %s is not UTF-8 text (byte %d); write it as UTF-8"
                             % (path, error.start)) from error
    import yaml
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise WebConfigError("the web configuration file %s is not YAML: %s" % (path, error)) from error
    return _mapping(path, "the whole file", document)


def _file(path, key, value):
    """A file the configuration names: relative to the configuration's folder, as exporter-toolkit reads it."""
    value = _text(path, key, value)
    if not value or "\0" in value:
        _fail(path, key, "expected a file path")
    return os.path.join(os.path.dirname(os.path.abspath(path)), value)


def _tls_context(path, section):
    """The server's ssl.SSLContext and the client_auth_type's name; (None, ...) when the section asks no TLS."""
    _check_keys(path, "tls_server_config", section, TLS_KEYS)
    key = "tls_server_config."
    auth = _text(path, key + "client_auth_type", section.get("client_auth_type") or "NoClientCert")
    if auth not in CLIENT_AUTH:
        _fail(path, key + "client_auth_type", "%r is none of %s" % (auth, ", ".join(CLIENT_AUTH)))
    if CLIENT_AUTH[auth] is None:
        _fail(path, key + "client_auth_type", "%s takes a client certificate without checking it, which this agent "
                                              "does not do: use RequireAndVerifyClientCert with client_ca_file" % auth)
    asked = [name for name in ("cert_file", "key_file", "client_ca_file", "client_ca", "client_auth_type")
             if section.get(name)]
    if not asked:
        return None, auth   # as exporter-toolkit: no TLS setting given, plain HTTP
    for name in ("cert_file", "key_file"):
        if not section.get(name):
            _fail(path, key + name, "missing: TLS needs both cert_file and key_file")
    if section.get("client_ca_file") and section.get("client_ca"):
        _fail(path, key + "client_ca", "give client_ca_file or client_ca, not both")
    has_ca = bool(section.get("client_ca_file") or section.get("client_ca"))
    if has_ca and CLIENT_AUTH[auth] == ssl.CERT_NONE:
        _fail(path, key + "client_auth_type", "a client CA is given but client_auth_type is NoClientCert, so no "
                                              "client certificate would be asked for: set RequireAndVerifyClientCert")
    if not has_ca and CLIENT_AUTH[auth] != ssl.CERT_NONE:
        _fail(path, key + "client_ca_file", "%s needs the CA that signs the client certificates: name it in "
                                            "client_ca_file" % auth)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = {}
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        version = _text(path, key + name, section.get(name) or default)
        if version not in TLS_VERSIONS:
            _fail(path, key + name, "%r is none of %s" % (version, ", ".join(TLS_VERSIONS)))
        versions[name] = TLS_VERSIONS[version]
    if versions["min_version"] > versions["max_version"]:
        _fail(path, key + "min_version", "is above max_version")
    try:
        context.minimum_version, context.maximum_version = versions["min_version"], versions["max_version"]
    except (ValueError, ssl.SSLError) as error:
        _fail(path, key + "min_version", "this OpenSSL refuses it: %s" % error)
    cert, private = _file(path, key + "cert_file", section["cert_file"]), _file(path, key + "key_file", section["key_file"])
    try:
        context.load_cert_chain(cert, private)
    except OSError as error:   # ssl.SSLError is an OSError
        _fail(path, key + "cert_file", "cannot load %s with the key %s: %s; give a PEM certificate and its PEM "
                                       "private key" % (cert, private, getattr(error, "strerror", None) or error))
    context.verify_mode = CLIENT_AUTH[auth]
    if has_ca:
        _load_client_ca(path, key, section, context)
    return context, auth


def _load_client_ca(path, key, section, context):
    try:
        if section.get("client_ca_file"):
            ca = _file(path, key + "client_ca_file", section["client_ca_file"])
            context.load_verify_locations(cafile=ca)
        else:
            context.load_verify_locations(cadata=_text(path, key + "client_ca", section["client_ca"]))
    except (OSError, ValueError) as error:
        name = "client_ca_file" if section.get("client_ca_file") else "client_ca"
        _fail(path, key + name, "cannot load the client CA: %s; give PEM certificates"
              % (getattr(error, "strerror", None) or error))


def _users(path, section):
    users = {}
    for user, hashed in section.items():
        key = "basic_auth_users.%s" % user
        if not isinstance(user, str) or not user or ":" in user:
            _fail(path, key, "a user name is text without ':' (basic authentication splits user and password there)")
        if not isinstance(hashed, str) or not BCRYPT_HASH.match(hashed):
            _fail(path, key, "the value is not a bcrypt hash: %s" % HASH_HOWTO)
        cost = int(BCRYPT_HASH.match(hashed).group(1))
        if not BCRYPT_MIN_COST <= cost <= BCRYPT_MAX_COST:
            _fail(path, key, "the hash's cost is %d, and bcrypt's costs go from %d to %d (no password can match it): "
                             "%s" % (cost, BCRYPT_MIN_COST, BCRYPT_MAX_COST, HASH_HOWTO))
        users[user] = hashed.encode("ascii")
    return users


def _headers(path, section):
    _check_keys(path, "http_server_config", section, HTTP_KEYS)
    if section.get("http2", False) is not False:
        _fail(path, "http_server_config.http2", "the agent serves HTTP/1.1 only: set it to false or remove it")
    headers = {}
    for name, value in _mapping(path, "http_server_config.headers", section.get("headers")).items():
        key = "http_server_config.headers.%s" % name
        if name not in HEADERS:
            _fail(path, key, "not a header exporter-toolkit lets a file set; allowed: %s" % ", ".join(HEADERS))
        value = _text(path, key, value)
        if HEADERS[name] is not None and value not in HEADERS[name]:
            _fail(path, key, "%r is none of %s" % (value, ", ".join(HEADERS[name])))
        if "\r" in value or "\n" in value:
            _fail(path, key, "a header value is one line")
        if value:   # blank: unset, as exporter-toolkit reads it
            headers[name] = value
    return headers


def load(path):
    """The WebConfig of the file at ``path``; WebConfigError naming the file and the key when it cannot be used."""
    document = _read(path)
    _check_keys(path, "", document, SECTIONS)
    tls, auth = _tls_context(path, _mapping(path, "tls_server_config", document.get("tls_server_config")))
    headers = _headers(path, _mapping(path, "http_server_config", document.get("http_server_config")))
    users = _users(path, _mapping(path, "basic_auth_users", document.get("basic_auth_users")))
    if users:
        try:
            import bcrypt  # noqa: F401  pylint: disable=unused-import
        except ImportError as error:
            raise WebConfigError("the web configuration file %s: basic_auth_users needs the bcrypt package (%s): "
                                 "the agent's requirements carry it; install them again" % (path, error)) from error
    return WebConfig(path, tls, auth, users, headers)


def replacement(old, path):
    """The WebConfig that SIGHUP puts in place of ``old``: the file read again; WebConfigError when it cannot be
    used or would turn off TLS or basic authentication (a half-written file must not open the endpoint)."""
    new = load(path)
    if old is not None and old.tls is not None and new.tls is None:
        raise WebConfigError("the web configuration file %s: tls_server_config: no longer asks for TLS; the agent "
                             "keeps serving TLS until it is restarted (systemctl restart scv-gpu-agent)" % path)
    if old is not None and old.users and not new.users:
        raise WebConfigError("the web configuration file %s: basic_auth_users: no longer names users; the agent "
                             "keeps asking for them until it is restarted (systemctl restart scv-gpu-agent)" % path)
    return new
