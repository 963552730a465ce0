# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Cordons that remember who made them (private to the collection; pure functions).

A Node cordoned by someone else (an operator investigating it, another tool) must stay
cordoned when our maintenance ends. So our cordon carries an annotation naming its owner,
and we uncordon only a Node that carries it and whose cordon is still the one we set: the
Node's ``managedFields`` name the field manager that last set ``spec.unschedulable``. An
operator who uncordoned the Node and cordoned it again (``kubectl`` as kubectl 1.37 names itself) owns that
cordon, even though our mark is still there; it stays, and our stale mark is removed.
"""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.kube.api_resource import FIELD_MANAGER

ANNOTATION = "scv.gpu/cordoned-by"


def cordoned_by(node):
    """The field managers that own ``spec.unschedulable``; None when the Node shows no managedFields."""
    entries = (node.get("metadata") or {}).get("managedFields")
    if not isinstance(entries, list):
        return None
    return sorted({entry.get("manager") or "?" for entry in entries if isinstance(entry, dict)
                   and "f:unschedulable" in (((entry.get("fieldsV1") or {}).get("f:spec")) or {})})


def _ours(node, owner):
    """Whether the Node's cordon is the one we set: our mark, and (where the Node says) our field manager."""
    _unschedulable, marked = _state(node)
    managers = cordoned_by(node)
    return marked == owner and (managers is None or FIELD_MANAGER in managers)


def _state(node):
    spec = node.get("spec") or {}
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return bool(spec.get("unschedulable")), annotations.get(ANNOTATION)


def cordon(node, owner):
    """(merge patch or None, outcome) that cordons ``node`` for ``owner``.

    Outcomes: ``cordoned`` (we cordon it now), ``ours`` (our cordon is already there, from an
    earlier run), ``foreign`` (someone else cordoned it: it stays so, and is not marked ours).
    """
    unschedulable, _marked = _state(node)
    if unschedulable:
        return None, "ours" if _ours(node, owner) else "foreign"
    return {"spec": {"unschedulable": True}, "metadata": {"annotations": {ANNOTATION: owner}}}, "cordoned"


def uncordon(node, owner):
    """(merge patch or None, outcome) that lifts ``owner``'s cordon from ``node``, and no other.

    Outcomes: ``uncordoned`` (ours, lifted now), ``foreign`` (cordoned, not by us, or by someone else
    since our cordon: left alone, and a stale mark of ours removed), ``schedulable`` (not cordoned; a
    stale mark of ours is removed with the patch).
    """
    unschedulable, marked = _state(node)
    if marked == owner:
        body = {"metadata": {"annotations": {ANNOTATION: None}}}
        if unschedulable and not _ours(node, owner):
            return body, "foreign"       # someone cordoned it again since: theirs stays, our stale mark goes
        if unschedulable:
            body["spec"] = {"unschedulable": None}
        return body, "uncordoned" if unschedulable else "schedulable"
    if unschedulable:
        return None, "foreign"
    return None, "schedulable"
