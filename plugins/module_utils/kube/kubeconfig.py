# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Kubeconfig files read with the standard library, for the Scv agent's own client (private).

The modules never read a kubeconfig themselves: kubernetes.core does, for them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import shutil
import ssl
import tempfile
import urllib.parse

from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError


UNSUPPORTED_USER_AUTH = (
    ("exec", "a credential plugin (users[].user.exec)"),
    ("auth-provider", "an auth-provider plugin (users[].user.auth-provider)"),
    ("username", "basic authentication (users[].user.username)"),
)


def load_kubeconfig(path):
    """A kubeconfig file as a dict (YAML with PyYAML when present; JSON otherwise)."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        import yaml
    except ImportError:
        return json.loads(text)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError("it is not YAML: %s" % " ".join(str(error).split())) from error


def file_signature(path):
    """What changes when a file (or the file a symlink points at) is replaced or rewritten."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino, found.st_mtime_ns, found.st_size)


def select_context(kubeconfig, origin):
    """(context name, cluster, user name, user) of the current context; an ApiError if there is none."""
    if not isinstance(kubeconfig, dict):
        raise ApiError("%s is not a kubeconfig: it holds %s, not a mapping with clusters, users and contexts"
                       % (origin, "nothing" if kubeconfig is None else "a %s" % type(kubeconfig).__name__))
    if not any(kubeconfig.get(key) for key in ("clusters", "contexts", "users")):
        raise ApiError("%s is not a kubeconfig: it has no clusters, contexts or users (keys: %s)"
                       % (origin, ", ".join(sorted(map(str, kubeconfig))) or "none"))
    try:
        context_name = kubeconfig.get("current-context")
        contexts = {c.get("name"): c.get("context") or {} for c in kubeconfig.get("contexts") or []}
        if context_name not in contexts:
            raise ApiError("%s has no current context (current-context: %r)" % (origin, context_name))
        context = contexts[context_name]
        cluster = {c.get("name"): c.get("cluster") for c in kubeconfig.get("clusters") or []}.get(context.get("cluster"))
        user_name = context.get("user")
        user = {u.get("name"): u.get("user") for u in kubeconfig.get("users") or []}.get(user_name) or {}
        if not isinstance(cluster, dict) or not cluster.get("server"):
            raise ApiError("%s: context %s names no cluster with a server" % (origin, context_name))
        if not isinstance(user, dict):
            raise ApiError("%s: user %s is not a mapping" % (origin, user_name))
    except (AttributeError, TypeError) as error:
        raise ApiError("%s is not a kubeconfig (expected mappings under clusters, users and contexts): %s"
                       % (origin, error)) from error
    return context_name, cluster, user_name, user


def not_after(certificate_file):
    """When the first certificate in ``certificate_file`` (PEM) expires, in seconds since the epoch; None if unknown.

    The standard library has no public certificate parser; CPython's ``ssl`` module decodes one for its
    own tests, and a certificate that does not decode costs only this detail of an error message.
    """
    try:
        decoded = ssl._ssl._test_decode_cert(certificate_file)  # pylint: disable=protected-access
        return ssl.cert_time_to_seconds(decoded["notAfter"])
    except Exception:  # pylint: disable=broad-exception-caught
        return None


class Credentials:
    """The TLS context and token of one reading of a kubeconfig, and the files it came from."""

    def __init__(self, kubeconfig, base_dir, origin):
        context_name, cluster, user_name, user = select_context(kubeconfig, origin)
        for key, what in UNSUPPORTED_USER_AUTH:
            if user.get(key):
                raise ApiError(
                    "%s: user %s authenticates with %s, which scv-gpu-agent does not run; give it a kubeconfig "
                    "with a client certificate or a token (the kubelet's /etc/kubernetes/kubelet.conf has one)"
                    % (origin, user_name, what))
        self.server = cluster["server"].rstrip("/")
        url = urllib.parse.urlsplit(self.server)
        if url.scheme != "https":
            raise ApiError("%s: server %s is not an https:// address" % (origin, self.server))
        self.host, self.port, self.prefix = url.hostname, url.port or 443, url.path
        self.files = []           # files read, watched for rotation
        self.certificate_expiry = None   # the client certificate's notAfter (seconds since the epoch), if known
        material = hashlib.sha256()
        private = tempfile.mkdtemp(prefix="scv-agent-")  # mode 0700: inline (-data) keys, removed below

        sources = {}

        def path_of(entry, key):
            if entry.get(key + "-data"):
                sources[key] = "the %s-data of %s" % (key, origin)
                try:
                    data = base64.b64decode(entry[key + "-data"], validate=True)
                except (binascii.Error, TypeError, ValueError) as error:
                    raise ApiError("%s: %s-data is not base64: %s" % (origin, key, error)) from error
                target = os.path.join(private, key)
                handle = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(handle, "wb") as stream:
                    stream.write(data)
                material.update(data)
                return target
            if entry.get(key):
                path = sources[key] = os.path.join(base_dir, entry[key])
                self.files.append(path)
                try:
                    with open(path, "rb") as stream:
                        material.update(stream.read())
                except OSError as error:
                    raise ApiError("%s: cannot read %s %s: %s" % (origin, key, path, error.strerror)) from error
                return path
            return None

        try:
            try:
                self.ssl = ssl.create_default_context(cafile=path_of(cluster, "certificate-authority"))
                if cluster.get("insecure-skip-tls-verify"):
                    self.ssl.check_hostname = False
                    self.ssl.verify_mode = ssl.CERT_NONE
                certificate = path_of(user, "client-certificate")
                key = path_of(user, "client-key")
                if certificate:
                    self.ssl.load_cert_chain(certificate, key or certificate)
                    self.certificate_expiry = not_after(certificate)
            except (ssl.SSLError, ValueError) as error:
                raise ApiError("%s: the certificates or key of user %s cannot be used: %s"
                               % (origin, user_name, error)) from error
        finally:
            # The context holds the keys now (or nothing does): inline ones never outlive this.
            shutil.rmtree(private, ignore_errors=True)
        # What error messages name: where the CA and the client certificate came from.
        self.ca_source = sources.get("certificate-authority", "the system's CA certificates")
        self.certificate_source = sources.get("client-certificate")
        self.token = user.get("token")
        if not self.token and user.get("tokenFile"):
            path = os.path.join(base_dir, user["tokenFile"])
            self.files.append(path)
            try:
                with open(path, encoding="utf-8") as handle:
                    self.token = handle.read().strip()
            except OSError as error:
                raise ApiError("%s: cannot read tokenFile %s: %s" % (origin, path, error.strerror)) from error
        material.update((self.token or "").encode())
        self.fingerprint = material.hexdigest()
