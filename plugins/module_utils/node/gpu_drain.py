# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Evict a node's GPU pods and wait until they are gone (private).

``client`` is a ``kube.pods.PodClient``. Every pod that would be refused (no controller, emptyDir
data) is named before anything is evicted, so a refused drain evicts nothing. Evictions a
PodDisruptionBudget refuses (429) are asked again every ``RETRY_S`` until the timeout, as
``kubectl drain`` asks; an evicted pod is gone when the API server has no pod of that name and UID.
"""

from __future__ import annotations

import time

from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.kube.pods import EVICTED, REFUSED
from ansible_collections.scv.gpu.plugins.module_utils.node.gpu_pods import budgets_of, pod_key, refusal, select

RETRY_S = 2.0


class DrainFailed(Exception):
    """The drain stopped; ``evicted`` are the pods it evicted before it did."""

    def __init__(self, message, evicted=()):
        super().__init__(message)
        self.evicted = list(evicted)


class Plan:
    """The node's GPU pods (pod, holdings) and the keys of the pods that stay."""

    def __init__(self, client, node, resources, drivers, force, delete_emptydir_data):
        self.node = node
        if not client.node_exists(node):
            raise DrainFailed("Node %s does not exist on %s: is the node name right? Nothing was evicted"
                              % (node, client.server))
        self.chosen, self.left = select(client.on_node(node), resources, drivers, client.claim)
        refused = [(pod, refusal(pod, force, delete_emptydir_data)) for pod, _holdings in self.chosen]
        refused = ["%s (%s): %s" % (pod_key(pod), "; ".join(holdings), reason)
                   for (pod, holdings), (_pod, reason) in zip(self.chosen, refused) if reason]
        if refused:
            raise DrainFailed("Node %s: these GPU pods cannot be evicted, so none was: %s"
                              % (node, " | ".join(refused)))

    @property
    def keys(self):
        return [pod_key(pod) for pod, _holdings in self.chosen]

    def holdings(self):
        return {pod_key(pod): holdings for pod, holdings in self.chosen}


def dry_run(client, plan):
    """Check mode: the server-side dry run of each eviction; the reasons of those refused now, by pod."""
    refused = {}
    for pod, _holdings in plan.chosen:
        outcome, reason = client.evict(pod, check_mode=True)
        if outcome == REFUSED:
            refused[pod_key(pod)] = reason
    return refused


def _gone(client, pod):
    metadata = pod["metadata"]
    now = client.current(metadata.get("namespace") or "default", metadata["name"])
    return now is None or (now.get("metadata") or {}).get("uid") != metadata.get("uid")


def _timed_out(client, plan, timeout, refused, terminating, evicted):
    problems = []
    for key, (pod, reason) in refused.items():
        budgets = budgets_of(pod, client.budgets(pod["metadata"].get("namespace") or "default"))
        problems.append("%s was not evicted: %s refuses it (%s); let the budget allow a disruption (more "
                        "replicas ready, or a looser minAvailable/maxUnavailable), or raise the timeout"
                        % (key, "PodDisruptionBudget " + ", ".join(budgets) if budgets else "the API server", reason))
    for key, pod in terminating.items():
        problems.append("%s was evicted but is still there (its kubelet on Node %s has not stopped it; "
                        "kubectl describe pod -n %s %s says why)"
                        % (key, plan.node, pod["metadata"].get("namespace") or "default", pod["metadata"]["name"]))
    return DrainFailed("Node %s still has GPU pods after %g s: %s. Evicted meanwhile: %s"
                       % (plan.node, timeout, " | ".join(problems), ", ".join(evicted) or "none"), evicted)


def evict_all(client, plan, timeout, clock=time.monotonic, sleep=time.sleep):
    """Evicts the plan's pods and waits until they are gone; the keys of the pods evicted, or DrainFailed."""
    evicted = []
    try:
        return _evict_all(client, plan, timeout, evicted, clock, sleep)
    except ApiError as error:
        raise DrainFailed("%s. Evicted before that: %s" % (error, ", ".join(evicted) or "none"), evicted) from error


def _evict_all(client, plan, timeout, evicted, clock, sleep):
    end = clock() + timeout
    waiting = {pod_key(pod): pod for pod, _holdings in plan.chosen}    # not yet evicted
    terminating, refused = {}, {}
    while True:
        for key, pod in list(waiting.items()):
            outcome, reason = client.evict(pod)
            if outcome == REFUSED:
                refused[key] = (pod, reason)
                continue
            del waiting[key]
            refused.pop(key, None)
            if outcome == EVICTED:
                evicted.append(key)
                terminating[key] = pod
        for key, pod in list(terminating.items()):
            if _gone(client, pod):
                del terminating[key]
        if not waiting and not terminating:
            return evicted
        if clock() >= end:
            raise _timed_out(client, plan, timeout, refused, terminating, evicted)
        sleep(max(0.0, min(RETRY_S, end - clock())))
