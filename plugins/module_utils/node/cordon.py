# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Cordons that remember who made them (private to the collection; pure functions).

A Node cordoned by someone else (an operator investigating it, another tool) must stay
cordoned when our maintenance ends. So our cordon carries an annotation naming its owner,
and we uncordon only a Node that carries it.
"""

from __future__ import annotations

ANNOTATION = "scv.gpu/cordoned-by"


def _state(node):
    spec = node.get("spec") or {}
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return bool(spec.get("unschedulable")), annotations.get(ANNOTATION)


def cordon(node, owner):
    """(merge patch or None, outcome) that cordons ``node`` for ``owner``.

    Outcomes: ``cordoned`` (we cordon it now), ``ours`` (our cordon is already there, from an
    earlier run), ``foreign`` (someone else cordoned it: it stays so, and is not marked ours).
    """
    unschedulable, marked = _state(node)
    if unschedulable:
        return None, "ours" if marked == owner else "foreign"
    return {"spec": {"unschedulable": True}, "metadata": {"annotations": {ANNOTATION: owner}}}, "cordoned"


def uncordon(node, owner):
    """(merge patch or None, outcome) that lifts ``owner``'s cordon from ``node``, and no other.

    Outcomes: ``uncordoned`` (ours, lifted now), ``foreign`` (cordoned, not by us: left alone),
    ``schedulable`` (not cordoned; a stale mark of ours is removed with the patch).
    """
    unschedulable, marked = _state(node)
    if marked == owner:
        body = {"metadata": {"annotations": {ANNOTATION: None}}}
        if unschedulable:
            body["spec"] = {"unschedulable": None}
        return body, "uncordoned" if unschedulable else "schedulable"
    if unschedulable:
        return None, "foreign"
    return None, "schedulable"
