#!/usr/bin/python
# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: mig_layout
short_description: Lay out the MIG devices of a host's NVIDIA GPUs as declared
version_added: 2.0.0
description:
  - Makes each named GPU's MIG mode and GPU instances what a layout declares, through NVML - the
    job of NVIDIA's nvidia-mig-parted, as an Ansible module. A layout is a list of entries in
    nvidia-mig-parted's form, given inline (O(layout)) or by name from a configuration file in its
    C(mig-configs) form (O(config_file) and O(config_name)), or the same as a mapping (O(config)).
  - Each entry names GPUs (C(devices), C(all) or a list of indexes, optionally narrowed by
    C(device-filter), PCI device IDs such as C(0x233010DE)), whether MIG mode is on
    (C(mig-enabled)), and how many GPU instances of each profile there are (C(mig-devices), a mapping of
    profile to count, such as C(1g.10gb) to 7). Each GPU instance gets one compute instance that spans it, which is what
    the device plugin offers. C(_) may stand for C(-) in the keys. GPUs no entry names are left
    as they are; an entry naming a GPU another entry named is an error.
  - Idempotent. A GPU whose MIG mode and instances (counted per profile; where they sit does not
    matter) already match is not touched. One that differs loses all its instances, which are
    then created anew, the largest first, at places where the whole layout fits.
  - Everything is checked before any GPU changes, MIG mode included - the entries, the profile
    names (against what the GPU's driver offers), whether the layout fits, and the processes. A
    GPU that any process uses (on the GPU or on one of its MIG devices) is refused, naming the
    PIDs, and nothing changes. An entry that names no GPU is skipped with a warning; a layout
    that names none at all is refused.
  - While a GPU's MIG mode is off its driver lists no profiles, so its layout is planned from the
    collection's table of the cards NVIDIA publishes MIG tables for (A100, A30, H100, H100 NVL,
    H200). For another card whose mode is off, a layout with C(mig-devices) is refused before
    anything changes; turn MIG mode on first (C(mig-enabled) true and no C(mig-devices)), then
    apply it.
  - Should the driver fail part-way, the module fails naming the GPUs already changed, from what
    to what, and returns O(layout) entries that put them back (RV(restore_layout)).
  - MIG mode is changed by the driver with a GPU reset. Where the driver cannot reset the GPU (it
    reports that a reset or reboot is required, or something still holds the GPU, such as
    C(nvidia-persistenced) or a monitoring agent), the mode stays pending, the GPU's instances are
    not created, and the result says C(reboot_required); reboot (or reset the GPU) and run again.
  - MIG instances do not outlive a reboot or a driver reload; run this again at boot.
author:
  - scv.gpu contributors (!UNKNOWN)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
requirements:
  - nvidia-ml-py (imported as C(pynvml)) on the target host
  - the NVIDIA driver's C(libnvidia-ml.so.1) on the target host, and root
options:
  layout:
    description: The layout's entries, each with C(devices), C(device-filter), C(mig-enabled) and C(mig-devices).
    type: list
    elements: dict
  config:
    description:
      - An nvidia-mig-parted style configuration - C(version) C(v1), and C(mig-configs), a mapping of layout names
        to lists of entries.
    type: dict
  config_file:
    description: A YAML or JSON file on the target host holding such a configuration.
    type: path
  config_name:
    description: The layout of O(config) or O(config_file) to apply, such as C(all-1g.10gb).
    type: str
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Cut every H100 into seven 1g.10gb MIG devices
  scv.gpu.mig_layout:
    layout:
      - devices: all
        mig-enabled: true
        mig-devices:
          1g.10gb: 7
  become: true
  register: mig

- name: Two GPUs for training, the rest cut in two and in seven
  scv.gpu.mig_layout:
    layout:
      - devices: [0, 1]
        mig-enabled: false
      - devices: [2, 3]
        mig-enabled: true
        mig-devices: {3g.40gb: 2}
      - devices: [4, 5, 6, 7]
        mig-enabled: true
        mig-devices: {1g.10gb: 7}
  become: true

- name: A named layout from an nvidia-mig-parted configuration file
  scv.gpu.mig_layout:
    config_file: /etc/nvidia-mig-manager/config.yaml
    config_name: all-3g.40gb
  become: true

- name: Reboot when a MIG mode change waits for one
  ansible.builtin.reboot:
  become: true
  when: mig.reboot_required
"""

RETURN = r"""
gpus:
  description: Every GPU the layout names, before and after.
  returned: always
  type: list
  elements: dict
  sample: [{"index": 0, "uuid": "GPU-5a7c0000-1f2e-4d3c-8b4a-9e8d7c6b5a40", "name": "NVIDIA H100 80GB HBM3",
            "before": {"mig-enabled": false, "mig-devices": {}}, "after": {"mig-enabled": true, "mig-devices": {"1g.10gb": 7}},
            "changed": true, "pending": false}]
restore_layout:
  description:
    - After a failure part-way, a layout that puts the GPUs that changed back as they were; pass it as
      O(layout). Empty when no GPU changed.
  returned: failure part-way
  type: list
  elements: dict
  sample: [{"devices": [0], "mig-enabled": false, "mig-devices": {}}]
reboot_required:
  description: Whether a MIG mode change waits for a GPU reset or a reboot (the GPUs with C(pending) true).
  returned: always
  type: bool
  sample: false
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.scv.gpu.plugins.module_utils.common.mig_layout import LayoutError
from ansible_collections.scv.gpu.plugins.module_utils.host.mig_config import layout_entries
from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import HAS_PYNVML, PYNVML_IMPORT_ERROR, pynvml
from ansible_collections.scv.gpu.plugins.module_utils.nvml.mig import MigError, MigGpu, lay_out

LAYOUT_OPTIONS = ("layout", "config", "config_file", "config_name")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            layout=dict(type="list", elements="dict"),
            config=dict(type="dict"),
            config_file=dict(type="path"),
            config_name=dict(type="str"),
        ),
        mutually_exclusive=[("layout", "config", "config_file")],
        required_one_of=[("layout", "config", "config_file")],
        required_by={"config": "config_name", "config_file": "config_name"},
        supports_check_mode=True,
    )
    if not HAS_PYNVML:
        module.fail_json(msg=missing_required_lib("nvidia-ml-py"), exception=PYNVML_IMPORT_ERROR)
    try:
        entries = layout_entries(**{key: module.params[key] for key in LAYOUT_OPTIONS})
    except LayoutError as error:
        module.fail_json(msg=str(error))
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        module.fail_json(msg="NVML cannot be initialised, so no MIG layout can be read or applied: %s" % error)
    try:
        gpus = lay_out(entries, [MigGpu(index) for index in range(pynvml.nvmlDeviceGetCount())], module.check_mode,
                       warn=module.warn)
    except MigError as error:
        module.fail_json(msg=str(error), **({} if error.report is None else
                                            dict(changed=bool(error.restore), gpus=error.report,
                                                 restore_layout=error.restore)))
    except LayoutError as error:
        source = module.params["config_file"] or ("config" if module.params["config"] else None)
        module.fail_json(msg="%s%s" % ("%s, layout %s: " % (source, module.params["config_name"]) if source else "",
                                       error))
    finally:
        pynvml.nvmlShutdown()
    waiting = [gpu for gpu in gpus if gpu["pending"]]
    result = dict(changed=any(gpu["changed"] for gpu in gpus), gpus=gpus, reboot_required=bool(waiting))
    if waiting:
        module.warn("MIG mode of GPU %s waits for a reset: the driver could not reset the GPU (a reboot is "
                    "needed, or something holds it, such as nvidia-persistenced or a monitoring agent). Its "
                    "MIG devices were not created: reboot, or stop what holds it, and run again."
                    % ", ".join(str(gpu["index"]) for gpu in waiting))
    if module._diff:
        result["diff"] = {"before": {"gpu%d" % gpu["index"]: gpu["before"] for gpu in gpus},
                          "after": {"gpu%d" % gpu["index"]: gpu["after"] for gpu in gpus}}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
