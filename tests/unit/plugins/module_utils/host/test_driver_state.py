"""What a host says of its NVIDIA driver: loaded and installed versions, Secure Boot, the next kernel."""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.host.driver_state import (
    installed_version,
    loaded_kernel_modules,
    loaded_version,
    next_kernel,
    nouveau_loaded,
    secure_boot,
)


class Failed(Exception):
    pass


class StandInModule:
    """An AnsibleModule's get_bin_path, run_command and fail_json: ``tools`` maps a command's name to its
    (rc, out, err); each command run is recorded."""

    def __init__(self, **tools):
        self.tools, self.commands = tools, []

    def get_bin_path(self, name, **_kwargs):
        return "/usr/bin/%s" % name if name in self.tools else None

    def run_command(self, command, **_kwargs):
        self.commands.append(command)
        return self.tools[command[0].rpartition("/")[2]]

    def fail_json(self, **kwargs):
        raise Failed(kwargs["msg"])


def test_the_loaded_module_and_nouveau_are_read_from_sysfs(tmp_path):
    assert loaded_version(str(tmp_path)) is None and nouveau_loaded(str(tmp_path)) is False
    (tmp_path / "module" / "nvidia").mkdir(parents=True)
    (tmp_path / "module" / "nvidia" / "version").write_text("570.133.20\n")
    (tmp_path / "module" / "nouveau").mkdir()
    assert loaded_version(str(tmp_path)) == "570.133.20" and nouveau_loaded(str(tmp_path)) is True


@pytest.mark.parametrize("line, flavour", [
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16-I3-B03-4-3)  "
     "Tue Jun 25 01:26:03 UTC 2024", "open"),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.216.03  Thu Apr  3 01:14:19 UTC 2025", "proprietary"),
    ("GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)", None),
    ("", None),
])
def test_the_loaded_modules_flavour_is_read_from_the_drivers_version_line(tmp_path, line, flavour):
    version = tmp_path / "driver" / "nvidia" / "version"
    version.parent.mkdir(parents=True)
    version.write_text(line + "\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    assert loaded_kernel_modules(str(tmp_path)) == flavour
    assert loaded_kernel_modules(str(tmp_path / "nothing")) is None


@pytest.mark.parametrize("out, rc, version", [
    ("ii 570.133.20-0ubuntu1", 0, "570.133.20-0ubuntu1"),
    ("hi 570.133.20-0ubuntu1", 0, "570.133.20-0ubuntu1"),      # held, installed
    ("rc 570.133.20-0ubuntu1", 0, None),                       # removed, its configuration left
    ("un ", 0, None),
    ("", 1, None),
])
def test_dpkg_says_whether_and_what_is_installed(out, rc, version):
    module = StandInModule(**{"dpkg-query": (rc, out, "")})
    assert installed_version(module, "nvidia-driver-570-server") == version
    assert module.commands == [["/usr/bin/dpkg-query", "-W", "-f=${db:Status-Abbrev} ${Version}",
                                "nvidia-driver-570-server"]]


def test_rpm_answers_where_there_is_no_dpkg():
    module = StandInModule(rpm=(0, "ii 570.133.20-1.el9", ""))
    assert installed_version(module, "nvidia-driver") == "570.133.20-1.el9"
    assert module.commands[0][:2] == ["/usr/bin/rpm", "-q"]


def test_a_host_without_dpkg_or_rpm_fails_naming_the_package():
    with pytest.raises(Failed, match="neither dpkg-query nor rpm is on this host: cannot read the version of nv"):
        installed_version(StandInModule(), "nv")


def efi(tmp_path, value=None):
    efivars = tmp_path / "firmware" / "efi" / "efivars"
    efivars.mkdir(parents=True)
    if value is not None:
        (efivars / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c").write_bytes(b"\x06\x00\x00\x00" + bytes([value]))
    return str(tmp_path)


@pytest.mark.parametrize("answer, enabled", [("SecureBoot enabled\n", True), ("SecureBoot disabled\n", False),
                                             ("EFI variables are not supported on this system\n", False)])
def test_mokutil_decides_secure_boot(tmp_path, answer, enabled):
    assert secure_boot(StandInModule(mokutil=(0, answer, "")), efi(tmp_path, 0 if enabled else 1)) == (enabled, "mokutil")


@pytest.mark.parametrize("value, enabled", [(1, True), (0, False)])
def test_without_mokutil_the_efi_variable_decides(tmp_path, value, enabled):
    assert secure_boot(StandInModule(), efi(tmp_path, value)) == (enabled, "efivars")


def test_efi_without_the_variable_and_no_efi_at_all_are_off(tmp_path):
    assert secure_boot(StandInModule(), efi(tmp_path / "efi")) == (False, "efivars")
    assert secure_boot(StandInModule(), str(tmp_path / "bios")) == (False, "no EFI")


def test_a_release_the_site_names_is_used_as_is_without_asking_grubby(tmp_path):
    module = StandInModule(grubby=(0, "/boot/vmlinuz-9.9.9\n", ""))
    verdict = next_kernel(module, "/", str(tmp_path), "6.8.0-60-generic", "570.133.20")
    assert verdict["kernel"] == "6.8.0-60-generic" and verdict["how"] == "nvidia_driver_next_kernel"
    assert module.commands == []


def test_grubby_decides_on_the_real_root_only(tmp_path):
    module = StandInModule(grubby=(0, "/boot/vmlinuz-6.8.0-60-generic\n", ""))
    verdict = next_kernel(module, "/", str(tmp_path), None, "570.133.20")
    assert module.commands == [["/usr/bin/grubby", "--default-kernel"]]
    assert verdict["kernel"] == "6.8.0-60-generic" and verdict["ok"] is False
    module = StandInModule(grubby=(0, "/boot/vmlinuz-6.8.0-60-generic\n", ""))
    next_kernel(module, str(tmp_path), str(tmp_path), None, "570.133.20")
    assert module.commands == []
