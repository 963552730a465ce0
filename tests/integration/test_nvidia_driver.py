"""The nvidia_driver role against the real kube-apiserver, and nvidia_driver_info on this host.

The host method runs in molecule (extensions/molecule/nvidia_driver_*). Here: the daemonset
method's manifest, accepted (or dry-run) by the real API server; the argument spec; and the info
module reading a prepared sysfs tree, Secure Boot's EFI variable, and NVML (the simulator)
through ctypes. The cordon, drain and uncordon run in test_driver_rollout.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from harness.ansible import recap
from harness.control_plane import read_object
from harness.kernel_modules import compile_module
from harness.pci_sysfs import add_function as add_pci_function

DAEMONSET_PLAY = """
- hosts: localhost
  gather_facts: false
  roles:
    - role: scv.gpu.nvidia_driver
"""

TASKS_PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Run the role's {tasks} tasks
      ansible.builtin.include_role:
        name: scv.gpu.nvidia_driver
        tasks_from: {tasks}
"""

INSTALLER = "registry.example.com/gke/nvidia-driver-installer:ubuntu-580"


def daemonset_vars(plane, name, **extra):
    settings = {
        "nvidia_driver_method": "daemonset",
        "nvidia_driver_kubeconfig": str(plane.admin_kubeconfig),
        "nvidia_driver_daemonset_name": name,
        "nvidia_driver_installer_image": INSTALLER,
        "nvidia_driver_daemonset_version": "580.95.05",
    }
    settings.update(extra)
    return json.dumps(settings)


@pytest.mark.every_ansible_line
def test_daemonset_check_mode_creates_nothing_then_apply_then_no_change(ansible, control_plane, tmp_path):
    plane = control_plane
    name = "driver-installer-%s" % ansible.venv.name.strip(".")
    plane.kubectl("delete", "daemonset", "-n", "kube-system", name, "--ignore-not-found")
    play = tmp_path / "daemonset.yml"
    play.write_text(DAEMONSET_PLAY)

    check = ansible.playbook(play, None, "-e", daemonset_vars(plane, name), "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert recap(check.stdout)["changed"] == 1
    assert read_object(plane, "daemonset", name, namespace="kube-system", missing_ok=True) is None

    first = ansible.playbook(play, None, "-e", daemonset_vars(plane, name))
    assert first.returncode == 0, first.stdout + first.stderr
    assert recap(first.stdout)["changed"] == 1
    spec = read_object(plane, "daemonset", name, namespace="kube-system")["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["hostPID"] is True
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "gpu/nvidia", "operator": "Exists"}]}]
    assert spec["tolerations"] == [{"operator": "Exists"}]
    installer = spec["initContainers"][0]
    assert installer["image"] == INSTALLER
    assert installer["securityContext"] == {"privileged": True}
    assert {e["name"]: e["value"] for e in installer["env"]} == {
        "NVIDIA_DRIVER_VERSION": "580.95.05",
        "NVIDIA_INSTALL_DIR_HOST": "/home/kubernetes/bin/nvidia",
        "NVIDIA_INSTALL_DIR_CONTAINER": "/usr/local/nvidia",
        "ROOT_MOUNT_DIR": "/root",
    }
    assert {m["name"]: m["mountPath"] for m in installer["volumeMounts"]} == {
        "nvidia-install-dir-host": "/usr/local/nvidia", "dev": "/dev", "root-mount": "/root"}
    assert {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]} == {
        "dev": "/dev", "nvidia-install-dir-host": "/home/kubernetes/bin/nvidia", "root-mount": "/"}
    assert [c["name"] for c in spec["containers"]] == ["pause"]

    second = ansible.playbook(play, None, "-e", daemonset_vars(plane, name))
    assert second.returncode == 0, second.stdout + second.stderr
    assert recap(second.stdout)["changed"] == 0

    changed = ansible.playbook(play, None, "-e", daemonset_vars(plane, name, nvidia_driver_daemonset_version="580.105.08"))
    assert recap(changed.stdout)["changed"] == 1
    installer = read_object(plane, "daemonset", name, namespace="kube-system")["spec"]["template"]["spec"]["initContainers"][0]
    assert {"name": "NVIDIA_DRIVER_VERSION", "value": "580.105.08"} in installer["env"]


def test_daemonset_selects_the_labelled_nodes_only(ansible, control_plane, tmp_path):
    """The affinity is 'key Exists': the same nodes as the label selector on that key."""
    plane = control_plane
    for node, labels in (("ds-gpu-node", {"gpu/nvidia": "TITAN-Xp"}), ("ds-cpu-node", {})):
        plane.kubectl("apply", "-f", "-", input_text=json.dumps(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": labels}}))
    name = "driver-installer-select-%s" % ansible.venv.name.strip(".")
    play = tmp_path / "daemonset.yml"
    play.write_text(DAEMONSET_PLAY)
    done = ansible.playbook(play, None, "-e", daemonset_vars(plane, name))
    assert done.returncode == 0, done.stdout + done.stderr
    spec = read_object(plane, "daemonset", name, namespace="kube-system")["spec"]["template"]["spec"]
    (expression,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"]
    assert expression["operator"] == "Exists"
    selected = plane.kubectl("get", "nodes", "-l", expression["key"], "-o", "name").stdout.split()
    assert "node/ds-gpu-node" in selected and "node/ds-cpu-node" not in selected


def test_daemonset_without_an_installer_image_says_what_to_set(ansible, control_plane, tmp_path):
    play = tmp_path / "daemonset.yml"
    play.write_text(DAEMONSET_PLAY)
    done = ansible.playbook(play, None, "-e", daemonset_vars(control_plane, "no-image", nvidia_driver_installer_image=""))
    assert done.returncode != 0
    assert "nvidia_driver_installer_image is empty" in done.stdout
    assert read_object(control_plane, "daemonset", "no-image", namespace="kube-system", missing_ok=True) is None


@pytest.mark.every_ansible_line
def test_bad_variables_are_rejected_before_any_task(ansible, tmp_path):
    play = tmp_path / "daemonset.yml"
    play.write_text(DAEMONSET_PLAY)
    done = ansible.playbook(play, None, "-e", json.dumps({"nvidia_driver_method": "operator",
                                                          "nvidia_driver_reboot": "sometimes"}))
    assert done.returncode != 0
    assert "Validating arguments against arg spec" in done.stdout
    assert "nvidia_driver_method" in done.stdout and "nvidia_driver_reboot" in done.stdout
    assert recap(done.stdout)["ok"] == 0


@pytest.fixture
def sysfs(tmp_path):
    root = tmp_path / "sys"
    (root / "module" / "nvidia").mkdir(parents=True)
    (root / "module" / "nvidia" / "version").write_text("535.183.01\n")
    (root / "module" / "nouveau").mkdir()
    return root


@pytest.mark.every_ansible_line
def test_info_reads_sysfs_and_nvml(ansible, sysfs):
    ok, result = ansible.module({"sysfs": str(sysfs), "package": "scv-gpu-no-such-package"}, scenario="titan_xp",
                                name="scv.gpu.nvidia_driver_info")
    assert ok, ansible.last_output
    assert result["changed"] is False
    assert result["loaded_version"] == "535.183.01"
    assert result["nouveau_loaded"] is True
    assert result["installed_version"] is None and result["installed_package_version"] is None
    assert result["nvml"] == {"loads": True, "driver_version": "535.183.01", "gpu_count": 1,
                              "bus_ids": ["00000000:01:00.0"], "error": None}
    assert result["pci_gpus"] == [] and result["nvml_missing"] == []


def test_info_names_the_gpu_that_nvml_does_not_see(ansible, sysfs):
    """Two GPUs on the bus, one answering NVML: the one that fell off the driver is named."""
    add_pci_function(sysfs, "0000:01:00.0", 0x10DE, 0x1B02, 0x030000, "nvidia")
    add_pci_function(sysfs, "0000:02:00.0", 0x10DE, 0x1B02, 0x030000)
    ok, result = ansible.module({"sysfs": str(sysfs)}, scenario="titan_xp", name="scv.gpu.nvidia_driver_info")
    assert ok, ansible.last_output
    assert [gpu["busId"] for gpu in result["pci_gpus"]] == ["0000:01:00.0", "0000:02:00.0"]
    assert result["nvml"]["gpu_count"] == 1
    assert result["nvml_missing"] == [{"busId": "0000:02:00.0", "deviceId": "0x1b02", "class": "0x030000",
                                       "model": "TITAN Xp", "driver": None, "vgpu": False}]


def test_info_lists_the_nvswitches_of_an_hgx_board(ansible, sysfs):
    """An HGX H100 board's four NVSwitch chips, from a scenario's nvswitches key, listed apart from the GPUs."""
    from harness import pci_sysfs
    pci_sysfs.build({"devices": [{"pciBusId": "00000000:18:00.0", "pciDeviceId": 0x233010DE}],
                     "nvswitches": [{"pciBusId": "00000000:%02X:00.0" % bus, "pciDeviceId": 0x22A310DE}
                                    for bus in (0x05, 0x06, 0x07, 0x08)]}, str(sysfs))
    ok, result = ansible.module({"sysfs": str(sysfs), "nvml": False}, name="scv.gpu.nvidia_driver_info")
    assert ok, ansible.last_output
    assert [gpu["busId"] for gpu in result["pci_gpus"]] == ["0000:18:00.0"]
    assert result["pci_nvswitches"] == [{"busId": "0000:%02x:00.0" % bus, "deviceId": "0x22a3", "generation": "LS10",
                                         "driver": "nvidia-nvswitch"} for bus in (0x05, 0x06, 0x07, 0x08)]


def test_info_without_the_library_or_driver(ansible, sysfs):
    (sysfs / "module" / "nvidia" / "version").unlink()
    ok, result = ansible.module({"sysfs": str(sysfs)}, simulator=False, name="scv.gpu.nvidia_driver_info")
    assert ok, ansible.last_output
    assert result["loaded_version"] is None
    assert result["nvml"]["loads"] is False
    assert result["nvml"]["error"].startswith("libnvidia-ml.so.1 was not found")

    ok, result = ansible.module({"sysfs": str(sysfs)}, scenario="driver_not_loaded", name="scv.gpu.nvidia_driver_info")
    assert ok and result["nvml"]["loads"] is False
    assert result["nvml"]["error"].startswith("the NVIDIA kernel driver is not loaded")


def test_info_reads_the_installed_package(ansible, sysfs):
    ok, result = ansible.module({"sysfs": str(sysfs), "package": "dpkg", "nvml": False}, name="scv.gpu.nvidia_driver_info")
    assert ok, ansible.last_output
    assert result["installed_package_version"]  # dpkg is installed on every Debian host
    assert "nvml" not in result


@pytest.mark.parametrize("value, enabled", [(1, True), (0, False)])
def test_info_reads_secure_boot_from_efivars(ansible, sysfs, value, enabled):
    efivars = sysfs / "firmware" / "efi" / "efivars"
    efivars.mkdir(parents=True)
    (efivars / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c").write_bytes(b"\x06\x00\x00\x00" + bytes([value]))
    ok, result = ansible.module({"sysfs": str(sysfs), "nvml": False}, name="scv.gpu.nvidia_driver_info")
    assert ok, ansible.last_output
    assert (result["secure_boot"], result["secure_boot_source"]) == (enabled, "efivars")


def test_info_without_efi(ansible, sysfs):
    ok, result = ansible.module({"sysfs": str(sysfs), "nvml": False}, name="scv.gpu.nvidia_driver_info")
    assert ok and (result["secure_boot"], result["secure_boot_source"]) == (False, "no EFI")


def test_info_next_kernel_follows_grub_reboot_and_checks_the_modules_vermagic(ansible, sysfs, tmp_path):
    """grub-reboot's next_entry picks 6.1.0-18 (not the newest kernel); its one module was built for
    another kernel, which modprobe refuses, so the reboot is refused and the message says why."""
    fixtures = Path(__file__).parents[1] / "fixtures" / "grub"
    root = tmp_path / "host"
    (root / "boot" / "grub").mkdir(parents=True)
    for release in ("6.1.0-9-amd64", "6.1.0-18-amd64", "6.1.0-27-amd64"):
        (root / "boot" / ("vmlinuz-%s" % release)).write_text("kernel")
    shutil.copy(fixtures / "grub-saved.cfg", root / "boot" / "grub" / "grub.cfg")
    shutil.copy(fixtures / "grubenv-next-18", root / "boot" / "grub" / "grubenv")
    dkms = root / "lib" / "modules" / "6.1.0-18-amd64" / "updates" / "dkms"
    dkms.mkdir(parents=True)
    module = compile_module(dkms / "nvidia-current.ko", "535.183.01", release="6.1.0-27-amd64")
    ok, result = ansible.module({"sysfs": str(sysfs), "nvml": False, "next_kernel": True, "root": str(root)},
                                name="scv.gpu.nvidia_driver_info")
    assert ok, ansible.last_output
    found = result["next_kernel"]
    assert (found["kernel"], found["ok"]) == ("6.1.0-18-amd64", False)
    assert found["how"] == ("next_entry in /boot/grub/grubenv (grub-reboot), the entry "
                            "'Debian GNU/Linux, with Linux 6.1.0-18-amd64'")
    assert found["modules"] == [{"path": str(module), "version": "535.183.01",
                                 "vermagic": "6.1.0-27-amd64 SMP preempt mod_unload modversions ",
                                 "problem": "it was built for the kernel 6.1.0-27-amd64 (vermagic), and modprobe "
                                            "refuses it on 6.1.0-18-amd64"}]
    assert "has no nvidia module that modprobe would load" in found["message"]

    compile_module(module, "535.183.01", release="6.1.0-18-amd64")
    ok, result = ansible.module({"sysfs": str(sysfs), "nvml": False, "next_kernel": True, "root": str(root)},
                                name="scv.gpu.nvidia_driver_info")
    assert ok and result["next_kernel"]["ok"] is True, result["next_kernel"]


def plan_on(ansible, tmp_path, sysfs, **settings):
    """The role's plan.yml on this host, reading the prepared sysfs tree: it changes nothing."""
    play = tmp_path / "plan.yml"
    play.write_text(TASKS_PLAY.format(tasks="plan"))
    settings.setdefault("nvidia_driver_sysfs", str(sysfs))
    return ansible.playbook(play, None, "-e", json.dumps(settings))


def hgx_h100(sysfs):
    from harness import pci_sysfs
    pci_sysfs.build({"devices": [{"pciBusId": "00000000:18:00.0", "pciDeviceId": 0x233010DE}],
                     "nvswitches": [{"pciBusId": "00000000:%02X:00.0" % bus, "pciDeviceId": 0x22A310DE}
                                    for bus in (0x05, 0x06, 0x07, 0x08)]}, str(sysfs))


@pytest.mark.every_ansible_line
def test_fabric_manager_goes_with_the_pinned_driver_where_the_bus_has_nvswitches(ansible, tmp_path, sysfs):
    hgx_h100(sysfs)
    done = plan_on(ansible, tmp_path, sysfs, nvidia_driver_version="535.247.01-1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Fabric Manager: installed with the driver (the PCI bus has 4 NVSwitch chip(s) (LS10))" in done.stdout
    assert recap(done.stdout)["changed"] == 0


def test_no_nvswitch_no_fabric_manager(ansible, tmp_path, sysfs):
    done = plan_on(ansible, tmp_path, sysfs, nvidia_driver_version="535.247.01-1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Fabric Manager: not managed (no NVSwitch on the PCI bus)" in done.stdout


def test_a_fabric_manager_version_other_than_the_driver_s_is_refused_before_anything_changes(ansible, tmp_path, sysfs):
    hgx_h100(sysfs)
    done = plan_on(ansible, tmp_path, sysfs, nvidia_driver_version="535.247.01-1",
                   nvidia_driver_fabric_manager_version="535.216.01-1", nvidia_driver_fabric_manager=True)
    assert done.returncode != 0
    assert ("nvidia_driver_fabric_manager_version 535.216.01-1 is not the driver version 535.247.01 of "
            "nvidia_driver_version 535.247.01-1") in done.stdout
    assert "Nothing has been changed." in done.stdout
    assert recap(done.stdout)["changed"] == 0


def test_an_hgx_b200_is_refused_with_what_to_install(ansible, tmp_path, sysfs):
    add_pci_function(sysfs, "0000:18:00.0", 0x10DE, 0x2901, 0x030200, "nvidia")
    done = plan_on(ansible, tmp_path, sysfs)
    assert done.returncode != 0
    assert "this host's GPUs (NVIDIA B200) sit on an HGX board with fourth-generation NVSwitches" in done.stdout
    assert "set nvidia_driver_fabric_manager: false" in done.stdout


def test_an_unknown_fabric_manager_setting_is_refused(ansible, tmp_path, sysfs):
    done = plan_on(ansible, tmp_path, sysfs, nvidia_driver_fabric_manager="sometimes")
    assert done.returncode != 0
    assert "nvidia_driver_fabric_manager" in done.stdout and "auto, true, false" in done.stdout


OFFERED_PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Plan the install
      ansible.builtin.include_role:
        name: scv.gpu.nvidia_driver
        tasks_from: plan
    - name: Ask the sources for Fabric Manager at the driver's version
      ansible.builtin.include_role:
        name: scv.gpu.nvidia_driver
        tasks_from: fabric-manager-offered-apt
      vars:
        apt_source_ready: true
"""

# A stand-in apt-cache: the sources offer the driver at 535.261.03-1 (the candidate) and 535.247.01-1,
# and Fabric Manager at the versions in $SCV_TEST_FABRIC_MANAGER.
APT_CACHE = """#!/bin/sh
case "$1" in
  policy) printf '%s:\\n  Installed: (none)\\n  Candidate: 535.261.03-1\\n  Version table:\\n' "$2"
          printf '     535.261.03-1 500\\n        500 http://mirror.example bookworm/non-free amd64 Packages\\n'
          printf '     535.247.01-1 500\\n        500 http://mirror.example bookworm/non-free amd64 Packages\\n' ;;
  madison) for version in $SCV_TEST_FABRIC_MANAGER; do
             printf ' %s | %s | http://mirror.example bookworm/non-free amd64 Packages\\n' "$2" "$version"
           done ;;
  *) exit 100 ;;
esac
"""


def offered_on(ansible, tmp_path, sysfs, monkeypatch, fabric_manager_offered, *extra, **settings):
    """plan.yml, then the check that the sources offer Fabric Manager, against a stand-in apt-cache."""
    hgx_h100(sysfs)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-cache").write_text(APT_CACHE)
    (bin_dir / "apt-cache").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    monkeypatch.setenv("SCV_TEST_FABRIC_MANAGER", " ".join(fabric_manager_offered))
    play = tmp_path / "offered.yml"
    play.write_text(OFFERED_PLAY)
    settings.setdefault("nvidia_driver_sysfs", str(sysfs))
    return ansible.playbook(play, None, "-e", json.dumps(settings), *extra)


@pytest.mark.parametrize("check", [[], ["--check"]])
def test_an_unpinned_driver_whose_fabric_manager_the_sources_lack_is_refused_before_anything_changes(
        ansible, tmp_path, sysfs, monkeypatch, check):
    done = offered_on(ansible, tmp_path, sysfs, monkeypatch, ["535.247.01-1"], *check)
    assert done.returncode != 0, done.stdout
    assert ("nvidia_driver_version is empty, so apt would install the branch's newest driver, nvidia-driver "
            "535.261.03-1, but this host's apt sources offer nvidia-fabricmanager-535 only at 535.247.01-1, not "
            "nvidia-fabricmanager-535 535.261.03") in done.stdout
    assert "Set nvidia_driver_version to a driver version the sources offer Fabric Manager at too (535.247.01-1)" in done.stdout
    assert "No package has been changed." in done.stdout
    assert recap(done.stdout)["changed"] == 0


def test_an_unpinned_driver_whose_fabric_manager_the_sources_offer_goes_ahead(ansible, tmp_path, sysfs, monkeypatch):
    done = offered_on(ansible, tmp_path, sysfs, monkeypatch, ["535.261.03-1", "535.247.01-1"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Check that the sources offer Fabric Manager at the driver's version" in done.stdout
    assert recap(done.stdout)["failed"] == 0


def test_a_pinned_driver_s_fabric_manager_is_still_asked_by_its_own_version(ansible, tmp_path, sysfs, monkeypatch):
    done = offered_on(ansible, tmp_path, sysfs, monkeypatch, ["535.261.03-1"], nvidia_driver_version="535.247.01-1")
    assert done.returncode != 0, done.stdout
    assert "nvidia-fabricmanager-535 535.247.01-* is not in this host's apt sources (they offer 535.261.03-1)" in done.stdout


@pytest.mark.parametrize("device, flavour, why", [
    (0x2BB5, "open", "auto: every GPU is Turing or newer (Blackwell)"),
    (0x1B02, "proprietary", "auto: a GPU older than Turing (Pascal) runs with the proprietary modules only"),
])
def test_the_default_kernel_modules_follow_the_gpus_on_the_bus(ansible, tmp_path, sysfs, device, flavour, why):
    """A default run's plan on a node with an RTX PRO 6000 Blackwell Server Edition, and on one with a TITAN Xp."""
    add_pci_function(sysfs, "0000:18:00.0", 0x10DE, device, 0x030200)
    done = plan_on(ansible, tmp_path, sysfs)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Kernel modules: %s (%s)" % (flavour, why) in done.stdout
    assert recap(done.stdout)["changed"] == 0


@pytest.mark.parametrize("devices, settings, said", [
    ((0x2BB5, 0x1B02), {}, "this host mixes GPUs that need different kernel modules"),
    ((0x2BB5,), {"nvidia_driver_kernel_modules": "proprietary"},
     "nvidia_driver_kernel_modules is proprietary, and GPU 0000:18:00.0"),
    ((0x1B02,), {"nvidia_driver_version": "590.44.01-1"}, "driver branch 590 no longer supports GPU 0000:18:00.0"),
], ids=["mixed", "forced-proprietary-on-blackwell", "past-580-on-pascal"])
def test_kernel_modules_the_gpus_cannot_run_are_refused_before_anything_changes(
        ansible, tmp_path, sysfs, devices, settings, said):
    for number, device in enumerate(devices):
        add_pci_function(sysfs, "0000:%02x:00.0" % (0x18 + number), 0x10DE, device, 0x030200)
    done = plan_on(ansible, tmp_path, sysfs, **settings)
    assert done.returncode != 0, done.stdout
    assert said in done.stdout and "Nothing has been changed." in done.stdout, done.stdout
    assert recap(done.stdout)["changed"] == 0


def test_info_names_the_nova_modules_loaded_and_the_reboot_they_need(ansible, sysfs):
    """Ubuntu 26.04's kernel loads nova_core for a Turing or newer GPU before NVIDIA's driver is installed."""
    for name in ("nova_core", "nova_drm"):
        (sysfs / "module" / name).mkdir()
    ok, result = ansible.module({"sysfs": str(sysfs), "nvml": False}, name="scv.gpu.nvidia_driver_info")
    assert ok, ansible.last_output
    assert result["nova_loaded"] == ["nova_core", "nova_drm"]
    play = sysfs.parent / "reboot.yml"
    state = dict(result, installed_version="580.95.05", loaded_version=None, nouveau_loaded=False)
    play.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [{"ansible.builtin.debug": {
        "msg": "{{ state | scv.gpu.nvidia_driver_reboot('auto', 'ssh') }}"}}]}]))
    done = ansible.playbook(play, None, "-e", json.dumps({"state": state}))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nova_core, nova_drm is loaded and binds the GPUs before NVIDIA's module can" in done.stdout
    assert "'reboot': True" in done.stdout or '"reboot": true' in done.stdout, done.stdout


def test_info_tells_the_loaded_flavour_and_a_change_of_flavour_asks_a_reboot(ansible, sysfs, tmp_path):
    """A host moved from the proprietary modules to the open ones at the same version (535.183.01): the loaded
    module still is the proprietary one until it is reloaded or the host rebooted."""
    procfs = tmp_path / "proc"
    (procfs / "driver" / "nvidia").mkdir(parents=True)
    (procfs / "driver" / "nvidia" / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    (sysfs / "module" / "nouveau").rmdir()
    ok, result = ansible.module({"sysfs": str(sysfs), "procfs": str(procfs), "nvml": False},
                                name="scv.gpu.nvidia_driver_info")
    assert ok, ansible.last_output
    assert result["loaded_kernel_modules"] == "proprietary" and result["loaded_version"] == "535.183.01"
    play = sysfs.parent / "reboot.yml"
    state = dict(result, installed_version="535.183.01")
    play.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [{"ansible.builtin.debug": {
        "msg": "{{ state | scv.gpu.nvidia_driver_reboot('auto', 'ssh', kernel_modules=flavour) }}"}}]}]))
    for flavour, reboot in (("open", True), ("proprietary", False)):
        done = ansible.playbook(play, None, "-e", json.dumps({"state": state, "flavour": flavour}))
        assert done.returncode == 0, done.stdout + done.stderr
        said = "the running kernel has the proprietary nvidia module loaded, and the open one is installed"
        assert (said in done.stdout) is reboot, done.stdout
        assert ("'reboot': %s" % reboot in done.stdout) or ('"reboot": %s' % str(reboot).lower() in done.stdout)
