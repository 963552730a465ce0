# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Runs a node's validation pods and reads what they found (private to the collection).

The pods (node.validation.validation_pods) run once, in a namespace of the validation's own; every pod and claim
made here is deleted before this returns, whatever happened, so a failed validation leaves nothing behind.
"""

from __future__ import annotations

import time
import uuid

from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.node.validation import (
    POD_CHECKS, check, container_outcome, pending_reason, validation_pods)

NAMESPACE_LABELS = {"app.kubernetes.io/managed-by": "scv.gpu",
                    # the probe and the workload run unprivileged: the restricted level would refuse neither but
                    # the workload images users name (running as root, no seccomp profile): baseline holds them
                    "pod-security.kubernetes.io/enforce": "baseline"}


def claim_body(name, device_class):
    """A ResourceClaim for exactly one device of ``device_class``."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}}]}}}


def validate_pods(client, node, namespace, workload, probe, request, timeout, clock=time.monotonic,
                  sleep=time.sleep):
    """The checks POD_CHECKS on Node ``node``: [check dicts]. ``request``: {"resource": name} or
    {"device_class": name} (a DRA node, validated through a ResourceClaim)."""
    body = client.node(node)
    if body is None:
        return [check(node, name, failure="Node %s does not exist" % node) for name in POD_CHECKS]
    hostname = ((body.get("metadata") or {}).get("labels") or {}).get("kubernetes.io/hostname") or node
    if not client.namespace_exists(namespace):
        client.create_namespace(namespace, NAMESPACE_LABELS)
    run_id = uuid.uuid4().hex[:8]
    made_claim = None
    if request.get("device_class"):
        made_claim = "scv-validate-%s" % run_id
        client.create_claim(namespace, claim_body(made_claim, request["device_class"]))
        request = {"claim": made_claim}
    pods = validation_pods(node, hostname, run_id, workload, probe, request)
    created = []
    try:
        for _checks, pod in pods:
            _create(client, namespace, pod, clock, sleep)
            created.append(pod["metadata"]["name"])
        return _wait(client, node, namespace, pods, timeout, clock, sleep)
    finally:
        for name in created:
            client.delete_in(namespace, name)
        if made_claim:
            client.delete_claim(namespace, made_claim)


def _create(client, namespace, pod, clock, sleep, patience=30):
    """Creates ``pod``; in a namespace made a moment ago, the API server refuses pods until the controller manager
    made its default ServiceAccount, so that refusal is retried for ``patience`` seconds."""
    ends = clock() + patience
    while True:
        try:
            return client.create_in(namespace, pod)
        except ApiError as error:
            if "service account" not in str(error) or clock() >= ends:
                raise
        sleep(1)


def _wait(client, node, namespace, pods, timeout, clock, sleep):
    """Polls the pods until every container ended (or cannot start) or ``timeout`` seconds passed."""
    results = {}
    ends = clock() + timeout
    last = {}
    while True:
        for checks, pod in pods:
            name = pod["metadata"]["name"]
            current = client.current(namespace, name) or {}
            last[name] = current
            for check_name, container in checks.items():
                if check_name in results:
                    continue
                finished, failure = container_outcome(current, container)
                if finished:
                    results[check_name] = check(node, check_name, failure=failure)
        if len(results) == len(POD_CHECKS) or clock() >= ends:
            break
        sleep(1)
    for checks, pod in pods:
        name = pod["metadata"]["name"]
        for check_name, container in checks.items():
            if check_name not in results:
                reason = pending_reason(last.get(name) or {}) or "container %s did not finish" % container
                results[check_name] = check(node, check_name, failure="pod %s/%s, within %d s: %s" % (
                    namespace, name, timeout, reason))
    return [results[name] for name in POD_CHECKS]
