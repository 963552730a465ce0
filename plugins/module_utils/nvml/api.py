# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""NVML's answers as this collection reads them: the pynvml import, error codes, text (private).

Every other file of ``nvml`` builds on this one; nothing outside ``nvml`` touches pynvml.
"""

from __future__ import annotations

import traceback

# The other files of nvml take pynvml from here.
try:
    import pynvml  # pylint: disable=unused-import
except ImportError:
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None

# NVML error codes (stable across NVML versions, see nvml.h). Spelled out here
# so that this file can be imported, and its messages built, without pynvml.
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18
TIMEOUT = 10   # a wait ended with nothing to report
UNKNOWN = 999

# Answers that mean "this card or driver cannot tell": the field is left out.
ABSENT = frozenset((NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, FUNCTION_NOT_FOUND))

# Answers after which a card is not queried further: it is gone until reset.
CARD_GONE = frozenset((GPU_IS_LOST, RESET_REQUIRED))

# Answers after which a long-lived NVML session is re-initialised: NVML was shut down under
# us, the driver went away, or the library no longer matches the loaded kernel driver.
UNINITIALIZED = 1
SESSION_ENDING = frozenset((UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH))

CLOCK_SM = 1
CLOCK_MEM = 2
TEMPERATURE_GPU = 0
MEMORY_ERROR_UNCORRECTED = 1
MEMORY_ERROR_CORRECTED = 0
VOLATILE_ECC = 0
AGGREGATE_ECC = 1
FI_DEV_GET_GPU_RECOVERY_ACTION = 230
GPU_VIRTUALIZATION_MODE_VGPU = 2
GRID_LICENSE_FEATURE_CODE_VGPU = 1
GPM_ANY_TENSOR_UTIL = 5
GPM_GRAPHICS_UTIL = 1
GPM_DRAM_BW_UTIL = 10
GPM_PCIE_TX_PER_SEC = 20
GPM_PCIE_RX_PER_SEC = 21

SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80

RECOVERY_ACTIONS = {
    1: "the driver asks for a GPU reset",
    2: "the driver asks for a node reboot",
    3: "the driver asks to drain peer-to-peer traffic",
    4: "the driver asks to drain peer-to-peer traffic and reset the GPU",
    5: "the driver asks to recover the IMEX domain",
    6: "the driver asks for a reset of the GPU's PCIe bus",
    7: "the driver asks for a system reboot",
}

UNAVAILABLE_REASONS = {
    LIBRARY_NOT_FOUND: ("libnvidia-ml.so.1 was not found: the NVIDIA driver is not installed "
                        "(or its library is not in the loader's search path)"),
    DRIVER_NOT_LOADED: ("the NVIDIA kernel driver is not loaded (is the nvidia module loaded? "
                        "a reboot may be pending after a driver install)"),
    NO_PERMISSION: ("no permission to open the NVIDIA device files (/dev/nvidia*); run as root "
                    "or as a member of the group that owns them"),
    LIB_RM_VERSION_MISMATCH: ("the NVML library and the loaded kernel driver have different "
                              "versions: reboot (or reload the nvidia module) after a driver upgrade"),
}


class CardGone(Exception):
    """The card answered GPU_IS_LOST or RESET_REQUIRED: stop asking it."""


class SessionLost(Exception):
    """NVML answered that the session itself is over (see ``SESSION_ENDING``)."""

    def __init__(self, code, text):
        super().__init__(text)
        self.code = code


def code_key(what, args):
    """The key under which a query's NOT_SUPPORTED answer is remembered."""
    return "%s%r" % (what, args)


def error_code(error):
    return getattr(error, "value", UNKNOWN)


def describe(error):
    """NVML's own text for an error; it needs the library, which may be absent."""
    try:
        return str(error)
    except Exception:  # pylint: disable=broad-exception-caught
        return "NVML error %s" % error_code(error)


def gone_reason(code):
    if code == GPU_IS_LOST:
        return ("GPU is lost: it fell off the bus or stopped responding (XID 79); "
                "reset the GPU or reboot the node")
    return "GPU requires a reset before it can be used again"


def as_text(value):
    """Text from NVML, made safe: bytes that are not UTF-8 become U+FFFD."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def text_call(function, *args):
    """``function(*args)``; a string pynvml cannot decode comes back as its raw bytes.

    pynvml decodes NVML's strings as strict UTF-8, so a card whose name or UUID holds
    other bytes would raise from inside pynvml; those bytes are in the error.
    """
    try:
        return function(*args)
    except UnicodeDecodeError as error:
        return bytes(error.object)
