"""The nvidia_driver role's choices: packages, pins, streams, Secure Boot and the reboot rule."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.scv.gpu.plugins.filter.nvidia_driver_plan import nvidia_driver_plan
from ansible_collections.scv.gpu.plugins.module_utils.host.driver import (
    DEFAULT_BRANCH,
    PlanError,
    kernel_flavour,
    plan,
    reboot_decision,
    reboot_reasons,
    same_version,
    upstream_version,
    version_key,
    version_problem,
)

DEBIAN = dict(os_family="Debian", distribution="Debian", major_version="12", kernel="6.1.0-28-amd64")
UBUNTU = dict(os_family="Debian", distribution="Ubuntu", major_version="24", kernel="6.8.0-45-generic")
RHEL9 = dict(os_family="RedHat", distribution="RedHat", major_version="9", kernel="5.14.0-427.13.1.el9_4.x86_64")
ROCKY8 = dict(os_family="RedHat", distribution="Rocky", major_version="8", kernel="4.18.0-553.el8_10.x86_64")


@pytest.mark.parametrize("version, upstream", [
    ("535.247.01-1~deb12u1", "535.247.01"),
    ("1:580.95.05-0ubuntu1", "580.95.05"),
    ("580.95.05-1.el9", "580.95.05"),
    ("470.256.02", "470.256.02"),
    ("", None),
    (None, None),
    ("latest", None),
])
def test_upstream_version(version, upstream):
    assert upstream_version(version) == upstream


def test_versions_compare_as_numbers_not_strings():
    as_strings = sorted(["535.54.03", "535.104.05"])
    assert as_strings == ["535.104.05", "535.54.03"]  # string order puts 535.104 first, which is wrong
    assert version_key("535.54.03") < version_key("535.104.05")
    assert version_key("10.0") > version_key("8.9")
    assert sorted(["550.54.14", "535.104.05", "580.95.05", "535.54.03"], key=version_key) == [
        "535.54.03", "535.104.05", "550.54.14", "580.95.05"]
    with pytest.raises(ValueError):
        version_key("branch")


def test_same_version_ignores_packaging_and_trailing_zeros():
    assert same_version("535.247.01", "535.247.01-1~deb12u1")
    assert same_version("580.95", "580.95.0")
    assert not same_version("535.216.01", "535.247.01-1")
    assert not same_version("535.216.01", "the newest driver")


def test_kernel_flavour():
    assert kernel_flavour("6.8.0-45-generic") == "generic"
    assert kernel_flavour("5.15.0-1060-aws") == "aws"
    assert kernel_flavour("6.1.0-28-amd64") == "amd64"
    assert kernel_flavour("weird") is None


def test_debian_latest():
    got = plan(**DEBIAN, branch="", kernel_modules="proprietary")
    assert got["manager"] == "apt"
    assert got["packages"] == ["nvidia-driver", "nvidia-kernel-dkms", "firmware-nvidia-gsp",
                               "linux-headers-6.1.0-28-amd64"]
    assert got["hold"] == [] and got["apt_pin"] is None and got["dnf_module"] is None
    assert got["initramfs_command"] == ["update-initramfs", "-u", "-k", "all"]


def test_debian_pinned_open_modules():
    got = plan(**DEBIAN, branch="", version="535.247.01-1~deb12u1", kernel_modules="open")
    assert got["packages"] == ["nvidia-driver=535.247.01-1~deb12u1", "nvidia-open-kernel-dkms=535.247.01-1~deb12u1",
                               "firmware-nvidia-gsp=535.247.01-1~deb12u1", "linux-headers-6.1.0-28-amd64"]
    assert got["hold"] == ["nvidia-driver", "nvidia-open-kernel-dkms"]
    # Debian builds the open modules from a source of their own (nvidia-open-gpu-kernel-modules, in contrib)
    assert got["apt_pin"] == {"sources": ["nvidia-graphics-drivers", "nvidia-open-gpu-kernel-modules"],
                              "version": "535.247.01-1~deb12u1"}
    proprietary = plan(**DEBIAN, branch="", version="535.247.01-1~deb12u1", kernel_modules="proprietary")
    assert proprietary["apt_pin"]["sources"] == ["nvidia-graphics-drivers"]
    # a change of flavour removes the other module package in the install's own transaction
    assert got["replaces"] == ["nvidia-kernel-dkms"] and proprietary["replaces"] == ["nvidia-open-kernel-dkms"]


def test_debian_refuses_a_branch():
    with pytest.raises(PlanError, match="Debian ships one driver branch"):
        plan(**DEBIAN, branch="580")


def test_ubuntu_server_open_with_signed_modules():
    got = plan(**UBUNTU, branch="580", kernel_modules="open", secure_boot=True)
    assert got["packages"] == ["nvidia-driver-580-server-open",
                               "linux-modules-nvidia-580-server-open-6.8.0-45-generic",
                               "linux-modules-nvidia-580-server-open-generic",
                               "linux-headers-6.8.0-45-generic"]
    assert got["signed_modules"] is True


def test_ubuntu_desktop_pinned():
    got = plan(**UBUNTU, branch="550", version="550.120-0ubuntu1", ubuntu_server=False, kernel_modules="proprietary")
    assert got["packages"][0] == "nvidia-driver-550=550.120-0ubuntu1"
    assert got["hold"] == ["nvidia-driver-550"]
    assert got["apt_pin"] == {"sources": ["nvidia-graphics-drivers-550"], "version": "550.120-0ubuntu1"}
    assert got["replaces"] == ["nvidia-driver-550-open"]


def test_an_empty_branch_is_the_distributions_default():
    """The role's default (an empty branch) works on every supported distribution."""
    # no GPU on the PCI bus: auto takes the open modules, NVIDIA's default
    assert plan(**UBUNTU, branch="", version="550.120-0ubuntu1")["driver_package"] == "nvidia-driver-550-server-open"
    assert plan(**UBUNTU, branch="")["driver_package"] == "nvidia-driver-%s-server-open" % DEFAULT_BRANCH
    assert plan(**RHEL9, branch="")["dnf_module"] == "nvidia-driver:%s-open" % DEFAULT_BRANCH
    assert plan(**ROCKY8, branch="", version="570.86.15-1.el8", kernel_modules="proprietary")["dnf_module"] == (
        "nvidia-driver:570-dkms")
    assert plan(**DEBIAN, branch="")["driver_package"] == "nvidia-driver"


def test_rhel_module_stream_profiles():
    got = plan(**RHEL9, branch="580", kernel_modules="proprietary")
    assert got["manager"] == "dnf"
    assert got["dnf_module"] == "nvidia-driver:580-dkms"
    assert got["packages"] == ["@nvidia-driver:580-dkms/default", "kernel-devel-5.14.0-427.13.1.el9_4.x86_64",
                               "kernel-headers-5.14.0-427.13.1.el9_4.x86_64"]
    assert got["hold"] == []
    assert got["initramfs_command"] == ["dracut", "--force", "--regenerate-all"]
    assert plan(**ROCKY8, branch="570", kernel_modules="open")["dnf_module"] == "nvidia-driver:570-open"


def test_rhel_exact_version_names_packages_and_locks_them():
    got = plan(**RHEL9, branch="580", version="580.95.05-1.el9", kernel_modules="proprietary")
    assert got["packages"][:3] == ["nvidia-driver-580.95.05-1.el9", "nvidia-driver-cuda-580.95.05-1.el9",
                                   "kmod-nvidia-latest-dkms-580.95.05-1.el9"]
    assert got["hold"] == got["packages"][:3]


RHEL10 = dict(os_family="RedHat", distribution="RedHat", major_version="10", kernel="6.12.0-124.8.1.el10_1.x86_64",
              distribution_version="10.1", architecture="x86_64")
HOPPER = {"busId": "0000:01:00.0", "deviceId": "0x2330", "model": "H100 SXM5"}
PASCAL = {"busId": "0000:01:00.0", "deviceId": "0x1b02", "model": "TITAN Xp"}


def test_rhel_10_1_gets_red_hats_signed_kmods_from_its_extensions_repository():
    got = plan(**RHEL10, gpus=[HOPPER])
    assert (got["manager"], got["dnf_repository"], got["dnf_module"]) == (
        "dnf", "rhel-10-for-x86_64-extensions-rpms", None)
    assert got["packages"] == ["nvidia-open", "kmod-nvidia"] and got["hold"] == []
    assert got["signed_modules"] and got["kernel_modules"] == "open"
    # signed by Red Hat: Secure Boot needs no key of the host's own
    assert plan(**RHEL10, secure_boot=True, signing_key_enrolled=False)["signed_modules"]
    later = {**RHEL10, "distribution_version": "10.2"}
    assert plan(**later)["dnf_repository"] == "rhel-10-for-x86_64-extensions-rpms"
    # EL 8 and 9 stay on the CUDA repository's module streams
    assert plan(**RHEL9)["dnf_repository"] == "cuda"


def test_rhel_10_takes_a_branch_as_its_newest_version_and_locks_it():
    branch = plan(**RHEL10, branch="580")
    assert branch["packages"] == ["nvidia-open-580.*", "kmod-nvidia-580.*"] and branch["hold"] == branch["packages"]
    exact = plan(**RHEL10, version="580.95.05")
    assert exact["packages"] == ["nvidia-open-580.95.05", "kmod-nvidia-580.95.05"] and exact["hold"] == exact["packages"]


@pytest.mark.parametrize("host, found", [
    (dict(RHEL10, distribution_version="10.0"), "this host is RedHat 10.0 on x86_64"),
    (dict(RHEL10, distribution="Rocky"), "this host is Rocky 10.1 on x86_64"),
    (dict(RHEL10, architecture="aarch64"), "this host is RedHat 10.1 on aarch64"),
])
def test_el_10_without_red_hats_signed_kmods_is_refused_naming_the_host(host, found):
    with pytest.raises(PlanError, match=r"^on EL 10 this role installs Red Hat's signed NVIDIA kernel modules "
                                        r"\(kmod-nvidia, from rhel-10-for-x86_64-extensions-rpms\), which RHEL 10.1"):
        plan(**host)
    with pytest.raises(PlanError, match=found):
        plan(**host)


def test_rhel_10_refuses_the_proprietary_modules_it_does_not_ship():
    with pytest.raises(PlanError, match=r"proprietary ones \(auto: a GPU older than Turing \(Pascal\) runs with the "
                                        r"proprietary modules only\): GPUs older than Turing need an EL 9 host"):
        plan(**RHEL10, gpus=[PASCAL], branch="580")
    with pytest.raises(PlanError, match="nvidia_driver_kernel_modules is proprietary.*set nvidia_driver_kernel_modules "
                                        "to auto or open"):
        plan(**RHEL10, gpus=[HOPPER], kernel_modules="proprietary")


def test_the_filter_hands_the_plan_the_release_and_the_architecture():
    facts = {"os_family": "RedHat", "distribution": "RedHat", "distribution_major_version": "10",
             "distribution_version": "10.1", "architecture": "x86_64", "kernel": "6.12.0-124.8.1.el10_1.x86_64"}
    assert nvidia_driver_plan(facts)["dnf_repository"] == "rhel-10-for-x86_64-extensions-rpms"
    with pytest.raises(AnsibleFilterError, match="this host is RedHat 10.0 on x86_64"):
        nvidia_driver_plan(dict(facts, distribution_version="10.0"))


def test_version_and_branch_must_agree():
    with pytest.raises(PlanError, match="not on nvidia_driver_branch 580"):
        plan(**RHEL9, branch="580", version="550.54.15-1.el9")
    with pytest.raises(PlanError, match="'stable' is not a package version"):
        plan(**RHEL9, branch="580", version="stable")


def test_unsupported_distribution_and_modules():
    with pytest.raises(PlanError, match="not Archlinux"):
        plan(os_family="Archlinux", distribution="Archlinux", major_version="", kernel="6.9.0")
    with pytest.raises(PlanError, match="kernel_modules"):
        plan(**DEBIAN, kernel_modules="nouveau")


@pytest.mark.parametrize("host", [DEBIAN, RHEL9])
def test_secure_boot_stops_dkms_until_the_key_is_enrolled(host):
    branch = "" if host is DEBIAN else "580"
    with pytest.raises(PlanError, match="Secure Boot is enabled.*mokutil --import /var/lib/dkms/mok.pub.*Nothing has been changed"):
        plan(**host, branch=branch, secure_boot=True)
    assert plan(**host, branch=branch, secure_boot=True, signing_key_enrolled=True)["packages"]


@pytest.mark.parametrize("loaded, installed, nouveau, reasons", [
    (None, None, False, []),
    (None, "535.247.01-1", False, []),            # nothing holds the GPUs: load the module, no reboot
    ("535.247.01", "535.247.01-1~deb12u1", False, []),
    ("535.216.01", "535.247.01-1", False, ["the running kernel has driver 535.216.01 loaded, and 535.247.01 is installed"]),
    (None, "535.247.01-1", True, ["nouveau is loaded and holds the GPUs; the blacklist takes effect at boot"]),
    (None, None, True, []),                       # nouveau with no driver installed: nothing to reboot into
])
def test_reboot_reasons(loaded, installed, nouveau, reasons):
    assert reboot_reasons(loaded, installed, nouveau) == reasons


def test_a_change_of_flavour_at_the_same_version_needs_the_module_reloaded():
    assert reboot_reasons("550.163.01", "550.163.01-2", False, (), "proprietary", "open") == [
        "the running kernel has the proprietary nvidia module loaded, and the open one is installed"]
    assert reboot_reasons("550.163.01", "550.163.01-2", False, (), "open", "open") == []
    # a flavour the loaded module does not tell, or nothing loaded: no reason from it
    assert reboot_reasons("550.163.01", "550.163.01-2", False, (), None, "open") == []
    assert reboot_reasons(None, "550.163.01-2", False, (), None, "open") == []
    # with the version moving too, that reason says it
    assert reboot_reasons("535.216.01", "550.163.01-2", False, (), "proprietary", "open") == [
        "the running kernel has driver 535.216.01 loaded, and 550.163.01 is installed"]


def test_reboot_decision_by_policy_and_connection():
    needed = ["nouveau is loaded"]
    assert reboot_decision("auto", needed, "ssh") == (True, "rebooting: nouveau is loaded")
    assert reboot_decision("auto", [], "ssh") == (False, "no reboot is needed")
    reboot, message = reboot_decision("never", needed, "ssh")
    assert not reboot and "nvidia_driver_reboot is never: reboot this host yourself" in message
    reboot, message = reboot_decision("auto", needed, "local")
    assert not reboot and "local connection" in message
    assert reboot_decision("always", [], "ssh", driver_changed=True) == (True, "rebooting: nvidia_driver_reboot is always")
    # a rerun that changed nothing does not reboot again
    assert reboot_decision("always", [], "ssh", driver_changed=False) == (False, "no reboot is needed")
    with pytest.raises(PlanError, match="auto, never or always"):
        reboot_decision("sometimes", [], "ssh")


@pytest.mark.parametrize("version", ["535.247.01-1\n", "535.247.01-1 ", "535.247.01-1\nPin-Priority: 1",
                                     " 535.247.01-1", "535.247.01-1:x y"])
def test_a_version_apt_or_dnf_would_not_read_as_one_is_refused(version):
    with pytest.raises(PlanError, match="nvidia_driver_version .* is not a package version: .* no whitespace or "
                                        "newline"):
        plan(**DEBIAN, branch="", version=version)


@pytest.mark.parametrize("version", ["535.247.01-1~deb12u1", "1:535.247.01-1", "580.95.05-1.el9", "580.95.05",
                                     "580.95.05-0ubuntu0.24.04.2+really", "580.95.05-1^post"])
def test_package_versions_as_debian_and_rpm_write_them_pass(version):
    assert version_problem("nvidia_driver_version", version) is None
