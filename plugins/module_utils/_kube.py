# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Kubernetes API calls for Scv objects and Node labels.

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

from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.exceptions import CoreException

from ansible_collections.scv.gpu.plugins.module_utils._scv_status import API_VERSION, CRD_NAME, KIND

FIELD_MANAGER = "scv.gpu"
CRD_HINT = ("install it with the scv.gpu.scv_publish role, or: "
            "kubectl apply -f roles/scv_publish/files/scvs.core.run-linux.com.yml (in the scv.gpu collection)")


class ScvApiError(Exception):
    """A failed API call, explained. ``conflict`` is True for HTTP 409."""

    def __init__(self, message, conflict=False):
        super().__init__(message)
        self.conflict = conflict


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
