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

import json
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


def explain(error, verb, target, server):
    """Turn an exception from the kubernetes client into an ScvApiError."""
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


class _Client:
    """A kubernetes.core client with calls that fail as explained ScvApiErrors."""

    def __init__(self, k8s_client):
        self._client = k8s_client
        self._resource = None
        self.server = k8s_client.configuration.host

    @classmethod
    def connect(cls, module=None, **auth):
        """A client configured from a module's kubernetes.core auth options (or ``auth``)."""
        server = (module.params.get("host") if module else auth.get("host")) or "the API server"
        try:
            return cls(get_api_client(module=module, **auth))
        except Exception as error:  # pylint: disable=broad-exception-caught
            raise explain(error, "connect to", "the Kubernetes API", server) from error

    def _call(self, verb, target, function, *args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as error:  # pylint: disable=broad-exception-caught
            raise explain(error, verb, target, self.server) from error

    @staticmethod
    def _write_options(check_mode):
        options = {"field_manager": FIELD_MANAGER}
        if check_mode:
            options["dry_run"] = "All"
        return options

    def _call_or_missing(self, missing, verb, target, function, **kwargs):
        """Like _call, but a 404 for an object that does not exist returns ``missing``."""
        try:
            return function(**kwargs)
        except Exception as error:  # pylint: disable=broad-exception-caught
            if isinstance(error, NotFoundError) and _is_missing_object(error):
                return missing
            raise explain(error, verb, target, self.server) from error


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

    def patch_labels(self, name, changes, resource_version, check_mode=False):
        """Set (value) or remove (None) labels with a merge patch that fails (409) if the Node moved on."""
        body = {"metadata": {"labels": changes, "resourceVersion": resource_version}}
        return self._call("patch", "the labels of Node %s" % name, self.resource.patch, body=body, name=name,
                          content_type="application/merge-patch+json", **self._write_options(check_mode)).to_dict()


class RestScvClient:
    """Scv objects over the REST API with the standard library: the Scv agent's client.

    Same methods and errors as ScvClient (so the publisher works with either), plus a watch.
    ``kubeconfig`` is a parsed kubeconfig dict; file paths in it are relative to ``base_dir``.
    """

    def __init__(self, kubeconfig, base_dir=".", timeout=10.0):
        import os
        import ssl
        import tempfile
        import urllib.parse

        context_name = kubeconfig.get("current-context")
        contexts = {c["name"]: c["context"] for c in kubeconfig.get("contexts") or []}
        if context_name not in contexts:
            raise ScvApiError("the kubeconfig has no current context (current-context: %r)" % (context_name,))
        context = contexts[context_name]
        cluster = {c["name"]: c["cluster"] for c in kubeconfig.get("clusters") or []}.get(context.get("cluster"))
        user = {u["name"]: u["user"] for u in kubeconfig.get("users") or []}.get(context.get("user")) or {}
        if not cluster or not cluster.get("server"):
            raise ScvApiError("the kubeconfig's context %s names no cluster with a server" % context_name)
        self.server = cluster["server"].rstrip("/")
        url = urllib.parse.urlsplit(self.server)
        self._host, self._port = url.hostname, url.port or 443
        self._prefix = url.path
        self._timeout = timeout
        self._private = tempfile.mkdtemp(prefix="scv-agent-")  # for inline (-data) keys

        def path_of(entry, key):
            if entry.get(key + "-data"):
                import base64
                target = os.path.join(self._private, key)
                with open(target, "wb") as handle:
                    handle.write(base64.b64decode(entry[key + "-data"]))
                os.chmod(target, 0o600)
                return target
            if entry.get(key):
                return os.path.join(base_dir, entry[key])
            return None

        self._ssl = ssl.create_default_context(cafile=path_of(cluster, "certificate-authority"))
        if cluster.get("insecure-skip-tls-verify"):
            self._ssl.check_hostname = False
            self._ssl.verify_mode = ssl.CERT_NONE
        certificate = path_of(user, "client-certificate")
        if certificate:
            self._ssl.load_cert_chain(certificate, path_of(user, "client-key") or certificate)
        # The context holds the keys now: inline ones written for load_cert_chain go at once.
        import shutil
        shutil.rmtree(self._private, ignore_errors=True)
        self._token = user.get("token")
        if not self._token and user.get("tokenFile"):
            with open(os.path.join(base_dir, user["tokenFile"]), encoding="utf-8") as handle:
                self._token = handle.read().strip()
        self.requests = 0

    def _connection(self, timeout=None):
        import http.client
        return http.client.HTTPSConnection(self._host, self._port, context=self._ssl,
                                           timeout=self._timeout if timeout is None else timeout)

    def _headers(self):
        headers = {"Accept": "application/json", "Content-Type": "application/json", "User-Agent": "scv-gpu-agent"}
        if self._token:
            headers["Authorization"] = "Bearer " + self._token
        return headers

    def _path(self, name=None, subresource=None, **query):
        import urllib.parse
        path = "%s/apis/%s/scvs" % (self._prefix, API_VERSION)
        if name:
            path += "/" + urllib.parse.quote(name)
        if subresource:
            path += "/" + subresource
        query = {key: value for key, value in query.items() if value is not None}
        return path + ("?" + urllib.parse.urlencode(query) if query else "")

    def _request(self, method, verb, target, path, body=None, missing=_NO_DEFAULT):
        self.requests += 1
        connection = self._connection()
        try:
            connection.request(method, path, body=None if body is None else json.dumps(body), headers=self._headers())
            response = connection.getresponse()
            payload = response.read()
        except (OSError, ValueError) as error:
            raise ScvApiError("cannot %s %s: the Kubernetes API at %s is unreachable: %s"
                              % (verb, target, self.server, error)) from error
        finally:
            connection.close()
        if response.status == 404:
            # A missing object comes with a Status; an unserved resource (no CRD) with plain text.
            try:
                reason = json.loads(payload).get("reason")
            except ValueError:
                reason = None
            if reason != "NotFound":
                raise _crd_missing(self.server)
            if missing is not _NO_DEFAULT:
                return missing
        if response.status >= 400:
            try:
                message = json.loads(payload).get("message") or payload.decode("utf-8", "replace")
            except ValueError:
                message = payload.decode("utf-8", "replace")
            raise ScvApiError("cannot %s %s: HTTP %s from %s: %s" % (verb, target, response.status, self.server, message),
                              conflict=response.status == 409, status=response.status)
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

    def watch(self, name, resource_version, timeout_seconds):
        """Yields (type, object) for Scv ``name`` until the server ends the watch."""
        self.requests += 1
        path = self._path(watch="1", fieldSelector="metadata.name=%s" % name, resourceVersion=resource_version,
                          timeoutSeconds=timeout_seconds, allowWatchBookmarks="true")
        connection = self._connection(timeout=timeout_seconds + 30)
        try:
            connection.request("GET", path, headers=self._headers())
            response = connection.getresponse()
            if response.status >= 400:
                raise ScvApiError("cannot watch Scv %s: HTTP %s from %s: %s" % (
                    name, response.status, self.server, response.read().decode("utf-8", "replace")),
                    status=response.status)
            for line in response:
                if line.strip():
                    event = json.loads(line)
                    yield event.get("type"), event.get("object") or {}
        except (OSError, ValueError) as error:
            raise ScvApiError("cannot watch Scv %s: the Kubernetes API at %s is unreachable: %s"
                              % (name, self.server, error)) from error
        finally:
            connection.close()
