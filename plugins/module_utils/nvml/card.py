# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One card's readings: identity, capabilities, memory, health, telemetry and MIG (private).

:func:`read_card` reads one card for :func:`..collect.collect` and for a
:class:`..session.Session`, which keeps the static readings between reads.
"""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.common.gpu_info import (
    HEALTHY,
    UNHEALTHY,
    bytes_to_mib,
    gpu_family,
    pcie_bandwidth,
)
from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import (
    ABSENT,
    CARD_GONE,
    CLOCK_MEM,
    CLOCK_SM,
    FUNCTION_NOT_FOUND,
    NO_PERMISSION,
    NOT_SUPPORTED,
    SESSION_ENDING,
    TEMPERATURE_GPU,
    CardGone,
    SessionLost,
    as_text,
    code_key,
    describe,
    error_code,
    gone_reason,
    pynvml,
    text_call,
)
from ansible_collections.scv.gpu.plugins.module_utils.nvml.extras import read_codecs, read_counters, read_virtualization
from ansible_collections.scv.gpu.plugins.module_utils.nvml.fabric import fabric_reasons, read_fabric
from ansible_collections.scv.gpu.plugins.module_utils.nvml.health_readings import read_health


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
        unsupported = self.unsupported
        if unsupported and code_key(self.prefix + what, args) in unsupported:
            return None
        try:
            return text_call(function, self.handle, *args)
        except pynvml.NVMLError as error:
            code = error_code(error)
            if self.session and code in SESSION_ENDING:
                raise SessionLost(code, describe(error))
            if health and code == NO_PERMISSION:
                self.note_unchecked(what)
                return None
            if code in ABSENT:
                if unsupported is not None and code in (NOT_SUPPORTED, FUNCTION_NOT_FOUND):
                    unsupported.add(code_key(self.prefix + what, args))
                return None
            if code in CARD_GONE:
                raise CardGone(gone_reason(code))
            self.reasons.append("%sreading the %s failed: %s" % (self.prefix, what, describe(error)))
            return None

    def note_unchecked(self, what):
        note = "%s%s: no permission to read it (run as root to check it)" % (self.prefix, what)
        if note not in self.unchecked:
            self.unchecked.append(note)


def _read_ecc_mode(reader, card):
    ecc = reader.query("ECC mode", pynvml.nvmlDeviceGetEccMode, health=True)
    if ecc is not None:
        card["eccEnabled"] = bool(ecc[0])


def _read_telemetry(reader, card):
    temperature = reader.query("temperature", pynvml.nvmlDeviceGetTemperature, TEMPERATURE_GPU)
    if temperature is not None:
        card["temperature"] = temperature
    utilization = reader.query("utilization", pynvml.nvmlDeviceGetUtilizationRates)
    if utilization is not None:
        card["gpuUtilization"] = utilization.gpu
        card["memoryUtilization"] = utilization.memory
    draw = reader.query("power draw", pynvml.nvmlDeviceGetPowerUsage)
    if draw is not None:
        card["powerDraw"] = draw // 1000
    for key, what, clock in (("smClock", "SM clock", CLOCK_SM), ("memClock", "memory clock", CLOCK_MEM)):
        value = reader.query(what, pynvml.nvmlDeviceGetClockInfo, clock)
        if value is not None:
            card[key] = value
    read_codecs(reader, card)


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
            device[key] = as_text(value)
    memory = reader.query("memory information", pynvml.nvmlDeviceGetMemoryInfo)
    if memory is not None:
        device["totalMemory"] = bytes_to_mib(memory.total)
        device["freeMemory"] = bytes_to_mib(memory.free)
    profile = mig_profile(device.get("model"))
    if profile:
        device["profile"] = profile
    attributes = reader.query("attributes", pynvml.nvmlDeviceGetAttributes)
    if attributes is not None:
        device["attributes"] = {key: int(getattr(attributes, field)) for key, field in MIG_ATTRIBUTES}
    return device


# A MIG device's share of its GPU, as nvmlDeviceGetAttributes gives it: fact key, NVML field.
MIG_ATTRIBUTES = (
    ("memory", "memorySizeMB"),
    ("multiprocessors", "multiprocessorCount"),
    ("gpuInstanceSlices", "gpuInstanceSliceCount"),
    ("computeInstanceSlices", "computeInstanceSliceCount"),
    ("copyEngines", "sharedCopyEngineCount"),
    ("decoders", "sharedDecoderCount"),
    ("encoders", "sharedEncoderCount"),
    ("jpegEngines", "sharedJpegCount"),
    ("ofaEngines", "sharedOfaCount"),
)


def mig_profile(name):
    """The MIG profile in a MIG device's name, as the driver names it ('NVIDIA A100-SXM4-40GB MIG
    1g.5gb+me' -> '1g.5gb+me'), or None."""
    head, sep, profile = (name or "").rpartition(" MIG ")
    return profile.strip() or None if sep and head else None


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
        card["model"] = as_text(name)
    uuid = reader.query("UUID", pynvml.nvmlDeviceGetUUID)
    if uuid is not None:
        card["uuid"] = as_text(uuid)
    pci = reader.query("PCI information", pynvml.nvmlDeviceGetPciInfo)
    if pci is not None:
        card["pciBusId"] = as_text(pci.busId)


def memory_mib(total, free, reserved):
    """NVML's memory reading (bytes) as facts: in MiB as nvidia-smi shows it, so that used + free + reserved =
    total."""
    found = {"totalMemory": bytes_to_mib(total), "freeMemory": bytes_to_mib(free),
             "reservedMemory": bytes_to_mib(reserved)}
    found["usedMemory"] = max(0, found["totalMemory"] - found["freeMemory"] - found["reservedMemory"])
    return found


def _read_memory(reader, card):
    # The second version tells the driver's reserve apart; the first counts it as used.
    failures = len(reader.reasons)
    memory = reader.query("memory information", pynvml.nvmlDeviceGetMemoryInfo, pynvml.nvmlMemory_v2)
    reserved = getattr(memory, "reserved", 0)
    if memory is None and len(reader.reasons) == failures:   # a driver without the second version
        memory = reader.query("memory information", pynvml.nvmlDeviceGetMemoryInfo)
    if memory is not None:
        total, free, used = memory.total, memory.free, memory.used   # each a conversion in pynvml
        card.update(memory_mib(total, free, reserved))
        # Any two parts over the whole is a reading no GPU can have, whichever part the driver got wrong.
        if free + reserved > total or used + reserved > total or free + used > total:
            reader.reasons.append(
                "the memory reading cannot be right: %d MiB free, %d MiB used and %d MiB reserved by the driver "
                "add up to more than the %d MiB in all; reset the GPU or reload the driver"
                % (bytes_to_mib(free), bytes_to_mib(used), card["reservedMemory"], card["totalMemory"]))


def _read_capabilities(reader, card):
    clock = reader.query("maximum memory clock", pynvml.nvmlDeviceGetMaxClockInfo, CLOCK_MEM)
    if clock is not None:
        card["clock"] = clock
    core = reader.query("maximum SM clock", pynvml.nvmlDeviceGetMaxClockInfo, CLOCK_SM)
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


class Static:
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


def read_card(index, subsets, handle=None, static=None, lost=None, settled=None, wanted=None, fabric=None):
    """One card's facts. ``handle`` and ``static`` come from a Session; without them, everything is read.

    ``settled``: the readings ``settled_health`` kept, reused instead of asked (a Session's, while they
    read clear and no XID came); None: ask them.
    ``wanted``: the costly counters' fact keys to read (None: all).
    ``fabric``: with the fabric subset, the fabric facts a Session kept (``fabric.FabricChecks``); None: ask them.

    A card that answers GPU_IS_LOST or RESET_REQUIRED has its index added to ``lost``.
    """
    card = {"id": index}
    reasons, unchecked = [], []
    try:
        if handle is None:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError as error:
                code = error_code(error)
                if static is not None and code in SESSION_ENDING:
                    raise SessionLost(code, describe(error))
                if code in CARD_GONE:
                    raise CardGone(gone_reason(code))
                reasons.append("the driver cannot open this GPU: %s" % describe(error))
                return finish(card, reasons)
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
        once(_read_persistence)   # changed only by an administrator (nvidia-smi -pm), 0.03 ms a read
        once(_read_ecc_mode)
        read_health(reader, card, "telemetry" in subsets, "counters" in subsets or static is None, settled)
        if "telemetry" in subsets:
            _read_telemetry(reader, card)
        if "counters" in subsets:
            once(read_virtualization)
            read_counters(reader, card, wanted)
        if "fabric" in subsets:
            _fabric_part(reader, card, fabric)
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
    return finish(card, reasons, unchecked)


def _fabric_part(reader, card, kept):
    if kept is None:
        read_fabric(reader, card)
    else:
        card.update((key, dict(value)) for key, value in kept.items())
    reader.reasons.extend(fabric_reasons(card))


def finish(card, reasons, unchecked=()):
    card["health"] = UNHEALTHY if reasons else HEALTHY
    card["healthReasons"] = reasons
    if unchecked:
        card["healthUnchecked"] = list(unchecked)
    return card
