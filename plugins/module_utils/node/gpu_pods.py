# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which pods of a node hold GPUs, and which of them a drain may evict (private; pure functions).

A pod holds a GPU when one of its containers (init containers included: a sidecar keeps its GPU while
the pod runs) asks for a GPU extended resource, or when a ResourceClaim it uses was allocated by a GPU
DRA driver. DaemonSet pods (their controller puts them back at once), mirror pods (the kubelet runs
them from a file; the API server cannot evict them) and finished pods (they hold nothing) stay, as
``kubectl drain`` leaves them. The rest of ``kubectl drain``'s care is kept too: a pod with no
controller is not evicted unless forced (nothing would start it again), nor one with emptyDir data
unless that data may go.
"""

from __future__ import annotations

import fnmatch
import re

DEFAULT_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")
DEFAULT_DRIVERS = ("gpu.nvidia.com",)
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
FINISHED = ("Succeeded", "Failed")


def pod_key(pod):
    """``namespace/name``, as messages and results name a pod."""
    metadata = pod.get("metadata") or {}
    return "%s/%s" % (metadata.get("namespace") or "default", metadata.get("name"))


def controller_of(pod):
    """The pod's controlling owner reference, or None."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return next((owner for owner in owners if isinstance(owner, dict) and owner.get("controller")), None)


def why_left(pod):
    """Why a drain leaves ``pod`` alone whatever it holds (``DaemonSet``, ``mirror``, ``finished``), or None."""
    if (controller_of(pod) or {}).get("kind") == "DaemonSet":
        return "DaemonSet"
    if MIRROR_ANNOTATION in ((pod.get("metadata") or {}).get("annotations") or {}):
        return "mirror"
    if (pod.get("status") or {}).get("phase") in FINISHED:
        return "finished"
    return None


_QUANTITY_NUMBER = re.compile(r"\s*[+-]?(\d+(?:\.\d*)?|\.\d+)")


def _is_zero(quantity):
    """Whether a resource quantity (1, "0", "0.0", "0k") is zero: such a request holds no device."""
    found = _QUANTITY_NUMBER.match(str(quantity))
    return found is not None and float(found.group(1)) == 0


def gpu_resources(pod, patterns):
    """The resources matching ``patterns`` (shell-style) that the pod's containers request or are limited to, in a
    quantity above zero (a limit of "0" holds no GPU)."""
    spec = pod.get("spec") or {}
    found = set()
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for amounts in (resources.get("requests") or {}, resources.get("limits") or {}):
            found.update(name for name, amount in amounts.items()
                         if not _is_zero(amount) and any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns))
    return sorted(found)


def claim_names(pod):
    """The names of the ResourceClaims the pod uses: named in its spec, or made for it from a template."""
    names = [claim.get("resourceClaimName") for claim in (pod.get("spec") or {}).get("resourceClaims") or []]
    names += [status.get("resourceClaimName")
              for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []]
    return sorted({name for name in names if name})


def claim_drivers(claim):
    """The DRA drivers that ``claim``'s allocation gave devices from."""
    results = ((((claim or {}).get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
    return sorted({result.get("driver") for result in results or [] if result.get("driver")})


def gpu_holdings(pod, patterns, drivers, claim_of):
    """What GPUs ``pod`` holds, in words (empty: none). ``claim_of(namespace, name)`` reads a ResourceClaim
    (None when there is none); it is asked only about the claims the pod uses."""
    held = ["requests %s" % name for name in gpu_resources(pod, patterns)]
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    for name in claim_names(pod):
        chosen = [driver for driver in claim_drivers(claim_of(namespace, name)) if driver in drivers]
        if chosen:
            held.append("claim %s allocated by %s" % (name, ", ".join(chosen)))
    return held


def select(pods, patterns, drivers, claim_of):
    """(GPU pods as (pod, holdings) pairs, the keys of the pods left), in the order given."""
    chosen, left = [], []
    for pod in pods:
        holdings = None if why_left(pod) else gpu_holdings(pod, patterns, drivers, claim_of)
        if holdings:
            chosen.append((pod, holdings))
        else:
            left.append(pod_key(pod))
    return chosen, left


def refusal(pod, force, delete_emptydir_data):
    """Why ``pod`` may not be evicted with these options, and what to do; None when it may."""
    if controller_of(pod) is None and not force:
        return ("it has no controller, so nothing would start it again: delete it yourself, give it a controller "
                "(a Deployment, a Job), or set force to evict it anyway")
    volumes = (pod.get("spec") or {}).get("volumes") or []
    if not delete_emptydir_data and any("emptyDir" in volume for volume in volumes if isinstance(volume, dict)):
        return "its emptyDir data would be lost: set delete_emptydir_data to evict it anyway"
    return None


def _expression_holds(expression, labels):
    key, operator = expression.get("key"), expression.get("operator")
    values = expression.get("values") or []
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return False


def selects(selector, labels):
    """Whether a label selector (matchLabels, matchExpressions) selects ``labels``; an empty one selects all,
    a missing one none, as a PodDisruptionBudget's (policy/v1)."""
    if selector is None:
        return False
    return (all(labels.get(key) == value for key, value in (selector.get("matchLabels") or {}).items())
            and all(_expression_holds(expression, labels) for expression in selector.get("matchExpressions") or []))


def budgets_of(pod, budgets):
    """``namespace/name (disruptionsAllowed N)`` of each PodDisruptionBudget in ``budgets`` that covers ``pod``."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return ["%s (disruptionsAllowed %s)" % (pod_key(budget), (budget.get("status") or {}).get("disruptionsAllowed", "?"))
            for budget in budgets if selects((budget.get("spec") or {}).get("selector"), labels)]
