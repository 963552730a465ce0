#!/usr/bin/python
# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver_info
short_description: Report the NVIDIA driver a host runs, the one it has installed, and Secure Boot
description:
  - Reads the version of the loaded C(nvidia) kernel module and whether C(nouveau) is loaded, from sysfs.
  - Reads the installed version of the driver package with C(dpkg-query) or C(rpm).
  - Tells whether Secure Boot is enabled (C(mokutil --sb-state), or the EFI variable when mokutil is absent).
  - Loads C(libnvidia-ml.so.1) and asks it for the driver version and the GPU count, with the standard
    library's ctypes, so the host needs no nvidia-ml-py.
  - Compares the options the loaded C(nvidia) module runs with against wanted ones, and names the processes
    that hold the GPUs (O(module_params)).
  - The C(scv.gpu.nvidia_driver) role uses it to decide whether a reboot must follow an install
    (see the role's C(nvidia_driver_reboot)), and whether its C(nvidia_driver_module_params) need a reload or a
    reboot.
version_added: 1.0.0
author:
  - scv.gpu contributors (!UNKNOWN)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
options:
  package:
    description:
      - The package whose installed version is the driver's (C(nvidia-driver) on Debian and the RHEL family,
        C(nvidia-driver-<branch>[-server][-open]) on Ubuntu). Leave it out to skip the package query.
    type: str
  sysfs:
    description: Where sysfs is mounted; tests point it at a prepared tree.
    type: path
    default: /sys
  nvml:
    description: Load the NVML library and report what it answers.
    type: bool
    default: true
  next_kernel:
    description:
      - Find the kernel that boots next and the nvidia module built for it, and judge whether a reboot into it
        would bring the installed driver up (RV(next_kernel)).
      - The kernel is resolved as the boot loader resolves it. On the RHEL family, C(grubby --default-kernel).
        With GRUB, the generated C(/boot/grub/grub.cfg) (or C(/boot/grub2/grub.cfg)) and its C(grubenv) decide
        it; C(next_entry) (what C(grub-reboot) writes), else C(saved_entry) when GRUB_DEFAULT is C(saved), else
        GRUB_DEFAULT as an entry number, title, id or C(a>b) path through the menu. With systemd-boot, the EFI
        one-shot and default entries, then C(default) in C(/boot/loader/loader.conf), over C(/boot/loader/entries).
      - When the answer is not certain (no boot loader configuration, GRUB_DEFAULT in C(/etc/default/grub) or
        C(/etc/default/grub.d/*.cfg) changed since grub.cfg was generated, a default naming a submenu or no
        kernel), C(ok) is false and C(message) says why; nothing is guessed.
      - A module counts only when its C(.modinfo) section parses and its vermagic names that kernel, as
        modprobe requires.
    type: bool
    default: false
  next_kernel_release:
    description:
      - The kernel release that boots next, when the site decides it otherwise (a custom boot loader), or when the
        boot loader's configuration cannot be read here.
    type: str
  root:
    description:
      - Where the host's C(/boot), C(/etc/default/grub) and C(/lib/modules) are; tests point it at a prepared tree.
    type: path
    default: /
  module_params:
    description:
      - Options of the C(nvidia) module (name to value, as the C(scv.gpu.nvidia_module_options) filter spells them)
        to compare with the loaded module's, read from C(/sys/module/nvidia/parameters/<name>) where the driver
        exposes one, else from C(/proc/driver/nvidia/params) (without the C(NVreg_) prefix). Reported as
        RV(module_params).
    type: dict
  module_params_file:
    description: The modprobe.d file that holds those options, for the messages.
    type: path
    default: /etc/modprobe.d/scv-gpu-nvidia.conf
  procfs:
    description: Where procfs is mounted (the loaded driver's version line and parameters, and the processes that
      hold its devices); tests point it at a prepared tree.
    type: path
    default: /proc
attributes:
  check_mode:
    support: full
    details: It only reads, so it runs the same in check mode.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Read the driver state
  scv.gpu.nvidia_driver_info:
    package: nvidia-driver
  register: driver

- name: Say whether the installed driver runs
  ansible.builtin.debug:
    msg: "loaded {{ driver.loaded_version }}, installed {{ driver.installed_version }}"
"""

RETURN = r"""
loaded_version:
  description: Version of the C(nvidia) module in the running kernel; null when none is loaded.
  returned: always
  type: str
  sample: "580.95.05"
loaded_kernel_modules:
  description:
    - The flavour of the loaded C(nvidia) module, C(open) or C(proprietary), from the first line of
      C(/proc/driver/nvidia/version); null when none is loaded. A change of flavour at the same version runs only
      after the module is reloaded or the host rebooted.
  returned: always
  type: str
  sample: open
nouveau_loaded:
  description: Whether the C(nouveau) module is loaded.
  returned: always
  type: bool
  sample: false
nova_loaded:
  description:
    - The modules of Linux's own NVIDIA driver (C(nova_core), C(nova_drm), C(nova); Linux 6.15 and later) loaded in
      the running kernel. C(nova_core) binds Turing and newer GPUs before NVIDIA's module can.
  returned: always
  type: list
  elements: str
  sample: [nova_core]
installed_version:
  description: The driver's version from the installed package (upstream part); null when not installed.
  returned: always
  type: str
  sample: "580.95.05"
installed_package_version:
  description: The installed package's full version; null when not installed.
  returned: always
  type: str
  sample: "580.95.05-1~deb12u1"
secure_boot:
  description: Whether Secure Boot is enabled.
  returned: always
  type: bool
  sample: false
secure_boot_source:
  description: What told (C(mokutil), C(efivars)), or C(no EFI) on a host booted without EFI.
  returned: always
  type: str
  sample: mokutil
nvml:
  description: What loading C(libnvidia-ml.so.1) gave, with the PCI address of each GPU that answered.
  returned: when I(nvml=true)
  type: dict
  sample: {"loads": true, "driver_version": "580.95.05", "gpu_count": 1, "bus_ids": ["00000000:18:00.0"], "error": null}
pci_gpus:
  description:
    - The NVIDIA GPUs on the PCI bus (vendor 0x10de, class VGA or 3D controller), read from sysfs, so
      they are listed with no driver at all. C(model) is the name NVML gives that device, where the
      collection's table knows it, else null. C(driver) is the bound kernel driver, or null.
  returned: always
  type: list
  elements: dict
  sample: [{"busId": "0000:18:00.0", "deviceId": "0x2330", "model": "NVIDIA H100 80GB HBM3", "driver": "nvidia"}]
pci_virtual_functions:
  description:
    - SR-IOV virtual functions of NVIDIA GPUs (a C(physfn) link to their GPU), listed apart, since they are not GPUs of this
      host, and C(nvml_missing) does not count them.
  returned: always
  type: list
  elements: dict
  sample: [{"busId": "0000:3b:00.4", "deviceId": "0x2330", "physfn": "0000:3b:00.0", "driver": "nvidia"}]
pci_unreadable:
  description: PCI functions that may be NVIDIA GPUs and cannot be read, each with the reason. These are NVIDIA functions
    whose class cannot be read, and entries of C(/sys/bus/pci/devices) that are broken links (C(vendor) null). The
    module warns about each.
  returned: always
  type: list
  elements: dict
  sample: [{"busId": "0000:19:00.0", "vendor": "0x10de", "problem": "cannot read /sys/bus/pci/devices/0000:19:00.0/class"}]
pci_nvswitches:
  description:
    - The NVSwitch chips on the PCI bus (vendor 0x10de, class 0680), read from sysfs, in bus order. C(generation) is
      C(LR10) (HGX A100), C(LS10) (HGX H100/H200) or null for a device ID the collection's table does not know;
      C(driver) is the bound kernel driver (C(nvidia-nvswitch)), or null.
    - The fourth generation (HGX B200/B300) is reached through ConnectX bridges, not as NVIDIA functions, so it is not
      listed here.
    - The C(scv.gpu.nvidia_driver) role installs NVIDIA Fabric Manager where this is not empty.
  returned: always
  type: list
  elements: dict
  sample: [{"busId": "0000:05:00.0", "deviceId": "0x22a3", "generation": "LS10", "driver": "nvidia-nvswitch"}]
next_kernel:
  description:
    - The preflight for a reboot. C(kernel) is the release that boots next, or null when that is not certain, and
      C(how) what decided it, or why it could not be decided.
    - C(modules) lists the nvidia module files for that kernel, each with its C(version), C(vermagic) and
      C(problem) (null when modprobe would load it).
    - C(ok) is true when one without a problem is the installed driver's release (any, when the installed version
      is unknown); C(message) says what was found.
  returned: when I(next_kernel=true)
  type: dict
  sample: {"kernel": "6.1.0-27-amd64", "running": "6.1.0-18-amd64", "ok": false, "modules": [],
           "how": "GRUB_DEFAULT=0, in /boot/grub/grub.cfg, the entry 'Debian GNU/Linux'",
           "message": "the kernel that boots next, 6.1.0-27-amd64 (GRUB_DEFAULT=0, in /boot/grub/grub.cfg, the entry
           'Debian GNU/Linux'), has no nvidia module under /lib/modules/6.1.0-27-amd64"}
module_params:
  description:
    - The loaded C(nvidia) module against O(module_params). C(loaded) tells whether one is loaded; C(differ) lists
      each option it runs with another value (C(name), C(wanted), C(running), C(source) it was read from);
      C(unknown) the options it lists nowhere (the kernel ignores those).
    - C(action) is C(none) (nothing to apply), C(reload) (no process holds a GPU, but C(services) such as
      C(nvidia-persistenced), which are stopped for it; C(unload) lists the modules in the order C(modprobe -r)
      takes them) or C(reboot) (C(holders) lists the processes that hold the GPUs, by C(pid), C(command) and
      C(devices); C(pending) is the reboot reason).
    - C(problems) names a word given where the loaded module holds a number, which would keep it from loading.
  returned: when O(module_params) is given
  type: dict
  sample: {"loaded": true, "action": "reboot", "unknown": [], "services": [], "unload": ["nvidia_uvm", "nvidia"],
           "differ": [{"name": "NVreg_EnableStreamMemOPs", "wanted": "1", "running": "0",
                       "source": "/proc/driver/nvidia/params"}],
           "holders": [{"pid": 4242, "command": "python3", "devices": ["/dev/nvidia0", "/dev/nvidiactl"]}],
           "pending": "the loaded nvidia module runs with NVreg_EnableStreamMemOPs=0 (1 wanted), and processes hold
           the GPUs (4242 python3), so it is not reloaded: the options of /etc/modprobe.d/scv-gpu-nvidia.conf take
           effect at the next boot", "problems": [], "message": "..."}
nvml_missing:
  description:
    - The PCI GPUs that NVML did not answer for (by PCI address); empty when NVML sees every GPU the
      bus has. A card that fell off the driver, or a driver that failed to bind one, shows here. A GPU bound to
      C(vfio-pci) or C(pci-stub) (passed through to a VM) is not missing, as the host's NVML is not meant to see it.
  returned: when I(nvml=true)
  type: list
  elements: dict
  sample: []
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.scv.gpu.plugins.module_utils.host.driver import upstream_version
from ansible_collections.scv.gpu.plugins.module_utils.host.driver_state import (
    installed_version,
    loaded_kernel_modules,
    loaded_version,
    next_kernel,
    nouveau_loaded,
    nova_loaded,
    secure_boot,
)
from ansible_collections.scv.gpu.plugins.module_utils.host.module_params import check_options, options_state
from ansible_collections.scv.gpu.plugins.module_utils.host.pci import missing_from_nvml, pci_facts
from ansible_collections.scv.gpu.plugins.module_utils.nvml.probe import probe_library


def main():
    module = AnsibleModule(
        argument_spec=dict(
            package=dict(type="str"),
            sysfs=dict(type="path", default="/sys"),
            nvml=dict(type="bool", default=True),
            next_kernel=dict(type="bool", default=False),
            next_kernel_release=dict(type="str"),
            root=dict(type="path", default="/"),
            module_params=dict(type="dict"),
            module_params_file=dict(type="path", default="/etc/modprobe.d/scv-gpu-nvidia.conf"),
            procfs=dict(type="path", default="/proc"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    sysfs = params["sysfs"]
    package_version = installed_version(module, params["package"]) if params["package"] else None
    enabled, source = secure_boot(module, sysfs)
    result = dict(
        changed=False,
        loaded_version=loaded_version(sysfs),
        loaded_kernel_modules=loaded_kernel_modules(params["procfs"]),
        nouveau_loaded=nouveau_loaded(sysfs),
        nova_loaded=nova_loaded(sysfs),
        installed_package_version=package_version,
        installed_version=upstream_version(package_version),
        secure_boot=enabled,
        secure_boot_source=source,
    )
    pci, warnings = pci_facts(sysfs)
    result.update(pci)
    for warning in warnings:
        module.warn(warning)
    if params["next_kernel"]:
        result["next_kernel"] = next_kernel(module, params["root"], sysfs, params["next_kernel_release"],
                                            result["installed_version"])
    if params["module_params"] is not None:
        checked = check_options(params["module_params"])
        if checked["problems"]:
            module.fail_json(msg="%s. Nothing was read." % "; ".join(checked["problems"]))
        result["module_params"] = options_state(checked["options"], params["module_params_file"], sysfs,
                                                params["procfs"])
    if params["nvml"]:
        result["nvml"] = probe_library()
        result["nvml_missing"] = missing_from_nvml(result["pci_gpus"], result["nvml"]["bus_ids"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
