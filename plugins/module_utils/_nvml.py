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

_CLOCK_SM = 1
_CLOCK_MEM = 2
_TEMPERATURE_GPU = 0
_MEMORY_ERROR_UNCORRECTED = 1
_MEMORY_ERROR_CORRECTED = 0
_VOLATILE_ECC = 0
_AGGREGATE_ECC = 1
_FI_DEV_GET_GPU_RECOVERY_ACTION = 230

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

    def __init__(self, handle, reasons, unchecked=None, prefix=""):
        self.handle = handle
        self.reasons = reasons
        self.unchecked = [] if unchecked is None else unchecked
        self.prefix = prefix

    def query(self, what, function, *args, health=False):
        """Call ``function(handle, *args)``; None when the card cannot tell.

        A failure other than "not supported" becomes a health reason naming the
        query (SCV marks such a card Unhealthy too). GPU_IS_LOST and
        RESET_REQUIRED raise CardGone so that a dead card costs no more calls.
        A health check (``health``) that NVML refuses for lack of permission is
        recorded in ``unchecked``: the card is not known to be healthy there.
        """
        try:
            return _text_call(function, self.handle, *args)
        except pynvml.NVMLError as error:
            code = _error_code(error)
            if health and code == _NO_PERMISSION:
                self.note_unchecked(what)
                return None
            if code in _ABSENT:
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


def _read_health(reader, card):
    reasons = reader.reasons
    ecc = reader.query("ECC mode", pynvml.nvmlDeviceGetEccMode, health=True)
    if ecc is not None:
        card["eccEnabled"] = bool(ecc[0])
        if ecc[0]:
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

    pending = reader.query("retired pages", pynvml.nvmlDeviceGetRetiredPagesPendingStatus, health=True)
    if pending is not None:
        card["retiredPagesPending"] = bool(pending)
        if pending:
            reasons.append("memory pages are pending retirement: reset the GPU or reboot the node")

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


def _read_mig_device(parent_reader, index):
    slot = _CardReader(parent_reader.handle, parent_reader.reasons, parent_reader.unchecked,
                       prefix="MIG device %d: " % index)
    handle = slot.query("handle", pynvml.nvmlDeviceGetMigDeviceHandleByIndex, index)
    if handle is None:
        return None
    reader = _CardReader(handle, parent_reader.reasons, parent_reader.unchecked, prefix="MIG device %d: " % index)
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


def _read_mig(reader, card):
    mode = reader.query("MIG mode", pynvml.nvmlDeviceGetMigMode)
    if mode is None:
        return
    card["migEnabled"] = bool(mode[0])
    card["migPendingEnabled"] = bool(mode[1])
    if not mode[0]:
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


def _read_card(index, subsets):
    card = {"id": index}
    reasons, unchecked = [], []
    try:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as error:
            code = _error_code(error)
            if code in _CARD_GONE:
                raise CardGone(_gone_reason(code))
            reasons.append("the driver cannot open this GPU: %s" % _describe(error))
            return _finish(card, reasons)
        reader = _CardReader(handle, reasons, unchecked)

        name = reader.query("name", pynvml.nvmlDeviceGetName)
        if name is not None:
            card["model"] = _as_text(name)
        uuid = reader.query("UUID", pynvml.nvmlDeviceGetUUID)
        if uuid is not None:
            card["uuid"] = _as_text(uuid)
        pci = reader.query("PCI information", pynvml.nvmlDeviceGetPciInfo)
        if pci is not None:
            card["pciBusId"] = _as_text(pci.busId)

        memory = reader.query("memory information", pynvml.nvmlDeviceGetMemoryInfo)
        if memory is not None:
            card["totalMemory"] = bytes_to_mib(memory.total)
            card["freeMemory"] = bytes_to_mib(memory.free)
            card["usedMemory"] = bytes_to_mib(memory.used)
            if memory.free > memory.total or memory.used > memory.total:
                reasons.append(
                    "the memory reading cannot be right: %d MiB free and %d MiB used of %d MiB in all; reset the "
                    "GPU or reload the driver" % (card["freeMemory"], card["usedMemory"], card["totalMemory"]))
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

        persistence = reader.query("persistence mode", pynvml.nvmlDeviceGetPersistenceMode)
        if persistence is not None:
            card["persistenceMode"] = bool(persistence)

        _read_health(reader, card)
        if "telemetry" in subsets:
            _read_telemetry(reader, card)
        if "mig" in subsets:
            _read_mig(reader, card)
        if "processes" in subsets:
            processes = reader.query("running compute processes", pynvml.nvmlDeviceGetComputeRunningProcesses)
            if processes is not None:
                card["processCount"] = len(processes)
    except CardGone as gone:
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


def collect(subsets):
    """Every GPU's facts, as the ``nvidia_gpu`` fact of ``gpu_facts``.

    ``subsets`` names the optional parts to read (see ``GATHER_SUBSETS``).
    Never raises for a missing driver or a failing card: the driver's absence
    is reported in ``nvml_available``/``nvml_error``, a failing card as
    Unhealthy with its reasons.
    """
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return _unavailable(_init_failure_reason(error))
    try:
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


def probe_library(name="libnvidia-ml.so.1"):
    """Whether the NVML library loads and answers, without pynvml (which a bare host lacks).

    Returns {'loads': bool, 'driver_version': str or None, 'gpu_count': int or None,
    'error': str or None}; the error is one of the reasons above where NVML gives one.
    """
    import ctypes

    result = {"loads": False, "driver_version": None, "gpu_count": None, "error": None}
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
    finally:
        library.nvmlShutdown()
    result["loads"] = True
    return result
