# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Publishing one node's Scv: create when missing, write status only when the GPUs changed.

This file is private to the collection (see docs/architecture.md).
"""

from __future__ import annotations

import copy

from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError, retry_on_conflict
from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import API_VERSION, KIND
from ansible_collections.scv.gpu.plugins.module_utils.scv.status import desired_status, needs_update, now_rfc3339

MANAGED_BY = {"app.kubernetes.io/managed-by": "scv.gpu"}


def view(obj):
    """What diff mode shows of an Scv: its spec and status."""
    if obj is None:
        return {}
    return {"spec": obj.get("spec") or {}, "status": obj.get("status") or {}}


def publish(client, name, facts, update_interval, force_spec=False, check_mode=False):
    """Make Scv ``name`` describe ``facts`` (the nvidia_gpu fact); see ``_publish_once``."""
    desired = desired_status(facts)
    return retry_on_conflict(lambda: _publish_once(client, name, desired, update_interval, force_spec, check_mode))


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
                raise ApiError("Scv %s has a spec that is not an object (a %s), which this module does not edit: "
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
            try:
                current = write_status(client, current, status, check_mode)
            except ApiError as error:
                if result["created"]:
                    _undo_create(client, name, error)
                raise
        result.update(changed=True, status_updated=True)

    result["after"] = view(current)
    result["scv"] = _kept(current)
    return result


def write_status(client, current, status, check_mode=False):
    """Writes ``status`` (with its ``updateTime``) over the status of ``current``, the Scv as last read.

    Fails with a conflict (409) when the object moved on since ``current`` was read; returns
    the object as written, without its managedFields.
    """
    body = copy.deepcopy(current)
    body["status"] = status
    body.get("metadata", {}).pop("managedFields", None)
    return _kept(client.replace_status(body, check_mode))


def _kept(obj):
    """A copy of ``obj`` without managedFields, which nobody here reads and which only grow."""
    kept = copy.deepcopy(obj)
    kept.get("metadata", {}).pop("managedFields", None)
    return kept


def _undo_create(client, name, error):
    """Delete the Scv just created whose status could not be written: no half-written object stays."""
    try:
        client.delete(name)
    except ApiError as cleanup:
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
