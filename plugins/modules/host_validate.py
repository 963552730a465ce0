#!/usr/bin/python
# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_validate
short_description: Check what a GPU host gives its containers, as the driver and the toolkit left it
version_added: 2.0.0
description:
  - Reads what the driver and NVIDIA's container toolkit left on the host, without NVML, and says which checks
    pass. A host where NVML answers but no container can start fails here.
  - C(driver) - the nvidia kernel module is loaded (C(/sys/module/nvidia/version)), at O(driver_version) when
    given, and lists its GPUs under C(/proc/driver/nvidia/gpus).
  - C(device_nodes) - C(nvidiactl), C(nvidia-uvm), C(nvidia-uvm-tools) and one C(nvidiaN) per GPU, by the device
    minor the driver gives each GPU, exist under O(dev).
  - C(dev_char_links) - each NVIDIA device node has its C(/dev/char/<major>:<minor>) link (see
    M(scv.gpu.nvidia_dev_char_links)).
  - C(cdi_spec) - O(cdi_spec) names every GPU the driver lists, by UUID, and no GPU it does not.
  - C(fabric) - on NVSwitch (HGX) boards, every GPU in an NVLink fabric has it completed, with status
    C(Success) and healthy, as O(nvml) (M(scv.gpu.gpu_facts) with the C(fabric) subset) reads it, so Fabric
    Manager trained it. Skipped where no GPU is in a fabric.
  - C(container_runtime) - the container runtime (O(container_runtime)) has a runtime that runs
    C(nvidia-container-runtime), as its default where O(default_runtime) says the roles made it so; that binary
    exists and its release has every fix of NVIDIA's security bulletins for the toolkit (1.19.1 and later).
    containerd's configuration is read with the files it imports, CRI-O's with its drop-in folder
    (C(crio.conf.d) beside it, recursively, in byte order), dockerd's C(daemon.json) as it is.
  - C(runtime_isolation) - O(runtime_config) sets C(accept-nvidia-visible-devices-envvar-when-unprivileged =
    false) and C(accept-nvidia-visible-devices-as-volume-mounts = true), as the container_toolkit role does.
  - A failed check is a result, not a module failure; M(scv.gpu.validation_report) writes the report and fails
    the play.
author:
  - scv.gpu contributors (!UNKNOWN)
requirements:
  - Python 3.11 or newer on the managed host (tomllib), or on an older Python the host's python3-tomli package,
    and PyYAML; without them, the checks that need them are skipped and say why.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
options:
  node:
    description: The Kubernetes node name the results carry.
    type: str
    required: true
  driver_version:
    description: The driver version the inventory pins (C(580.95.05), or a branch such as C(580)); any when unset.
    type: str
  dev:
    description: The folder of the device nodes.
    type: path
    default: /dev
  sysfs:
    description: Where sysfs is mounted.
    type: path
    default: /sys
  proc_driver:
    description: The driver's folder under procfs.
    type: path
    default: /proc/driver
  cdi_spec:
    description: The CDI specification the container runtimes read.
    type: path
    default: /etc/cdi/nvidia.yaml
  runtime_config:
    description: NVIDIA's container runtime configuration.
    type: path
    default: /etc/nvidia-container-runtime/config.toml
  nvml:
    description:
      - The C(nvidia_gpu) fact of M(scv.gpu.gpu_facts), read with the C(fabric) subset. Without it the C(fabric)
        check is skipped.
    type: dict
  container_runtime:
    description:
      - The container runtime whose configuration is checked. V(auto) picks it as the container_toolkit role does
        (C(dockerd) when installed, otherwise C(containerd), otherwise C(crio)); with none installed the check is
        skipped.
    type: str
    choices: [auto, docker, containerd, crio]
    default: auto
  container_config:
    description:
      - Its configuration file; by default C(/etc/docker/daemon.json), C(/etc/containerd/config.toml) or
        C(/etc/crio/crio.conf).
    type: path
  default_runtime:
    description:
      - By container runtime (C(docker), C(containerd), C(crio)), whether NVIDIA's runtime must be its default one,
        as C(container_toolkit_<runtime>_default_runtime) says; true for a runtime not named. With V(false), a
        runtime of NVIDIA's must exist under any name.
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
    details: It only reads; check mode runs every check.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Check what the host gives its containers
  scv.gpu.host_validate:
    node: "{{ scv_gpu_node_name | default(inventory_hostname) }}"
    driver_version: "{{ nvidia_driver_version | default(omit) }}"
  register: host_checks

- name: Show the checks that failed
  ansible.builtin.debug:
    msg: "{{ host_checks.checks | selectattr('outcome', 'equalto', 'failed') | list }}"
"""

RETURN = r"""
checks:
  description:
    - One entry per check, in the order C(driver), C(device_nodes), C(dev_char_links), C(cdi_spec),
      C(fabric), C(container_runtime), C(runtime_isolation). C(outcome) is V(passed), V(failed) or V(skipped), C(reason) says why
      a check failed or was skipped (the file or device node, and what to do).
  returned: always
  type: list
  elements: dict
  sample:
    - {node: gpu-node-1, check: driver, outcome: passed, reason: ""}
    - node: gpu-node-1
      check: device_nodes
      outcome: failed
      reason: "missing /dev/nvidia-uvm, /dev/nvidia-uvm-tools (nvidia-uvm: load the nvidia-uvm module and run
        nvidia-modprobe -u -c=0)"
failed_checks:
  description: How many checks failed.
  returned: always
  type: int
  sample: 1
gpus:
  description: The GPUs the driver lists - PCI bus, UUID and device minor.
  returned: always
  type: list
  elements: dict
  sample: [{bus: "0000:18:00.0", uuid: GPU-5a7c0000-1f2e-4d3c-8b4a-9e8d7c6b5a40, minor: 0}]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.scv.gpu.plugins.module_utils.common.names import node_name_problem
from ansible_collections.scv.gpu.plugins.module_utils.node.validation_host import (
    driver_gpus, host_checks, installed_runtime)
from ansible_collections.scv.gpu.plugins.module_utils.node.validation import FAILED


def main():
    module = AnsibleModule(argument_spec=dict(
        node=dict(type="str", required=True),
        driver_version=dict(type="str"),
        dev=dict(type="path", default="/dev"),
        sysfs=dict(type="path", default="/sys"),
        proc_driver=dict(type="path", default="/proc/driver"),
        cdi_spec=dict(type="path", default="/etc/cdi/nvidia.yaml"),
        runtime_config=dict(type="path", default="/etc/nvidia-container-runtime/config.toml"),
        nvml=dict(type="dict"),
        container_runtime=dict(type="str", choices=["auto", "docker", "containerd", "crio"], default="auto"),
        container_config=dict(type="path"),
        default_runtime=dict(type="dict", default={}),
    ), supports_check_mode=True)
    params = module.params
    problem = node_name_problem(params["node"])
    if problem:
        module.fail_json(msg="node: %s" % problem)
    pinned = (params["driver_version"] or "").strip() or None
    if pinned and not all(part.isdigit() for part in pinned.split(".")):
        module.fail_json(msg="driver_version: expected a version such as 580.95.05 or a branch such as 580, got %r"
                         % params["driver_version"])
    paths = {key: params[key] for key in ("sysfs", "proc_driver", "dev", "cdi_spec", "runtime_config")}
    kind = installed_runtime() if params["container_runtime"] == "auto" else params["container_runtime"]
    unknown = sorted(set(params["default_runtime"]) - {"docker", "containerd", "crio"})
    if unknown:
        module.fail_json(msg="default_runtime: expected keys among docker, containerd and crio, got %s"
                         % ", ".join(unknown))
    runtime = {"kind": kind, "config": params["container_config"], "run": module.run_command,
               "default": boolean(params["default_runtime"].get(kind, True), strict=False)}
    checks = host_checks(params["node"], paths, pinned, runtime, params["nvml"])
    module.exit_json(changed=False, checks=checks, gpus=driver_gpus(params["proc_driver"]),
                     failed_checks=sum(1 for item in checks if item["outcome"] == FAILED))


if __name__ == "__main__":
    main()
