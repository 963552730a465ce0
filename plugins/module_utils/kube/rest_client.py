# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Objects of one resource, and the node's own Node, over ``rest.RestTransport`` (private)."""

from __future__ import annotations

import json

from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError, checked_name
from ansible_collections.scv.gpu.plugins.module_utils.kube.api_resource import FIELD_MANAGER, NODE
from ansible_collections.scv.gpu.plugins.module_utils.kube.rest import DEFAULT_BURST, DEFAULT_QPS, NO_DEFAULT, RestTransport


class RestClient(RestTransport):
    """Get, create, replace and delete objects of ``resource`` (an ApiResource), and watch one.

    Same methods and errors as ``client.ResourceClient``, so code that reads and writes objects
    works with either.
    """

    def __init__(self, kubeconfig, base_dir=".", timeout=10.0, path=None, resource=NODE, qps=DEFAULT_QPS,
                 burst=DEFAULT_BURST, status_manager=FIELD_MANAGER):
        super().__init__(kubeconfig, base_dir, timeout, path, qps, burst)
        self.resource = resource
        # The field manager of status writes: the agent names its host, so that the managedFields of an
        # object two agents write tell them apart (see agent.scv_writer).
        self.status_manager = status_manager

    def _object(self, method, verb, name, body=None, subresource=None, missing=NO_DEFAULT, check_mode=False,
                what=None, **options):
        checked_name(self.resource.kind, name if name else body["metadata"]["name"])
        parts = [name] if name else []
        if subresource:
            parts.append(subresource)
        query = dict(options, dryRun="All" if check_mode else None)
        target = what or "%s %s" % (self.resource.kind, name or body["metadata"]["name"])
        return self.request(method, verb, target, self.url(self.resource.base_path, *parts, **query), body,
                            missing=missing, resource=self.resource)

    def get(self, name):
        """The object named ``name``, or None when there is none."""
        return self._object("GET", "get", name, missing=None)

    def create(self, body, check_mode=False):
        return self._object("POST", "create", None, body, check_mode=check_mode, fieldManager=FIELD_MANAGER)

    def replace(self, body, check_mode=False):
        return self._object("PUT", "update", body["metadata"]["name"], body, check_mode=check_mode,
                            fieldManager=FIELD_MANAGER)

    def replace_status(self, body, check_mode=False):
        name = body["metadata"]["name"]
        return self._object("PUT", "update", name, body, "status", check_mode=check_mode,
                            what="the status of %s %s" % (self.resource.kind, name), fieldManager=self.status_manager)

    def delete(self, name, check_mode=False):
        """Delete object ``name``; False when there was none."""
        return self._object("DELETE", "delete", name, missing=False, check_mode=check_mode) is not False

    # ------------------------------------------------------ the node's own Node

    def get_node(self, name):
        """Node ``name``, or None when there is none."""
        return self.request("GET", "get", "Node %s" % name, self.url(NODE.base_path, checked_name("Node", name)),
                            missing=None)

    def patch_node(self, name, patch):
        """A strategic-merge patch of Node ``name`` (its metadata and spec)."""
        return self.request("PATCH", "patch", "Node %s" % name,
                            self.url(NODE.base_path, checked_name("Node", name), fieldManager=FIELD_MANAGER), patch,
                            content_type="application/strategic-merge-patch+json")

    def patch_node_status(self, name, patch):
        """A strategic-merge patch of Node ``name``'s status (conditions merge by their type)."""
        return self.request("PATCH", "patch", "the status of Node %s" % name,
                            self.url(NODE.base_path, checked_name("Node", name), "status",
                                     fieldManager=FIELD_MANAGER), patch,
                            content_type="application/strategic-merge-patch+json")

    def create_event(self, event):
        namespace = event["metadata"]["namespace"]
        return self.request("POST", "create", "an Event in %s" % namespace,
                            self.url("/api/v1/namespaces", namespace, "events"), event)

    def patch_event(self, namespace, name, patch):
        """A merge patch of Event ``name`` in ``namespace`` (its count and lastTimestamp)."""
        return self.request("PATCH", "patch", "Event %s in %s" % (name, namespace),
                            self.url("/api/v1/namespaces", namespace, "events", name), patch,
                            content_type="application/merge-patch+json")

    def list_named(self, name):
        """(the objects named ``name``: none or one, the list's resourceVersion: the store's revision now)."""
        found = self.request("GET", "list", "%s %s" % (self.resource.kind, checked_name(self.resource.kind, name)),
                             self.url(self.resource.base_path, fieldSelector="metadata.name=%s" % name),
                             resource=self.resource)
        return found.get("items") or [], (found.get("metadata") or {}).get("resourceVersion")

    def watch(self, name, resource_version, timeout_seconds):
        """Yields (type, object) for object ``name`` until the server ends the watch.

        With ``resource_version`` None the watch starts from the object as it is now: the server
        sends it first (ADDED, when it exists), then a BOOKMARK marked ``k8s.io/initial-events-end``
        (Kubernetes' watch-list; one request instead of a read and a watch). The server ends the
        watch after ``timeout_seconds``. A server that does not begin its answer within the request
        timeout, or goes silent for that long past ``timeout_seconds``, ends it with an error.
        """
        target = "%s %s" % (self.resource.kind, checked_name(self.resource.kind, name))
        self.limiter.take()
        self.requests += 1
        start = {"resourceVersion": resource_version} if resource_version is not None else {
            "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"}
        path = self.url(self.resource.base_path, watch="1", fieldSelector="metadata.name=%s" % name,
                        timeoutSeconds=timeout_seconds, allowWatchBookmarks="true", **start)
        # The answer's head within the request timeout, as any request's: an API server still starting can take
        # the request and say nothing. Then the events, with the watch's own time.
        timeout = self._timeout
        connection = self.connection(timeout=timeout)
        try:
            connection.request("GET", path, headers=self.headers())
            response = connection.getresponse()
            self.contact.reached(response.status)
            timeout = timeout_seconds + self._timeout
            connection.sock.settimeout(timeout)
            if response.status >= 400:
                if response.status in (401, 403):
                    self.reload(force=True)
                raise ApiError("cannot watch %s: HTTP %s from %s: %s" % (
                    target, response.status, self.server, response.read().decode("utf-8", "replace")),
                    status=response.status)
            for line in response:
                if line.strip():
                    event = json.loads(line)
                    yield event.get("type"), event.get("object") or {}
        except (OSError, ValueError) as error:
            self.contact.failed()
            raise self.unreachable("watch", target, error, timeout) from error
        finally:
            connection.close()
