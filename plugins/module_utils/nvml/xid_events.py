# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""XID critical errors from NVML's event API, and the log they are kept in (private).

This file records which XID struck which card, and when. What an XID means for a card's
health is policy, and belongs to the agent (``agent.xid``).
"""

from __future__ import annotations

import ctypes
import threading
import time

from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import TIMEOUT, error_code, pynvml


class XidRecord:
    """One XID: the card's index (None when the handle is unknown), the code, RFC 3339 time, clock time."""

    __slots__ = ("index", "xid", "at", "seen")

    def __init__(self, index, xid, at, seen):
        self.index, self.xid, self.at, self.seen = index, xid, at, seen

    def __repr__(self):
        return "XidRecord(%r, %r, %r)" % (self.index, self.xid, self.at)


class XidLog:
    """The XIDs of one NVML session, per card; safe to use from the waiting and the reading thread."""

    def __init__(self, clock):
        self._clock = clock
        self._lock = threading.Lock()
        self._records = {}   # card index -> [XidRecord], oldest first
        self._last = {}      # card index -> the last XID, kept when its record is dropped
        self._count = 0      # XIDs added so far, of every card: a reader can tell whether any came since

    def add(self, index, xid):
        record = XidRecord(index, xid, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), self._clock())
        with self._lock:
            self._records.setdefault(index, []).append(record)
            self._count += 1
            if index is not None:
                self._last[index] = xid
        return record

    def kept(self, index, newer_than=None):
        """Card ``index``'s records; with ``newer_than`` (a clock time), older ones are dropped for good."""
        with self._lock:
            records = self._records.get(index) or []
            if newer_than is not None:
                records[:] = [record for record in records if record.seen > newer_than]
            return list(records)

    def count(self):
        """How many XIDs were added so far (of every card, this session and the ones before)."""
        with self._lock:
            return self._count

    def last(self):
        """{card index: the last XID seen}, as dcgm-exporter's DCGM_FI_DEV_XID_ERRORS ("value of the
        last XID error encountered"): it stays after the hold has dropped the record, and after a
        new NVML session."""
        with self._lock:
            return dict(self._last)

    def clear(self, keep=()):
        """Drops the records (a new session) but those of the cards in ``keep``; the last XID per card stays."""
        with self._lock:
            self._records = {index: records for index, records in self._records.items() if index in keep}

    def drop(self, index):
        """Drops card ``index``'s records (the card answers again after a reset)."""
        with self._lock:
            self._records.pop(index, None)


def handle_key(handle):
    """A device handle as a number, comparable across calls."""
    return ctypes.cast(handle, ctypes.c_void_p).value


class XidEvents:
    """The event set of one NVML session, registered for XID critical errors on every card that has events."""

    def __init__(self):
        self._set = None
        self._inits = None
        self._indexes = {}   # handle_key -> card index

    def ready(self, card_count, inits):
        """The event set for session number ``inits``, made on first use; None when there can be none."""
        if self._set is not None and self._inits == inits:
            return self._set
        self.free()
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError:
            return None
        self._indexes = {}
        for index in range(card_count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
            except pynvml.NVMLError:
                continue   # a card without events (or lost) is read as before
            self._indexes[handle_key(handle)] = index
        if not self._indexes:
            pynvml.nvmlEventSetFree(event_set)
            return None
        self._set, self._inits = event_set, inits
        return event_set

    def wait(self, event_set, timeout_ms):
        """(card index, xid) of the next XID within ``timeout_ms``, or None.

        The card is known by its handle: a lost card no longer answers nvmlDeviceGetIndex.
        """
        try:
            data = pynvml.nvmlEventSetWait(event_set, timeout_ms)
        except pynvml.NVMLError as error:
            if error_code(error) != TIMEOUT:
                self.free()
            return None
        return self._indexes.get(handle_key(data.device)), int(data.eventData)

    def free(self):
        if self._set is not None:
            try:
                pynvml.nvmlEventSetFree(self._set)
            except pynvml.NVMLError:
                pass
            self._set = None
