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
# The annotation of the bookmark that ends a watch-list's first events (the objects as they are now).
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def reconnect_pause(failures, cap_s=MAX_BACKOFF_S, rand=random.random):
    """Seconds before the watch tries again after ``failures`` failures in a row: 2 ** failures, capped, and
    drawn at random from its upper half, so that a fleet whose watches broke together (an API server
    restart) does not come back in step."""
    return pause(failures, 2.0, cap_s, rand)


class ScvState:
    """The Scv as last written or watched (None: read it again), whether it must be created again, and where its
    watch resumes.

    A watch bookmark moves only where the watch resumes: the object keeps its own resourceVersion, which
    its next write sends as the version it replaces (a bookmark's in its place would make every write
    after one meet a conflict).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._scv = None
        self._recreate = False
        self._resume = None   # the last bookmark's resourceVersion, when newer than the object's

    def get(self):
        """(object or None, whether to create it again)."""
        with self._lock:
            return self._scv, self._recreate

    def set(self, scv):
        with self._lock:
            self._scv, self._recreate, self._resume = scv, False, None

    def deleted(self):
        with self._lock:
            self._scv, self._recreate, self._resume = None, True, None

    def version(self):
        """Where a watch resumes: the last bookmark, else the object's resourceVersion; None without an object."""
        with self._lock:
            if self._scv is None:
                return None
            return self._resume or (self._scv.get("metadata") or {}).get("resourceVersion")

    def interval(self):
        """spec.updateInterval of the object held, None when it has none."""
        with self._lock:
            return interval_of(self._scv)

    def bookmark(self, version):
        with self._lock:
            if self._scv is not None:
                self._resume = version

    def offer(self, obj):
        """Keeps ``obj`` unless the object held is newer; (interval before, interval after)."""
        with self._lock:
            before = interval_of(self._scv)
            # The event of our own write can arrive after the write's response: keep the newer.
            if not _older(obj, self._scv):
                self._scv, self._resume = obj, None
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
        self.watch_list = True       # the server sends the object first when a watch starts from none
        self._thread = None

    def configure(self, timeout):
        """The seconds each watch request lasts, from the next one on."""
        self.timeout = timeout

    def ensure(self):
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._forever, name="scv-watch", daemon=True)
            self._thread.start()

    def _forever(self):
        failures, resync = 0, False
        while not self.stopping.is_set():
            version = self.state.version()
            if version is None:
                return
            try:
                if resync and not self.watch_list:
                    self._read_again()
                    resync = False
                    continue
                if self._watch(None if resync else version):
                    return
                failures, resync = 0, False
            except ApiError as error:
                if error.status == 410:
                    # Our resourceVersion is older than the server keeps (a restarted API server's watch cache
                    # starts at its own): start again from the object as it is now, at once.
                    resync = True
                    continue
                # An API server that does not know watch-lists refuses the request as invalid (a 403 is not that:
                # a starting server says it before its authorizer is ready).
                if resync and self.watch_list and error.status in (400, 422):
                    LOG.info("the API server does not serve watch-lists (%s): reading the Scv before watching",
                             error)
                    self.watch_list = False
                    continue
                failures += 1
                # After an error the server may have restarted: start from the object as it is now.
                resync = True
                LOG.warning("%s", error)
                self.stopping.wait(reconnect_pause(failures))

    def _watch(self, version):
        """One watch request, from ``version`` or (None) from the object as it is now; True when the watch
        should end for good."""
        initial, seen = version is None, False
        for kind, obj in self.client.watch(self.node, version, self.timeout):
            if initial and kind in ("ADDED", "MODIFIED"):
                seen = True
            elif initial and kind == "BOOKMARK" and \
                    ((obj.get("metadata") or {}).get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                initial = False
                if not seen:
                    self._gone()
                    return True
            if self.on_event(kind, obj):
                return True
        return False

    def _read_again(self):
        """For servers without watch-lists: the object and the store's revision by one list request."""
        items, version = self.client.list_named(self.node)
        if not items:
            self._gone()
            return
        self.on_event("MODIFIED", items[0])
        if version:
            self.state.bookmark(version)

    def _gone(self):
        LOG.warning("Scv %s is gone; creating it again", self.node)
        self.state.deleted()
        self.wake.set()

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
