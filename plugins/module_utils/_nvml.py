# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Reads a node's NVIDIA GPUs through NVML (nvidia-ml-py).

This file is private to the collection (its name starts with ``_``) and is the
only one that touches NVML. ``gpu_facts`` and the Scv agent both call
:func:`collect`, so the SCV fields have one implementation.
"""

from __future__ import annotations

import traceback

try:
    import pynvml
except ImportError:
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None

from ansible_collections.scv.gpu.plugins.module_utils._gpu_info import (
    HEALTHY,
    UNHEALTHY,
    bytes_to_mib,
    cuda_version_string,
    gpu_family,
    node_totals,
    pcie_bandwidth,
)

# NVML error codes (stable across NVML versions, see nvml.h). Spelled out here
# so that this file can be imported, and its messages built, without pynvml.
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_NOT_FOUND = 6
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_RESET_REQUIRED = 16
_LIB_RM_VERSION_MISMATCH = 18
_UNKNOWN = 999

# Answers that mean "this card or driver cannot tell": the field is left out.
_ABSENT = frozenset((_NOT_SUPPORTED, _NO_PERMISSION, _NOT_FOUND, _FUNCTION_NOT_FOUND))

# Answers after which a card is not queried further: it is gone until reset.
_CARD_GONE = frozenset((_GPU_IS_LOST, _RESET_REQUIRED))

# Answers after which a long-lived NVML session is re-initialised: NVML was shut down under
# us, the driver went away, or the library no longer matches the loaded kernel driver.
_UNINITIALIZED = 1
_SESSION_ENDING = frozenset((_UNINITIALIZED, _DRIVER_NOT_LOADED, _LIB_RM_VERSION_MISMATCH))

_CLOCK_SM = 1
_CLOCK_MEM = 2
_TEMPERATURE_GPU = 0
_MEMORY_ERROR_UNCORRECTED = 1
_MEMORY_ERROR_CORRECTED = 0
_VOLATILE_ECC = 0
_AGGREGATE_ECC = 1
_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
_GPM_ANY_TENSOR_UTIL = 5

_HW_SLOWDOWN = 0x8
_SW_THERMAL_SLOWDOWN = 0x20
_HW_THERMAL_SLOWDOWN = 0x40
_HW_POWER_BRAKE_SLOWDOWN = 0x80

_RECOVERY_ACTIONS = {
    1: "the driver asks for a GPU reset",
    2: "the driver asks for a node reboot",
    3: "the driver asks to drain peer-to-peer traffic",
    4: "the driver asks to drain peer-to-peer traffic and reset the GPU",
    5: "the driver asks to recover the IMEX domain",
    6: "the driver asks for a reset of the GPU's PCIe bus",
    7: "the driver asks for a system reboot",
}

_UNAVAILABLE_REASONS = {
    _LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 was not found: the NVIDIA driver is not installed "
                        "(or its library is not in the loader's search path)",
    _DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded (is the nvidia module loaded? "
                        "a reboot may be pending after a driver install)",
    _NO_PERMISSION: "no permission to open the NVIDIA device files (/dev/nvidia*); run as root "
                    "or as a member of the group that owns them",
    _LIB_RM_VERSION_MISMATCH: "the NVML library and the loaded kernel driver have different "
                              "versions: reboot (or reload the nvidia module) after a driver upgrade",
}


class CardGone(Exception):
    """The card answered GPU_IS_LOST or RESET_REQUIRED: stop asking it."""


class SessionLost(Exception):
    """NVML answered that the session itself is over (see ``_SESSION_ENDING``)."""

    def __init__(self, code, text):
        super().__init__(text)
        self.code = code


def code_key(what, args):
    """The key under which a query's NOT_SUPPORTED answer is remembered."""
    return "%s%r" % (what, args)


def _error_code(error):
    return getattr(error, "value", _UNKNOWN)


def _describe(error):
    """NVML's own text for an error; it needs the library, which may be absent."""
    try:
        return str(error)
    except Exception:  # pylint: disable=broad-exception-caught
        return "NVML error %s" % _error_code(error)


def _gone_reason(code):
    if code == _GPU_IS_LOST:
        return ("GPU is lost: it fell off the bus or stopped responding (XID 79); "
                "reset the GPU or reboot the node")
    return "GPU requires a reset before it can be used again"


def _as_text(value):
    """Text from NVML, made safe: bytes that are not UTF-8 become U+FFFD."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _text_call(function, *args):
    """``function(*args)``; a string pynvml cannot decode comes back as its raw bytes.

    pynvml decodes NVML's strings as strict UTF-8, so a card whose name or UUID holds
    other bytes would raise from inside pynvml; those bytes are in the error.
    """
    try:
        return function(*args)
    except UnicodeDecodeError as error:
        return bytes(error.object)


class _CardReader:
    """Queries one device, turning NVML answers into fields and health reasons."""

    def __init__(self, handle, reasons, unchecked=None, prefix="", unsupported=None, session=False):
        self.handle = handle
        self.reasons = reasons
        self.unchecked = [] if unchecked is None else unchecked
        self.prefix = prefix
        # Queries this card answered NOT_SUPPORTED, not asked again (a Session's cards only).
        self.unsupported = unsupported
        # Within a Session, errors that end the session raise SessionLost.
        self.session = session

    def child(self, handle, prefix):
        return _CardReader(handle, self.reasons, self.unchecked, prefix, self.unsupported, self.session)

    def query(self, what, function, *args, health=False):
        """Call ``function(handle, *args)``; None when the card cannot tell.

        A failure other than "not supported" becomes a health reason naming the
        query (SCV marks such a card Unhealthy too). GPU_IS_LOST and
        RESET_REQUIRED raise CardGone so that a dead card costs no more calls.
        A health check (``health``) that NVML refuses for lack of permission is
        recorded in ``unchecked``: the card is not known to be healthy there.
        """
        remembered = self.unsupported is not None and code_key(self.prefix + what, args)
        if remembered and remembered in self.unsupported:
            return None
        try:
            return _text_call(function, self.handle, *args)
        except pynvml.NVMLError as error:
            code = _error_code(error)
            if self.session and code in _SESSION_ENDING:
                raise SessionLost(code, _describe(error))
            if health and code == _NO_PERMISSION:
                self.note_unchecked(what)
                return None
            if code in _ABSENT:
                if remembered and code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                    self.unsupported.add(remembered)
                return None
            if code in _CARD_GONE:
                raise CardGone(_gone_reason(code))
            self.reasons.append("%sreading the %s failed: %s" % (self.prefix, what, _describe(error)))
            return None

    def note_unchecked(self, what):
        note = "%s%s: no permission to read it (run as root to check it)" % (self.prefix, what)
        if note not in self.unchecked:
            self.unchecked.append(note)


def _clock_event_reasons(handle):
    try:
        return pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    except pynvml.NVMLError as error:
        if _error_code(error) != _FUNCTION_NOT_FOUND:
            raise
    # Drivers before the r535 branch know only the older name of the same query.
    return pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)


def _read_ecc_mode(reader, card):
    ecc = reader.query("ECC mode", pynvml.nvmlDeviceGetEccMode, health=True)
    if ecc is not None:
        card["eccEnabled"] = bool(ecc[0])


def _read_health(reader, card):
    reasons = reader.reasons
    if card.get("eccEnabled"):
        counts = {}
        for key, kind, counter in (
            ("uncorrectedVolatile", _MEMORY_ERROR_UNCORRECTED, _VOLATILE_ECC),
            ("uncorrectedAggregate", _MEMORY_ERROR_UNCORRECTED, _AGGREGATE_ECC),
            ("correctedVolatile", _MEMORY_ERROR_CORRECTED, _VOLATILE_ECC),
            ("correctedAggregate", _MEMORY_ERROR_CORRECTED, _AGGREGATE_ECC),
        ):
            value = reader.query("ECC error count", pynvml.nvmlDeviceGetTotalEccErrors, kind, counter, health=True)
            if value is not None:
                counts[key] = value
        card["eccErrors"] = counts
        if counts.get("uncorrectedVolatile"):
            reasons.append("%d uncorrectable ECC errors since the driver loaded"
                           % counts["uncorrectedVolatile"])

    rows = reader.query("remapped rows", pynvml.nvmlDeviceGetRemappedRows, health=True)
    if rows is not None:
        correctable, uncorrectable, remap_pending, remap_failed = rows
        card["remappedRows"] = {
            "correctable": correctable,
            "uncorrectable": uncorrectable,
            "pending": bool(remap_pending),
            "failed": bool(remap_failed),
        }
        if remap_failed:
            reasons.append("row remapping failed: the GPU needs service")
        if remap_pending:
            reasons.append("row remapping is pending: reset the GPU")

    # Cards that remap rows (Ampere and later) do not retire pages: the query would answer
    # NOT_SUPPORTED, and on an H100 that answer alone costs 0.4 ms. Ask only the others.
    pending = None if rows is not None else reader.query(
        "retired pages", pynvml.nvmlDeviceGetRetiredPagesPendingStatus, health=True)
    if pending is not None:
        card["retiredPagesPending"] = bool(pending)
        if pending:
            reasons.append("memory pages are pending retirement: reset the GPU or reboot the node")

    fields = reader.query("GPU recovery action", pynvml.nvmlDeviceGetFieldValues,
                          [_FI_DEV_GET_GPU_RECOVERY_ACTION], health=True)
    if fields is not None and fields[0].nvmlReturn == _NO_PERMISSION:
        reader.note_unchecked("GPU recovery action")
    if fields is not None and fields[0].nvmlReturn == 0:
        action = fields[0].value.uiVal
        card["recoveryAction"] = action
        if action:
            reasons.append("%s after a critical XID error"
                           % _RECOVERY_ACTIONS.get(action, "the driver asks for recovery action %d" % action))

    event_reasons = reader.query("clock event reasons", _clock_event_reasons, health=True)
    if event_reasons is not None:
        if event_reasons & _HW_THERMAL_SLOWDOWN:
            reasons.append("hardware thermal slowdown: the GPU is too hot and its clocks are cut")
        if event_reasons & _SW_THERMAL_SLOWDOWN:
            reasons.append("software thermal slowdown: the GPU runs above its target temperature")
        if event_reasons & _HW_POWER_BRAKE_SLOWDOWN:
            reasons.append("hardware power brake slowdown: the power supply asked the GPU to slow down")


def _read_telemetry(reader, card):
    temperature = reader.query("temperature", pynvml.nvmlDeviceGetTemperature, _TEMPERATURE_GPU)
    if temperature is not None:
        card["temperature"] = temperature
    utilization = reader.query("utilization", pynvml.nvmlDeviceGetUtilizationRates)
    if utilization is not None:
        card["gpuUtilization"] = utilization.gpu
        card["memoryUtilization"] = utilization.memory
    draw = reader.query("power draw", pynvml.nvmlDeviceGetPowerUsage)
    if draw is not None:
        card["powerDraw"] = draw // 1000
    for key, what, clock in (("smClock", "SM clock", _CLOCK_SM), ("memClock", "memory clock", _CLOCK_MEM)):
        value = reader.query(what, pynvml.nvmlDeviceGetClockInfo, clock)
        if value is not None:
            card[key] = value


def _read_mig_device(parent_reader, index):
    prefix = "MIG device %d: " % index
    handle = parent_reader.child(parent_reader.handle, prefix).query(
        "handle", pynvml.nvmlDeviceGetMigDeviceHandleByIndex, index)
    if handle is None:
        return None
    reader = parent_reader.child(handle, prefix)
    device = {"index": index}
    for key, what, function in (
        ("uuid", "UUID", pynvml.nvmlDeviceGetUUID),
        ("model", "name", pynvml.nvmlDeviceGetName),
        ("gpuInstanceId", "GPU instance id", pynvml.nvmlDeviceGetGpuInstanceId),
        ("computeInstanceId", "compute instance id", pynvml.nvmlDeviceGetComputeInstanceId),
    ):
        value = reader.query(what, function)
        if value is not None:
            device[key] = _as_text(value)
    memory = reader.query("memory information", pynvml.nvmlDeviceGetMemoryInfo)
    if memory is not None:
        device["totalMemory"] = bytes_to_mib(memory.total)
        device["freeMemory"] = bytes_to_mib(memory.free)
    return device


def _read_mig_mode(reader, card):
    mode = reader.query("MIG mode", pynvml.nvmlDeviceGetMigMode)
    if mode is not None:
        card["migEnabled"] = bool(mode[0])
        card["migPendingEnabled"] = bool(mode[1])


def _read_mig_devices(reader, card):
    if not card.get("migEnabled"):
        return
    devices = []
    slots = reader.query("MIG device count", pynvml.nvmlDeviceGetMaxMigDeviceCount) or 0
    first_reason = len(reader.reasons)
    for index in range(slots):
        device = _read_mig_device(reader, index)
        if device is not None:
            devices.append(device)
    card["migDevices"] = devices
    reader.reasons[first_reason:] = _group_mig_reasons(reader.reasons[first_reason:])


def _group_mig_reasons(reasons):
    """One reason per failure, naming every MIG device it struck: "MIG devices 0, 1, 2: ..."."""
    grouped = {}
    for reason in reasons:
        head, sep, rest = reason.partition(": ")
        if sep and head.startswith("MIG device "):
            grouped.setdefault(rest, []).append(head[len("MIG device "):])
        else:
            grouped.setdefault(reason, None)
    return ["%s %s: %s" % ("MIG devices" if len(slots) > 1 else "MIG device", ", ".join(slots), rest)
            if slots else rest for rest, slots in grouped.items()]


def _read_identity(reader, card):
    name = reader.query("name", pynvml.nvmlDeviceGetName)
    if name is not None:
        card["model"] = _as_text(name)
    uuid = reader.query("UUID", pynvml.nvmlDeviceGetUUID)
    if uuid is not None:
        card["uuid"] = _as_text(uuid)
    pci = reader.query("PCI information", pynvml.nvmlDeviceGetPciInfo)
    if pci is not None:
        card["pciBusId"] = _as_text(pci.busId)


def _read_memory(reader, card):
    memory = reader.query("memory information", pynvml.nvmlDeviceGetMemoryInfo)
    if memory is not None:
        card["totalMemory"] = bytes_to_mib(memory.total)
        card["freeMemory"] = bytes_to_mib(memory.free)
        card["usedMemory"] = bytes_to_mib(memory.used)
        if memory.free > memory.total or memory.used > memory.total:
            reader.reasons.append(
                "the memory reading cannot be right: %d MiB free and %d MiB used of %d MiB in all; reset the "
                "GPU or reload the driver" % (card["freeMemory"], card["usedMemory"], card["totalMemory"]))


def _read_capabilities(reader, card):
    clock = reader.query("maximum memory clock", pynvml.nvmlDeviceGetMaxClockInfo, _CLOCK_MEM)
    if clock is not None:
        card["clock"] = clock
    core = reader.query("maximum SM clock", pynvml.nvmlDeviceGetMaxClockInfo, _CLOCK_SM)
    if core is not None:
        card["core"] = core
    limit = reader.query("power management limit", pynvml.nvmlDeviceGetPowerManagementLimit)
    if limit is not None:
        card["power"] = limit // 1000

    generation = reader.query("maximum PCIe generation", pynvml.nvmlDeviceGetMaxPcieLinkGeneration)
    width = reader.query("maximum PCIe width", pynvml.nvmlDeviceGetMaxPcieLinkWidth)
    if generation is not None:
        card["pcieGeneration"] = generation
    if width is not None:
        card["pcieWidth"] = width
    if generation is not None and width is not None:
        bandwidth = pcie_bandwidth(generation, width)
        if bandwidth is not None:
            card["bandwidth"] = bandwidth

    capability = reader.query("compute capability", pynvml.nvmlDeviceGetCudaComputeCapability)
    if capability is not None:
        major, minor = capability
        card["computeCapability"] = "%d.%d" % (major, minor)
        family = gpu_family(major, minor)
        if family:
            card["family"] = family


def _read_persistence(reader, card):
    persistence = reader.query("persistence mode", pynvml.nvmlDeviceGetPersistenceMode)
    if persistence is not None:
        card["persistenceMode"] = bool(persistence)


class _Static:
    """What one card's static readings gave (fields, reasons, unchecked notes), kept by a Session.

    Static readings are those that change only with the driver, a reset or an administrator:
    identity, maximum clocks, power limit, maximum PCIe link, compute capability, ECC and MIG
    mode, and which queries the card does not support.
    """

    def __init__(self, subsets):
        self.subsets = frozenset(subsets)
        self.reset()

    def reset(self):
        self.filled = False
        self.fields = {}
        self.reasons = []
        self.unchecked = []
        self.unsupported = set()


def _read_card(index, subsets, handle=None, static=None, lost=None):
    """One card's facts. ``handle`` and ``static`` come from a Session; without them, everything is read.

    A card that answers GPU_IS_LOST or RESET_REQUIRED has its index added to ``lost``.
    """
    card = {"id": index}
    reasons, unchecked = [], []
    try:
        if handle is None:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError as error:
                code = _error_code(error)
                if static is not None and code in _SESSION_ENDING:
                    raise SessionLost(code, _describe(error))
                if code in _CARD_GONE:
                    raise CardGone(_gone_reason(code))
                reasons.append("the driver cannot open this GPU: %s" % _describe(error))
                return _finish(card, reasons)
        reader = _CardReader(handle, reasons, unchecked, unsupported=None if static is None else static.unsupported,
                             session=static is not None)
        fresh = static is None or not static.filled
        if not fresh:
            card.update(static.fields)
            reasons.extend(static.reasons)
            unchecked.extend(static.unchecked)

        def once(step):
            """Runs a static step on a fresh card, keeping what it gave for the next reads."""
            if not fresh:
                return
            keys, first_reason, first_note = set(card), len(reasons), len(unchecked)
            step(reader, card)
            if static is not None:
                static.fields.update((key, card[key]) for key in card if key not in keys)
                static.reasons.extend(reasons[first_reason:])
                static.unchecked.extend(unchecked[first_note:])

        once(_read_identity)
        _read_memory(reader, card)
        once(_read_capabilities)
        _read_persistence(reader, card)
        once(_read_ecc_mode)
        _read_health(reader, card)
        if "telemetry" in subsets:
            _read_telemetry(reader, card)
        if "mig" in subsets:
            once(_read_mig_mode)
            _read_mig_devices(reader, card)
        if "processes" in subsets:
            processes = reader.query("running compute processes", pynvml.nvmlDeviceGetComputeRunningProcesses)
            if processes is not None:
                card["processCount"] = len(processes)
        if static is not None:
            # A static query that failed (not one the card lacks) is asked again next time.
            static.filled = not static.reasons
            if static.reasons:
                static.reset()
    except CardGone as gone:
        if static is not None:
            static.reset()   # a half-read card is read afresh next time
        if lost is not None:
            lost.append(index)
        reasons.append(str(gone))
    return _finish(card, reasons, unchecked)


def _finish(card, reasons, unchecked=()):
    card["health"] = UNHEALTHY if reasons else HEALTHY
    card["healthReasons"] = reasons
    if unchecked:
        card["healthUnchecked"] = list(unchecked)
    return card


def _unavailable(reason):
    facts = {"nvml_available": False, "nvml_error": reason, "cardList": []}
    facts.update(node_totals([]))
    return facts


def _init_failure_reason(error):
    code = _error_code(error)
    return _UNAVAILABLE_REASONS.get(code, "NVML could not be initialised: %s" % _describe(error))


def _system_facts():
    facts = {"nvml_available": True, "nvml_error": None}
    for key, function in (
        ("driver_version", pynvml.nvmlSystemGetDriverVersion),
        ("nvml_version", pynvml.nvmlSystemGetNVMLVersion),
    ):
        try:
            facts[key] = _as_text(_text_call(function))
        except pynvml.NVMLError:
            pass
    try:
        facts["cuda_driver_version"] = cuda_version_string(pynvml.nvmlSystemGetCudaDriverVersion())
    except pynvml.NVMLError:
        pass
    return facts


def collect(subsets):
    """Every GPU's facts, as the ``nvidia_gpu`` fact of ``gpu_facts``.

    ``subsets`` names the optional parts to read (see ``GATHER_SUBSETS``).
    Never raises for a missing driver or a failing card: the driver's absence
    is reported in ``nvml_available``/``nvml_error``, a failing card as
    Unhealthy with its reasons. Initialises NVML and shuts it down again: for
    repeated reads, a :class:`Session` costs far less.
    """
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return _unavailable(_init_failure_reason(error))
    try:
        facts = _system_facts()
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as error:
            facts.update(_unavailable("NVML cannot count the GPUs: %s" % _describe(error)))
            return facts
        cards = [_read_card(index, subsets) for index in range(count)]
        facts["cardList"] = cards
        facts.update(node_totals(cards))
        return facts
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _handle_key(handle):
    import ctypes
    return ctypes.cast(handle, ctypes.c_void_p).value


class Session:
    """NVML kept initialised across reads, for a long-running reader such as the Scv agent.

    :meth:`read` returns what :func:`collect` returns, at a fraction of the cost: NVML is
    initialised once (about 11 ms on an H100, plus about 11 ms to attach each GPU), and each
    card's static readings (see ``_Static``) are read once per session and again every
    ``static_refresh_s`` seconds. A read then asks each card only what changes: memory,
    persistence mode, the health counters, and telemetry when asked for.

    NVML is initialised again, and everything read afresh, only when something calls for it:
    the driver version NVML reports changed (the driver was reloaded or upgraded), the GPU
    count changed, a call answered UNINITIALIZED, DRIVER_NOT_LOADED or LIB_RM_VERSION_MISMATCH
    (the read is then retried once at once), or a card answered GPU_IS_LOST or
    RESET_REQUIRED (at the next read, then backing off to ``max_lost_backoff_s`` while a card
    stays lost, since a lost card recovers only after a reset).
    """

    def __init__(self, static_refresh_s=600.0, max_lost_backoff_s=300.0, clock=None, xid_actions=None,
                 xid_hold_s=600.0):
        import threading
        import time

        self.xid_actions = dict(xid_actions or {})
        self.xid_hold_s = xid_hold_s
        self._xids = {}                # card index -> [(xid, RFC 3339 time, clock time)] in this session
        self._nvml_lock = threading.RLock()   # session start and stop against the event waiter
        self._wanted = threading.Event()      # the reader waits for the lock: the waiter lets it have it
        self._event_set = None
        self._event_inits = None
        self._event_indexes = {}
        self._gpm = {}                 # card index -> {"supported": bool, "previous": GPM sample}
        self.static_refresh_s = static_refresh_s
        self.max_lost_backoff_s = max_lost_backoff_s
        self.clock = clock or time.monotonic
        self.inits = 0                 # successful nvmlInit calls
        self.static_reads = 0          # times the static readings were (re)started
        self.last_reinit_reason = None
        self._open = False
        self._system = None
        self._handles = []
        self._uuids = []
        self._static = {}
        self._static_at = 0.0
        self._reinit_at = None
        self._lost_backoff = 0.0

    # -------------------------------------------------------------- public

    def read(self, subsets):
        """Every GPU's facts, like :func:`collect`; never raises for NVML's answers."""
        now = self.clock()
        if self._open and self._reinit_at is not None and now >= self._reinit_at:
            self._restart("a GPU was lost or needed a reset")
        if self._open and now - self._static_at >= self.static_refresh_s:
            self._static.clear()
            self._static_at = now
            self.static_reads += 1
        for attempt in (1, 2):
            if not self._open:
                failure = self._start()
                if failure is not None:
                    return failure
            try:
                return self._read(subsets)
            except SessionLost as lost:
                self._restart(str(lost))
                if attempt == 2:
                    return _unavailable("NVML answered \"%s\" again after it was initialised anew" % lost)
        raise AssertionError("unreachable")

    def close(self):
        """Shuts NVML down (the next read initialises it again)."""
        self._wanted.set()
        try:
            self._close_locked()
        finally:
            self._wanted.clear()

    def _close_locked(self):
        with self._nvml_lock:
            self._free_events()
            self._free_gpm()
            if self._open:
                self._open = False
                try:
                    pynvml.nvmlShutdown()
                except pynvml.NVMLError:
                    pass
            self._handles = []
            self._uuids = []
            self._static.clear()
            self._xids.clear()

    # ----------------------------------------------------------- XID events

    def wait_event(self, timeout_ms):
        """Waits up to ``timeout_ms`` for an XID critical error; (card index, xid), or None.

        Meant for one thread beside the reader's: NVML wakes it when the driver reports an XID,
        with no polling. NVML is not shut down during a wait, so a new session waits for the
        current wait to end. The XID is kept and becomes a health reason of its card at the next
        read (see ``_xid``), for ``xid_hold_s`` seconds (0: while this NVML session lasts).
        Returns None at once, after a pause, when NVML is not initialised or has no events.
        """
        import time

        if self._wanted.is_set():
            time.sleep(0.05)   # the reader is starting or stopping NVML: let it have the lock
            return None
        with self._nvml_lock:
            event_set = self._events_ready()
            if event_set is not None:
                try:
                    data = pynvml.nvmlEventSetWait(event_set, timeout_ms)
                except pynvml.NVMLError as error:
                    if _error_code(error) != 10:   # NVML_ERROR_TIMEOUT: nothing happened
                        self._free_events()
                    return None
                index = self._index_of(data.device)
                xid = int(data.eventData)
                at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                self._xids.setdefault(index, []).append((xid, at, self.clock()))
                return index, xid
        time.sleep(timeout_ms / 1000.0)
        return None

    def _events_ready(self):
        """The event set of this session, created and registered on first use; None when there can be none."""
        if not self._open:
            return None
        if self._event_set is not None and self._event_inits == self.inits:
            return self._event_set
        self._free_events()
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError:
            return None
        self._event_indexes = {}
        for index in range(len(self._handles)):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
            except pynvml.NVMLError:
                continue   # a card without events (or lost) is read as before
            self._event_indexes[_handle_key(handle)] = index
        if not self._event_indexes:
            pynvml.nvmlEventSetFree(event_set)
            return None
        self._event_set, self._event_inits = event_set, self.inits
        return event_set

    def _free_events(self):
        if self._event_set is not None:
            try:
                pynvml.nvmlEventSetFree(self._event_set)
            except pynvml.NVMLError:
                pass
            self._event_set = None

    def _index_of(self, handle):
        """The card an event came from, by its handle: a lost card no longer answers nvmlDeviceGetIndex."""
        return self._event_indexes.get(_handle_key(handle))

    def _read_tensor_activity(self, index, handle, card):
        """``tensorUtilization``: percent of time the SMs did tensor work since the last read (GPM, Hopper on).

        GPM compares two samples, so the first read of a session gives nothing; a card without
        GPM is asked once per session.
        """
        state = self._gpm.get(index)
        if state is None:
            try:
                supported = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            except pynvml.NVMLError:
                supported = False
            state = self._gpm[index] = {"supported": supported, "previous": None}
        if not state["supported"]:
            return
        try:
            sample = pynvml.nvmlGpmSampleAlloc()
            pynvml.nvmlGpmSampleGet(handle, sample)
        except pynvml.NVMLError:
            return
        previous, state["previous"] = state["previous"], sample
        if previous is None:
            return
        try:
            request = pynvml.c_nvmlGpmMetricsGet_t()
            request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = 1
            request.sample1, request.sample2 = previous, sample
            request.metrics[0].metricId = _GPM_ANY_TENSOR_UTIL
            pynvml.nvmlGpmMetricsGet(request)
            if request.metrics[0].nvmlReturn == 0:
                card["tensorUtilization"] = round(request.metrics[0].value, 2)
        except pynvml.NVMLError:
            pass
        finally:
            try:
                pynvml.nvmlGpmSampleFree(previous)
            except pynvml.NVMLError:
                pass

    def _free_gpm(self):
        for state in self._gpm.values():
            if state.get("previous") is not None:
                try:
                    pynvml.nvmlGpmSampleFree(state["previous"])
                except pynvml.NVMLError:
                    pass
        self._gpm = {}

    def last_xids(self):
        """{card index: the last XID seen in this session}, as dcgm-exporter's DCGM_FI_DEV_XID_ERRORS."""
        return {index: kept[-1][0] for index, kept in list(self._xids.items()) if kept and index is not None}

    def _xid_reasons(self, index):
        """Health reasons for the XIDs kept for card ``index``; drops those older than xid_hold_s."""
        from ansible_collections.scv.gpu.plugins.module_utils._xid import reason_for

        kept = self._xids.get(index)
        if not kept:
            return []
        if self.xid_hold_s:
            kept[:] = [entry for entry in kept if self.clock() - entry[2] < self.xid_hold_s]
        reasons = []
        for xid, at, _seen in kept:
            reason = reason_for(xid, at, self.xid_actions)
            if reason and reason not in reasons:
                reasons.append(reason)
        return reasons

    # ------------------------------------------------------------ internal

    def _restart(self, reason):
        self.last_reinit_reason = reason
        self.close()

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
            return _unavailable(_init_failure_reason(error))
        self._open = True
        self.inits += 1
        self.static_reads += 1
        self._static_at = self.clock()
        self._reinit_at = None
        self._system = _system_facts()
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as error:
            facts = dict(self._system)
            facts.update(_unavailable("NVML cannot count the GPUs: %s" % _describe(error)))
            self.close()
            return facts
        self._handles = [None] * count
        self._uuids = [None] * count
        return None

    def _system_call(self, function):
        """``function()``; None when it fails, SessionLost when its answer ends the session."""
        try:
            return _text_call(function)
        except pynvml.NVMLError as error:
            if _error_code(error) in _SESSION_ENDING:
                raise SessionLost(_error_code(error), _describe(error))
            return None

    def _read(self, subsets):
        facts = dict(self._system)
        count = self._system_call(pynvml.nvmlDeviceGetCount)
        known = facts.get("driver_version")
        driver = self._system_call(pynvml.nvmlSystemGetDriverVersion)
        if known is not None and driver is not None and _as_text(driver) != known:
            raise SessionLost(0, "the driver changed from %s to %s" % (known, _as_text(driver)))
        if count != len(self._handles):
            raise SessionLost(0, "the GPU count changed from %d to %s" % (len(self._handles), count))
        cards, lost = [], []
        for index in range(count):
            static = self._static_for(index, subsets)
            card = _read_card(index, subsets, self._handles[index], static, lost)
            if "telemetry" in subsets and self._handles[index] is not None:
                self._read_tensor_activity(index, self._handles[index], card)
            xid_reasons = self._xid_reasons(index)
            if xid_reasons:
                card["healthReasons"] = card["healthReasons"] + xid_reasons
                card["health"] = UNHEALTHY
            cards.append(card)
        self._note_lost(lost)
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
                uuid = _as_text(_text_call(pynvml.nvmlDeviceGetUUID, handle))
            except pynvml.NVMLError:
                return _Static(subsets)   # _read_card opens it itself and reports why it cannot
            self._handles[index], self._uuids[index] = handle, uuid
        key = (self._uuids[index], frozenset(subsets))
        entry = self._static.get(key)
        if entry is None:
            entry = self._static[key] = _Static(subsets)
        return entry

    def _note_lost(self, lost):
        """Schedules a new session after a lost card: at the next read, then backing off."""
        if not lost:
            self._lost_backoff = 0.0
        elif self._reinit_at is None:
            self._reinit_at = self.clock() + self._lost_backoff
            self._lost_backoff = min(self.max_lost_backoff_s, max(1.0, self._lost_backoff * 2))


def probe_library(name="libnvidia-ml.so.1"):
    """Whether the NVML library loads and answers, without pynvml (which a bare host lacks).

    Returns {'loads': bool, 'driver_version': str or None, 'gpu_count': int or None,
    'bus_ids': [str] (the PCI address of each GPU that answers), 'error': str or None}; the
    error is one of the reasons above where NVML gives one.
    """
    import ctypes

    class PciInfo(ctypes.Structure):  # nvmlPciInfo_t (nvml.h)
        _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                    ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                    ("busId", ctypes.c_char * 32)]

    result = {"loads": False, "driver_version": None, "gpu_count": None, "bus_ids": [], "error": None}
    try:
        library = ctypes.CDLL(name)
    except OSError as error:
        result["error"] = "%s (%s)" % (_UNAVAILABLE_REASONS[_LIBRARY_NOT_FOUND], error)
        return result
    code = library.nvmlInit_v2()
    if code != 0:
        library.nvmlErrorString.restype = ctypes.c_char_p
        result["error"] = _UNAVAILABLE_REASONS.get(
            code, "nvmlInit failed: %s" % library.nvmlErrorString(code).decode(errors="replace"))
        return result
    try:
        version = ctypes.create_string_buffer(96)
        if library.nvmlSystemGetDriverVersion(version, ctypes.c_uint(len(version))) == 0:
            result["driver_version"] = version.value.decode(errors="replace")
        count = ctypes.c_uint(0)
        if library.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0:
            result["gpu_count"] = count.value
        for index in range(count.value):
            handle, pci = ctypes.c_void_p(), PciInfo()
            if (library.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) == 0
                    and library.nvmlDeviceGetPciInfo_v3(handle, ctypes.byref(pci)) == 0):
                result["bus_ids"].append(pci.busId.decode(errors="replace"))
    finally:
        library.nvmlShutdown()
    result["loads"] = True
    return result
