# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One card's health readings: ECC errors, remapped rows, retired pages, the GPU recovery action and clock
event reasons, each turned into health reasons (private; ``card.read_card`` calls it).
"""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import (
    AGGREGATE_ECC,
    FI_DEV_GET_GPU_RECOVERY_ACTION,
    FUNCTION_NOT_FOUND,
    HW_POWER_BRAKE_SLOWDOWN,
    HW_THERMAL_SLOWDOWN,
    MEMORY_ERROR_CORRECTED,
    MEMORY_ERROR_UNCORRECTED,
    NO_PERMISSION,
    RECOVERY_ACTIONS,
    SW_THERMAL_SLOWDOWN,
    VOLATILE_ECC,
    error_code,
    pynvml,
)
from ansible_collections.scv.gpu.plugins.module_utils.nvml.extras import TELEMETRY_FIELDS, field_value


def _clock_event_reasons(handle):
    try:
        return pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    except pynvml.NVMLError as error:
        if error_code(error) != FUNCTION_NOT_FOUND:
            raise
    # Drivers before the r535 branch know only the older name of the same query.
    return pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)


# ECC error counts: fact key, error type, counter. Health needs the first (asked at every read that does
# not reuse it, see settled_health); the others are counters for metrics, read with the counters subset.
ECC_COUNTS = (
    ("uncorrectedVolatile", MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC),
    ("uncorrectedAggregate", MEMORY_ERROR_UNCORRECTED, AGGREGATE_ECC),
    ("correctedVolatile", MEMORY_ERROR_CORRECTED, VOLATILE_ECC),
    ("correctedAggregate", MEMORY_ERROR_CORRECTED, AGGREGATE_ECC),
)


# What settled_health keeps besides the uncorrectable ECC count.
SETTLED_KEYS = ("remappedRows", "retiredPagesPending")


def settled_health(card):
    """The readings a Session may reuse while they read clear, or None, for a card with no health reason.

    They are the GPU recovery action, the uncorrectable ECC count, the remapped rows and the pages
    pending retirement. The driver changes them only with an XID: an uncorrectable ECC error is XID 48,
    94 or 95; a row remapping or page retirement is XID 63 or 64; a recovery action follows a critical
    XID. On a card with no health reason, read_health found no uncorrectable error, no pending or
    failed remapping and no page pending retirement; only a recovery action that could not be read
    leaves no reason, and keeps them from being reused.
    """
    if card.get("recoveryAction") != 0:
        return None
    ecc = card.get("eccErrors") or {}
    kept = {key: card[key] for key in SETTLED_KEYS if key in card}
    if "uncorrectedVolatile" in ecc:
        kept["eccErrors"] = {"uncorrectedVolatile": ecc["uncorrectedVolatile"]}
    return kept


def read_health(reader, card, telemetry=False, counters=True, settled=None):
    """Reads the card's health into ``card`` and its reasons into ``reader.reasons``.

    ``telemetry``: also the memory temperature and NVLink fields (in the recovery action's call);
    ``counters``: all four ECC counts, not only the uncorrectable volatile one;
    ``settled``: what settled_health gave at an earlier read, reused instead of asked (a Session's).
    """
    reasons = reader.reasons
    if card.get("eccEnabled"):
        if settled is not None:
            counts = dict(settled.get("eccErrors", ()))
        else:
            counts = {}
            for key, kind, counter in ECC_COUNTS if counters else ECC_COUNTS[:1]:
                value = reader.query("ECC error count", pynvml.nvmlDeviceGetTotalEccErrors, kind, counter,
                                     health=True)
                if value is not None:
                    counts[key] = value
        card["eccErrors"] = counts
        if counts.get("uncorrectedVolatile"):
            reasons.append("%d uncorrectable ECC errors since the driver loaded"
                           % counts["uncorrectedVolatile"])
    if settled is None:
        _read_memory_health(reader, card)
    else:
        card.update((key, dict(value) if isinstance(value, dict) else value) for key, value in settled.items()
                    if key in SETTLED_KEYS)
    _read_fields(reader, card, telemetry, settled is None)

    event_reasons = reader.query("clock event reasons", _clock_event_reasons, health=True)
    if event_reasons is not None:
        card["clockEventReasons"] = int(event_reasons)
        if event_reasons & HW_THERMAL_SLOWDOWN:
            reasons.append("hardware thermal slowdown: the GPU is too hot and its clocks are cut")
        if event_reasons & SW_THERMAL_SLOWDOWN:
            reasons.append("software thermal slowdown: the GPU runs above its target temperature")
        if event_reasons & HW_POWER_BRAKE_SLOWDOWN:
            reasons.append("hardware power brake slowdown: the power supply asked the GPU to slow down")


def _read_memory_health(reader, card):
    """Remapped rows, or on cards that do not remap rows, pages pending retirement."""
    reasons = reader.reasons
    rows = reader.query("remapped rows", pynvml.nvmlDeviceGetRemappedRows, health=True)
    if rows is not None:
        correctable, uncorrectable, remap_pending, remap_failed = rows
        card["remappedRows"] = {
            "correctable": correctable,
            "uncorrectable": uncorrectable,
            "pending": bool(remap_pending),
            "failed": bool(remap_failed),
        }
        if remap_failed:
            reasons.append("row remapping failed: the GPU needs service")
        if remap_pending:
            reasons.append("row remapping is pending: reset the GPU")

    # Cards that remap rows (Ampere and later) do not retire pages: the query would answer
    # NOT_SUPPORTED, and on an H100 that answer alone costs 0.4 ms. Ask only the others.
    pending = None if rows is not None else reader.query(
        "retired pages", pynvml.nvmlDeviceGetRetiredPagesPendingStatus, health=True)
    if pending is not None:
        card["retiredPagesPending"] = bool(pending)
        if pending:
            reasons.append("memory pages are pending retirement: reset the GPU or reboot the node")


def _read_fields(reader, card, telemetry, recovery):
    """One field-values call for the recovery action and, with telemetry, the memory temperature and
    NVLink traffic: each field a call of its own would cost the call again.

    Without ``recovery`` (a Session that read 0 and has seen no XID since) the action is not asked:
    the driver changes it only with an XID, and the call alone costs 0.04 ms on an H100.
    """
    reasons = reader.reasons
    wanted = [FI_DEV_GET_GPU_RECOVERY_ACTION] if recovery else []
    wanted += list(TELEMETRY_FIELDS.values()) if telemetry else []
    what = "GPU recovery action" if recovery else "memory temperature and NVLink fields"
    fields = reader.query(what, pynvml.nvmlDeviceGetFieldValues, wanted, health=True) if wanted else None
    action_field = fields[0] if fields is not None and recovery else None
    for field, (key, _field_id) in zip(fields[int(recovery):] if fields is not None else (), TELEMETRY_FIELDS.items()):
        if field.nvmlReturn == 0:
            card[key] = field_value(field)
    if not recovery:
        card["recoveryAction"] = 0
    if action_field is not None and action_field.nvmlReturn == NO_PERMISSION:
        reader.note_unchecked("GPU recovery action")
    if action_field is not None and action_field.nvmlReturn == 0:
        action = action_field.value.uiVal
        card["recoveryAction"] = action
        if action:
            reasons.append("%s after a critical XID error"
                           % RECOVERY_ACTIONS.get(action, "the driver asks for recovery action %d" % action))
