"""Yoda-Scheduler's filter and score, ported from Go to test the Scvs we publish against a real consumer.

Yoda-Scheduler (NJUPT-ISL/Yoda-Scheduler, pkg/yoda: filter/filter.go, collection/collection.go,
score/algorithm.go, scheduler.go) is the scheduler plugin written for SCV's Scv objects. This is
our own port of its logic, kept as close to the Go as Python allows, quirks included:

- numbers are Go unsigned integers: label values that do not parse are 0, negative ones wrap;
- integer division by zero panics in Go and raises ZeroDivisionError here, which the tests read
  as the scheduler crashing;
- ``CalculateCardScore`` divides the card's clock by the largest bandwidth, as the Go does.

A pod's requests are its labels: ``scv/number`` (cards), ``scv/memory`` (free MiB per card),
``scv/clock`` (memory clock in MHz, matched exactly by the filter).
"""

from __future__ import annotations

import re

UINT64 = 2 ** 64

BANDWIDTH_WEIGHT = CLOCK_WEIGHT = CORE_WEIGHT = POWER_WEIGHT = TOTAL_MEMORY_WEIGHT = 1
FREE_MEMORY_WEIGHT = ACTUAL_WEIGHT = 2
ALLOCATE_WEIGHT = 3


def _uint(text):
    """Go's ``uint(strconv.Atoi(text))``: 0 when it does not parse, wrapped when negative."""
    if not re.fullmatch(r"[+-]?[0-9]+", text or ""):
        return 0
    return int(text) % UINT64


class _Card:
    """scv.Card: a missing field is Go's zero value."""

    def __init__(self, card):
        self.health = card.get("health", "")
        for field in ("freeMemory", "totalMemory", "clock", "core", "power", "bandwidth"):
            setattr(self, field, int(card.get(field, 0)))


class _Status:
    def __init__(self, scv):
        status = scv.get("status") or {}
        self.card_number = int(status.get("cardNumber", 0))
        self.total_memory_sum = int(status.get("totalMemorySum", 0))
        self.free_memory_sum = int(status.get("freeMemorySum", 0))
        self.cards = [_Card(card) for card in status.get("cardList") or []]


# ------------------------------------------------------------------ filter.go

def pod_fits_number(labels, status):
    if "scv/number" in labels:
        number = _uint(labels["scv/number"])
        return number <= status.card_number, number
    return status.card_number > 0, 1


def card_fits_memory(memory, card):
    return card.health == "Healthy" and card.freeMemory >= memory


def card_fits_clock(clock, card):
    return card.health == "Healthy" and card.clock == clock


def pod_fits_memory(number, labels, status):
    if "scv/memory" in labels:
        memory = _uint(labels["scv/memory"])
        return sum(1 for card in status.cards if card_fits_memory(memory, card)) >= number, memory
    return True, 0


def pod_fits_clock(number, labels, status):
    if "scv/clock" in labels:
        clock = _uint(labels["scv/clock"])
        return sum(1 for card in status.cards if card_fits_clock(clock, card)) >= number, clock
    return True, 0


def filter_node(labels, scv):
    """Yoda.Filter: whether the pod may go to the node of ``scv``."""
    status = _Status(scv)
    fits, number = pod_fits_number(labels, status)
    if fits:
        fits_memory, _memory = pod_fits_memory(number, labels, status)
        fits_clock, _clock = pod_fits_clock(number, labels, status)
        return fits_memory and fits_clock
    return False


# -------------------------------------------------------------- collection.go

def collect_max_values(labels, scvs):
    """CollectMaxValues (PreScore) over every Scv in the cluster."""
    value = {"bandwidth": 1, "clock": 1, "core": 1, "freeMemory": 1, "power": 1, "totalMemory": 1}
    for scv in scvs:
        status = _Status(scv)
        fits, number = pod_fits_number(labels, status)
        if not fits:
            continue
        fits_memory, memory = pod_fits_memory(number, labels, status)
        fits_clock, clock = pod_fits_clock(number, labels, status)
        if fits_memory and fits_clock:
            for card in status.cards:
                if card.freeMemory >= memory and card.clock >= clock:
                    for field in value:
                        value[field] = max(value[field], getattr(card, field))
    return value


# ---------------------------------------------------------------- algorithm.go

def calculate_card_score(value, card):
    bandwidth = card.bandwidth * 100 // value["bandwidth"]
    clock = card.clock * 100 // value["bandwidth"]          # sic: the Go divides by MaxBandwidth
    core = card.core * 100 // value["core"]
    power = card.power * 100 // value["power"]
    free_memory = card.freeMemory * 100 // value["freeMemory"]
    total_memory = card.totalMemory * 100 // value["totalMemory"]
    return (bandwidth * BANDWIDTH_WEIGHT + clock * CLOCK_WEIGHT + core * CORE_WEIGHT + power * POWER_WEIGHT
            + free_memory * FREE_MEMORY_WEIGHT + total_memory * TOTAL_MEMORY_WEIGHT)


def calculate_basic_score(value, scv, labels):
    status = _Status(scv)
    score = 0
    fits, number = pod_fits_number(labels, status)
    if fits:
        fits_memory, memory = pod_fits_memory(number, labels, status)
        fits_clock, clock = pod_fits_clock(number, labels, status)
        if fits_clock and fits_memory:
            for card in status.cards:
                if card.freeMemory >= memory and card.clock >= clock:
                    score += calculate_card_score(value, card)
    return score


def calculate_actual_score(scv):
    status = _Status(scv)
    return (status.free_memory_sum * 100 // status.total_memory_sum) * ACTUAL_WEIGHT


def calculate_allocate_score(pods_on_node, scv):
    status = _Status(scv)
    allocated = sum(_uint(labels["scv/memory"]) for labels in pods_on_node if "scv/memory" in labels)
    if status.total_memory_sum < allocated:
        return 0
    return (status.total_memory_sum - allocated) * 100 // status.total_memory_sum * ALLOCATE_WEIGHT


def score_node(labels, scv, scvs, pods_on_node=()):
    """Yoda.Score (CalculateScore) for the node of ``scv``; ``scvs`` is the cluster's list for PreScore."""
    value = collect_max_values(labels, scvs)
    return (calculate_basic_score(value, scv, labels) + calculate_allocate_score(pods_on_node, scv)
            + calculate_actual_score(scv))
