# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The modules' Kubernetes client: kubernetes.core's, with calls that fail as explained errors (private).

Connections and authentication come from kubernetes.core (``get_api_client``), so users
configure scv.gpu exactly as they configure ``kubernetes.core.k8s``. Every failure becomes an
``errors.ApiError`` whose message names the verb, the object and what to do. The Scv agent
does not use this file: it has its own client (``rest_client``), with the standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import threading
import time
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
    # Where kubernetes.core is absent the modules fail with missing_required_lib before connecting.
    get_api_client = None

    class CoreException(Exception):
        """Stands in for kubernetes.core's exception where kubernetes.core is absent."""

from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import (
    ApiError,
    checked_name,
    causes,
    is_missing_object,
    missing_definition,
    retry_on_conflict,
)
from ansible_collections.scv.gpu.plugins.module_utils.kube.kubeconfig import load_kubeconfig, not_after, select_context
from ansible_collections.scv.gpu.plugins.module_utils.kube.api_resource import FIELD_MANAGER, NODE

DEFAULT_REQUEST_TIMEOUT = 30.0


class DeadlinePassed(BaseException):
    """Raised by the alarm of ``deadline`` inside a call that took too long.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` in the kubernetes
    client can swallow it and carry on waiting.
    """


@contextlib.contextmanager
def deadline(seconds):
    """Interrupts the block after ``seconds``, with DeadlinePassed.

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
        raise DeadlinePassed()

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        # None: the previous handler was not set from Python; the default is what it was.
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)


def explain(error, verb, target, server, timeout=None, resource=None, connection=None):
    """Turn an exception from the kubernetes client into an ApiError; ``resource`` is the ApiResource asked for,
    ``connection`` what ``_connection_of`` says of the connection (for TLS and credential messages)."""
    _server, ca, certificate = connection or (server, "the kubeconfig's certificate-authority", None)
    failure = _tls_verification_failure(error)
    if failure is not None:
        return ApiError("cannot %s %s: the API server at %s is not vouched for by %s (%s): is that this cluster's CA?"
                        % (verb, target, server, ca, failure.verify_message or failure))
    if isinstance(error, DeadlinePassed):
        return ApiError("cannot %s %s: the Kubernetes API at %s did not answer within %s (raise request_timeout "
                        "if the server is slow rather than stalled)"
                        % (verb, target, server, "%g s" % timeout if timeout else "the request timeout"))
    if isinstance(error, ResourceNotFoundError) and resource is not None and resource.crd_name:
        return missing_definition(resource, server)
    if (isinstance(error, DynamicApiError) and error.status == 404 and not is_missing_object(error.body)
            and resource is not None and resource.crd_name):
        # Discovery was cached while the CRD existed; the API server no longer serves it.
        return missing_definition(resource, server)
    if isinstance(error, CoreException):
        return ApiError("cannot %s %s: no usable Kubernetes client configuration: %s" % (verb, target, error))
    if isinstance(error, DynamicApiError):
        summary = error.summary()
        if isinstance(summary, bytes):
            summary = summary.decode("utf-8", "replace")
        if error.status == 401:
            expiry = not_after(certificate) if certificate else None
            expired = ("; the client certificate %s expired on %s" % (
                certificate, time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(expiry)))
                if expiry is not None and expiry < time.time() else "")
            return ApiError("cannot %s %s: the API server at %s does not accept these credentials (401): %s%s"
                            % (verb, target, server, summary, expired))
        if error.status == 403:
            return ApiError("cannot %s %s: forbidden (403): %s" % (verb, target, summary))
        if error.status == 409:
            return ApiError("cannot %s %s: conflict (409): %s" % (verb, target, summary), conflict=True)
        if error.status == 422:
            fields = causes(error.body)
            return ApiError("cannot %s %s: the API server rejected it as invalid (422): %s%s" % (
                verb, target, summary, "".join("\n  - " + cause for cause in fields)))
        return ApiError("cannot %s %s: HTTP %s from %s: %s" % (verb, target, error.status, server, summary))
    if isinstance(error, TransportError):
        pool = getattr(error, "pool", None)
        if pool is not None:
            server = "%s://%s:%s" % (pool.scheme, pool.host, pool.port)
        return ApiError("cannot %s %s: the Kubernetes API at %s is unreachable: %s" % (verb, target, server, error))
    return ApiError("cannot %s %s: %s" % (verb, target, error))


def _connection_of(params):
    """What messages say of the connection the options point at: (server, CA source, client certificate file)."""
    if params.get("host"):
        return params["host"], params.get("ca_cert") or "the system's CA certificates", params.get("client_cert")
    try:
        kubeconfig = params.get("kubeconfig") or os.environ.get("K8S_AUTH_KUBECONFIG") or os.environ.get(
            "KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]
        base = "."
        if not isinstance(kubeconfig, dict):
            path = os.path.expanduser(kubeconfig)
            kubeconfig, base = load_kubeconfig(path), os.path.dirname(path)
        if params.get("context"):
            kubeconfig = dict(kubeconfig, **{"current-context": params["context"]})
        _name, cluster, _user_name, user = select_context(kubeconfig, "the kubeconfig")
        ca = (os.path.join(base, cluster["certificate-authority"]) if cluster.get("certificate-authority") else
              "the kubeconfig's certificate-authority-data" if cluster.get("certificate-authority-data") else
              "the system's CA certificates")
        certificate = os.path.join(base, user["client-certificate"]) if user.get("client-certificate") else None
        return cluster["server"], ca, certificate
    except (OSError, ValueError, ApiError, KeyError, TypeError, AttributeError):
        return "the API server", "the kubeconfig's certificate-authority", None


def _tls_verification_failure(error):
    """The ssl.SSLCertVerificationError somewhere behind ``error`` (urllib3 wraps it twice), or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ssl.SSLCertVerificationError):
            return error
        reason = getattr(error, "reason", None)   # urllib3's MaxRetryError; an API error's reason is a string
        error = (reason if isinstance(reason, BaseException) else None) or error.__cause__ or error.__context__ or next(
            (arg for arg in getattr(error, "args", ()) if isinstance(arg, BaseException)), None)
    return None


class ResourceClient:
    """Get, create, replace and delete objects of ``resource`` (an ApiResource) through kubernetes.core."""

    def __init__(self, k8s_client, resource):
        self._client = k8s_client
        self.resource_type = resource
        self._resource = None
        self.server = k8s_client.configuration.host
        self.timeout = None
        self._auth = None          # the connection options, read again only to explain a failure

    @classmethod
    def connect(cls, module=None, resource=NODE, **auth):
        """A client configured from a module's kubernetes.core auth options (or ``auth``).

        ``request_timeout`` (a module option, or a keyword here) bounds connecting (which runs
        discovery) and every call after it.
        """
        params = module.params if module else auth
        timeout = params.get("request_timeout") or DEFAULT_REQUEST_TIMEOUT
        auth.pop("request_timeout", None)
        try:
            with deadline(timeout):
                client = cls(get_api_client(module=module, **auth), resource)
        except (Exception, DeadlinePassed) as error:  # pylint: disable=broad-exception-caught
            connection = _connection_of(params)
            raise explain(error, "connect to", "the Kubernetes API", connection[0], timeout,
                          connection=connection) from error
        client.timeout = timeout
        client._auth = params     # pylint: disable=protected-access
        return client

    def _explain(self, error, verb, target):
        connection = _connection_of(self._auth) if self._auth is not None else None
        return explain(error, verb, target, self.server, self.timeout, self.resource_type, connection)

    def _call(self, verb, target, function, *args, **kwargs):
        try:
            with deadline(self.timeout):
                return function(*args, **kwargs)
        except (Exception, DeadlinePassed) as error:  # pylint: disable=broad-exception-caught
            raise self._explain(error, verb, target) from error

    @staticmethod
    def _write_options(check_mode):
        options = {"field_manager": FIELD_MANAGER}
        if check_mode:
            options["dry_run"] = "All"
        return options

    def _call_or_missing(self, missing, verb, target, function, **kwargs):
        """Like _call, but a 404 for an object that does not exist returns ``missing``."""
        try:
            with deadline(self.timeout):
                return function(**kwargs)
        except (Exception, DeadlinePassed) as error:  # pylint: disable=broad-exception-caught
            if isinstance(error, NotFoundError) and is_missing_object(error.body):
                return missing
            raise self._explain(error, verb, target) from error

    @property
    def resource(self):
        if self._resource is None:
            kind = self.resource_type
            self._resource = self._call("discover", "the %s API" % kind.api_version,
                                        self._client.resource, kind.kind, kind.api_version)
        return self._resource

    def _name(self, name):
        """What error messages call object ``name``; every call names its object here, so the name is checked."""
        return "%s %s" % (self.resource_type.kind, checked_name(self.resource_type.kind, name))

    def get(self, name):
        """The object named ``name`` as a dict, or None when there is none."""
        found = self._call_or_missing(None, "get", self._name(name), self.resource.get, name=name)
        return None if found is None else found.to_dict()

    def create(self, body, check_mode=False):
        return self._call("create", self._name(body["metadata"]["name"]), self.resource.create,
                          body=body, **self._write_options(check_mode)).to_dict()

    def replace(self, body, check_mode=False):
        name = body["metadata"]["name"]
        return self._call("update", self._name(name), self.resource.replace,
                          body=body, name=name, **self._write_options(check_mode)).to_dict()

    def replace_status(self, body, check_mode=False):
        name = body["metadata"]["name"]
        return self._call("update", "the status of %s" % self._name(name), self.resource.status.replace,
                          body=body, name=name, **self._write_options(check_mode)).to_dict()

    def delete(self, name, check_mode=False):
        """Delete object ``name``; False when there was none."""
        deleted = self._call_or_missing(False, "delete", self._name(name), self.resource.delete,
                                        name=name, **({"dry_run": "All"} if check_mode else {}))
        return deleted is not False


class NodeClient(ResourceClient):
    """Read Nodes, and patch them from what was read."""

    @classmethod
    def connect(cls, module=None, resource=NODE, **auth):
        return super().connect(module, resource, **auth)

    def get(self, name):
        """Node ``name`` as a dict; an error that says so when it does not exist."""
        found = super().get(name)
        if found is None:
            raise ApiError("Node %s does not exist on %s: is the host's Kubernetes node name right? "
                           "(set it per host; it defaults to the inventory name)" % (name, self.server))
        return found

    def patch(self, name, body, resource_version, what, check_mode=False):
        """A merge patch of Node ``name`` that fails (409) if the Node moved on; ``what`` names it in errors."""
        body = dict(body, metadata=dict(body.get("metadata") or {}, resourceVersion=resource_version))
        return self._call("patch", "%s of Node %s" % (what, name), self.resource.patch, body=body, name=name,
                          content_type="application/merge-patch+json", **self._write_options(check_mode)).to_dict()

    def update(self, name, decide, what, check_mode=False):
        """Reads Node ``name``, asks ``decide(node)`` for a merge patch (None: nothing to change) and
        applies it; a 409 (the Node changed meanwhile) reads and decides again (``retry_on_conflict``).

        Returns (node before, node after, the patch or None).
        """
        def cycle():
            node = self.get(name)
            body = decide(node)
            if body is None:
                return node, node, None
            return node, self.patch(name, body, node["metadata"]["resourceVersion"], what, check_mode), body

        return retry_on_conflict(cycle)
