# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The GPUHealthy Node condition and its Events, from gpu_facts's facts (private to the collection).

The agent sets the condition on its own Node, as node-problem-detector sets its conditions, so
that ``kubectl describe node`` and anything that reads Node conditions sees an unhealthy GPU:

- ``True``, reason ``GPUsHealthy``: every GPU NVML reports is Healthy;
- ``False``, reason ``GPUUnhealthy``: one or more GPUs are Unhealthy; the message names each card
  (index, UUID) and its reasons;
- ``False``, reason ``NVMLUnavailable``: NVML could not be read (no driver, driver not loaded,
  version mismatch); the message says why.

A node with no GPU and a working NVML is ``True`` with a message saying so.
"""

from __future__ import annotations

CONDITION_TYPE = "GPUHealthy"
MESSAGE_LIMIT = 1024   # kubectl shows it on one line; the Node object stays small


def _card_name(card):
    uuid = card.get("uuid")
    return "GPU %s (%s)" % (card.get("id"), uuid) if uuid else "GPU %s" % card.get("id")


def gpu_condition(facts):
    """(status, reason, message) of the GPUHealthy condition for these facts."""
    if not facts.get("nvml_available"):
        return "False", "NVMLUnavailable", "NVML cannot be read: %s" % (facts.get("nvml_error") or "no reason given")
    cards = list(facts.get("cardList") or [])
    unhealthy = [card for card in cards if card.get("health") != "Healthy"]
    if unhealthy:
        parts = ["%s: %s" % (_card_name(card), "; ".join(card.get("healthReasons") or ["no reason given"]))
                 for card in sorted(unhealthy, key=lambda card: str(card.get("id")))]
        message = "%d of %d GPUs unhealthy. %s" % (len(unhealthy), len(cards), " | ".join(parts))
        if len(message) > MESSAGE_LIMIT:
            message = message[:MESSAGE_LIMIT - 3] + "..."
        return "False", "GPUUnhealthy", message
    if not cards:
        return "True", "GPUsHealthy", "NVML works and reports no GPU"
    return "True", "GPUsHealthy", "all %d GPUs are healthy" % len(cards)


def condition_patch(status, reason, message, now, transition_time):
    """A strategic-merge patch of Node status setting only our condition (merge key ``type``)."""
    return {"status": {"conditions": [{
        "type": CONDITION_TYPE,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": transition_time,
    }]}}


def current_condition(node):
    """Our condition as it stands on a Node object, or None."""
    for condition in ((node or {}).get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == CONDITION_TYPE:
            return condition
    return None


def transition_event(node, status, reason, message, now, component):
    """A core/v1 Event on the Node for a change of the condition."""
    metadata = (node or {}).get("metadata") or {}
    involved = {"apiVersion": "v1", "kind": "Node", "name": metadata.get("name"), "uid": metadata.get("uid")}
    return core_event(involved, "Normal" if status == "True" else "Warning", reason, message, now, component)


def core_event(involved, event_type, reason, message, now, component):
    """A new core/v1 Event (count 1) about ``involved`` (an involvedObject), from ``component`` on the node
    the object is named after."""
    import uuid

    name = involved.get("name")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "%s.%s" % (name, uuid.uuid4().hex[:16]), "namespace": "default"},
        "involvedObject": involved,
        "type": event_type,
        "reason": reason,
        "message": message,
        "source": {"component": component, "host": name},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": component,
        "reportingInstance": name,
    }
