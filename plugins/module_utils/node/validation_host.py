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

import glob
import json
import os
import re
import shutil

from ansible_collections.scv.gpu.plugins.module_utils.host import crio_dropins
from ansible_collections.scv.gpu.plugins.module_utils.host.containerd import TOML_NEEDS, tomllib
from ansible_collections.scv.gpu.plugins.module_utils.host.dev_char import link_states
from ansible_collections.scv.gpu.plugins.module_utils.host.driver_state import loaded_version
from ansible_collections.scv.gpu.plugins.module_utils.host.toolkit_advisories import ToolkitVersionError, exposures
from ansible_collections.scv.gpu.plugins.module_utils.node.validation import (
    NVIDIA_RUNTIME, cdi_problems, check, fabric_problems, isolation_problems, missing_device_nodes,
    runtime_choice_problems)

try:
    import yaml
except ImportError:
    yaml = None

HOST_CHECKS = ("driver", "device_nodes", "dev_char_links", "cdi_spec", "fabric", "container_runtime",
               "runtime_isolation")
CONTAINER_CONFIGS = {"containerd": "/etc/containerd/config.toml", "crio": "/etc/crio/crio.conf",
                     "docker": "/etc/docker/daemon.json"}
_RUNTIME_VERSION = re.compile(r"version (\d+\.\d+\.\d+(?:~rc\.\d+)?)")
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


def host_checks(node, paths, pinned_version=None, runtime=None, nvml=None):
    """The HOST_CHECKS of this host as check dicts. ``paths``: {"sysfs", "proc_driver", "dev", "cdi_spec",
    "runtime_config"}; ``runtime``: {"kind": containerd, crio or docker (None: none is installed), "config": its
    configuration file, "default": whether the roles made NVIDIA's runtime its default, "run": a command runner as
    AnsibleModule.run_command}; ``nvml``: gpu_facts'
    nvidia_gpu fact, read with the fabric subset (None: the fabric check is skipped)."""
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
    results.append(fabric_check(node, nvml))
    results.append(container_runtime_check(node, runtime or {}))
    results.append(_isolation_check(node, paths["runtime_config"]))
    return results


def fabric_check(node, nvml):
    """Every GPU in an NVLink fabric has it completed: on NVSwitch boards, Fabric Manager trained it."""
    if nvml is None:
        return check(node, "fabric", skipped="no NVML reading was given")
    if not nvml.get("nvml_available"):
        return check(node, "fabric", skipped="NVML cannot be read: %s" % (nvml.get("nvml_error") or "unknown"))
    problems, in_fabric = fabric_problems(nvml.get("cardList") or [])
    if problems:
        return check(node, "fabric", failure="; ".join(problems) + ": Fabric Manager has not brought the fabric "
                                                                   "up; see systemctl status nvidia-fabricmanager")
    if not in_fabric:
        return check(node, "fabric", skipped="no GPU is in an NVLink fabric (no NVSwitch board, or GPUs older than "
                                             "Hopper, whose fabric NVML does not report)")
    return check(node, "fabric")


def installed_runtime():
    """The container runtime the container_toolkit role configures on this host when told ``auto``: docker where
    dockerd is installed, else containerd, else CRI-O; None when none is."""
    for kind, program in (("docker", "dockerd"), ("containerd", "containerd"), ("crio", "crio")):
        if shutil.which(program):
            return kind
    return None


def container_runtime_check(node, runtime):
    """Whether ``runtime`` (see host_checks) gets pods to NVIDIA's runtime, and that runtime's release."""
    kind, path = runtime.get("kind"), runtime.get("config")
    if not kind:
        return check(node, "container_runtime", skipped="no container runtime (dockerd, containerd, crio) is "
                                                        "installed")
    path = path or CONTAINER_CONFIGS[kind]
    try:
        default, runtimes = _READERS[kind](path)
    except (OSError, ValueError) as error:
        return check(node, "container_runtime", failure="%s cannot be read: %s; run the container_toolkit role" % (
            path, getattr(error, "strerror", None) or " ".join(str(error).split())))
    problems = runtime_choice_problems(kind, default, runtimes, runtime.get("default", True))
    if problems:
        return check(node, "container_runtime", failure="%s: %s" % (path, "; ".join(problems)))
    binaries = sorted({binary for binary in runtimes.values() if binary.rsplit("/", 1)[-1].startswith(NVIDIA_RUNTIME)})
    problem = _release_problem(binaries[0], runtime["run"])
    return check(node, "container_runtime", failure="%s names %s: %s" % (path, binaries[0], problem)
                 if problem else None)


def _release_problem(binary, run):
    """Why the NVIDIA runtime at ``binary`` (a path, or a name found on PATH) will not do, or None. ``run``: a
    command runner as AnsibleModule.run_command, giving (exit code, stdout, stderr)."""
    found = binary if os.path.isabs(binary) else shutil.which(binary)
    if not found or not os.access(found, os.X_OK):
        return "it is not an executable file on the host; run the container_toolkit role"
    code, out, err = run([found, "--version"])
    version = _RUNTIME_VERSION.search(out or "")
    if not version:
        said = " ".join(((out or "") + (err or "")).split())[:200]
        return "its --version gave no version (exit %s): %s" % (code, said)
    try:
        exposed = exposures(version.group(1))
    except ToolkitVersionError as error:
        return str(error)
    if exposed:
        return "release %s predates the fixes of %s (%s has them all): upgrade nvidia-container-toolkit" % (
            version.group(1), ", ".join(item["cve"] for item in exposed), exposed[-1]["fixed"])
    return None


def _merged(into, update):
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merged(into[key], value)
        else:
            into[key] = value
    return into


def _toml(path):
    if tomllib is None:
        raise ValueError("%s is needed on the host to read it" % TOML_NEEDS)
    with open(path, "rb") as handle:
        try:
            return tomllib.load(handle)
        except tomllib.TOMLDecodeError as error:
            raise ValueError("%s is not TOML: %s" % (path, error)) from None


def _containerd(path):
    """(default runtime, {runtime: binary}) of containerd's configuration at ``path`` and the files it imports."""
    settings = _toml(path)
    imports = settings.get("imports") or []
    merged = {}
    for pattern in imports if isinstance(imports, list) else []:
        pattern = pattern if os.path.isabs(pattern) else os.path.join(os.path.dirname(path), pattern)
        for imported in sorted(glob.glob(pattern)):
            _merged(merged, _toml(imported))
    settings = _merged(merged, settings)
    plugins = settings.get("plugins") or {}
    # version 3 (containerd 2) keeps the runtimes in the CRI runtime plugin; version 2 in the CRI plugin
    cri = ((plugins.get("io.containerd.cri.v1.runtime") or {}).get("containerd")
           or (plugins.get("io.containerd.grpc.v1.cri") or {}).get("containerd") or {})
    runtimes = {name: str(((body or {}).get("options") or {}).get("BinaryName") or "runc")
                for name, body in (cri.get("runtimes") or {}).items()}
    return str(cri.get("default_runtime_name") or "runc"), runtimes


def _crio(path):
    """(default runtime, {runtime: binary}) of CRI-O's configuration file ``path`` and the drop-ins of ``path``.d,
    read as CRI-O reads them (host.crio_dropins)."""
    settings = _toml(path) if os.path.exists(path) else {}
    for drop_in in crio_dropins.walk(path + ".d"):
        _merged(settings, _toml(drop_in))
    runtime = (settings.get("crio") or {}).get("runtime") or {}
    runtimes = {name: str((body or {}).get("runtime_path") or name)
                for name, body in (runtime.get("runtimes") or {}).items()}
    return str(runtime.get("default_runtime") or "crun"), runtimes


def _docker(path):
    """(default runtime, {runtime: binary}) of dockerd's daemon.json at ``path``."""
    with open(path, encoding="utf-8") as handle:
        settings = json.load(handle)
    if not isinstance(settings, dict):
        raise ValueError("it holds no JSON object")
    runtimes = {"runc": "runc"}
    runtimes.update({name: str((body or {}).get("path") or name) for name, body in
                     (settings.get("runtimes") or {}).items() if isinstance(body, dict)})
    return str(settings.get("default-runtime") or "runc"), runtimes


_READERS = {"containerd": _containerd, "crio": _crio, "docker": _docker}


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
        return check(node, "runtime_isolation", skipped="%s is needed on the host to read %s" % (TOML_NEEDS, path))
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
