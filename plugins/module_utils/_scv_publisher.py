# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Publishing one node's Scv: create when missing, write status only when the GPUs changed.

This file is private to the collection (its name starts with ``_``).
"""

from __future__ import annotations

import copy

from ansible_collections.scv.gpu.plugins.module_utils._kube import ScvApiError
from ansible_collections.scv.gpu.plugins.module_utils._scv_status import (
    API_VERSION,
    KIND,
    desired_status,
    needs_update,
    now_rfc3339,
)

MANAGED_BY = {"app.kubernetes.io/managed-by": "scv.gpu"}
CONFLICT_ATTEMPTS = 5


def view(obj):
    """What diff mode shows of an Scv: its spec and status."""
    if obj is None:
        return {}
    return {"spec": obj.get("spec") or {}, "status": obj.get("status") or {}}


def _retrying_conflicts(function, *args):
    """``function(*args)``, started over on a 409 up to CONFLICT_ATTEMPTS times in all."""
    for _retry in range(CONFLICT_ATTEMPTS - 1):
        try:
            return function(*args)
        except ScvApiError as error:
            if not error.conflict:
                raise
    return function(*args)


def publish(client, name, facts, update_interval, force_spec=False, check_mode=False):
    """Make Scv ``name`` describe ``facts`` (the nvidia_gpu fact); see ``_publish_once``."""
    return _retrying_conflicts(_publish_once, client, name, desired_status(facts), update_interval,
                               force_spec, check_mode)


def _publish_once(client, name, desired, update_interval, force_spec, check_mode):
    """One read-compare-write cycle. A 409 from a concurrent writer starts it over.

    Returns a dict: changed, created, spec_updated, status_updated, warnings,
    before and after (spec and status), and ``scv`` (the object as last written
    or read).
    """
    result = {"changed": False, "created": False, "spec_updated": False, "status_updated": False, "warnings": []}
    current = client.get(name)
    result["before"] = view(current)

    if current is None:
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "labels": dict(MANAGED_BY)},
            "spec": {"updateInterval": update_interval},
        }
        current = client.create(body, check_mode)
        result.update(changed=True, created=True)
    else:
        spec = current.get("spec")
        if spec is not None and not isinstance(spec, dict):
            if not force_spec:
                raise ScvApiError("Scv %s has a spec that is not an object (a %s), which this module does not edit: "
                                  "set force_spec=true to replace it, or fix it (kubectl edit scv %s); nothing was "
                                  "written" % (name, type(spec).__name__, name))
            current = dict(current, spec={})
        interval = (current.get("spec") or {}).get("updateInterval")
        if interval != update_interval:
            if force_spec:
                body = copy.deepcopy(current)
                body.setdefault("spec", {})["updateInterval"] = update_interval
                current = client.replace(body, check_mode)
                result.update(changed=True, spec_updated=True)
            else:
                result["warnings"].append(
                    "Scv %s keeps spec.updateInterval=%s, which someone set; set force_spec=true to make it %s"
                    % (name, interval, update_interval))

    if needs_update(current.get("status"), desired):
        status = dict(desired, updateTime=now_rfc3339())
        if result["created"] and check_mode:
            # A dry-run create stores nothing, so there is no object whose status
            # the server could dry-run: report what would be written.
            current = dict(current, status=status)
        else:
            body = copy.deepcopy(current)
            body["status"] = status
            try:
                current = client.replace_status(body, check_mode)
            except ScvApiError as error:
                if result["created"]:
                    _undo_create(client, name, error)
                raise
        result.update(changed=True, status_updated=True)

    result["after"] = view(current)
    result["scv"] = copy.deepcopy(current)
    result["scv"].get("metadata", {}).pop("managedFields", None)
    return result


def _undo_create(client, name, error):
    """Delete the Scv just created whose status could not be written: no half-written object stays."""
    try:
        client.delete(name)
    except ScvApiError as cleanup:
        error.args = ("%s; the Scv created a moment before could not be deleted again either (%s): delete it "
                      "by hand (kubectl delete scv %s)" % (error, cleanup, name),)
    else:
        error.args = ("%s; the Scv created a moment before was deleted again" % error,)


def remove(client, name, check_mode=False):
    """Delete Scv ``name``; returns changed, before and after."""
    current = client.get(name)
    if current is None:
        return {"changed": False, "before": {}, "after": {}}
    deleted = client.delete(name, check_mode)
    return {"changed": deleted, "before": view(current), "after": {}}
