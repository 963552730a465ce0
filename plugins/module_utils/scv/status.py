# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Scv resource's status, built from the ``nvidia_gpu`` fact of ``gpu_facts``.

This file is private to the collection (see docs/architecture.md). It is pure:
the ``scv`` module and the Scv agent share it, so both publish the same fields
and decide the same way when a write is due.
"""

from __future__ import annotations

import datetime

from ansible_collections.scv.gpu.plugins.module_utils.common.gpu_info import HEALTHY, node_totals

# SCV's card fields, in SCV's order; ``id`` is the one SCV never omits.
SCV_CARD_FIELDS = ("id", "model", "totalMemory", "freeMemory", "clock", "core", "power", "bandwidth", "health")

# What scv.gpu adds to each card: stable facts only. Telemetry (temperature,
# utilization, power draw) changes every second and would turn every publish
# into a write; it belongs in metrics, not in the Scv.
EXTRA_CARD_FIELDS = ("healthReasons", "healthUnchecked", "uuid", "pciBusId", "computeCapability", "family")

# The status fields SCV compares to decide whether to write (its NeedUpdate),
# plus those scv.gpu derives from the cards.
COMPARED_FIELDS = ("cardList", "cardNumber", "totalMemorySum", "freeMemorySum", "healthyCardNumber",
                   "unhealthyCardList", "unhealthyCardNumber")


def _omit_empty(mapping, keep=()):
    """Drop zero values as Go's ``omitempty`` does (0, false, "", empty list, None)."""
    return {key: value for key, value in mapping.items()
            if key in keep or value not in (0, "", None, [], {})}


def usable(card):
    """Whether a scheduler can place work on ``card``: Healthy, with its memory known."""
    return card.get("health") == HEALTHY and bool(card.get("totalMemory"))


def desired_status(facts):
    """The status an Scv should carry for these GPU facts (without ``updateTime``).

    The consumer contract: ``cardList``, ``cardNumber`` and the memory sums describe the
    cards a scheduler can use, and nothing else. Schedulers written for SCV (Yoda-Scheduler)
    count ``cardNumber`` against a pod's ``scv/number`` and divide by ``totalMemorySum``;
    SCV never published a broken card, because its collector stopped first. Cards that
    cannot be used are published apart, in ``unhealthyCardList``, with their reasons.
    """
    cards = []
    for card in sorted(facts.get("cardList", []), key=lambda c: c["id"]):
        entry = {key: card[key] for key in SCV_CARD_FIELDS + EXTRA_CARD_FIELDS if key in card}
        cards.append(_omit_empty(entry, keep=("id",)))
    good = [card for card in cards if usable(card)]
    bad = [card for card in cards if not usable(card)]
    status = dict(node_totals(good), cardList=good, healthyCardNumber=len(good),
                  unhealthyCardList=bad, unhealthyCardNumber=len(bad))
    return _omit_empty(status)


def needs_update(current, desired):
    """SCV's rule: write when ``updateTime`` is unset or the GPU data differ."""
    current = current or {}
    if not current.get("updateTime"):
        return True
    return any(current.get(key) != desired.get(key) for key in COMPARED_FIELDS)


def now_rfc3339():
    """``updateTime`` as Kubernetes writes times: UTC, whole seconds, ``Z``."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


HEALTH_VALUES = ("Healthy", "Unhealthy")


def _card_problems(where, card):
    problems = []
    for key in ("totalMemory", "freeMemory", "clock", "core", "power", "bandwidth"):
        value = card.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            problems.append("%s.%s: expected an integer >= 0, got %r" % (where, key, value))
    for key in ("model", "uuid", "pciBusId", "computeCapability", "family"):
        value = card.get(key)
        if value is not None and not isinstance(value, str):
            problems.append("%s.%s: expected a string, got %r" % (where, key, value))
    if card.get("health") not in HEALTH_VALUES:
        problems.append("%s.health: expected Healthy or Unhealthy, got %r" % (where, card.get("health")))
    for key in ("healthReasons", "healthUnchecked"):
        value = card.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(item, str) for item in value)):
            problems.append("%s.%s: expected a list of strings, got %r" % (where, key, value))
    return problems


def facts_problems(facts):
    """What makes ``facts`` unusable as the nvidia_gpu fact, as ``key: problem`` strings."""
    if not isinstance(facts, dict):
        return ["gpu_facts: expected the nvidia_gpu fact (a dict), got %s" % type(facts).__name__]
    cards = facts.get("cardList")
    if not isinstance(cards, list):
        return ["gpu_facts.cardList: missing or not a list; pass ansible_facts.nvidia_gpu from scv.gpu.gpu_facts"]
    problems = []
    seen = set()
    for position, card in enumerate(cards):
        where = "gpu_facts.cardList[%d]" % position
        if not isinstance(card, dict):
            problems.append("%s: expected a dict" % where)
            continue
        if not isinstance(card.get("id"), int) or isinstance(card.get("id"), bool) or card["id"] < 0:
            problems.append("%s.id: expected the card's NVML index (an integer >= 0), got %r" % (where, card.get("id")))
        elif card["id"] in seen:
            problems.append("%s.id: %d appears twice" % (where, card["id"]))
        else:
            seen.add(card["id"])
        problems.extend(_card_problems(where, card))
    return problems
