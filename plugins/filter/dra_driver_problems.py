# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What keeps a node from running NVIDIA's DRA driver, for the dra_driver role (module_utils/node/dra.py)."""

from __future__ import annotations

import base64

from ansible_collections.scv.gpu.plugins.module_utils.node import dra


# What the role hands the filter (roles/dra_driver/tasks/prerequisites.yml), every key every time: a key
# misspelt on either side is an error, not a check quietly switched off.
KEYS = frozenset((
    "node_name", "stack", "prerequisites", "check_label", "node", "gpu_facts", "min_driver_version",
    "min_kubelet_version", "api_found", "compute_domain_api_found", "runtime", "containerd_path",
    "containerd_config", "containerd_imports", "containerd_error", "crio_reads", "cdi_refresh", "cdi_spec"))


def contract_problem(checks):
    """Why ``checks`` is not the dict the filter reads (None when it is)."""
    if not isinstance(checks, dict):
        return "dra_driver_problems reads a dict, not %s" % type(checks).__name__
    missing, unknown = sorted(KEYS - set(checks)), sorted(set(checks) - KEYS)
    if not missing and not unknown:
        return None
    return "dra_driver_problems: %s (the role and the filter must name the same %d keys)" % ("; ".join(
        part for part in ("missing %s" % ", ".join(missing) if missing else "",
                          "unknown %s" % ", ".join(unknown) if unknown else "") if part), len(KEYS))


def scv_gpu_dra_driver_problems(checks):
    """["node N: problem; what to do", ...] from what the role read of the node, the host and the API."""
    problem = contract_problem(checks)
    if problem:
        # Imported here: ansible.errors is controller code, and importing it turns a module run in the same
        # process (the tests run modules in-process) into a controller whose warnings go to the display.
        from ansible.errors import AnsibleFilterError  # pylint: disable=import-outside-toplevel
        raise AnsibleFilterError(problem)
    name = checks["node_name"]
    label = dra.label_problem(checks["node"], checks["stack"]) if checks["check_label"] else None
    if checks["stack"] != "dra" or not checks["prerequisites"]:
        return ["node %s: %s" % (name, label)] if label else []
    problems = [
        dra.driver_problem(checks["gpu_facts"], checks["min_driver_version"]),
        dra.kubelet_problem(checks["node"], checks["min_kubelet_version"]),
        None if checks["api_found"] else (
            "the API server does not serve resource.k8s.io/v1 (DeviceClass); DRA needs Kubernetes 1.34 or newer "
            "with that API enabled (kube-apiserver --runtime-config must not turn it off)"),
        None if checks["compute_domain_api_found"] else (
            "dra_driver_compute_domains is true and the API server does not serve resource.nvidia.com/v1beta1 "
            "ComputeDomain; install NVIDIA's ComputeDomain CRDs first, or set dra_driver_compute_domains: false"),
        dra.cdi_spec_problem(checks["cdi_refresh"], checks["cdi_spec"]),
        label,
    ]
    if checks["runtime"] == "containerd":
        problems.insert(2, _containerd_problem(checks))
    elif checks["runtime"] == "crio":
        problems.insert(2, dra.crio_cdi_problem(_slurped(checks["crio_reads"])))
    return ["node %s: %s" % (name, problem) for problem in problems if problem]


def _containerd_problem(checks):
    """Why CDI in containerd stops the node, from what scv.gpu.containerd_config_info read on the host."""
    path, text, error = checks["containerd_path"], checks["containerd_config"], checks["containerd_error"]
    if text is None:
        unread = (error if error and str(path) in error else
                  "%s cannot be read%s" % (path, " (%s)" % error if error else ""))
        return ("%s; CDI in containerd cannot be checked (set dra_driver_containerd_config, or dra_driver_runtime: "
                "crio on CRI-O nodes)" % unread)
    if error:
        return "CDI cannot be checked: %s" % error
    return dra.containerd_cdi_problem(text, path, checks["containerd_imports"])


def _slurped(reads):
    """[{path, content, error}] from ansible.builtin.slurp's results of a loop over the files (``item``)."""
    files = []
    for read in reads or ():
        if read.get("failed") or "content" not in read:
            files.append({"path": read.get("item"), "content": None, "error": read.get("msg") or "not read"})
            continue
        try:
            content = base64.b64decode(read["content"]).decode("utf-8")
        except (ValueError, UnicodeDecodeError) as error:
            files.append({"path": read.get("item"), "content": None, "error": "not UTF-8 text (%s)" % error})
            continue
        files.append({"path": read.get("item"), "content": content, "error": None})
    return files


def scv_gpu_dra_node_stack(node):
    """The stack a Node runs now (its scv.gpu/gpu-stack label; device-plugin without one)."""
    return dra.node_stack(node)


class FilterModule:
    def filters(self):
        return {"dra_driver_problems": scv_gpu_dra_driver_problems, "dra_node_stack": scv_gpu_dra_node_stack}
