#!/usr/bin/python
# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_validate
short_description: Run a GPU workload and the secure-access probes on one Kubernetes node, and say what they found
version_added: 2.0.0
description:
  - Runs two pods on Node O(name), placed by the scheduler through the node's C(kubernetes.io/hostname) label and
    tolerating every taint, so that a cordoned node can be validated before it is uncordoned.
  - The workload pod's container C(workload) asks for one GPU (a O(resource) limit, or on a DRA node a
    ResourceClaim for one device of O(device_class)) and runs O(workload_image). It must exit 0 within O(timeout).
    Its second container, C(no-request), asks for nothing and runs O(probe_image), which must find no GPU.
  - The no-request pod runs O(probe_image) with C(NVIDIA_VISIBLE_DEVICES=all) and C(NVIDIA_DRIVER_CAPABILITIES=all) in
    its environment, as CUDA base images set them. It must find no GPU.
  - These are the three cases of the secure accelerator access test of the CNCF Kubernetes AI Conformance.
  - Given O(metrics_url), a third pod then holds one GPU (O(probe_image) running O(holder_command)) while the
    node's agent is read there, until it serves C(DCGM_FI_DEV_GPU_UTIL) of that GPU labelled with the pod's
    C(namespace) and C(pod), for O(metrics_hold) seconds at most. This is evidence for the accelerator metrics
    requirement. Without O(metrics_url) that check is skipped.
  - Where the node's device plugin shares its GPUs (its C(nvidia.com/gpu.replicas) label above 1, as
    M(scv.gpu.node_labels) writes it from the plugin's config), one more pod than the node has GPUs
    (C(nvidia.com/gpu.count)), each asking for one O(resource) and running O(holder_command), must all run at once,
    so at least two of them share a GPU. This is evidence for the GPU sharing requirement. Elsewhere, and on DRA
    nodes, that check is skipped.
  - Every pod and claim it made is deleted before it returns, whatever the outcome.
  - It changes nothing that stays, and reports C(changed=false). A failed check is a result, not a module
    failure; M(scv.gpu.validation_report) writes the report and fails the play.
author:
  - scv.gpu contributors (!UNKNOWN)
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - scv.gpu.k8s
  - scv.gpu.node_name
  - ansible.builtin.action_common_attributes
options:
  namespace:
    description:
      - The namespace the pods run in; created, with the Pod Security level C(baseline), when it does not exist.
    type: str
    default: scv-gpu-validation
  resource:
    description: The extended resource the workload asks one of, on a device plugin node.
    type: str
    default: nvidia.com/gpu
  device_class:
    description:
      - On a DRA node, the DeviceClass of the ResourceClaim the workload pod uses instead of O(resource).
    type: str
  workload_image:
    description:
      - The image of the workload; it must exit 0 when it ran on its GPU. The default runs NVIDIA's C(vectorAdd)
        CUDA sample, a kernel on the GPU.
    type: str
    default: nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04
  workload_command:
    description: The command of the workload container; the image's own when empty.
    type: list
    elements: str
    default: []
  probe_image:
    description:
      - The image of the probe containers, which must exit 0 when they find no GPU. With the default
        O(probe_command), any image with a POSIX shell serves.
    type: str
    default: nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04
  probe_command:
    description:
      - The probe's command; the default looks for GPU device nodes (C(/dev/nvidia0) and on) and exits 1 on the
        first it finds.
    type: list
    elements: str
  image_pull_policy:
    description: The pull policy of every container.
    type: str
    choices: [Always, IfNotPresent, Never]
    default: IfNotPresent
  timeout:
    description: Seconds the pods have to finish, from the moment they were created; a slow image pull counts.
    type: int
    default: 300
  metrics_url:
    description:
      - The URL of the node's agent's metrics, as the controller reaches it, for example
        C(http://gpu-node-1:9400/metrics) where the agent's C(scv_agent_metrics_address) is C(0.0.0.0:9400).
    type: str
  metrics_hold:
    description:
      - Seconds the agent has to name the holder pod once it runs. The agent reads the kubelet's pod-resources
        every C(scv_agent_pod_resources_interval) seconds (10 by default).
    type: int
    default: 60
  holder_command:
    description:
      - The command of the containers that hold a GPU during the sharing and metrics checks, in O(probe_image); it
        must keep running. The default sleeps longer than both checks can take; the pods are deleted once each
        check is done.
    type: list
    elements: str
  metrics_ca_path:
    description: A CA bundle to verify the agent's HTTPS certificate with (C(scv_agent_web_tls)).
    type: path
  metrics_client_cert:
    description: A client certificate for agents that ask for one (C(scv_agent_web_client_auth_type)).
    type: path
  metrics_client_key:
    description: The key of O(metrics_client_cert).
    type: path
  metrics_username:
    description: A user of the agent's basic authentication (C(scv_agent_web_basic_auth_users)).
    type: str
  metrics_password:
    description: The password of O(metrics_username).
    type: str
  metrics_validate_certs:
    description: Verify the agent's HTTPS certificate.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    details: Starts no pod; every check is reported as skipped.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
notes:
  - "Run it from the controller (C(delegate_to: localhost)); C(playbooks/validate.yml) runs it for every GPU node."
"""

EXAMPLES = r"""
- name: Run the workload and the secure-access probes on the node
  scv.gpu.node_validate:
    name: "{{ inventory_hostname }}"
    timeout: 600
  delegate_to: localhost
  register: pods

- name: Also check that the node's agent names a pod on its GPU's series
  scv.gpu.node_validate:
    name: gpu-node-2
    metrics_url: https://gpu-node-2:9400/metrics
    metrics_ca_path: /etc/pki/scv-gpu/agent-ca.pem
  delegate_to: localhost
  register: pods

- name: Validate a DRA node through a ResourceClaim, with images of a registry of our own
  scv.gpu.node_validate:
    name: gpu-node-3
    device_class: gpu.nvidia.com
    workload_image: registry.example.com/cuda-sample:vectoradd
    probe_image: registry.example.com/busybox:1.37
  delegate_to: localhost
  register: pods
"""

RETURN = r"""
checks:
  description:
    - One entry per check, in the order C(workload), C(second_container), C(no_request), C(sharing), C(metrics).
    - O(name) as C(node); C(outcome) is V(passed), V(failed) or V(skipped); C(reason)
      says why a check failed (the container's exit code and the end of its output, the scheduler's message, the
      timeout) or was skipped, and is empty when it passed.
  returned: always
  type: list
  elements: dict
  sample:
    - {node: gpu-node-1, check: workload, outcome: passed, reason: ""}
    - {node: gpu-node-1, check: second_container, outcome: passed, reason: ""}
    - node: gpu-node-1
      check: no_request
      outcome: failed
      reason: "container probe exited 1: found /dev/nvidia0"
    - node: gpu-node-1
      check: sharing
      outcome: skipped
      reason: "the node's device plugin shares no GPU (nvidia.com/gpu.replicas is 1)"
    - {node: gpu-node-1, check: metrics, outcome: skipped, reason: "no metrics URL of the node's agent was given"}
failed_checks:
  description: How many checks failed.
  returned: always
  type: int
  sample: 1
"""

from ansible.module_utils.urls import open_url

from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.kube.module import api_module, check_node_name
from ansible_collections.scv.gpu.plugins.module_utils.kube.pods import PodClient
from ansible_collections.scv.gpu.plugins.module_utils.node.validation import (
    FAILED, NO_GPU_PROBE, NODE_CHECKS, check)
from ansible_collections.scv.gpu.plugins.module_utils.node.validation_run import validate_pods


def main():
    module = api_module(dict(
        name=dict(type="str", required=True),
        namespace=dict(type="str", default="scv-gpu-validation"),
        resource=dict(type="str", default="nvidia.com/gpu"),
        device_class=dict(type="str"),
        workload_image=dict(type="str", default="nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04"),
        workload_command=dict(type="list", elements="str", default=[]),
        probe_image=dict(type="str", default="nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04"),
        probe_command=dict(type="list", elements="str"),
        image_pull_policy=dict(type="str", choices=["Always", "IfNotPresent", "Never"], default="IfNotPresent"),
        timeout=dict(type="int", default=300),
        metrics_url=dict(type="str"),
        metrics_hold=dict(type="int", default=60),
        holder_command=dict(type="list", elements="str"),
        metrics_ca_path=dict(type="path"),
        metrics_client_cert=dict(type="path"),
        metrics_client_key=dict(type="path", no_log=False),
        metrics_username=dict(type="str"),
        metrics_password=dict(type="str", no_log=True),
        metrics_validate_certs=dict(type="bool", default=True),
    ), required_together=[("metrics_username", "metrics_password")])
    params = module.params
    check_node_name(module)
    for option in ("timeout", "metrics_hold"):
        if params[option] <= 0:
            module.fail_json(msg="%s: expected seconds > 0, got %s; no pod was started" % (option, params[option]))
    if params["metrics_url"] is not None and not params["metrics_url"].startswith(("http://", "https://")):
        module.fail_json(msg="metrics_url: expected an http:// or https:// URL of the agent's /metrics, got %r; no "
                             "pod was started" % params["metrics_url"])
    for option in ("workload_image", "probe_image", "resource"):
        if not (params[option] or "").strip():
            module.fail_json(msg="%s: expected a non-empty value; no pod was started" % option)
    if module.check_mode:
        checks = [check(params["name"], name, skipped="check mode starts no pod") for name in NODE_CHECKS]
        module.exit_json(changed=False, checks=checks, failed_checks=0)
    policy = params["image_pull_policy"]
    workload = {"image": params["workload_image"], "command": params["workload_command"], "pull_policy": policy}
    probe = {"image": params["probe_image"], "command": params["probe_command"] or NO_GPU_PROBE,
             "pull_policy": policy}
    request = {"device_class": params["device_class"]} if params["device_class"] else {"resource": params["resource"]}
    try:
        client = PodClient.connect(module)
        holder = {"image": params["probe_image"], "pull_policy": policy, "command": params["holder_command"] or [
            "sleep", str(params["timeout"] + params["metrics_hold"] + 60)]}
        checks = validate_pods(client, params["name"], params["namespace"], workload, probe, request,
                               params["timeout"], metrics=_metrics(params), holder=holder)
    except ApiError as error:
        module.fail_json(msg=str(error))
    module.exit_json(changed=False, checks=checks,
                     failed_checks=sum(1 for item in checks if item["outcome"] == FAILED))


def _metrics(params):
    """What the metrics check needs (validation_run.validate_pods), or None without a metrics URL."""
    if not params["metrics_url"]:
        return None

    def read():
        response = open_url(params["metrics_url"], timeout=10, validate_certs=params["metrics_validate_certs"],
                            ca_path=params["metrics_ca_path"], client_cert=params["metrics_client_cert"],
                            client_key=params["metrics_client_key"], url_username=params["metrics_username"],
                            url_password=params["metrics_password"], force_basic_auth=bool(params["metrics_username"]))
        try:
            return response.read().decode("utf-8", "replace")
        finally:
            response.close()

    return {"url": params["metrics_url"], "read": read, "hold": params["metrics_hold"]}


if __name__ == "__main__":
    main()
