# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The host checks of a GPU node's validation (private to the collection; run on the host).

They read what the driver and the toolkit left on the host, not NVML: the driver's own list of its GPUs
(``/proc/driver/nvidia/gpus/<bus>/information``: each GPU's UUID and device minor), the loaded module's version
(``/sys/module/nvidia/version``), the device nodes, the CDI specification and NVIDIA's runtime configuration.
A host where NVML answers and no container can start (``nvidia-uvm`` never loaded, a CDI spec from before a GPU
was replaced) fails here.
"""

from __future__ import annotations

import os
import re

from ansible_collections.scv.gpu.plugins.module_utils.host.dev_char import link_states
from ansible_collections.scv.gpu.plugins.module_utils.host.driver_state import loaded_version
from ansible_collections.scv.gpu.plugins.module_utils.node.validation import (
    cdi_problems, check, isolation_problems, missing_device_nodes)

try:
    import tomllib
except ImportError:  # Python 3.10: the module says so before reading anything
    tomllib = None

try:
    import yaml
except ImportError:
    yaml = None

HOST_CHECKS = ("driver", "device_nodes", "dev_char_links", "cdi_spec", "runtime_isolation")
_FIELD = re.compile(r"^([A-Za-z ]+):\s*(.*?)\s*$")


def driver_gpus(proc_driver):
    """[{"bus", "uuid", "minor"}] of the GPUs the driver lists under ``proc_driver``/nvidia/gpus, by bus."""
    folder = os.path.join(proc_driver, "nvidia", "gpus")
    try:
        buses = sorted(os.listdir(folder))
    except OSError:
        return []
    gpus = []
    for bus in buses:
        fields = {}
        try:
            with open(os.path.join(folder, bus, "information"), encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    found = _FIELD.match(line)
                    if found:
                        fields[found.group(1).strip()] = found.group(2)
        except OSError:
            continue
        minor = fields.get("Device Minor", "")
        gpus.append({"bus": bus, "uuid": fields.get("GPU UUID", ""),
                     "minor": int(minor) if minor.isdigit() else None})
    return gpus


def host_checks(node, paths, pinned_version=None):
    """The HOST_CHECKS of this host as check dicts. ``paths``: {"sysfs", "proc_driver", "dev", "cdi_spec",
    "runtime_config"}."""
    results = []
    version = loaded_version(paths["sysfs"])
    gpus = driver_gpus(paths["proc_driver"])
    if version is None:
        results.append(check(node, "driver", failure="no nvidia kernel module is loaded (%s/module/nvidia/version "
                                                     "is absent)" % paths["sysfs"]))
    elif pinned_version and not (version == pinned_version or version.startswith(pinned_version + ".")):
        results.append(check(node, "driver", failure="the loaded driver is %s, the inventory pins %s: run "
                                                     "playbooks/driver_upgrade.yml" % (version, pinned_version)))
    elif not gpus:
        results.append(check(node, "driver", failure="driver %s is loaded but lists no GPU under %s/nvidia/gpus"
                                                     % (version, paths["proc_driver"])))
    else:
        results.append(check(node, "driver"))

    present = _names(paths["dev"])
    unknown = [gpu["bus"] for gpu in gpus if gpu["minor"] is None]
    missing = missing_device_nodes(present, [gpu["minor"] for gpu in gpus if gpu["minor"] is not None])
    if missing or unknown:
        problems = (["missing %s" % ", ".join("%s/%s" % (paths["dev"], name) for name in missing)] if missing else [])
        problems += ["the driver gives no device minor for GPU %s" % bus for bus in unknown]
        hint = " (nvidia-uvm: load the nvidia-uvm module and run nvidia-modprobe -u -c=0)" if any(
            name.startswith("nvidia-uvm") for name in missing) else ""
        results.append(check(node, "device_nodes", failure="; ".join(problems) + hint))
    else:
        results.append(check(node, "device_nodes"))

    broken = [state for state in link_states(paths["dev"]) if state["state"] != "ok"]
    results.append(check(node, "dev_char_links", failure="; ".join(
        "%s is %s (should reach %s)" % (state["link"], state["state"], state["device"]) for state in broken)
        + "; run scv.gpu.nvidia_dev_char_links" if broken else None))

    results.append(_cdi_check(node, paths["cdi_spec"], [gpu["uuid"] for gpu in gpus]))
    results.append(_isolation_check(node, paths["runtime_config"]))
    return results


def _names(dev):
    try:
        return set(os.listdir(dev))
    except OSError:
        return set()


def _cdi_check(node, path, uuids):
    if yaml is None:
        return check(node, "cdi_spec", skipped="PyYAML is not installed on the host")
    try:
        with open(path, encoding="utf-8") as handle:
            spec = yaml.safe_load(handle)
    except OSError as error:
        return check(node, "cdi_spec", failure="%s cannot be read (%s): run the container_toolkit role" % (
            path, error.strerror))
    except yaml.YAMLError as error:
        return check(node, "cdi_spec", failure="%s is not YAML: %s" % (path, " ".join(str(error).split())))
    problems = cdi_problems(spec, uuids)
    if problems:
        return check(node, "cdi_spec", failure="%s: %s; regenerate it (the container_toolkit role does)" % (
            path, "; ".join(problems)))
    return check(node, "cdi_spec")


def _isolation_check(node, path):
    if tomllib is None:
        return check(node, "runtime_isolation", skipped="Python 3.11 or newer is needed on the host to read %s" % path)
    try:
        with open(path, "rb") as handle:
            settings = tomllib.load(handle)
    except OSError as error:
        return check(node, "runtime_isolation", failure="%s cannot be read (%s): run the container_toolkit role"
                     % (path, error.strerror))
    except tomllib.TOMLDecodeError as error:
        return check(node, "runtime_isolation", failure="%s is not TOML: %s" % (path, error))
    problems = isolation_problems(settings)
    if problems:
        return check(node, "runtime_isolation", failure="%s: %s" % (path, "; ".join(problems)))
    return check(node, "runtime_isolation")
