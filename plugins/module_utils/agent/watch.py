# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The node's own Scv as the agent last knew it, and the watch that keeps it current (private)."""

from __future__ import annotations

import logging
import random
import threading

from ansible_collections.scv.gpu.plugins.module_utils.common.backoff import pause
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError

LOG = logging.getLogger("scv-gpu-agent")
MAX_BACKOFF_S = 30.0


def reconnect_pause(failures, cap_s=MAX_BACKOFF_S, rand=random.random):
    """Seconds before the watch tries again after ``failures`` failures in a row: 2 ** failures, capped, and
    drawn at random from its upper half, so that a fleet whose watches broke together (an API server
    restart) does not come back in step."""
    return pause(failures, 2.0, cap_s, rand)


class ScvState:
    """The Scv as last written or watched (None: read it again), and whether it must be created again."""

    def __init__(self):
        self._lock = threading.Lock()
        self._scv = None
        self._recreate = False

    def get(self):
        """(object or None, whether to create it again)."""
        with self._lock:
            return self._scv, self._recreate

    def set(self, scv):
        with self._lock:
            self._scv, self._recreate = scv, False

    def forget(self):
        with self._lock:
            self._scv = None

    def deleted(self):
        with self._lock:
            self._scv, self._recreate = None, True

    def version(self):
        with self._lock:
            return ((self._scv or {}).get("metadata") or {}).get("resourceVersion")

    def interval(self):
        """spec.updateInterval of the object held, None when it has none."""
        with self._lock:
            return interval_of(self._scv)

    def bookmark(self, version):
        with self._lock:
            if self._scv is not None:
                self._scv.setdefault("metadata", {})["resourceVersion"] = version

    def offer(self, obj):
        """Keeps ``obj`` unless the object held is newer; (interval before, interval after)."""
        with self._lock:
            before = interval_of(self._scv)
            # The event of our own write can arrive after the write's response: keep the newer.
            if not _older(obj, self._scv):
                self._scv = obj
            return before, interval_of(self._scv)


def interval_of(scv):
    """spec.updateInterval of an Scv, None when it has none (or a spec that is not an object)."""
    spec = (scv or {}).get("spec")
    return spec.get("updateInterval") if isinstance(spec, dict) else None


def _older(candidate, current):
    """Whether ``candidate`` is an older version of the object than ``current``.

    resourceVersions are etcd revisions in every API server there is; one that is not a
    number is never judged older.
    """
    try:
        return int(candidate["metadata"]["resourceVersion"]) < int(current["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return False


class ScvWatch:
    """A watch on the node's own Scv (one request per ``timeout`` seconds), in a thread of its own.

    It brings spec changes (``wake`` is set when the interval changes) and deletions (the
    state asks for the object to be created again). It ends when the state has no object; the
    loop starts it again once it has one.
    """

    def __init__(self, client, node, state, wake, stopping, timeout=300):
        self.client = client
        self.node = node
        self.state = state
        self.wake = wake
        self.stopping = stopping
        self.timeout = timeout
        self._thread = None

    def ensure(self):
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._forever, name="scv-watch", daemon=True)
            self._thread.start()

    def _forever(self):
        failures = 0
        while not self.stopping.is_set():
            version = self.state.version()
            if version is None:
                return
            try:
                for kind, obj in self.client.watch(self.node, version, self.timeout):
                    failures = 0
                    if self.on_event(kind, obj):
                        return
            except ApiError as error:
                if error.status == 410:
                    # Our resourceVersion is too old: forget the object, the next tick reads it.
                    self.state.forget()
                    return
                failures += 1
                LOG.warning("%s", error)
                self.stopping.wait(reconnect_pause(failures))

    def on_event(self, kind, obj):
        """Applies one watch event; True when the watch should end."""
        if kind == "DELETED":
            LOG.warning("Scv %s was deleted; creating it again", self.node)
            self.state.deleted()
            self.wake.set()
            return True
        if kind == "BOOKMARK":
            self.state.bookmark(obj["metadata"]["resourceVersion"])
            return False
        if kind in ("ADDED", "MODIFIED"):
            before, after = self.state.offer(obj)
            if after != before:
                LOG.info("spec.updateInterval is now %s ms", after)
                self.wake.set()
            return False
        if kind == "ERROR":
            raise ApiError("watch error: %s" % obj.get("message"), status=obj.get("code"))
        return False
