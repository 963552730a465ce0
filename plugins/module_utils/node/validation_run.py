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
    METRICS_SERIES, NODE_CHECKS, POD_CHECKS, check, container_outcome, metrics_pod, pending_reason, series_naming_pod,
    sharing_plan, validation_pods)

NAMESPACE_LABELS = {"app.kubernetes.io/managed-by": "scv.gpu",
                    # the probe and the workload run unprivileged: the restricted level would refuse neither but
                    # the workload images users name (running as root, no seccomp profile): baseline holds them
                    "pod-security.kubernetes.io/enforce": "baseline"}


def claim_body(name, device_class):
    """A ResourceClaim for exactly one device of ``device_class``."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}}]}}}


def validate_pods(client, node, namespace, workload, probe, request, timeout, metrics=None, holder=None,
                  clock=time.monotonic, sleep=time.sleep):
    """The checks NODE_CHECKS on Node ``node``: [check dicts]. ``request``: {"resource": name} or
    {"device_class": name} (a DRA node, validated through a ResourceClaim). ``holder``: {"image", "command"} of the
    pods that hold a GPU while the sharing and metrics checks look (``probe`` sleeping by default). ``metrics``: None
    (the check is skipped) or {"url", "read": a function of no argument giving the agent's exposition text or
    raising OSError, "hold": seconds it may take the agent}."""
    holder = holder or dict(probe, command=["sleep", str(timeout + 60)])
    body = client.node(node)
    if body is None:
        return [check(node, name, failure="Node %s does not exist" % node) for name in NODE_CHECKS]
    hostname = ((body.get("metadata") or {}).get("labels") or {}).get("kubernetes.io/hostname") or node
    if not client.namespace_exists(namespace):
        client.create_namespace(namespace, NAMESPACE_LABELS)
    run_id = uuid.uuid4().hex[:8]
    made_claims, created = [], []

    def gpu_request(suffix):
        if not request.get("device_class"):
            return request
        made_claims.append("scv-validate-%s-%s" % (run_id, suffix))
        client.create_claim(namespace, claim_body(made_claims[-1], request["device_class"]))
        return {"claim": made_claims[-1]}

    try:
        pods = validation_pods(node, hostname, run_id, workload, probe, gpu_request("workload"))
        for _checks, pod in pods:
            _create(client, namespace, pod, clock, sleep)
            created.append(pod["metadata"]["name"])
        results, last = _wait(client, node, namespace, pods, timeout, clock, sleep)
        unplaced = _never_placed(pods, last, namespace)
        if unplaced and not sharing_plan(body)[1] and not request.get("device_class"):
            results.append(check(node, "sharing", failure="not tried: %s" % unplaced))
        else:
            results.append(_sharing(client, node, body, namespace, request, holder, run_id, timeout, clock, sleep))
        if metrics is None:
            return results + [check(node, "metrics", skipped="no metrics URL of the node's agent was given")]
        if unplaced:
            return results + [check(node, "metrics", failure="not tried: %s" % unplaced)]
        pod = metrics_pod(node, hostname, run_id, holder, gpu_request("metrics"))
        _create(client, namespace, pod, clock, sleep)
        created.append(pod["metadata"]["name"])
        return results + [_metrics(client, node, namespace, pod["metadata"]["name"], metrics, timeout, clock, sleep)]
    finally:
        for name in created:
            client.delete_in(namespace, name)
        for name in made_claims:
            client.delete_claim(namespace, name)


def _never_placed(pods, last, namespace):
    """Why the checks that hold a GPU are not tried, where the workload pod, which asks for one, got none: the
    scheduler never bound it to the node, or the kubelet refused it before any container ran (no healthy device to
    allocate). No pod asking for a GPU would fare better. Else ''."""
    for checks, pod in pods:
        if "workload" not in checks:
            continue
        current = last.get(pod["metadata"]["name"]) or {}
        status = current.get("status") or {}
        if not (current.get("spec") or {}).get("nodeName"):
            how = "was never placed on the node"
        elif status.get("phase") == "Failed" and not status.get("containerStatuses"):
            how = "was refused by the node's kubelet (%s)" % (status.get("reason") or "Failed")
        else:
            return ""
        name = pod["metadata"]["name"]
        return "the workload pod %s/%s, which asks for one GPU as they do, %s" % (namespace, name, how)
    return ""


def _offered(body, resource):
    """How many of extended resource ``resource`` Node ``body`` offers (its allocatable), as an int."""
    value = str(((body.get("status") or {}).get("allocatable") or {}).get(resource) or "0")
    return int(value) if value.isdigit() else 0


def _sharing(client, node, body, namespace, request, holder, run_id, timeout, clock, sleep):
    """One more pod than Node ``node`` (``body``) has GPUs, each asking for one: all must run at once (``timeout``
    s). They are deleted before this returns, so that the GPUs are free again."""
    if request.get("device_class"):
        return check(node, "sharing", skipped="on a DRA node GPUs are shared through a claim that several pods use, "
                                              "which this check does not run")
    wanted, skipped = sharing_plan(body)
    if skipped:
        return check(node, "sharing", skipped=skipped)
    labels = (body.get("metadata") or {}).get("labels") or {}
    hostname = labels.get("kubernetes.io/hostname") or node
    offered = _offered(body, request["resource"])
    if offered < wanted:
        # the scheduler could never place them all: no pod needs to wait out the timeout to show it
        return check(node, "sharing", failure=(
            "the node offers %d %s (its allocatable), fewer than the %d pods asking for one each that its labels "
            "promise to run at once (%s GPUs shared %s ways): is the device plugin running with the sharing "
            "config the labels name?" % (offered, request["resource"], wanted, wanted - 1,
                                         labels["nvidia.com/gpu.replicas"])))
    pods = [metrics_pod(node, hostname, run_id, holder, request, "share-%d" % number) for number in range(wanted)]
    names = []
    try:
        for pod in pods:
            _create(client, namespace, pod, clock, sleep)
            names.append(pod["metadata"]["name"])
        ends = clock() + timeout
        while True:
            current = {name: client.current(namespace, name) or {} for name in names}
            running = [name for name in names if (current[name].get("status") or {}).get("phase") == "Running"]
            if len(running) == wanted:
                return check(node, "sharing")
            ended = [name for name in names if container_outcome(current[name], "holder")[0]]
            if ended or clock() >= ends:
                waiting = [name for name in names if name not in running]
                why = pending_reason(current[waiting[0]]) or container_outcome(current[waiting[0]], "holder")[1] \
                    or "not running"
                return check(node, "sharing", failure=(
                    "%d of %d pods asking for one %s each ran at once on a node of %s GPUs shared %s ways, within %d "
                    "s; pod %s/%s: %s" % (len(running), wanted, request["resource"], wanted - 1,
                                          labels["nvidia.com/gpu.replicas"], timeout,
                                          namespace, waiting[0], why)))
            sleep(1)
    finally:
        for name in names:
            client.delete_in(namespace, name)


def _metrics(client, node, namespace, name, metrics, timeout, clock, sleep):
    """Waits (``timeout`` s) until the holder pod runs, then reads the agent until it names the pod on a GPU's
    series, for ``metrics["hold"]`` seconds at most."""
    ends = clock() + timeout
    while True:
        current = client.current(namespace, name) or {}
        if (current.get("status") or {}).get("phase") == "Running":
            break
        finished, failure = container_outcome(current, "holder")
        if finished or clock() >= ends:
            reason = (failure or "container holder ended before the agent was read") if finished else (
                pending_reason(current) or "container holder did not start")
            return check(node, "metrics", failure="pod %s/%s, within %d s: %s" % (namespace, name, timeout, reason))
        sleep(1)
    ends = clock() + metrics["hold"]
    while True:
        try:
            named = series_naming_pod(metrics["read"](), namespace, name)
        except (OSError, ValueError) as error:
            return check(node, "metrics", failure="the agent's metrics at %s cannot be read (%s): is scv-gpu-agent "
                                                  "running on the node, serving there?" % (metrics["url"], error))
        if named:
            return check(node, "metrics")
        if clock() >= ends:
            return check(node, "metrics", failure=(
                "the agent at %s served no %s series naming pod %s/%s in the %d s the pod held a GPU: the agent "
                "does not read the kubelet's pod-resources socket (scv_agent_pod_resources_socket)"
                % (metrics["url"], METRICS_SERIES, namespace, name, metrics["hold"])))
        sleep(1)


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
    """Polls the pods until every container ended (or cannot start) or ``timeout`` seconds passed: ([check dicts of
    POD_CHECKS], {pod name: the pod as last read})."""
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
    return [results[name] for name in POD_CHECKS], last
