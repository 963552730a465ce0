# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""NVML kept initialised across reads, for a long-running reader such as the Scv agent (private).

XIDs that NVML reports while a session lasts are kept in its ``xids`` (an ``events.XidLog``); what
they mean for a card's health is the caller's policy.

NVML is initialised again, and everything read afresh, only when something calls for it: the driver
version or GPU count changed (asked every ``SYSTEM_CHECK_S``), a call answered UNINITIALIZED,
DRIVER_NOT_LOADED or LIB_RM_VERSION_MISMATCH (the read is then retried once at once), or a card answered
GPU_IS_LOST or RESET_REQUIRED (at the next read, then backing off to ``max_lost_backoff_s`` while a card
stays lost, since a lost card recovers only after a reset).
"""

from __future__ import annotations

import threading
import time

from ansible_collections.scv.gpu.plugins.module_utils.common.gpu_info import node_totals
from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import (
    SESSION_ENDING,
    SessionLost,
    as_text,
    describe,
    error_code,
    pynvml,
    text_call,
)
from ansible_collections.scv.gpu.plugins.module_utils.nvml.card import Static, read_card
from ansible_collections.scv.gpu.plugins.module_utils.nvml.collect import init_failure_reason, system_facts, unavailable
from ansible_collections.scv.gpu.plugins.module_utils.nvml.fabric import FabricChecks
from ansible_collections.scv.gpu.plugins.module_utils.nvml.xid_events import XidEvents, XidLog
from ansible_collections.scv.gpu.plugins.module_utils.nvml.health_readings import settled_health
from ansible_collections.scv.gpu.plugins.module_utils.nvml.mig_instances import MigInstances
from ansible_collections.scv.gpu.plugins.module_utils.nvml.slow_readings import DEFAULT_INTERVAL_S, SlowReadings


# Subsets with no static readings: a read with or without them shares the card's static entry.
NO_STATIC = frozenset(("telemetry", "processes", "fabric"))

# A driver reloaded or upgraded, or a GPU added or removed, shows first in NVML's answers (errors, a
# lost GPU); the GPU count and driver version are asked again only this often (0.06 ms on an H100).
SYSTEM_CHECK_S = 30.0


def system_change(known_driver, count, call):
    """Why the session no longer matches the system (driver version, GPU count), or None."""
    driver = call(pynvml.nvmlSystemGetDriverVersion)
    if known_driver is not None and driver is not None and as_text(driver) != known_driver:
        return "the driver changed from %s to %s" % (known_driver, as_text(driver))
    now = call(pynvml.nvmlDeviceGetCount)
    if now != count:
        return "the GPU count changed from %d to %s" % (count, now)
    return None


class SettledChecks:
    """When a card's XID-driven health readings must be asked (``health.settled_health``): the GPU recovery
    action, the uncorrectable ECC count, the remapped rows and the pages pending retirement.

    The driver changes them only with an XID. On a card with no health reason, readings that read clear
    are reused. They are asked again after an XID (of any card), with the counters, or every
    ``SYSTEM_CHECK_S``. A card with a reason, or whose readings are not clear, is asked at every read.
    """

    def __init__(self):
        self._clear = {}      # card index -> (clock, XIDs seen, the readings) when they last read clear
        self._now = self._xids = None
        self._all = True

    def start(self, now, xids, every_card):
        self._now, self._xids, self._all = now, xids, every_card

    def reuse(self, index):
        """Card ``index``'s readings to reuse, or None: ask them."""
        clear = None if self._all else self._clear.get(index)
        if clear is None or clear[1] != self._xids or self._now - clear[0] >= SYSTEM_CHECK_S:
            return None
        return clear[2]

    def read(self, index, card, asked):
        """After card ``index`` was read, with its readings ``asked`` or reused."""
        if card.get("healthReasons") or card.get("healthUnchecked"):
            self._clear.pop(index, None)
        elif asked:
            readings = settled_health(card)
            if readings is None:
                self._clear.pop(index, None)
            else:
                self._clear[index] = (self._now, self._xids, readings)

    def forget(self):
        self._clear.clear()


class LostCards:
    """A lost card keeps the identity it had when it was lost (UUID, bus ID, model, ...), and its XIDs.

    A new NVML session cannot read a lost card's identity, so without this the card would change
    from "GPU 0 (GPU-...)" to "GPU 0" one read after it was lost: a second write of the Scv and of
    the Node condition for one fault, and the card an operator must replace no longer named. The
    identity is kept while the card stays lost at that index and the GPU count stays the same; a
    card that answers again (a reset) drops its XIDs.

    It also says when a new session is due (``restart_at``), since a lost card recovers only after a reset.
    """

    def __init__(self, xids):
        self.xids = xids
        self.last = frozenset()   # the cards lost at the last read
        self.restart_at = None    # clock time of the next new session, while cards are lost
        self._identity = {}       # card index: (GPU count, what the card told before it was lost)
        self._backoff = 0.0

    def schedule(self, lost, now, max_backoff_s):
        """Sets ``restart_at`` after a read that found ``lost``: the next read after a first loss, then
        backing off, doubling up to ``max_backoff_s``, while a card stays lost."""
        if not lost:
            self._backoff = 0.0
        elif self.restart_at is None:
            self.restart_at = now + self._backoff
            self._backoff = min(max_backoff_s, max(1.0, self._backoff * 2))

    def keep_identity(self, cards, lost, count):
        for index, card in enumerate(cards):
            if index not in lost:
                self._identity.pop(index, None)
                if index in self.last:
                    self.xids.drop(index)   # it answers again: reset, and its XIDs with it
                continue
            known = self._identity.get(index)
            if card.get("uuid"):
                if known is None or known[0] != count:
                    self._identity[index] = (count, {key: value for key, value in card.items()
                                                     if key not in ("health", "healthReasons")})
            elif known is not None and known[0] == count:
                for key, value in known[1].items():
                    card.setdefault(key, value)
            else:
                self._identity.pop(index, None)
        self.last = frozenset(lost)


class Session:
    """NVML kept initialised across reads, for a long-running reader such as the Scv agent.

    :meth:`read` returns what :func:`collect` returns, at a fraction of the cost: NVML is initialised once
    (about 11 ms on an H100, plus about 11 ms to attach each GPU), and each card's static readings (see
    ``Static``) are read once per session, every ``static_refresh_s`` seconds, and after :meth:`refresh_static`.
    A read then asks each card only what changes: memory, persistence mode, the health counters, telemetry.
    The ``counters`` subset, GPM and the ``fabric`` subset are read every ``counters_interval_s``; the fabric after XIDs too.
    """

    def __init__(self, static_refresh_s=600.0, max_lost_backoff_s=300.0, clock=None,
                 counters_interval_s=DEFAULT_INTERVAL_S, on_demand=False):
        self.static_refresh_s = static_refresh_s
        self.max_lost_backoff_s = max_lost_backoff_s
        self.clock = clock or time.monotonic
        self.xids = XidLog(self.clock)
        self._nvml_lock = threading.RLock()   # session start and stop against the event waiter
        self._wanted = threading.Event()      # the reader waits for the lock: the waiter lets it have it
        self._open = threading.Event()        # NVML is initialised (the waiter waits for it before its first wait)
        self._events = XidEvents()
        self.slow, self.mig = SlowReadings(self.clock, counters_interval_s, on_demand), MigInstances()   # mig: scrapes
        self.inits, self.static_reads = 0, 0    # successful nvmlInit calls; static readings (re)started
        self.last_reinit_reason = self._system = None
        self._handles, self._uuids = [], []
        self._static, self._static_at = {}, 0.0
        self._check_system, self._checked_at = False, 0.0   # ask the GPU count and driver version at once; when
        self.lost = LostCards(self.xids)
        self._settled, self._fabric = SettledChecks(), FabricChecks(lambda: self.slow.interval_s)

    # -------------------------------------------------------------- public

    def read(self, subsets):
        """Every GPU's facts, like ``collect.collect``; never raises for NVML's answers."""
        now = self.clock()
        if self._open.is_set() and self.lost.restart_at is not None and now >= self.lost.restart_at:
            self._restart("a GPU was lost or needed a reset")
        if self._open.is_set() and now - self._static_at >= self.static_refresh_s:
            self._static.clear()
            self._static_at, self._check_system = now, True
            self.static_reads += 1
        for attempt in (1, 2):
            failure = None if self._open.is_set() else self._start()
            if failure is not None:
                return failure
            try:
                return self._read(subsets)
            except SessionLost as lost:
                self._restart(str(lost))
                if attempt == 2:
                    return unavailable("NVML answered \"%s\" again after it was initialised anew" % lost)
        raise AssertionError("unreachable")

    def refresh_static(self):
        """Reads every card's static readings again at the next read (MIG mode changed, say)."""
        self._static_at = -self.static_refresh_s - 1.0
        self._check_system = True

    def handle(self, index):
        """Card ``index``'s open (handle, UUID): (None, None) with no session or no such card (a read opens them)."""
        known = self._open.is_set() and 0 <= index < len(self._handles)
        return (self._handles[index], self._uuids[index]) if known else (None, None)

    def close(self, keep_xids=()):
        """Shuts NVML down (the next read starts it again); forgets the XIDs but those of ``keep_xids``' cards."""
        self._wanted.set()
        try:
            with self._nvml_lock:
                self._events.free()
                self.slow.free()
                self.mig.free()
                if self._open.is_set():
                    self._open.clear()
                    try:
                        pynvml.nvmlShutdown()
                    except pynvml.NVMLError:
                        pass
                self._handles, self._uuids = [], []
                self._static.clear()
                self._settled.forget()
                self._fabric.forget()
                self.xids.clear(keep_xids)
        finally:
            self._wanted.clear()

    def wait_event(self, timeout_ms):
        """Waits up to ``timeout_ms`` for an XID critical error; (card index, xid), or None.

        Meant for one thread beside the reader's: NVML wakes it when the driver reports an XID,
        with no polling. NVML is not shut down during a wait, so a new session waits for the
        current wait to end. The XID is kept in :attr:`xids`. Returns None: after the timeout when
        NVML has no events, and as soon as NVML is initialised (or after the timeout) when it is not.
        """
        if self._wanted.is_set():
            time.sleep(0.05)   # the reader is starting or stopping NVML: let it have the lock
            return None
        with self._nvml_lock:
            opened = self._open.is_set()
            event_set = self._events.ready(len(self._handles), self.inits) if opened else None
            if event_set is not None:
                event = self._events.wait(event_set, timeout_ms)
                if event is not None:
                    self.xids.add(*event)
                return event
        if opened:
            time.sleep(timeout_ms / 1000.0)   # no events on these cards
        else:
            self._open.wait(timeout_ms / 1000.0)   # a session that starts meanwhile is waited on at once
        return None

    # ------------------------------------------------------------ internal

    def _restart(self, reason):
        self.last_reinit_reason = reason
        self.close(keep_xids=self.lost.last)   # a card still lost keeps its XIDs: this is no reset

    def _start(self):
        self._wanted.set()
        try:
            with self._nvml_lock:
                return self._start_locked()
        finally:
            self._wanted.clear()

    def _start_locked(self):
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            return unavailable(init_failure_reason(error))
        self._open.set()
        self.inits, self.static_reads = self.inits + 1, self.static_reads + 1
        self._static_at = self._checked_at = self.clock()
        self.lost.restart_at = None
        self._system = system_facts()
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as error:
            facts = dict(self._system)
            facts.update(unavailable("NVML cannot count the GPUs: %s" % describe(error)))
            self.close()
            return facts
        self._handles, self._uuids = [None] * count, [None] * count
        return None

    def _system_call(self, function):
        """``function()``; None when it fails, SessionLost when its answer ends the session."""
        try:
            return text_call(function)
        except pynvml.NVMLError as error:
            if error_code(error) in SESSION_ENDING:
                raise SessionLost(error_code(error), describe(error))
            return None

    def _read(self, subsets):
        facts = dict(self._system)
        if self._check_system or self.clock() - self._checked_at >= SYSTEM_CHECK_S:
            self._check_system, self._checked_at = False, self.clock()
            changed = system_change(facts.get("driver_version"), len(self._handles), self._system_call)
            if changed:
                raise SessionLost(0, changed)
        slow = "counters" in subsets and self.slow.due()
        now_subsets = subsets if slow else [subset for subset in subsets if subset != "counters"]
        cards, lost = [], []
        now, xids = self.clock(), self.xids.count()
        self._settled.start(now, xids, slow)
        self._fabric.start(now, xids)
        for index in range(len(self._handles)):
            static = self._static_for(index, subsets)
            settled = self._settled.reuse(index)
            fabric = self._fabric.reuse(index) if "fabric" in subsets else None
            card = read_card(index, now_subsets, self._handles[index], static, lost, settled, self.slow.wanted, fabric)
            self._settled.read(index, card, settled is None)
            if "fabric" in subsets and fabric is None:
                self._fabric.read(index, card)
            if "counters" in subsets:
                self.slow.fill(index, self._handles[index], card, slow, not self.mig.listed(index))
            cards.append(card)
        self.lost.schedule(lost, self.clock(), self.max_lost_backoff_s)
        self.lost.keep_identity(cards, lost, len(self._handles))
        facts["cardList"] = cards
        facts.update(node_totals(cards))
        return facts

    def _static_for(self, index, subsets):
        """The card's static readings, kept under its UUID; opens the card's handle the first time.

        Returns a throwaway entry for a card whose handle or UUID cannot be read now: such a card
        is asked again at every read.
        """
        if self._handles[index] is None:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = as_text(text_call(pynvml.nvmlDeviceGetUUID, handle))
            except pynvml.NVMLError:
                return Static(subsets)   # read_card opens it itself and reports why it cannot
            self._handles[index], self._uuids[index] = handle, uuid
        key = (self._uuids[index], frozenset(subsets) - NO_STATIC)
        entry = self._static.get(key)
        if entry is None:
            entry = self._static[key] = Static(subsets)
        return entry
