# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A node's pods, their ResourceClaims and PodDisruptionBudgets, evictions, and the validation's own pods,
claims and namespace (private).

Calls go through kubernetes.core's client as ``client.ResourceClient``'s do, and fail as the same
explained ``ApiError``; an eviction the API server refuses for now (429: a PodDisruptionBudget) is an
answer, not a failure.
"""

from __future__ import annotations

import json

try:
    from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError
except ImportError:
    # Where the kubernetes library is absent the modules fail with missing_required_lib before connecting.
    DynamicApiError = NotFoundError = type("NeverRaised", (Exception,), {})

from ansible_collections.scv.gpu.plugins.module_utils.kube.api_resource import NODE, ApiResource
from ansible_collections.scv.gpu.plugins.module_utils.kube.client import DeadlinePassed, ResourceClient, deadline
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import checked_name, is_missing_object

POD = ApiResource("v1", "Pod", "pods")
RESOURCE_CLAIM = ApiResource("resource.k8s.io/v1", "ResourceClaim", "resourceclaims")
DISRUPTION_BUDGET = ApiResource("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
NAMESPACE = ApiResource("v1", "Namespace", "namespaces")

# What an eviction did: the pod is being deleted now; it was gone (or replaced) already; the API server
# refuses it for now (429), and says why.
EVICTED, GONE, REFUSED = "evicted", "gone", "refused"


def refusal_reason(body):
    """The message and causes of a 429's Status, in one line."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        status = json.loads(body)
    except (TypeError, ValueError):
        return str(body)
    if not isinstance(status, dict):
        return str(body)
    details = [cause.get("message") for cause in (status.get("details") or {}).get("causes") or []
               if isinstance(cause, dict) and cause.get("message")]
    return " ".join([status.get("message") or "too many requests"] + details)


class PodClient(ResourceClient):
    """Lists a node's pods, reads and evicts them; reads ResourceClaims and PodDisruptionBudgets."""

    @classmethod
    def connect(cls, module=None, resource=POD, **auth):
        return super().connect(module, resource, **auth)

    def __init__(self, k8s_client, resource):
        super().__init__(k8s_client, resource)
        self._others = {}

    def _other(self, resource):
        """A client of another resource type on the same connection (same timeout, same messages)."""
        if resource.kind not in self._others:
            other = ResourceClient(self._client, resource)
            other.timeout, other._auth = self.timeout, self._auth  # pylint: disable=protected-access
            self._others[resource.kind] = other
        return self._others[resource.kind]

    @staticmethod
    def _target(kind, namespace, name):
        return "%s %s/%s" % (kind, checked_name("namespace", namespace), checked_name(kind, name))

    def node_exists(self, node):
        """Whether Node ``node`` exists."""
        return self.node(node) is not None

    def node(self, node):
        """Node ``node`` as a dict, or None when there is none."""
        return self._other(NODE).get(node)

    def on_node(self, node):
        """Every pod bound to Node ``node``, in all namespaces."""
        found = self._call("list", "the pods of Node %s" % checked_name("node", node), self.resource.get,
                           field_selector="spec.nodeName=%s" % node)
        return found.to_dict().get("items") or []

    def current(self, namespace, name):
        """Pod ``namespace/name`` as it is now, or None when it is gone."""
        found = self._call_or_missing(None, "get", self._target("Pod", namespace, name), self.resource.get,
                                      name=name, namespace=namespace)
        return None if found is None else found.to_dict()

    def claim(self, namespace, name):
        """ResourceClaim ``namespace/name``, or None when there is none."""
        claims = self._other(RESOURCE_CLAIM)
        found = claims._call_or_missing(  # pylint: disable=protected-access
            None, "get", self._target("ResourceClaim", namespace, name), claims.resource.get,
            name=name, namespace=namespace)
        return None if found is None else found.to_dict()

    def budgets(self, namespace):
        """The PodDisruptionBudgets of ``namespace``."""
        budgets = self._other(DISRUPTION_BUDGET)
        found = budgets._call(  # pylint: disable=protected-access
            "list", "the PodDisruptionBudgets of namespace %s" % checked_name("namespace", namespace),
            budgets.resource.get, namespace=namespace)
        return found.to_dict().get("items") or []

    def evict(self, pod, check_mode=False):
        """Asks the Eviction API (policy/v1) to evict ``pod``, this very pod (its UID), honouring its budgets.

        Returns (EVICTED, None), (GONE, None) when it is gone or was replaced, or (REFUSED, the API
        server's reason) when a PodDisruptionBudget forbids it for now. Check mode is a server-side dry run.
        """
        metadata = pod["metadata"]
        namespace, name = metadata.get("namespace") or "default", metadata["name"]
        target = self._target("Pod", namespace, name)
        options = {"preconditions": {"uid": metadata["uid"]}}
        if check_mode:
            options["dryRun"] = ["All"]
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": options}
        try:
            with deadline(self.timeout):
                self.resource.eviction.create(body=body, name=name, namespace=namespace)
        except (Exception, DeadlinePassed) as error:  # pylint: disable=broad-exception-caught
            if isinstance(error, DynamicApiError) and error.status == 429:
                return REFUSED, refusal_reason(error.body)
            if isinstance(error, NotFoundError) and is_missing_object(error.body):
                return GONE, None
            if isinstance(error, DynamicApiError) and error.status == 409:
                return GONE, None   # the UID precondition failed: a new pod of that name stands there
            raise self._explain(error, "evict", target) from error
        return EVICTED, None

    # ------------------------------------------------------------------ pods of our own (the validation's)

    def create_in(self, namespace, body, check_mode=False):
        """Creates ``body`` (a Pod) in ``namespace``; the Pod as created."""
        body = dict(body, metadata=dict(body["metadata"], namespace=namespace))
        return self._call("create", self._target("Pod", namespace, body["metadata"]["name"]), self.resource.create,
                          body=body, namespace=namespace, **self._write_options(check_mode)).to_dict()

    def delete_in(self, namespace, name, grace_seconds=0):
        """Deletes Pod ``namespace/name`` at once (its containers get ``grace_seconds``); False when it was gone."""
        deleted = self._call_or_missing(False, "delete", self._target("Pod", namespace, name), self.resource.delete,
                                        name=name, namespace=namespace, grace_period_seconds=grace_seconds)
        return deleted is not False

    def namespace_exists(self, namespace):
        return self._other(NAMESPACE).get(checked_name("namespace", namespace)) is not None

    def create_namespace(self, namespace, labels):
        return self._other(NAMESPACE).create({"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": namespace, "labels": labels}})

    def create_claim(self, namespace, body):
        """Creates ResourceClaim ``body`` in ``namespace``."""
        claims = self._other(RESOURCE_CLAIM)
        body = dict(body, metadata=dict(body["metadata"], namespace=namespace))
        return claims._call(  # pylint: disable=protected-access
            "create", self._target("ResourceClaim", namespace, body["metadata"]["name"]), claims.resource.create,
            body=body, namespace=namespace, **self._write_options(False)).to_dict()

    def delete_claim(self, namespace, name):
        claims = self._other(RESOURCE_CLAIM)
        deleted = claims._call_or_missing(  # pylint: disable=protected-access
            False, "delete", self._target("ResourceClaim", namespace, name), claims.resource.delete,
            name=name, namespace=namespace)
        return deleted is not False
