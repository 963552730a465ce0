# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What common NVIDIA XID errors mean, what they call for, and how they mark a card (private to the collection).

The meanings follow NVIDIA's XID catalogue. An action says what a card needs after the XID:

- ``reset``: reset the GPU (or reboot the node) before it is used again; the card is Unhealthy;
- ``reboot``: reboot the node; the card is Unhealthy;
- ``none``: the application's own fault; the card stays Healthy.

The default is NVIDIA's device plugin's (``internal/rm/health.go`` of NVIDIA/k8s-device-plugin):
every critical XID makes the card Unhealthy except the application errors in
:data:`APPLICATION_XIDS`. An XID the table below does not name calls for a reset. Sites change
actions per XID (``parse_actions``). :class:`XidPolicy` applies the table to the XIDs an NVML
session logged (``nvml.xid_events.XidLog``).
"""

from __future__ import annotations

ACTIONS = ("none", "reset", "reboot")

# The XIDs NVIDIA's device plugin leaves a device healthy for: the application's own faults.
APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)
DEFAULT_ACTION = "reset"

XID_TABLE = {
    13: ("graphics engine exception (usually the application's fault)", "none"),
    31: ("GPU memory page fault (usually the application's fault)", "none"),
    43: ("GPU stopped processing (usually the application's fault)", "none"),
    45: ("preemptive cleanup after an earlier error", "none"),
    48: ("double-bit ECC error", "reset"),
    61: ("internal micro-controller breakpoint or warning", "reset"),
    62: ("internal micro-controller halt", "reset"),
    63: ("ECC page retirement or row remapping recorded", "reset"),
    64: ("ECC page retirement or row remapping failed", "reset"),
    68: ("video processor exception (usually the application's fault)", "none"),
    74: ("NVLink error", "reset"),
    79: ("GPU has fallen off the bus", "reboot"),
    92: ("high single-bit ECC error rate", "reset"),
    94: ("contained ECC error (the application was stopped)", "reset"),
    95: ("uncontained ECC error", "reset"),
    109: ("context switch timeout (usually the application's fault)", "none"),
    119: ("GSP RPC timeout", "reset"),
    120: ("GSP error", "reset"),
}

_ADVICE = {"reset": "reset the GPU or reboot the node", "reboot": "reboot the node"}


def parse_actions(items):
    """{xid: action} from ``["48=reset", "92=none", ...]``; raises ValueError naming a bad item."""
    actions = {}
    for item in items or ():
        xid, sep, action = str(item).partition("=")
        if not sep or not xid.strip().isdigit() or action.strip() not in ACTIONS:
            raise ValueError("bad XID action %r: write XID=ACTION, ACTION one of %s" % (item, ", ".join(ACTIONS)))
        actions[int(xid)] = action.strip()
    return actions


def action_for(xid, overrides=None):
    if overrides and xid in overrides:
        return overrides[xid]
    return XID_TABLE.get(xid, ("", DEFAULT_ACTION))[1]


def reason_for(xid, at, overrides=None):
    """The health reason for a critical XID seen at ``at`` (RFC 3339), or None when it calls for nothing."""
    action = action_for(xid, overrides)
    if action == "none":
        return None
    meaning = XID_TABLE.get(xid, ("a critical XID error not among the application's own",))[0]
    return "XID %d at %s: %s; %s" % (xid, at, meaning, _ADVICE[action])


class XidPolicy:
    """Marks cards Unhealthy for the XIDs that call for a reset or a reboot, for ``hold_s`` seconds.

    ``hold_s`` 0 keeps an XID while the NVML session that saw it lasts (a new session starts
    with an empty log). ``clock`` is the session's clock.
    """

    def __init__(self, actions=None, hold_s=600.0):
        self.actions = dict(actions or {})
        self.hold_s = hold_s

    def configure(self, actions, hold_s):
        """The site's actions per XID and the hold, from the next tick on."""
        self.actions, self.hold_s = dict(actions or {}), hold_s

    def reasons(self, log, index, now):
        """The health reasons of card ``index`` from ``log``; XIDs older than the hold are dropped from it."""
        records = log.kept(index, newer_than=now - self.hold_s if self.hold_s else None)
        reasons = []
        for record in records:
            reason = reason_for(record.xid, record.at, self.actions)
            if reason and reason not in reasons:
                reasons.append(reason)
        return reasons

    def critical(self, log, index, now):
        """The last XID held against card ``index`` that calls for a reset or a reboot, or 0."""
        records = log.kept(index, newer_than=now - self.hold_s if self.hold_s else None)
        held = [record.xid for record in records if action_for(record.xid, self.actions) != "none"]
        return held[-1] if held else 0

    def apply(self, facts, log, now):
        """Adds the XIDs' reasons to the cards of ``facts`` (the nvidia_gpu fact), in place."""
        for card in facts.get("cardList") or []:
            reasons = self.reasons(log, card.get("id"), now)
            if reasons:
                card["healthReasons"] = list(card.get("healthReasons") or []) + reasons
                card["health"] = "Unhealthy"
        return facts
