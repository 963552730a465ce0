"""Fabric Manager's part of the nvidia_driver role's plan: who gets it, which package, and the plans refused."""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.host.driver import PlanError
from ansible_collections.scv.gpu.plugins.filter import nvidia_driver_fabric_manager as filters
from ansible_collections.scv.gpu.plugins.module_utils.host.fabric_manager import (
    apt_candidate,
    availability_problem,
    candidate_problem,
    decide,
    installed_packages,
    package_name,
    packages,
    plan,
)

HGX_H100 = [{"busId": "0000:%02x:00.0" % bus, "deviceId": "0x22a3", "generation": "LS10", "driver": None}
            for bus in (5, 6, 7, 8)]
B200 = [{"busId": "0000:18:00.0", "deviceId": "0x2901", "model": None}]


@pytest.mark.parametrize("setting, switches, wanted, why", [
    ("auto", HGX_H100, True, "the PCI bus has 4 NVSwitch chip(s) (LS10)"),
    ("auto", [], False, "no NVSwitch on the PCI bus"),
    ("true", [], True, "nvidia_driver_fabric_manager is true"),
    ("True", HGX_H100[:1], True, "the PCI bus has 1 NVSwitch chip(s) (LS10)"),
    ("false", HGX_H100, False, "nvidia_driver_fabric_manager is false"),
    ("auto", [{"deviceId": "0x9999", "generation": None}], True, "the PCI bus has 1 NVSwitch chip(s) (unknown generation)"),
])
def test_fabric_manager_is_wanted_where_the_bus_has_nvswitches(setting, switches, wanted, why):
    assert decide(setting, switches, []) == (wanted, why)


def test_an_unknown_setting_is_refused():
    with pytest.raises(PlanError, match="nvidia_driver_fabric_manager must be one of auto, true, false, not 'sometimes'"):
        decide("sometimes", [], [])


@pytest.mark.parametrize("setting", ["auto", "true"])
def test_an_nvlink5_board_is_refused_with_what_to_do(setting):
    with pytest.raises(PlanError) as raised:
        decide(setting, [], B200)
    message = str(raised.value)
    assert message.startswith("this host's GPUs (NVIDIA B200) sit on an HGX board with fourth-generation NVSwitches")
    for words in ("package nvlsm", "ib_umad", "set nvidia_driver_fabric_manager: false", "Nothing has been changed"):
        assert words in message


def test_an_nvlink5_board_with_fabric_manager_off_is_the_site_s_own():
    assert decide("false", [], B200) == (False, "nvidia_driver_fabric_manager is false")


@pytest.mark.parametrize("distribution, family, branch, name", [
    ("Ubuntu", "Debian", "535", "nvidia-fabricmanager-535"),
    ("Ubuntu", "Debian", "580", "nvidia-fabricmanager-580"),
    ("Debian", "Debian", "535", "nvidia-fabricmanager-535"),
    ("Debian", "Debian", "575", "nvidia-fabricmanager-575"),
    ("Debian", "Debian", "579", "nvidia-fabricmanager-579"),
    ("Debian", "Debian", "580", "nvidia-fabricmanager"),
    ("RedHat", "RedHat", "570", "nvidia-fabric-manager"),
    ("Rocky", "RedHat", "580", "nvidia-fabricmanager"),
])
def test_the_package_is_named_as_each_repository_names_it(distribution, family, branch, name):
    assert package_name(distribution, family, branch) == name


def test_another_distribution_is_refused():
    with pytest.raises(PlanError, match="not Archlinux"):
        package_name("Archlinux", "Archlinux", "580")


def test_apt_installs_the_driver_s_upstream_version_pinned_and_held_when_the_driver_is():
    assert packages("Debian", "Debian", "535.247.01-1", pinned=True) == {
        "package": "nvidia-fabricmanager-535", "install": "nvidia-fabricmanager-535=535.247.01-*",
        "hold": ["nvidia-fabricmanager-535"], "version": "535.247.01",
        "apt_pin": {"package": "nvidia-fabricmanager-535", "version": "535.247.01-*"}}
    unpinned = packages("Ubuntu", "Debian", "580.95.05-0ubuntu1")
    assert unpinned["install"] == "nvidia-fabricmanager-580=580.95.05-*"
    assert unpinned["hold"] == [] and unpinned["apt_pin"] is None
    exact = packages("Ubuntu", "Debian", "580.95.05-0ubuntu1", "580.95.05-0ubuntu0.24.04.1", pinned=True)
    assert exact["install"] == "nvidia-fabricmanager-580=580.95.05-0ubuntu0.24.04.1"
    assert exact["apt_pin"] == {"package": "nvidia-fabricmanager-580", "version": "580.95.05-0ubuntu0.24.04.1"}


def test_dnf_installs_name_version_and_versionlocks_it():
    assert packages("Rocky", "RedHat", "570.172.08-1.el9", pinned=True) == {
        "package": "nvidia-fabric-manager", "install": "nvidia-fabric-manager-570.172.08",
        "hold": ["nvidia-fabric-manager-570.172.08"], "apt_pin": None, "version": "570.172.08"}


def test_no_driver_version_no_package():
    with pytest.raises(PlanError, match="cannot tell which Fabric Manager to install"):
        packages("Debian", "Debian", None)


def test_installed_packages_are_read_without_their_dev_packages_and_with_their_hold():
    lines = ["hi nvidia-fabricmanager-535 535.216.01-1", "ii nvidia-fabricmanager-dev-535 535.216.01-1",
             "iiR nvidia-fabricmanager-550 550.163.01-1",   # installed, with dpkg's reinstall-required flag
             "iU nvidia-fabricmanager-570 570.172.08-1",    # unpacked, not installed
             "un nvidia-fabricmanager 580.95.05-1", "ii nvidia-fabric-manager 570.172.08-1", "garbage"]
    assert installed_packages(lines) == [
        {"package": "nvidia-fabricmanager-535", "version": "535.216.01-1", "held": True},
        {"package": "nvidia-fabricmanager-550", "version": "550.163.01-1", "held": False},
        {"package": "nvidia-fabric-manager", "version": "570.172.08-1", "held": False}]
    assert installed_packages(None) == []


def test_a_plan_says_who_gets_it_and_what_is_installed():
    assert plan("Debian", "Debian", "auto", HGX_H100, [], "535.247.01-1", "",
                ["hi nvidia-fabricmanager-535 535.216.01-1"]) == {
        "wanted": True, "why": "the PCI bus has 4 NVSwitch chip(s) (LS10)", "service": "nvidia-fabricmanager",
        "installed": [{"package": "nvidia-fabricmanager-535", "version": "535.216.01-1", "held": True}]}


def test_a_fabric_manager_version_other_than_the_driver_s_is_refused_naming_both():
    with pytest.raises(PlanError) as raised:
        plan("Debian", "Debian", "auto", HGX_H100, [], "535.247.01-1", "535.216.01-1")
    assert str(raised.value) == (
        "nvidia_driver_fabric_manager_version 535.216.01-1 is not the driver version 535.247.01 of "
        "nvidia_driver_version 535.247.01-1, and Fabric Manager starts only at the driver's exact version: make them "
        "name the same driver version, or leave nvidia_driver_fabric_manager_version empty. Nothing has been changed.")


@pytest.mark.parametrize("setting", ["auto", "false"])
def test_a_fabric_manager_version_apt_would_not_read_is_refused_even_where_it_is_off(setting):
    """A newline ends the pin file's line: apt-cache policy then fails on the host ('No priority (or zero)
    specified for pin')."""
    with pytest.raises(PlanError, match=r"nvidia_driver_fabric_manager_version '535.247.01-1\\n' is not a package "
                                        r"version: .* no whitespace or newline"):
        plan("Debian", "Debian", setting, HGX_H100, [], "535.247.01-1", "535.247.01-1\n")


def test_the_same_driver_version_in_another_packaging_is_accepted():
    assert plan("Ubuntu", "Debian", "auto", HGX_H100, [], "580.95.05-0ubuntu1", "580.95.05-0ubuntu0.24.04.1")["wanted"]


def test_a_fabric_manager_version_without_a_driver_version_is_refused():
    with pytest.raises(PlanError, match="nvidia_driver_fabric_manager_version is 535.216.01-1 and nvidia_driver_version "
                                        "is empty"):
        plan("Debian", "Debian", "true", [], [], "", "535.216.01-1")


def test_a_fabric_manager_version_is_not_checked_where_fabric_manager_is_off():
    assert not plan("Debian", "Debian", "auto", [], [], "535.247.01-1", "535.216.01-1")["wanted"]


def test_an_installed_fabric_manager_the_role_would_leave_behind_is_refused():
    with pytest.raises(PlanError) as raised:
        plan("Debian", "Debian", "false", HGX_H100, [], "535.247.01-1", "", ["hi nvidia-fabricmanager-535 535.216.01-1"])
    assert str(raised.value) == (
        "nvidia-fabricmanager-535 535.216.01-1 is installed and held and this role, which does not manage Fabric "
        "Manager on this host, would leave it there while the driver moves to 535.247.01: set "
        "nvidia_driver_fabric_manager: true to move both, or remove nvidia-fabricmanager-535. Nothing has been changed.")


def test_an_installed_fabric_manager_at_the_driver_s_version_or_with_no_pin_is_left_alone():
    installed = ["ii nvidia-fabricmanager-535 535.247.01-1"]
    assert plan("Debian", "Debian", "false", [], [], "535.247.01-1", "", installed)["installed"][0]["held"] is False
    assert plan("Debian", "Debian", "false", [], [], "", "", ["hi nvidia-fabricmanager-535 535.216.01-1"])


MADISON = [" nvidia-fabricmanager-535 | 535.247.01-1 | file:/srv/driver-repo bookworm/non-free amd64 Packages",
           " nvidia-fabricmanager-535 | 535.216.01-1 | file:/srv/driver-repo bookworm/non-free amd64 Packages",
           " nvidia-fabricmanager-535 | 535.216.01-1 | http://mirror.example bookworm/non-free amd64 Packages"]


@pytest.mark.parametrize("install", ["nvidia-fabricmanager-535=535.216.01-*", "nvidia-fabricmanager-535=535.247.01-1"])
def test_a_version_the_sources_offer_is_installable(install):
    assert availability_problem("Debian", install, MADISON) is None


def test_a_version_the_sources_lack_is_refused_saying_where_it_comes_from():
    cut_short = ["nvidia-fabricmanager-535 | 535.261.03-1"]    # no source column: not an offer
    assert availability_problem("Debian", "nvidia-fabricmanager-535=535.261.03-*", MADISON + cut_short) == (
        "nvidia-fabricmanager-535 535.261.03-* is not in this host's apt sources (they offer 535.247.01-1, "
        "535.216.01-1). Fabric Manager must be the driver's exact version, so the driver is not changed without it: "
        "it comes from NVIDIA's CUDA repository for Debian (Debian's archive has none: add "
        "https://developer.download.nvidia.com/compute/cuda/repos/debian<release>/<arch>/, or a mirror of it). Add it, "
        "or set nvidia_driver_fabric_manager: false. No package has been changed.")


def test_a_package_the_sources_lack_entirely_is_refused():
    message = availability_problem("Ubuntu", "nvidia-fabricmanager-580=580.95.05-*",
                                   ["nvidia-fabricmanager-5800 | 580.95.05-1 | elsewhere", "garbage"])
    assert "(they offer no version of it)" in message and "Ubuntu's multiverse component" in message
    assert "the distribution's repositories" in availability_problem("Rocky", "x=1", [])


POLICY = ["nvidia-driver:",
          "  Installed: 535.216.01-1",
          "  Candidate: 535.261.03-1",
          "  Version table:",
          "     535.261.03-1 500",
          "        500 http://mirror.example bookworm/non-free amd64 Packages",
          "     535.247.01-1 500",
          "        500 file:/srv/driver-repo bookworm/non-free amd64 Packages",
          " *** 535.216.01-1 500",
          "        500 file:/srv/driver-repo bookworm/non-free amd64 Packages",
          "        100 /var/lib/dpkg/status"]


def test_apt_s_candidate_and_version_table_are_read_from_its_policy():
    assert apt_candidate(POLICY) == ("535.261.03-1", ["535.261.03-1", "535.247.01-1", "535.216.01-1"])
    assert apt_candidate(["nvidia-driver:", "  Installed: (none)", "  Candidate: (none)", "  Version table:"]) == ("", [])
    assert apt_candidate(None) == ("", [])
    assert apt_candidate(["  Candidate: 1:535.261.03-1", " *** 1:535.261.03-1 990"]) == ("1:535.261.03-1", ["1:535.261.03-1"])


def test_an_unpinned_driver_whose_fabric_manager_the_sources_lack_is_refused_naming_both():
    assert candidate_problem("Debian", "nvidia-driver", POLICY, "nvidia-fabricmanager-535=535.261.03-*", MADISON) == (
        "nvidia_driver_version is empty, so apt would install the branch's newest driver, nvidia-driver 535.261.03-1, "
        "but this host's apt sources offer nvidia-fabricmanager-535 only at 535.247.01-1, 535.216.01-1, not "
        "nvidia-fabricmanager-535 535.261.03, and Fabric Manager starts only at the driver's exact version, so the "
        "driver is not changed without it. Set nvidia_driver_version to a driver version the sources offer Fabric "
        "Manager at too (535.247.01-1, 535.216.01-1), add nvidia-fabricmanager-535 535.261.03 from NVIDIA's CUDA "
        "repository for Debian (Debian's archive has none: add "
        "https://developer.download.nvidia.com/compute/cuda/repos/debian<release>/<arch>/, or a mirror of it), or set "
        "nvidia_driver_fabric_manager: false. No package has been changed.")


def test_an_unpinned_driver_with_no_fabric_manager_in_the_sources_is_refused():
    message = candidate_problem("Ubuntu", "nvidia-driver-535", POLICY, "nvidia-fabricmanager-535=535.261.03-*", [])
    assert "offer no version of nvidia-fabricmanager-535, not" in message
    assert "Fabric Manager at too (they offer none now)" in message and "Ubuntu's multiverse component" in message


def test_an_unpinned_driver_whose_fabric_manager_is_offered_or_with_no_candidate_passes():
    offered = MADISON + [" nvidia-fabricmanager-535 | 535.261.03-2 | http://mirror.example bookworm/non-free amd64"]
    assert candidate_problem("Debian", "nvidia-driver", POLICY, "nvidia-fabricmanager-535=535.261.03-*", offered) is None
    # apt names no candidate: the driver's own install says why, so no Fabric Manager is asked for
    assert candidate_problem("Debian", "nvidia-driver", POLICY[:2] + ["  Candidate: (none)"],
                             "nvidia-fabricmanager-535=535.261.03-*", []) is None


def test_the_filters_name_the_candidate_s_fabric_manager_and_the_refusal():
    facts = {"distribution": "Debian", "os_family": "Debian"}
    assert filters.nvidia_driver_fabric_manager_candidate(POLICY, facts) == "nvidia-fabricmanager-535=535.261.03-*"
    assert filters.nvidia_driver_fabric_manager_candidate(["  Candidate: (none)"], facts) == ""
    install = "nvidia-fabricmanager-535=535.261.03-*"
    refusal = filters.nvidia_driver_fabric_manager_unavailable(MADISON, "Debian", install, "nvidia-driver", POLICY)
    assert refusal.startswith("nvidia_driver_version is empty, so apt would install")
    assert filters.nvidia_driver_fabric_manager_unavailable(MADISON, "Debian", install).startswith(
        "nvidia-fabricmanager-535 535.261.03-* is not in this host's apt sources")
    assert filters.nvidia_driver_fabric_manager_unavailable(MADISON, "Debian", "nvidia-fabricmanager-535=535.216.01-*",
                                                            "nvidia-driver", POLICY) == ""
    table = filters.FilterModule().filters()
    assert table["nvidia_driver_fabric_manager_candidate"] is filters.nvidia_driver_fabric_manager_candidate
