#!/usr/bin/python
# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather facts about every NVIDIA GPU of a host through NVML
version_added: 1.0.0
description:
  - Reads every NVIDIA GPU of the target host through NVML (the NVIDIA Management Library,
    through its Python binding nvidia-ml-py) and returns them as the C(nvidia_gpu) fact.
  - Each card carries the fields of the C(Scv) custom resource (C(core.run-linux.com/v1)) with
    the names and units SCV defines, so they can be published to Kubernetes unchanged, plus
    identity, health and telemetry fields that SCV lacks.
  - A host without the NVIDIA driver is not an error; the fact then says C(nvml_available=false)
    and why, and lists no cards.
  - The NVIDIA GPUs on the PCI bus are read from sysfs as well (C(pci_gpus)), with no driver needed, so
    a host whose driver is missing or broken still says that it has GPUs, and which.
  - A card that fails (lost from the bus, needing a reset, answering errors) is listed with its
    index as C(Unhealthy), with the reasons; every other card is still reported.
    A query that a card does not support leaves that field out.
author:
  - scv.gpu contributors (!UNKNOWN)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
requirements:
  - nvidia-ml-py (imported as C(pynvml)) on the target host
  - the NVIDIA driver's C(libnvidia-ml.so.1) on the target host, for any card to be reported
options:
  gather_subset:
    description:
      - Optional parts of the facts to read. The SCV fields, identity (UUID, PCI bus id,
        compute capability, family), persistence mode and everything health depends on
        (ECC, remapped rows, or retired pages on cards that do not remap rows, recovery action,
        clock event reasons) are always read.
      - C(telemetry) reads temperature, utilization, power draw, clocks, the memory temperature, and the
        encoder and decoder utilization.
      - C(counters) reads the total energy used since the driver loaded, the PCIe replay count, the NVLink
        traffic counter and, on a vGPU guest, the licence state. The energy costs about 4 ms per GPU on an
        H100, so leave C(counters) out where that matters.
      - C(fabric) reads each card's NVLinks and, on Hopper and later, its state in the NVLink fabric that
        NVIDIA Fabric Manager brings up on NVSwitch (HGX) boards. A card whose fabric is not completed is
        unhealthy, as CUDA programs cannot start on it.
      - C(mig) reads the MIG mode and, when MIG is enabled, the MIG devices.
      - C(processes) counts the compute processes running on each card.
      - V(all) selects every part, V(min) none; prefix a name with C(!) to leave it out,
        as in C(['!processes']). A list of exclusions only starts from V(all).
    type: list
    elements: str
    default: [all]
  sysfs:
    description: Where sysfs is mounted, for C(pci_gpus); tests point it at a prepared tree.
    type: path
    default: /sys
attributes:
  check_mode:
    support: full
    details: The module only reads; it behaves the same in check mode.
  diff_mode:
    support: none
    details: The module changes nothing, so it has nothing to show.
  facts:
    support: full
  platform:
    support: full
    platforms: linux
    details: NVML is loaded as libnvidia-ml.so.1, the NVIDIA driver's library on Linux.
notes:
  - The node totals C(cardNumber), C(totalMemorySum) and C(freeMemorySum) and every card field
    use SCV's names (camelCase) so the fact can be published as an C(Scv) status as it is.
    Fields about NVML itself (C(nvml_available), C(driver_version), ...) use Ansible's snake_case.
  - Memory is in MiB (bytes divided by 2^20, rounded down), clocks in MHz, power in W,
    C(bandwidth) in MB/s (PCIe per-lane rate at the maximum link generation times the maximum
    link width; PCIe gen5 and gen6 included).
seealso:
  - name: NVML API reference
    description: The NVIDIA Management Library calls this module makes.
    link: https://docs.nvidia.com/deploy/nvml-api/
"""

EXAMPLES = r"""
- name: Gather GPU facts
  scv.gpu.gpu_facts:

- name: Show each GPU's model and free memory
  ansible.builtin.debug:
    msg: "GPU {{ item.id }}: {{ item.model }}, {{ item.freeMemory }} of {{ item.totalMemory }} MiB free"
  loop: "{{ ansible_facts.nvidia_gpu.cardList }}"
  loop_control:
    label: "{{ item.id }}"

- name: Gather only what SCV publishes, plus identity and health (fastest)
  scv.gpu.gpu_facts:
    gather_subset:
      - min

- name: Gather everything but the per-card process count
  scv.gpu.gpu_facts:
    gather_subset:
      - "!processes"

- name: Stop when a GPU is unhealthy
  ansible.builtin.assert:
    that: ansible_facts.nvidia_gpu.cardList | selectattr('health', 'ne', 'Healthy') | list | length == 0
    fail_msg: >-
      Unhealthy GPUs on {{ inventory_hostname }}:
      {{ ansible_facts.nvidia_gpu.cardList | selectattr('health', 'ne', 'Healthy')
         | map(attribute='healthReasons') | list }}

- name: Register the facts instead of reading ansible_facts
  scv.gpu.gpu_facts:
  register: gpu

- name: Fail on hosts where the driver does not answer
  ansible.builtin.fail:
    msg: "NVML is not available: {{ gpu.ansible_facts.nvidia_gpu.nvml_error }}"
  when: not gpu.ansible_facts.nvidia_gpu.nvml_available
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: complex
  contains:
    nvidia_gpu:
      description: The host's NVIDIA GPUs and driver.
      returned: always
      type: complex
      contains:
        nvml_available:
          description: Whether NVML answered. False when the driver or its library is missing.
          returned: always
          type: bool
          sample: true
        nvml_error:
          description: Why NVML is not available, and what to do; null when it is.
          returned: always
          type: str
          sample: "libnvidia-ml.so.1 was not found: the NVIDIA driver is not installed (or its library is not in the loader's search path)"
        system_errors:
          description: The driver, NVML or CUDA version queries that failed, each with NVML's answer; their keys are
            left out of the facts, and the module warns about each.
          returned: when one of those queries failed
          type: dict
          sample: {"driver_version": "Unknown Error"}
        pci_gpus:
          description:
            - The NVIDIA GPUs on the PCI bus (vendor 0x10de, class VGA or 3D controller), from sysfs, whether
              or not a driver is bound. C(model) is the name NVML gives that device ID where the collection's
              table knows it, else null; C(driver) is the bound kernel driver (C(nvidia), C(nouveau),
              C(vfio-pci)), or null. C(class) is the PCI class (C(0x030000) a VGA controller, a GPU in
              graphics mode; C(0x030200) a 3D controller, in compute mode). C(vgpu) is true for an NVIDIA
              vGPU (its configuration space carries NVIDIA's vGPU capability).
            - NVSwitches and the GPUs' audio functions are not listed.
          returned: always
          type: list
          elements: dict
          sample: [{"busId": "0000:18:00.0", "deviceId": "0x2330", "class": "0x030200", "model": "NVIDIA H100 80GB HBM3",
                    "driver": "nvidia", "vgpu": false}]
        pci_virtual_functions:
          description:
            - SR-IOV virtual functions of NVIDIA GPUs (a C(physfn) link to their GPU), slices of a GPU given to
              VMs, not GPUs of this host, so they are not in C(pci_gpus) and count for no label. C(physfn) is
              the address of their GPU.
          returned: always
          type: list
          elements: dict
          sample: [{"busId": "0000:3b:00.4", "deviceId": "0x2330", "physfn": "0000:3b:00.0", "driver": "nvidia"}]
        pci_unreadable:
          description:
            - PCI functions that may be NVIDIA GPUs and cannot be read, with the reason. These are NVIDIA functions
              whose class cannot be read, and entries of C(/sys/bus/pci/devices) that are broken links (C(vendor)
              null). The module warns about each.
          returned: always
          type: list
          elements: dict
          sample: [{"busId": "0000:19:00.0", "vendor": "0x10de",
                    "problem": "cannot read /sys/bus/pci/devices/0000:19:00.0/class"}]
        pci_nvswitches:
          description: The NVSwitch chips of an HGX board on the PCI bus (vendor 0x10de, class 0680), as
            M(scv.gpu.nvidia_driver_info) returns them; the C(fabric) subset tells each GPU's place in their fabric.
          returned: always
          type: list
          elements: dict
          sample: [{"busId": "0000:05:00.0", "deviceId": "0x22a3", "generation": "LS10", "driver": "nvidia-nvswitch"}]
        driver_version:
          description: The NVIDIA driver's version.
          returned: when NVML is available
          type: str
          sample: "550.54.15"
        cuda_driver_version:
          description: The highest CUDA version the driver supports, C(major.minor).
          returned: when NVML is available
          type: str
          sample: "12.4"
        nvml_version:
          description: The NVML library's version.
          returned: when NVML is available
          type: str
          sample: "12.550.54.15"
        cardNumber:
          description: Number of GPUs (SCV field).
          returned: always
          type: int
          sample: 1
        totalMemorySum:
          description: Sum of the cards' total memory in MiB (SCV field).
          returned: always
          type: int
          sample: 12194
        freeMemorySum:
          description: Sum of the cards' free memory in MiB (SCV field).
          returned: always
          type: int
          sample: 11950
        cardList:
          description:
            - One entry per GPU, sorted by NVML index. A field the card cannot report is left out.
            - C(id), C(model), C(totalMemory), C(freeMemory), C(clock), C(core), C(power),
              C(bandwidth) and C(health) are SCV's fields with SCV's units.
          returned: always
          type: list
          elements: dict
          contains:
            id:
              description: NVML device index (SCV field).
              type: int
              sample: 0
            model:
              description: Product name (SCV field).
              type: str
              sample: TITAN Xp
            totalMemory:
              description: Total memory, MiB (SCV field).
              type: int
              sample: 12194
            freeMemory:
              description: Free memory, MiB (SCV field).
              type: int
              sample: 11950
            usedMemory:
              description:
                - Used memory, MiB, as nvidia-smi's C(Used) - without the driver's reserve, so that C(usedMemory)
                  + C(freeMemory) + C(reservedMemory) = C(totalMemory).
                - On a driver too old to report its reserve apart, the reserve is counted here.
              type: int
              sample: 0
            reservedMemory:
              description: Memory the driver reserves for itself, MiB (nvidia-smi's C(Reserved)).
              type: int
              sample: 480
            clock:
              description: Maximum memory clock, MHz (SCV field).
              type: int
              sample: 5705
            core:
              description: Maximum SM clock, MHz (SCV field).
              type: int
              sample: 1911
            power:
              description: Power management limit, W (SCV field). Not the current draw.
              type: int
              sample: 250
            bandwidth:
              description: PCIe bandwidth, MB/s, at the maximum link generation and width (SCV field).
              type: int
              sample: 15760
            pcieGeneration:
              description: Maximum PCIe link generation.
              type: int
              sample: 3
            pcieWidth:
              description: Maximum PCIe link width (lanes).
              type: int
              sample: 16
            health:
              description: C(Healthy) or C(Unhealthy) (SCV field).
              type: str
              sample: Healthy
            healthReasons:
              description: Why the card is Unhealthy; empty when it is Healthy.
              type: list
              elements: str
              sample: ["2 uncorrectable ECC errors since the driver loaded"]
            healthUnchecked:
              description:
                - Health checks that NVML refused for lack of permission (ECC, retired pages, remapped rows, the
                  recovery action, clock event reasons). The card is not known to pass them; run as root to check.
                - Absent when every check ran.
              type: list
              elements: str
              sample: ["ECC mode: no permission to read it (run as root to check it)"]
            uuid:
              description: The GPU's UUID.
              type: str
              sample: GPU-5a4f8c2e-7f0b-4e55-9c3a-1b2d3e4f5a6b
            pciBusId:
              description: PCI bus id, C(domain:bus:device.function).
              type: str
              sample: "00000000:01:00.0"
            computeCapability:
              description: CUDA compute capability, C(major.minor).
              type: str
              sample: "6.1"
            family:
              description: Architecture family as GPU feature discovery names it (C(nvidia.com/gpu.family)).
              type: str
              sample: pascal
            persistenceMode:
              description: Whether persistence mode is on.
              type: bool
              sample: false
            eccEnabled:
              description: Whether ECC is on.
              returned: when the card has ECC
              type: bool
              sample: true
            eccErrors:
              description: ECC error counts (volatile since the driver loaded, aggregate over the card's life).
              returned: when ECC is on
              type: dict
              sample: {"uncorrectedVolatile": 0, "uncorrectedAggregate": 0, "correctedVolatile": 3, "correctedAggregate": 12}
            retiredPagesPending:
              description: Whether memory pages wait for retirement (cards before Ampere).
              returned: when the card retires pages
              type: bool
              sample: false
            remappedRows:
              description: Row remapping state (Ampere and later).
              returned: when the card remaps rows
              type: dict
              sample: {"correctable": 0, "uncorrectable": 0, "pending": false, "failed": false}
            recoveryAction:
              description: The recovery action the driver asks for after a critical XID (0 for none).
              returned: when the driver reports it
              type: int
              sample: 0
            clockEventReasons: {description: "NVML's clock event reasons, a bit mask (0x1 idle, 0x4 power cap, 0x20 and 0x40
                thermal, ...).", returned: when the driver reports it, type: int, sample: 1}
            temperature:
              description: GPU temperature, degrees Celsius.
              returned: with the telemetry subset
              type: int
              sample: 38
            gpuUtilization:
              description: Percent of time a kernel ran over the last sample period.
              returned: with the telemetry subset
              type: int
              sample: 0
            memoryUtilization:
              description: Percent of time memory was read or written over the last sample period.
              returned: with the telemetry subset
              type: int
              sample: 0
            powerDraw:
              description: Current power draw, W.
              returned: with the telemetry subset
              type: int
              sample: 15
            smClock:
              description: Current SM clock, MHz.
              returned: with the telemetry subset, where the driver reports it
              type: int
              sample: 1980
            memClock:
              description: Current memory clock, MHz.
              returned: with the telemetry subset, where the driver reports it
              type: int
              sample: 2619
            memoryTemperature:
              description: Memory temperature, degrees C.
              returned: with the telemetry subset, where the card reports it (HBM cards)
              type: int
              sample: 43
            encoderUtilization:
              description: Percent of time the video encoder was busy over the last sample period.
              returned: with the telemetry subset, where the card reports it
              type: int
              sample: 0
            decoderUtilization:
              description: Percent of time the video decoder was busy over the last sample period.
              returned: with the telemetry subset, where the card reports it
              type: int
              sample: 0
            energyConsumption: {description: "Energy used since the driver was loaded, mJ.", returned: with the
                counters subset where the card reports it, type: int, sample: 2742790}
            pcieReplayCount: {description: "PCIe replays (retries) since the driver was loaded.", returned: with the
                counters subset where the card reports it, type: int, sample: 0}
            nvlinkBandwidthTotal: {description: "The NVLink traffic counter of all links (counter set 0).", returned: with
                the counters subset on cards with NVLink, type: int, sample: 0}
            powerCapThrottling: {description: "Time the power cap held the clocks down since the driver was loaded, ns
                (nvidia-smi's clocks event reasons counter C(SW Power Capping), in us).", returned: with the counters
                subset where the card reports it, type: int, sample: 0}
            virtualizationMode:
              description: NVML's virtualization mode (0 none, 1 passthrough, 2 vGPU guest, 3 vGPU host).
              returned: with the counters subset
              type: int
              sample: 1
            vgpuLicenseStatus:
              description: On a vGPU guest, 1 when the vGPU licence is held, else 0.
              returned: with the counters subset, on vGPU guests
              type: int
              sample: 1
            fabric:
              description:
                - The card's place in the NVLink fabric, as NVML reports it - C(state) (C(not started), C(in progress)
                  or C(completed)), C(status) (once completed, C(Success) or NVML's error), C(cliqueId), C(clusterUuid)
                  (all zeros on a single HGX board) and, where the driver reports it, C(healthSummary) (C(healthy),
                  C(unhealthy) or C(limited capacity)).
              returned: with the fabric subset, on Hopper and later cards in an NVLink fabric
              type: dict
              sample: {"state": "completed", "status": "Success", "cliqueId": 0,
                       "clusterUuid": "00000000-0000-0000-0000-000000000000", "healthSummary": "healthy"}
            nvlink:
              description:
                - The card's NVLinks - C(links) (how many it has), C(activeLinks), C(switchLinks) (active links whose
                  far end is an NVSwitch), C(speedMBps) (per link, where reported) and C(version) (such as C(4.0)).
              returned: with the fabric subset, on cards with NVLink
              type: dict
              sample: {"links": 18, "activeLinks": 18, "switchLinks": 18, "speedMBps": 26562, "version": "4.0"}
            migEnabled:
              description: Whether MIG mode is on.
              returned: with the mig subset, on MIG-capable cards
              type: bool
              sample: true
            migPendingEnabled:
              description: The MIG mode that applies after the next GPU reset.
              returned: with the mig subset, on MIG-capable cards
              type: bool
              sample: true
            migDevices:
              description:
                - The MIG devices, with C(index), C(uuid), C(model), C(gpuInstanceId), C(computeInstanceId),
                  C(totalMemory) and C(freeMemory) (MiB), C(profile) (from the name, such as C(1g.10gb) or
                  C(1c.3g.20gb)) and C(attributes), the device's share of the GPU - C(memory) (MiB),
                  C(multiprocessors), C(gpuInstanceSlices), C(computeInstanceSlices), C(copyEngines),
                  C(decoders), C(encoders), C(jpegEngines), C(ofaEngines).
              returned: with the mig subset, when MIG is on
              type: list
              elements: dict
              sample: [{"index": 0, "uuid": "MIG-1b9c8d2e-0f3a-5b4c-8d7e-6f5a4b3c2d1e", "model": "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
                        "gpuInstanceId": 1, "computeInstanceId": 0, "totalMemory": 19968, "freeMemory": 19955, "profile": "3g.20gb",
                        "attributes": {"memory": 19968, "multiprocessors": 42, "gpuInstanceSlices": 3, "computeInstanceSlices": 3,
                        "copyEngines": 3, "decoders": 2, "encoders": 0, "jpegEngines": 0, "ofaEngines": 0}}]
            processCount:
              description: Number of compute processes running on the card.
              returned: with the processes subset
              type: int
              sample: 2
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.scv.gpu.plugins.module_utils.common.gpu_info import parse_gather_subset
from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import HAS_PYNVML, PYNVML_IMPORT_ERROR
from ansible_collections.scv.gpu.plugins.module_utils.nvml.collect import collect
from ansible_collections.scv.gpu.plugins.module_utils.host.pci import pci_facts


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gather_subset=dict(type="list", elements="str", default=["all"]),
            sysfs=dict(type="path", default="/sys"),
        ),
        supports_check_mode=True,
    )
    subsets, unknown = parse_gather_subset(module.params["gather_subset"])
    if unknown:
        module.fail_json(
            msg="gather_subset: unknown value(s) %s; use all, min, telemetry, counters, fabric, mig or processes, "
                "each optionally prefixed with '!'" % ", ".join(unknown)
        )
    if not HAS_PYNVML:
        module.fail_json(msg=missing_required_lib("nvidia-ml-py"), exception=PYNVML_IMPORT_ERROR)

    fact = collect(subsets)
    for key, reason in sorted((fact.get("system_errors") or {}).items()):
        module.warn("%s could not be read, so it is left out of the facts: NVML answered %s" % (key, reason))
    pci, warnings = pci_facts(module.params["sysfs"])
    fact.update(pci)
    for warning in warnings:
        module.warn(warning)
    module.exit_json(changed=False, ansible_facts={"nvidia_gpu": fact})


if __name__ == "__main__":
    main()
