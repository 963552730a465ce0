# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A node's GPU stack (device plugin or DRA) and what DRA needs of the node (private; pure functions).

Each GPU node runs either a device plugin or NVIDIA's DRA kubelet plugin, never both: the
label :data:`STACK_LABEL` says which, and both DaemonSets select on it. A node without the
label runs the device plugin, as every node did before the label existed.
"""

from __future__ import annotations

import re

from ansible_collections.scv.gpu.plugins.module_utils.host.containerd import (
    ContainerdConfigError, config_version, effective_configs, lookup, parse, tomllib)

STACK_LABEL = "scv.gpu/gpu-stack"
STACKS = ("device-plugin", "dra")
DEFAULT_STACK = "device-plugin"
GPU_RESOURCE = "nvidia.com/gpu"
# Where the DRA kubelet plugin writes its CDI specifications (its CDI_ROOT).
DRA_CDI_DIR = "/var/run/cdi"


def names_dra_cdi_dir(dirs):
    """Whether the folders ``dirs`` include the DRA driver's CDI folder, as /var/run/cdi or /run/cdi (/var/run is a
    link to /run on every distribution the collection supports), a trailing slash aside."""
    if not isinstance(dirs, (list, tuple)):
        return False
    spelt = {str(path).rstrip("/") for path in dirs}
    return DRA_CDI_DIR in spelt or "/run/cdi" in spelt


# The CRI plugin's runtime table, where enable_cdi and cdi_spec_dirs live, and whether CDI is on
# when enable_cdi is not written (containerd 1.7: off; 2.x: on).
_CRI_RUNTIME = {2: (("plugins", "io.containerd.grpc.v1.cri"), False),
                3: (("plugins", "io.containerd.cri.v1.runtime"), True)}
_DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
_NUMBERS = re.compile(r"^v?(\d+(?:\.\d+)*)")


def version_tuple(text):
    """(major, minor, ...) of "570.158.01" or "v1.34.2-gke.100"; None when it starts with no number."""
    match = _NUMBERS.match(str(text or "").strip())
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def at_least(version, minimum):
    found, wanted = version_tuple(version), version_tuple(minimum)
    if found is None or wanted is None:
        return False
    width = max(len(found), len(wanted))
    return found + (0,) * (width - len(found)) >= wanted + (0,) * (width - len(wanted))


def node_stack(node):
    """The stack a Node runs now: its label, or the device plugin when it has none."""
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(STACK_LABEL) or DEFAULT_STACK


def offers_gpus(node):
    allocatable = ((node or {}).get("status") or {}).get("allocatable") or {}
    return str(allocatable.get(GPU_RESOURCE, "0")) not in ("0", "")


def driver_problem(gpu_facts, minimum):
    facts = gpu_facts or {}
    version = facts.get("driver_version")
    if not facts.get("nvml_available") or not version:
        return ("the NVIDIA driver does not answer through NVML (%s); install it (scv.gpu.nvidia_driver) first"
                % (facts.get("nvml_error") or "no driver version"))
    if not at_least(version, minimum):
        return ("the NVIDIA driver is %s and NVIDIA's DRA driver needs %s or newer; upgrade it "
                "(playbooks/driver_upgrade.yml with nvidia_driver_version)" % (version, minimum))
    return None


def kubelet_problem(node, minimum):
    if not node:
        return "there is no such Node in the cluster; set dra_driver_node_name to the host's Kubernetes node name"
    version = ((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion")
    if not version:
        return "the Node reports no kubelet version (status.nodeInfo.kubeletVersion); is its kubelet running?"
    if not at_least(version, minimum):
        return "its kubelet is %s and DRA through resource.k8s.io/v1 needs %s or newer; upgrade the kubelet" % (
            version, minimum)
    return None


def containerd_cdi_problem(text, path, imports=()):
    """Why containerd would not give containers the DRA driver's CDI devices, or None.

    ``text`` is the main file at ``path``; ``imports`` the files it imports, in the order containerd
    merges them ([{path, imported_by, content}], as scv.gpu.containerd_config_info reads them on the
    host). What counts is the configuration containerd runs with, the imports merged in.
    """
    try:
        config = parse(text or "", path)
        version = config_version(config, path)
        chain = [dict(entry, config=parse(entry.get("content") or "", entry["path"])) for entry in imports or ()]
    except ContainerdConfigError as error:
        return "CDI cannot be checked: %s" % error
    files = [{"path": path, "config": config}] + chain
    for rule, (merged, sources) in effective_configs(config, version, path, chain=chain).items():
        problem = _cdi_problem(version, merged, _Deciders(files, rule, sources))
        if problem:
            return problem
    return None


class _Deciders:
    """Which file decides a key of the CRI runtime table, under one rule of merging imports."""

    def __init__(self, files, rule, sources):
        self.files, self.rule, self.sources = files, rule, sources

    def file(self, table, key):
        """The file whose value of ``key`` containerd runs with; None when no file sets it (the default)."""
        if self.rule == "replace":
            # containerd 1.x: the last import that names the plugin section replaces it whole
            owner = self.sources.get(table[1], self.files[0]["path"])
            return next(entry for entry in reversed(self.files) if entry["path"] == owner)
        return next((entry for entry in reversed(self.files) if lookup(entry["config"], table + (key,)) is not None),
                    None)

    def where(self, table, key):
        """The deciding file for a message, with the file that imports it; the main file when none decides."""
        entry = self.file(table, key)
        if entry is None or entry is self.files[0]:
            return self.files[0]["path"], None
        return "%s (imported by %s)" % (entry["path"], entry["imported_by"]), entry


def _cdi_problem(version, merged, deciders):
    table, enabled_by_default = _CRI_RUNTIME[version]
    section = ".".join(table[1:])
    enabled = lookup(merged, table + ("enable_cdi",))
    if enabled is False or (enabled is None and not enabled_by_default):
        where, imported = deciders.where(table, "enable_cdi")
        if imported is None:
            return ("%s does not enable CDI (%s.enable_cdi); run scv.gpu.container_toolkit with "
                    "container_toolkit_cdi: true, then restart containerd" % (where, section))
        if enabled is False:
            return ("%s turns CDI off (%s.enable_cdi = false), and containerd merges it over the main file; set "
                    "enable_cdi = true there, then restart containerd" % (where, section))
        return ("%s names the %s section, which containerd 1.x takes whole in place of the main file's, and does not "
                "enable CDI in it (enable_cdi); set enable_cdi = true there, then restart containerd"
                % (where, section))
    dirs = lookup(merged, table + ("cdi_spec_dirs",))
    dirs = _DEFAULT_SPEC_DIRS if dirs is None else dirs
    if not names_dra_cdi_dir(dirs):
        where, imported = deciders.where(table, "cdi_spec_dirs")
        return ("%s sets cdi_spec_dirs to %s, without %s where the DRA driver writes its CDI specifications; "
                "add it%s" % (where, list(dirs) if isinstance(dirs, (list, tuple)) else dirs, DRA_CDI_DIR,
                              "" if imported is None else " there, then restart containerd"))
    return None


def cdi_spec_problem(refresh, spec):
    """Why the CDI spec is not fresh, from scv-gpu-cdi-refresh --check (``refresh``: rc, stdout, or missing)."""
    advice = "run scv.gpu.container_toolkit with container_toolkit_cdi: true"
    if not refresh or refresh.get("missing"):
        return "scv-gpu-cdi-refresh is not installed, so nothing keeps %s fresh; %s" % (spec, advice)
    stdout = (refresh.get("stdout") or "").strip()
    if refresh.get("rc") == 0 and stdout == "unchanged":
        return None
    if refresh.get("rc") == 0 and stdout == "would generate":
        return ("the CDI specification %s is missing or stale (the driver, toolkit or MIG layout changed since "
                "it was generated); %s" % (spec, advice))
    return "the CDI specification %s cannot be checked: %s" % (
        spec, stdout or (refresh.get("stderr") or "").strip() or "exit %s" % refresh.get("rc"))


def label_problem(node, wanted):
    """Why the role must not write the stack label itself (a running node needs playbooks/gpu_stack.yml)."""
    if not node:
        return None
    current = node_stack(node)
    has_label = STACK_LABEL in (((node.get("metadata") or {}).get("labels")) or {})
    if current == wanted or (not has_label and wanted == "dra" and not offers_gpus(node)):
        return None
    return ("it runs the %s stack%s and gpu_stack asks for %s; switching needs its GPU pods drained: "
            "run playbooks/gpu_stack.yml for it" % (current, "" if has_label else " (no %s label)" % STACK_LABEL,
                                                    wanted))


# CRI-O: its configuration file, then its drop-ins in the order host.crio_dropins says, each setting the keys
# it names; the CDI folders it reads are crio.runtime's cdi_spec_dirs.
_CRIO_SPEC_DIRS = ("crio", "runtime", "cdi_spec_dirs")


def crio_cdi_problem(files):
    """Why CRI-O would not give containers the DRA driver's CDI devices, or None.

    ``files``: [{path, content, error}] in the order CRI-O reads them (its main file first, then its drop-ins in
    filepath.Walk's order, host.crio_dropins); a file that does not exist is left out, one that cannot be read has ``error`` set. CRI-O
    reads CDI specifications whatever its configuration; what may leave the DRA driver's out is
    ``cdi_spec_dirs`` in ``[crio.runtime]``, which the last file that sets it decides.
    """
    decided = None
    for entry in files or ():
        if entry.get("error") or entry.get("content") is None:
            return ("CDI in CRI-O cannot be checked: %s cannot be read (%s); CRI-O would not start with it either"
                    % (entry["path"], entry.get("error") or "no content"))
        try:
            config = tomllib.loads(entry["content"])
        except tomllib.TOMLDecodeError as error:
            return ("CDI in CRI-O cannot be checked: %s is not valid TOML (%s); CRI-O would not start with it either"
                    % (entry["path"], error))
        dirs = lookup(config, _CRIO_SPEC_DIRS)
        if dirs is not None:
            decided = (entry["path"], dirs)
    if decided is None:
        return None          # CRI-O's own default: /etc/cdi and /var/run/cdi
    path, dirs = decided
    if names_dra_cdi_dir(dirs):
        return None
    shown = list(dirs) if isinstance(dirs, (list, tuple)) else dirs
    return ("%s sets cdi_spec_dirs ([crio.runtime]) to %s, without %s where the DRA driver writes its CDI "
            "specifications, and no later drop-in sets it; add %s there, then restart crio"
            % (path, shown, DRA_CDI_DIR, DRA_CDI_DIR))
