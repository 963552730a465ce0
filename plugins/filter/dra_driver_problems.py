# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What keeps a node from running NVIDIA's DRA driver, for the dra_driver role (module_utils/node/dra.py)."""

from __future__ import annotations

import base64

from ansible_collections.scv.gpu.plugins.module_utils.node import dra


def scv_gpu_dra_driver_problems(checks):
    """["node N: problem; what to do", ...] from what the role read of the node, the host and the API."""
    checks = checks or {}
    name = checks.get("node_name")
    label = dra.label_problem(checks.get("node"), checks.get("stack")) if checks.get("check_label") else None
    if checks.get("stack") != "dra" or not checks.get("prerequisites", True):
        return ["node %s: %s" % (name, label)] if label else []
    problems = [
        dra.driver_problem(checks.get("gpu_facts"), checks.get("min_driver_version")),
        dra.kubelet_problem(checks.get("node"), checks.get("min_kubelet_version")),
        None if checks.get("api_found") else (
            "the API server does not serve resource.k8s.io/v1 (DeviceClass); DRA needs Kubernetes 1.34 or newer "
            "with that API enabled (kube-apiserver --runtime-config must not turn it off)"),
        None if checks.get("compute_domain_api_found", True) else (
            "dra_driver_compute_domains is true and the API server does not serve resource.nvidia.com/v1beta1 "
            "ComputeDomain; install NVIDIA's ComputeDomain CRDs first, or set dra_driver_compute_domains: false"),
        dra.cdi_spec_problem(checks.get("cdi_refresh"), checks.get("cdi_spec")),
        label,
    ]
    if checks.get("runtime") == "containerd":
        problems.insert(2, _containerd_problem(checks))
    elif checks.get("runtime") == "crio":
        problems.insert(2, dra.crio_cdi_problem(_slurped(checks.get("crio_reads"))))
    return ["node %s: %s" % (name, problem) for problem in problems if problem]


def _containerd_problem(checks):
    """Why CDI in containerd stops the node, from what scv.gpu.containerd_config_info read on the host."""
    path, text, error = checks.get("containerd_path"), checks.get("containerd_config"), checks.get("containerd_error")
    if text is None:
        unread = (error if error and str(path) in error else
                  "%s cannot be read%s" % (path, " (%s)" % error if error else ""))
        return ("%s; CDI in containerd cannot be checked (set dra_driver_containerd_config, or dra_driver_runtime: "
                "crio on CRI-O nodes)" % unread)
    if error:
        return "CDI cannot be checked: %s" % error
    return dra.containerd_cdi_problem(text, path, checks.get("containerd_imports"))


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
