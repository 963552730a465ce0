# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Kubernetes API calls for Scv objects and Node labels.

``ScvClient`` and ``NodeClient`` use kubernetes.core's client (modules, on the controller).
``RestScvClient`` speaks HTTPS with the standard library only, for the Scv agent on each node,
where neither Ansible nor the kubernetes package is installed (and would cost memory).

This file is private to the collection (its name starts with ``_``) and is the
only one that calls the Kubernetes API. Connections and authentication come
from kubernetes.core (``get_api_client``), so users configure scv.gpu exactly as
they configure ``kubernetes.core.k8s``. Every failure becomes an
:class:`ScvApiError` whose message names the verb, the object and what to do.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import traceback

try:
    from kubernetes.dynamic.exceptions import (
        DynamicApiError,
        NotFoundError,
        ResourceNotFoundError,
    )
    from urllib3.exceptions import HTTPError as TransportError
except ImportError:
    HAS_KUBERNETES = False
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()
else:
    HAS_KUBERNETES = True
    KUBERNETES_IMPORT_ERROR = None

try:
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.exceptions import CoreException
except ImportError:
    # The Scv agent runs on nodes without Ansible; it uses RestScvClient below.
    get_api_client = None

    class CoreException(Exception):
        """Stands in for kubernetes.core's exception where kubernetes.core is absent."""

from ansible_collections.scv.gpu.plugins.module_utils._scv_status import API_VERSION, CRD_NAME, KIND

FIELD_MANAGER = "scv.gpu"
DEFAULT_REQUEST_TIMEOUT = 30.0
CRD_HINT = ("install it with the scv.gpu.scv_publish role, or: "
            "kubectl apply -f roles/scv_publish/files/scvs.core.run-linux.com.yml (in the scv.gpu collection)")


class ScvApiError(Exception):
    """A failed API call, explained. ``conflict`` is True for HTTP 409; ``status`` is the HTTP status if any."""

    def __init__(self, message, conflict=False, status=None):
        super().__init__(message)
        self.conflict = conflict
        self.status = status


_NO_DEFAULT = object()


def _causes(error):
    """The fields a 422 names, as ``field: message`` lines."""
    try:
        details = json.loads(error.body).get("details") or {}
    except (TypeError, ValueError):
        return []
    return ["%s: %s" % (cause.get("field", "?"), cause.get("message", "")) for cause in details.get("causes", [])]


def _crd_missing(server):
    return ScvApiError("the %s custom resource definition is not installed on %s (the API server does not serve "
                       "%s %s): %s" % (CRD_NAME, server, API_VERSION, KIND, CRD_HINT))


def _is_missing_object(error):
    """A 404 for an object that does not exist carries a Status; one for an unserved resource does not."""
    try:
        return json.loads(error.body).get("reason") == "NotFound"
    except (TypeError, ValueError, AttributeError):
        return False


class _DeadlinePassed(BaseException):
    """Raised by the alarm of ``_deadline`` inside a call that took too long.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` in the kubernetes
    client can swallow it and carry on waiting.
    """


@contextlib.contextmanager
def _deadline(seconds):
    """Interrupts the block after ``seconds``, with _DeadlinePassed.

    The kubernetes client sends requests without a timeout unless each call passes one, and
    kubernetes.core's discovery (run while connecting) passes none: a server that accepts the
    connection and never answers would hold the module forever. A timer bounds the whole call,
    retries included. Modules run single-threaded, in the main thread, where signals arrive;
    elsewhere the block runs unbounded, as before.
    """
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(_signum, _frame):
        raise _DeadlinePassed()

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        # None: the previous handler was not set from Python; the default is what it was.
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)


def explain(error, verb, target, server, timeout=None):
    """Turn an exception from the kubernetes client into an ScvApiError."""
    if isinstance(error, _DeadlinePassed):
        return ScvApiError("cannot %s %s: the Kubernetes API at %s did not answer within %s (raise request_timeout "
                           "if the server is slow rather than stalled)"
                           % (verb, target, server, "%g s" % timeout if timeout else "the request timeout"))
    if isinstance(error, ResourceNotFoundError):
        return _crd_missing(server)
    if isinstance(error, DynamicApiError) and error.status == 404 and not _is_missing_object(error):
        # Discovery was cached while the CRD existed; the API server no longer serves it.
        return _crd_missing(server)
    if isinstance(error, CoreException):
        return ScvApiError("cannot %s %s: no usable Kubernetes client configuration: %s" % (verb, target, error))
    if isinstance(error, DynamicApiError):
        summary = error.summary()
        if isinstance(summary, bytes):
            summary = summary.decode("utf-8", "replace")
        if error.status == 401:
            return ScvApiError("cannot %s %s: the API server at %s does not accept these credentials (401): %s"
                               % (verb, target, server, summary))
        if error.status == 403:
            return ScvApiError("cannot %s %s: forbidden (403): %s" % (verb, target, summary))
        if error.status == 409:
            return ScvApiError("cannot %s %s: conflict (409): %s" % (verb, target, summary), conflict=True)
        if error.status == 422:
            causes = _causes(error)
            return ScvApiError("cannot %s %s: the API server rejected it as invalid (422): %s%s" % (
                verb, target, summary, "".join("\n  - " + cause for cause in causes)))
        return ScvApiError("cannot %s %s: HTTP %s from %s: %s" % (verb, target, error.status, server, summary))
    if isinstance(error, TransportError):
        pool = getattr(error, "pool", None)
        if pool is not None:
            server = "%s://%s:%s" % (pool.scheme, pool.host, pool.port)
        return ScvApiError("cannot %s %s: the Kubernetes API at %s is unreachable: %s" % (verb, target, server, error))
    return ScvApiError("cannot %s %s: %s" % (verb, target, error))


def _server_of(params):
    """The API server that connection options point at, for messages: host, else the kubeconfig's."""
    import os
    if params.get("host"):
        return params["host"]
    try:
        kubeconfig = params.get("kubeconfig") or os.environ.get("K8S_AUTH_KUBECONFIG") or os.environ.get(
            "KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]
        if not isinstance(kubeconfig, dict):
            kubeconfig = load_kubeconfig(os.path.expanduser(kubeconfig))
        if params.get("context"):
            kubeconfig = dict(kubeconfig, **{"current-context": params["context"]})
        return _select_context(kubeconfig, "the kubeconfig")[1]["server"]
    except (OSError, ValueError, ScvApiError):
        return "the API server"


class _Client:
    """A kubernetes.core client with calls that fail as explained ScvApiErrors."""

    def __init__(self, k8s_client):
        self._client = k8s_client
        self._resource = None
        self.server = k8s_client.configuration.host
        self.timeout = None

    @classmethod
    def connect(cls, module=None, **auth):
        """A client configured from a module's kubernetes.core auth options (or ``auth``).

        ``request_timeout`` (a module option, or a keyword here) bounds connecting (which runs
        discovery) and every call after it.
        """
        params = module.params if module else auth
        timeout = params.get("request_timeout") or DEFAULT_REQUEST_TIMEOUT
        auth.pop("request_timeout", None)
        try:
            with _deadline(timeout):
                client = cls(get_api_client(module=module, **auth))
        except (Exception, _DeadlinePassed) as error:  # pylint: disable=broad-exception-caught
            raise explain(error, "connect to", "the Kubernetes API", _server_of(params),
                          timeout) from error
        client.timeout = timeout
        return client

    def _call(self, verb, target, function, *args, **kwargs):
        try:
            with _deadline(self.timeout):
                return function(*args, **kwargs)
        except (Exception, _DeadlinePassed) as error:  # pylint: disable=broad-exception-caught
            raise explain(error, verb, target, self.server, self.timeout) from error

    @staticmethod
    def _write_options(check_mode):
        options = {"field_manager": FIELD_MANAGER}
        if check_mode:
            options["dry_run"] = "All"
        return options

    def _call_or_missing(self, missing, verb, target, function, **kwargs):
        """Like _call, but a 404 for an object that does not exist returns ``missing``."""
        try:
            with _deadline(self.timeout):
                return function(**kwargs)
        except (Exception, _DeadlinePassed) as error:  # pylint: disable=broad-exception-caught
            if isinstance(error, NotFoundError) and _is_missing_object(error):
                return missing
            raise explain(error, verb, target, self.server, self.timeout) from error


class ScvClient(_Client):
    """Get, create, replace and delete Scv objects."""

    @property
    def resource(self):
        if self._resource is None:
            self._resource = self._call("discover", "the %s API" % API_VERSION,
                                        self._client.resource, KIND, API_VERSION)
        return self._resource

    def get(self, name):
        """The Scv named ``name`` as a dict, or None when there is none."""
        found = self._call_or_missing(None, "get", "Scv %s" % name, self.resource.get, name=name)
        return None if found is None else found.to_dict()

    def create(self, body, check_mode=False):
        name = body["metadata"]["name"]
        return self._call("create", "Scv %s" % name, self.resource.create,
                          body=body, **self._write_options(check_mode)).to_dict()

    def replace(self, body, check_mode=False):
        name = body["metadata"]["name"]
        return self._call("update", "Scv %s" % name, self.resource.replace,
                          body=body, name=name, **self._write_options(check_mode)).to_dict()

    def replace_status(self, body, check_mode=False):
        name = body["metadata"]["name"]
        return self._call("update", "the status of Scv %s" % name, self.resource.status.replace,
                          body=body, name=name, **self._write_options(check_mode)).to_dict()

    def delete(self, name, check_mode=False):
        """Delete Scv ``name``; False when there was none."""
        deleted = self._call_or_missing(False, "delete", "Scv %s" % name, self.resource.delete,
                                        name=name, **({"dry_run": "All"} if check_mode else {}))
        return deleted is not False


class NodeClient(_Client):
    """Read and patch the labels of Node objects."""

    @property
    def resource(self):
        if self._resource is None:
            self._resource = self._call("discover", "the v1 API", self._client.resource, "Node", "v1")
        return self._resource

    def get(self, name):
        """Node ``name`` as a dict; an error that says so when it does not exist."""
        found = self._call_or_missing(None, "get", "Node %s" % name, self.resource.get, name=name)
        if found is None:
            raise ScvApiError("Node %s does not exist on %s: is the host's Kubernetes node name right? "
                              "(set it per host; it defaults to the inventory name)" % (name, self.server))
        return found.to_dict()

    def patch(self, name, body, resource_version, what, check_mode=False):
        """A merge patch of Node ``name`` that fails (409) if the Node moved on; ``what`` names it in errors."""
        body = dict(body, metadata=dict(body.get("metadata") or {}, resourceVersion=resource_version))
        return self._call("patch", "%s of Node %s" % (what, name), self.resource.patch, body=body, name=name,
                          content_type="application/merge-patch+json", **self._write_options(check_mode)).to_dict()

    def update(self, name, decide, what, check_mode=False, attempts=3):
        """Reads Node ``name``, asks ``decide(node)`` for a merge patch (None: nothing to change) and
        applies it; a 409 (the Node changed meanwhile) reads and decides again.

        Returns (node before, node after, the patch or None).
        """
        for attempt in range(attempts):
            node = self.get(name)
            body = decide(node)
            if body is None:
                return node, node, None
            try:
                return node, self.patch(name, body, node["metadata"]["resourceVersion"], what, check_mode), body
            except ScvApiError as error:
                if not (error.conflict and attempt + 1 < attempts):
                    raise
        raise AssertionError("unreachable")


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
    return yaml.safe_load(text)


def _file_signature(path):
    """What changes when a file (or the file a symlink points at) is replaced or rewritten."""
    import os
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino, found.st_mtime_ns, found.st_size)


def _select_context(kubeconfig, origin):
    """(context name, cluster, user name, user) of the current context; an ScvApiError if there is none."""
    try:
        context_name = kubeconfig.get("current-context")
        contexts = {c.get("name"): c.get("context") or {} for c in kubeconfig.get("contexts") or []}
        if context_name not in contexts:
            raise ScvApiError("%s has no current context (current-context: %r)" % (origin, context_name))
        context = contexts[context_name]
        cluster = {c.get("name"): c.get("cluster") for c in kubeconfig.get("clusters") or []}.get(context.get("cluster"))
        user_name = context.get("user")
        user = {u.get("name"): u.get("user") for u in kubeconfig.get("users") or []}.get(user_name) or {}
        if not isinstance(cluster, dict) or not cluster.get("server"):
            raise ScvApiError("%s: context %s names no cluster with a server" % (origin, context_name))
        if not isinstance(user, dict):
            raise ScvApiError("%s: user %s is not a mapping" % (origin, user_name))
    except (AttributeError, TypeError) as error:
        raise ScvApiError("%s is not a kubeconfig (expected mappings under clusters, users and contexts): %s"
                          % (origin, error)) from error
    return context_name, cluster, user_name, user


class _Credentials:
    """The TLS context and token of one reading of a kubeconfig, and the files it came from."""

    def __init__(self, kubeconfig, base_dir, origin):
        import base64
        import binascii
        import hashlib
        import os
        import shutil
        import ssl
        import tempfile
        import urllib.parse

        context_name, cluster, user_name, user = _select_context(kubeconfig, origin)
        for key, what in UNSUPPORTED_USER_AUTH:
            if user.get(key):
                raise ScvApiError(
                    "%s: user %s authenticates with %s, which scv-gpu-agent does not run; give it a kubeconfig "
                    "with a client certificate or a token (the kubelet's /etc/kubernetes/kubelet.conf has one)"
                    % (origin, user_name, what))
        self.server = cluster["server"].rstrip("/")
        url = urllib.parse.urlsplit(self.server)
        if url.scheme != "https":
            raise ScvApiError("%s: server %s is not an https:// address" % (origin, self.server))
        self.host, self.port, self.prefix = url.hostname, url.port or 443, url.path
        self.files = []           # files read, watched for rotation
        material = hashlib.sha256()
        private = tempfile.mkdtemp(prefix="scv-agent-")  # mode 0700: inline (-data) keys, removed below

        def path_of(entry, key):
            if entry.get(key + "-data"):
                try:
                    data = base64.b64decode(entry[key + "-data"], validate=True)
                except (binascii.Error, TypeError, ValueError) as error:
                    raise ScvApiError("%s: %s-data is not base64: %s" % (origin, key, error)) from error
                target = os.path.join(private, key)
                handle = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(handle, "wb") as stream:
                    stream.write(data)
                material.update(data)
                return target
            if entry.get(key):
                path = os.path.join(base_dir, entry[key])
                self.files.append(path)
                try:
                    with open(path, "rb") as stream:
                        material.update(stream.read())
                except OSError as error:
                    raise ScvApiError("%s: cannot read %s %s: %s" % (origin, key, path, error.strerror)) from error
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
            except (ssl.SSLError, ValueError) as error:
                raise ScvApiError("%s: the certificates or key of user %s cannot be used: %s"
                                  % (origin, user_name, error)) from error
        finally:
            # The context holds the keys now (or nothing does): inline ones never outlive this.
            shutil.rmtree(private, ignore_errors=True)
        self.token = user.get("token")
        if not self.token and user.get("tokenFile"):
            path = os.path.join(base_dir, user["tokenFile"])
            self.files.append(path)
            try:
                with open(path, encoding="utf-8") as handle:
                    self.token = handle.read().strip()
            except OSError as error:
                raise ScvApiError("%s: cannot read tokenFile %s: %s" % (origin, path, error.strerror)) from error
        material.update((self.token or "").encode())
        self.fingerprint = material.hexdigest()


class RestScvClient:
    """Scv objects over the REST API with the standard library: the Scv agent's client.

    Same methods and errors as ScvClient (so the publisher works with either), plus a watch.
    ``kubeconfig`` is a parsed kubeconfig dict; file paths in it are relative to ``base_dir``.
    ``from_file`` reads a kubeconfig file and reads it again when it changes.

    Credentials follow the files they came from: before each connection the client looks at
    the kubeconfig and the certificate, key and token files (a kubelet's
    ``kubelet-client-current.pem`` is a symlink that rotation points elsewhere) and reads them
    again when one changed; a 401 or 403 makes it read them again and retry once when they
    differ. Every request gives up after ``timeout`` seconds without an answer.
    """

    def __init__(self, kubeconfig, base_dir=".", timeout=10.0, path=None):
        self._path_name = path
        self._base_dir = base_dir
        self._timeout = timeout
        self._origin = "the kubeconfig %s" % path if path else "the kubeconfig"
        self._config_signature = _file_signature(path) if path else None
        self._kubeconfig = None if path else kubeconfig
        self._credentials = _Credentials(kubeconfig, base_dir, self._origin)
        self._signatures = {name: _file_signature(name) for name in self._credentials.files}
        self.server = self._credentials.server
        self.requests = 0
        self.reloads = 0

    @classmethod
    def from_file(cls, path, timeout=10.0):
        import os
        path = os.path.abspath(path)
        try:
            kubeconfig = load_kubeconfig(path)
        except (OSError, ValueError) as error:
            raise ScvApiError("cannot read the kubeconfig %s: %s" % (path, error)) from error
        return cls(kubeconfig, os.path.dirname(path), timeout, path=path)

    def _changed_on_disk(self):
        if self._path_name and _file_signature(self._path_name) != self._config_signature:
            return True
        return any(_file_signature(name) != signature for name, signature in self._signatures.items())

    def reload(self, force=False):
        """Reads the credentials again when their files changed (or ``force``); True when they differ now.

        A reading that fails (a rotation caught half-way) keeps the credentials in use and says why.
        """
        if not (force or self._changed_on_disk()):
            return False
        config_signature = _file_signature(self._path_name) if self._path_name else None
        try:
            if self._path_name:
                try:
                    kubeconfig = load_kubeconfig(self._path_name)
                except (OSError, ValueError) as error:
                    raise ScvApiError("cannot read the kubeconfig %s: %s" % (self._path_name, error)) from error
            else:
                kubeconfig = self._kubeconfig_again()
            credentials = _Credentials(kubeconfig, self._base_dir, self._origin)
        except ScvApiError as error:
            import logging
            logging.getLogger("scv-gpu-agent").warning("keeping the credentials in use: %s", error)
            return False
        changed = credentials.fingerprint != self._credentials.fingerprint or credentials.server != self.server
        self._credentials, self._config_signature = credentials, config_signature
        self._signatures = {name: _file_signature(name) for name in credentials.files}
        self.server = credentials.server
        if changed:
            self.reloads += 1
        return changed

    def _kubeconfig_again(self):
        return self._kubeconfig

    def _connection(self, timeout=None):
        import http.client
        self.reload()
        credentials = self._credentials
        return http.client.HTTPSConnection(credentials.host, credentials.port, context=credentials.ssl,
                                           timeout=self._timeout if timeout is None else timeout)

    def _headers(self, content_type="application/json"):
        headers = {"Accept": "application/json", "Content-Type": content_type, "User-Agent": "scv-gpu-agent"}
        if self._credentials.token:
            headers["Authorization"] = "Bearer " + self._credentials.token
        return headers

    def _path(self, name=None, subresource=None, **query):
        import urllib.parse
        path = "%s/apis/%s/scvs" % (self._credentials.prefix, API_VERSION)
        if name:
            path += "/" + urllib.parse.quote(name, safe="")
        if subresource:
            path += "/" + subresource
        query = {key: value for key, value in query.items() if value is not None}
        return path + ("?" + urllib.parse.urlencode(query) if query else "")

    def _unreachable(self, verb, target, error, timeout):
        import socket
        if isinstance(error, socket.timeout):
            return ScvApiError("cannot %s %s: the Kubernetes API at %s did not answer within %g s"
                               % (verb, target, self.server, timeout))
        return ScvApiError("cannot %s %s: the Kubernetes API at %s is unreachable: %s"
                           % (verb, target, self.server, error))

    def _exchange(self, method, verb, target, path, body, content_type="application/json"):
        """One request; (status, payload)."""
        self.requests += 1
        connection = self._connection()
        try:
            connection.request(method, path, body=None if body is None else json.dumps(body),
                               headers=self._headers(content_type))
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, ValueError) as error:
            raise self._unreachable(verb, target, error, self._timeout) from error
        finally:
            connection.close()

    def _request(self, method, verb, target, path, body=None, missing=_NO_DEFAULT, content_type="application/json"):
        status, payload = self._exchange(method, verb, target, path, body, content_type)
        if status in (401, 403) and self.reload(force=True):
            # Rotated credentials (a kubelet's client certificate): one more try with the new ones.
            status, payload = self._exchange(method, verb, target, path, body, content_type)
        if status == 404:
            if "/scvs" in path:
                # A missing object comes with a Status; an unserved resource (no CRD) with plain text.
                try:
                    reason = json.loads(payload).get("reason")
                except (ValueError, AttributeError):
                    reason = None
                if reason != "NotFound":
                    raise _crd_missing(self.server)
            if missing is not _NO_DEFAULT:
                return missing
        if status >= 400:
            try:
                message = json.loads(payload).get("message") or payload.decode("utf-8", "replace")
            except (ValueError, AttributeError):
                message = payload.decode("utf-8", "replace")
            if status == 401:
                message += " (the credentials from %s were rejected; they are read again before the next request)" % (
                    self._path_name or "the kubeconfig")
            raise ScvApiError("cannot %s %s: HTTP %s from %s: %s" % (verb, target, status, self.server, message),
                              conflict=status == 409, status=status)
        return json.loads(payload) if payload else {}

    def get(self, name):
        return self._request("GET", "get", "Scv %s" % name, self._path(name), missing=None)

    def create(self, body, check_mode=False):
        return self._request("POST", "create", "Scv %s" % body["metadata"]["name"],
                             self._path(fieldManager=FIELD_MANAGER, dryRun="All" if check_mode else None), body)

    def replace(self, body, check_mode=False):
        name = body["metadata"]["name"]
        return self._request("PUT", "update", "Scv %s" % name,
                             self._path(name, fieldManager=FIELD_MANAGER, dryRun="All" if check_mode else None), body)

    def replace_status(self, body, check_mode=False):
        name = body["metadata"]["name"]
        return self._request("PUT", "update", "the status of Scv %s" % name,
                             self._path(name, "status", fieldManager=FIELD_MANAGER,
                                        dryRun="All" if check_mode else None), body)

    def delete(self, name, check_mode=False):
        """Delete Scv ``name``; False when there was none."""
        deleted = self._request("DELETE", "delete", "Scv %s" % name,
                                self._path(name, dryRun="All" if check_mode else None), missing=False)
        return deleted is not False

    # ------------------------------------------------------ the node's own Node

    def _core_path(self, *parts, **query):
        import urllib.parse
        path = "%s/api/v1/%s" % (self._credentials.prefix, "/".join(urllib.parse.quote(part, safe="") for part in parts))
        query = {key: value for key, value in query.items() if value is not None}
        return path + ("?" + urllib.parse.urlencode(query) if query else "")

    def get_node(self, name):
        """Node ``name``, or None when there is none."""
        return self._request("GET", "get", "Node %s" % name, self._core_path("nodes", name), missing=None)

    def patch_node(self, name, patch):
        """A strategic-merge patch of Node ``name`` (its metadata and spec)."""
        return self._request("PATCH", "patch", "Node %s" % name,
                             self._core_path("nodes", name, fieldManager=FIELD_MANAGER), patch,
                             content_type="application/strategic-merge-patch+json")

    def patch_node_status(self, name, patch):
        """A strategic-merge patch of Node ``name``'s status (conditions merge by their type)."""
        return self._request("PATCH", "patch", "the status of Node %s" % name,
                             self._core_path("nodes", name, "status", fieldManager=FIELD_MANAGER), patch,
                             content_type="application/strategic-merge-patch+json")

    def create_event(self, event):
        namespace = event["metadata"]["namespace"]
        return self._request("POST", "create", "an Event in %s" % namespace,
                             self._core_path("namespaces", namespace, "events"), event)

    def watch(self, name, resource_version, timeout_seconds):
        """Yields (type, object) for Scv ``name`` until the server ends the watch.

        The server ends it after ``timeout_seconds``; a server that goes silent for
        ``timeout`` seconds more ends it with an error.
        """
        self.requests += 1
        path = self._path(watch="1", fieldSelector="metadata.name=%s" % name, resourceVersion=resource_version,
                          timeoutSeconds=timeout_seconds, allowWatchBookmarks="true")
        timeout = timeout_seconds + self._timeout
        connection = self._connection(timeout=timeout)
        try:
            connection.request("GET", path, headers=self._headers())
            response = connection.getresponse()
            if response.status >= 400:
                if response.status in (401, 403):
                    self.reload(force=True)
                raise ScvApiError("cannot watch Scv %s: HTTP %s from %s: %s" % (
                    name, response.status, self.server, response.read().decode("utf-8", "replace")),
                    status=response.status)
            for line in response:
                if line.strip():
                    event = json.loads(line)
                    yield event.get("type"), event.get("object") or {}
        except (OSError, ValueError) as error:
            raise self._unreachable("watch", "Scv %s" % name, error, timeout) from error
        finally:
            connection.close()
