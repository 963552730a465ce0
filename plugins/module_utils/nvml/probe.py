# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Whether the NVML library loads and answers, through ctypes: for hosts without pynvml (private)."""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import LIBRARY_NOT_FOUND, UNAVAILABLE_REASONS


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
        result["error"] = "%s (%s)" % (UNAVAILABLE_REASONS[LIBRARY_NOT_FOUND], error)
        return result
    code = library.nvmlInit_v2()
    if code != 0:
        library.nvmlErrorString.restype = ctypes.c_char_p
        result["error"] = UNAVAILABLE_REASONS.get(
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
