# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Failed Kubernetes API calls, explained: the error type both clients raise (private)."""

from __future__ import annotations

import json
import time

from ansible_collections.scv.gpu.plugins.module_utils.common.backoff import pause
from ansible_collections.scv.gpu.plugins.module_utils.common.names import object_name_problem

# The one conflict policy: a read-decide-write cycle that meets a 409 starts over, this many times in all,
# after a pause of CONFLICT_PAUSE_S to twice that, doubling with each try (``backoff.pause``): writers that
# collided do not collide again in step, and a writer that never pauses gets 0.3 to 0.6 s to finish before
# we give up.
CONFLICT_ATTEMPTS = 5
CONFLICT_PAUSE_S = 0.02


class ApiError(Exception):
    """A failed API call, explained. ``conflict`` is True for HTTP 409; ``status`` is the HTTP status if any."""

    def __init__(self, message, conflict=False, status=None):
        super().__init__(message)
        self.conflict = conflict
        self.status = status


def checked_name(kind, name):
    """``name`` when it can name a ``kind`` object; otherwise an ApiError, before any request is built from it.

    Every name the collection puts in a URL passes here: ``node-a/status`` would reach the status
    subresource, and ``..`` the collection's list.
    """
    problem = object_name_problem(name, kind)
    if problem:
        raise ApiError("%s; nothing was sent to the API server" % problem, status=422)
    return name


def missing_definition(resource, server):
    """The error for a custom resource whose definition the API server does not serve."""
    return ApiError("the %s custom resource definition is not installed on %s (the API server does not serve "
                    "%s %s): %s" % (resource.crd_name, server, resource.api_version, resource.kind,
                                    resource.install_hint))


def is_missing_object(body):
    """Whether a 404's body is a Status for an object that does not exist (an unserved resource has none)."""
    try:
        return json.loads(body).get("reason") == "NotFound"
    except (TypeError, ValueError, AttributeError):
        return False


def causes(body):
    """The fields a 422's Status names, as ``field: message`` lines."""
    try:
        details = json.loads(body).get("details") or {}
    except (TypeError, ValueError, AttributeError):
        return []
    return ["%s: %s" % (cause.get("field", "?"), cause.get("message", "")) for cause in details.get("causes", [])]


def retry_on_conflict(cycle, attempts=CONFLICT_ATTEMPTS, sleep=time.sleep):
    """``cycle()``, started over when it fails with a conflict (409), ``attempts`` times in all.

    ``cycle`` must read what it decides from: a conflict means the object moved on meanwhile. When
    every attempt meets one, the error says so: another client writes the object without pause.
    """
    for attempt in range(attempts):
        try:
            return cycle()
        except ApiError as error:
            if not error.conflict:
                raise
            if attempt + 1 == attempts:
                raise ApiError("%s. It changed between our read and our write %d times in a row: another client "
                               "is writing it without pause. Nothing of ours was written; its managedFields name "
                               "the writers (kubectl get -o yaml --show-managed-fields). Run again when it settles"
                               % (error, attempts), conflict=True, status=error.status) from error
            sleep(pause(attempt + 1, 2 * CONFLICT_PAUSE_S, 1.0))
    raise AssertionError("unreachable")
