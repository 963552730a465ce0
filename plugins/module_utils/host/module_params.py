# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The nvidia kernel module's options (NVreg_*), as the nvidia_driver role sets them (private to the collection).

``check_options`` turns the role's ``nvidia_driver_module_params`` into the text of one modprobe.d file, or
says what is wrong with each key; ``options_state`` compares them with what the loaded module runs with,
and says whether a reload could apply them (no process holds a GPU) or they wait for a reboot.

The loaded module's values come from ``/sys/module/nvidia/parameters/<name>`` where the driver exposes one
there, else from ``/proc/driver/nvidia/params``, where the driver lists its registry keys as ``Name: value``
without the ``NVreg_`` prefix (numbers in decimal, strings in double quotes).
"""

from __future__ import annotations

import os
import re

NAME = re.compile(r"NVreg_[A-Za-z0-9_]+")      # matched whole (fullmatch), so no trailing newline
# Parameters of nvidia.ko without the NVreg_ prefix.
OTHER_NVIDIA_PARAMS = ("rm_firmware_active", "nv_cap_enable_devfs")
# Parameters of the driver's other modules, which 'options nvidia' does not reach.
OTHER_MODULES = {"modeset": "nvidia_drm", "fbdev": "nvidia_drm", "hdmi_deepcolor": "nvidia_modeset",
                 "uvm_perf_prefetch_enable": "nvidia_uvm", "uvm_disable_hmm": "nvidia_uvm"}
# One word of modprobe.d: no whitespace (it separates options), no quotes or backslash (modprobe reads them).
# Matched whole (fullmatch): "$" alone would let a trailing newline through, which ends modprobe.d's line.
VALUE = re.compile(r"""[^\s"'\\]+""")
# nvidia.ko declares its options int (NV_MODULE_PARAMETER: module_param(x, int, 0)), which the kernel parses with
# kstrtoint: a number outside a C int keeps the module from loading. These few are charp, strings of any word
# (NV_DEFINE_REG_STRING_ENTRY in nv-reg.h, and rm_firmware_active).
INT_MIN, INT_MAX = -2 ** 31, 2 ** 31 - 1
STRING_PARAMS = frozenset(["NVreg_CoherentGPUMemoryMode", "NVreg_RegistryDwords", "NVreg_RegistryDwordsPerDevice",
                           "NVreg_RmMsg", "NVreg_GpuBlacklist", "NVreg_TemporaryFilePath", "NVreg_ExcludedGpus",
                           "NVreg_RmNvlinkBandwidth", "rm_firmware_active"])
# Device nodes of the driver: a process that holds one open holds the GPUs (or the driver) in use.
DEVICE = re.compile(r"^/dev/nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset|-nvswitch\d*|-nvlink|-caps/.*)$")
# Services that hold the GPUs only to keep the driver initialised; the reload stops and starts them.
RESTARTABLE = ("nvidia-persistenced",)
HEADER = "# Managed by the scv.gpu.nvidia_driver role (nvidia_driver_module_params); edits are overwritten.\n"


def check_options(params):
    """{'options': {name: str}, 'problems': [str], 'content': str}: each value as modprobe.d spells it,
    what is wrong with each key (refused before anything changes), and the file's text ('' for no options)."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        return {"options": {}, "problems": ["nvidia_driver_module_params must be a dict of option names and "
                                            "values, not %s" % type(params).__name__], "content": ""}
    options, problems = {}, []
    for name in sorted(params, key=str):
        problem = name_problem(name)
        value, value_problem = spelt_value(name, params[name])
        if problem or value_problem:
            problems.append("nvidia_driver_module_params: %s: %s" % (name, problem or value_problem))
        else:
            options[name] = value
    content = ""
    if options and not problems:
        content = HEADER + "options nvidia %s\n" % " ".join("%s=%s" % item for item in sorted(options.items()))
    return {"options": options if not problems else {}, "problems": problems, "content": content}


def name_problem(name):
    """Why ``name`` is not an option of the nvidia module; None when it is one."""
    if not isinstance(name, str):
        return "the name must be a string"
    if NAME.fullmatch(name) or name in OTHER_NVIDIA_PARAMS:
        return None
    if name in OTHER_MODULES:
        return ("%s is an option of %s, not of nvidia, and this variable writes 'options nvidia': set it in a "
                "modprobe.d file of your own ('options %s %s=...')" % (name, OTHER_MODULES[name], OTHER_MODULES[name], name))
    if not name.lower().startswith("nvreg") and NAME.fullmatch("NVreg_" + name):
        return "the nvidia module's options are named NVreg_<key>: write NVreg_%s" % name
    return ("not an option of the nvidia module: the names are NVreg_ followed by letters, digits and "
            "underscores (such as NVreg_EnableStreamMemOPs), or one of %s" % ", ".join(OTHER_NVIDIA_PARAMS))


def spelt_value(name, value):
    """(the value as modprobe.d spells it, None) or (None, why it cannot be one)."""
    if value is None:
        return None, "it has no value: give a number, a word or true/false (written 1/0), or remove the key"
    if isinstance(value, bool):
        return ("1" if value else "0"), None
    if isinstance(value, int):
        return (None, _range_problem(value)) if _range_problem(value) else (str(value), None)
    if isinstance(value, float):
        return None, "%r is not a whole number: the nvidia module's options are whole numbers or words" % value
    if isinstance(value, str):
        if not value:
            return None, "the value is empty: give a number or a word, or remove the key to leave the driver's default"
        if not VALUE.fullmatch(value):
            return None, ("%r holds whitespace, a quote or a backslash, which modprobe.d cannot carry in one "
                          "option: give one word (a RegistryDwords list is written 'Key1=1;Key2=2')" % value)
        number = kernel_number(value)
        if number is not None and name not in STRING_PARAMS and _range_problem(number):
            return None, "%r is %s" % (value, _range_problem(number))
        return value, None
    return None, "a %s is not a value: give a number, a word or true/false (written 1/0)" % type(value).__name__


def _range_problem(number):
    """Why the kernel refuses ``number`` for an int option; None when it takes it."""
    if INT_MIN <= number <= INT_MAX:
        return None
    return ("%d, outside the range of the nvidia module's int options (%d to %d): the kernel refuses it, and the "
            "module does not load" % (number, INT_MIN, INT_MAX))


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def proc_params(procfs):
    """{name without NVreg_: value} from /proc/driver/nvidia/params; None when the file cannot be read."""
    text = _read(os.path.join(procfs, "driver", "nvidia", "params"))
    if text is None:
        return None
    found = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            found[key.strip()] = value
    return found


def running_value(name, sysfs, procfs, listed):
    """(value, where it was read) for option ``name`` of the loaded module; (None, None) when neither
    sysfs nor ``listed`` (proc_params' answer) has it."""
    path = os.path.join(sysfs, "module", "nvidia", "parameters", name)
    text = _read(path)
    if text is not None:
        text = text.strip()
        return ("" if text == "(null)" else text), path
    key = name[len("NVreg_"):] if name.startswith("NVreg_") else name
    if listed is not None and key in listed:
        return listed[key], os.path.join(procfs, "driver", "nvidia", "params")
    return None, None


_KERNEL_NUMBER = re.compile(r"([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")


def kernel_number(text):
    """``text`` as the kernel reads a number option (base 0: 0x1f hex, 017 octal, else decimal, a sign before
    either); None for a word."""
    found = _KERNEL_NUMBER.fullmatch((text or "").strip())
    if found is None:
        return None
    sign, digits = found.groups()
    value = int(digits, 16) if digits[:2].lower() == "0x" else int(digits, 8 if digits.startswith("0") else 10)
    return -value if sign == "-" else value


def same_value(wanted, running):
    """Whether the module runs with ``wanted``: numbers compare as numbers (0x10 is 16), words as words."""
    wanted_number, running_number = kernel_number(wanted), kernel_number(running)
    if wanted_number is not None and running_number is not None:
        return wanted_number == running_number
    return wanted == running


def dependants(sysfs, name="nvidia"):
    """The loaded modules that use ``name``, each before the modules it uses: the order modprobe -r takes."""
    order = []

    def visit(module, trail):
        folder = os.path.join(sysfs, "module", module, "holders")
        try:
            holders = sorted(os.listdir(folder))
        except OSError:
            holders = []
        for holder in holders:
            if holder not in trail:
                visit(holder, trail + (holder,))
        if module not in order:
            order.append(module)

    visit(name, (name,))
    return order


def gpu_holders(procfs):
    """The processes that hold a device node of the driver open: [{'pid', 'command', 'devices'}], by pid."""
    found = []
    try:
        pids = sorted(int(entry) for entry in os.listdir(procfs) if entry.isdigit())
    except OSError:
        return found
    for pid in pids:
        folder = os.path.join(procfs, str(pid), "fd")
        try:
            links = os.listdir(folder)
        except OSError:
            continue
        devices = set()
        for link in links:
            try:
                target = os.readlink(os.path.join(folder, link))
            except OSError:
                continue
            if DEVICE.match(target):
                devices.add(target)
        if devices:
            found.append({"pid": pid, "command": _command(procfs, pid), "devices": sorted(devices)})
    return found


def _command(procfs, pid):
    """The program's name: argv[0]'s base name (comm stops at 15 characters), else comm."""
    argv = _read(os.path.join(procfs, str(pid), "cmdline"))
    if argv and argv.split("\0")[0]:
        return os.path.basename(argv.split("\0")[0])
    return (_read(os.path.join(procfs, str(pid), "comm")) or "?").strip()


def options_state(options, path, sysfs, procfs):
    """What the loaded nvidia module runs with, against ``options`` (check_options' answer), and what to do.

    ``action``: 'none' (nothing to apply: no module loaded, or it runs with them), 'reload' (no process but
    the RESTARTABLE services holds a GPU) or 'reboot'. ``pending``: the reboot reason, or None.
    ``problems``: a word where the loaded module holds a number, which would keep it from loading.
    """
    loaded = os.path.isdir(os.path.join(sysfs, "module", "nvidia"))
    state = {"loaded": loaded, "differ": [], "unknown": [], "holders": [], "services": [],
             "unload": [], "action": "none", "pending": None, "message": "", "problems": []}
    if not loaded:
        state["message"] = "no nvidia module is loaded: it loads with the options in %s" % path if options else ""
        return state
    listed = proc_params(procfs)
    for name, wanted in sorted(options.items()):
        running, source = running_value(name, sysfs, procfs, listed)
        if source is None:
            state["unknown"].append(name)
        elif not same_value(wanted, running):
            state["differ"].append({"name": name, "wanted": wanted, "running": running, "source": source})
            if running.isdigit() and kernel_number(wanted) is None:
                state["problems"].append(
                    "nvidia_driver_module_params: %s: the loaded nvidia module holds a number there (%s reads %s), "
                    "and the module would refuse to load with %r: give a number" % (name, source, running, wanted))
    if state["unknown"]:
        state["message"] = ("the loaded nvidia module lists no %s in %s or %s: check the spelling, as the kernel "
                            "ignores an option the module does not have; "
                            % (", ".join(state["unknown"]), os.path.join(sysfs, "module", "nvidia", "parameters"),
                               os.path.join(procfs, "driver", "nvidia", "params")))
    if not state["differ"]:
        state["message"] += "the loaded nvidia module runs with the options of %s" % path if options else ""
        return state
    holders = gpu_holders(procfs)
    state["services"] = sorted({h["command"] for h in holders if h["command"] in RESTARTABLE})
    state["holders"] = [h for h in holders if h["command"] not in RESTARTABLE]
    state["unload"] = dependants(sysfs)
    runs = ", ".join("%s=%s (%s wanted)" % (d["name"], d["running"], d["wanted"]) for d in state["differ"])
    if state["holders"]:
        state["action"] = "reboot"
        state["pending"] = ("the loaded nvidia module runs with %s, and processes hold the GPUs (%s), so it is not "
                            "reloaded: the options of %s take effect at the next boot"
                            % (runs, holder_list(state["holders"]), path))
        state["message"] += state["pending"]
    else:
        state["action"] = "reload"
        state["message"] += ("the loaded nvidia module runs with %s, and no process holds a GPU: reloading %s"
                             % (runs, ", ".join(state["unload"])))
    return state


def holder_list(holders, most=5):
    """'1234 python3, 99 nv-hostengine and 3 more': the processes that hold the GPUs, for a message."""
    named = ", ".join("%d %s" % (h["pid"], h["command"]) for h in holders[:most])
    return named + (" and %d more" % (len(holders) - most) if len(holders) > most else "")
