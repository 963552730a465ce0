"""The kernel the boot loader starts next, read from files GRUB's own tools wrote (tests/fixtures/grub)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.host.bootloader import (
    SYSTEMD_BOOT_VENDOR,
    next_boot,
    parse_grub_menu,
)

FIXTURES = Path(__file__).parents[4] / "fixtures" / "grub"
RELEASES = ("6.1.0-9-amd64", "6.1.0-18-amd64", "6.1.0-27-amd64")
DEBIAN = "Debian GNU/Linux, with Linux %s"


@pytest.fixture
def host(tmp_path):
    """A host's /boot with three kernels, and a writer for its GRUB files."""
    (tmp_path / "boot" / "grub").mkdir(parents=True)
    for release in RELEASES:
        (tmp_path / "boot" / ("vmlinuz-%s" % release)).write_text("kernel")

    def grub(cfg, env=None, default=None, dropins=None):
        shutil.copy(FIXTURES / cfg, tmp_path / "boot" / "grub" / "grub.cfg")
        if env:
            shutil.copy(FIXTURES / env, tmp_path / "boot" / "grub" / "grubenv")
        if default is not None:
            (tmp_path / "etc" / "default").mkdir(parents=True, exist_ok=True)
            (tmp_path / "etc" / "default" / "grub").write_text("# site settings\nGRUB_TIMEOUT=5\n%s\n" % default)
        for name, text in (dropins or {}).items():
            (tmp_path / "etc" / "default" / "grub.d").mkdir(parents=True, exist_ok=True)
            (tmp_path / "etc" / "default" / "grub.d" / name).write_text(text)
        return next_boot(str(tmp_path))
    grub.root = tmp_path
    return grub


def test_the_generated_menu_is_read_as_grub_numbers_it():
    menu = parse_grub_menu((FIXTURES / "grub-default-0.cfg").read_text())
    assert [(item["kind"], item["title"]) for item in menu] == [
        ("entry", "Debian GNU/Linux"), ("submenu", "Advanced options for Debian GNU/Linux")]
    assert menu[0]["release"] == "6.1.0-27-amd64"
    children = menu[1]["children"]
    assert [child["release"] for child in children] == [r for r in reversed(RELEASES) for _twice in (1, 2)]
    assert children[1]["id"] == "gnulinux-6.1.0-27-amd64-recovery-/dev/sda1"
    assert children[1]["title"] == DEBIAN % "6.1.0-27-amd64" + " (recovery mode)"


def test_default_0_is_the_first_entry(host):
    assert host("grub-default-0.cfg", "grubenv-empty", "GRUB_DEFAULT=0") == (
        "6.1.0-27-amd64", "GRUB_DEFAULT=0, in /boot/grub/grub.cfg, the entry 'Debian GNU/Linux'")


def test_a_number_without_submenus_counts_every_entry(host):
    # 0 and 1 are 6.1.0-27 and its recovery entry: 2 is 6.1.0-18, not the newest kernel.
    assert host("grub-flat-2.cfg", None, "GRUB_DEFAULT=2\nGRUB_DISABLE_SUBMENU=y") == (
        "6.1.0-18-amd64", "GRUB_DEFAULT=2, in /boot/grub/grub.cfg, the entry '%s'" % DEBIAN % "6.1.0-18-amd64")


def test_a_path_walks_into_the_submenu(host):
    assert host("grub-path.cfg", None, 'GRUB_DEFAULT="1>2"') == (
        "6.1.0-18-amd64", "GRUB_DEFAULT=1>2, in /boot/grub/grub.cfg, the entry '%s'" % DEBIAN % "6.1.0-18-amd64")


def test_next_entry_from_grub_reboot_wins_over_saved_entry(host):
    release, how = host("grub-saved.cfg", "grubenv-next-18", "GRUB_DEFAULT=saved")
    assert release == "6.1.0-18-amd64"
    assert how.startswith("next_entry in /boot/grub/grubenv (grub-reboot)")


def test_saved_followed_by_a_comment_reads_saved_entry(host):
    assert host("grub-saved.cfg", "grubenv-saved-9", "GRUB_DEFAULT=saved   # keep the last choice") == (
        "6.1.0-9-amd64", "saved_entry in /boot/grub/grubenv, the entry '%s'" % DEBIAN % "6.1.0-9-amd64")


def test_a_drop_in_overrides_etc_default_grub(host):
    dropin = {"50-site.cfg": "GRUB_DEFAULT=saved\n"}
    assert host("grub-saved.cfg", "grubenv-saved-9", "GRUB_DEFAULT=0", dropin)[0] == "6.1.0-9-amd64"


def test_a_setting_changed_since_grub_cfg_was_generated_is_refused(host):
    release, how = host("grub-default-0.cfg", "grubenv-saved-9", "GRUB_DEFAULT=0",
                        {"50-site.cfg": "export GRUB_DEFAULT=saved\n"})
    assert release is None
    assert how == ("GRUB_DEFAULT in /etc/default/grub.d/50-site.cfg is 'saved', but /boot/grub/grub.cfg was "
                   "generated with '0' before that: run update-grub, then check again")


def test_an_empty_saved_entry_is_the_first_entry(host):
    release, how = host("grub-saved.cfg", "grubenv-empty", "GRUB_DEFAULT=saved")
    assert release == "6.1.0-27-amd64"
    assert how.startswith("the first entry of /boot/grub/grub.cfg, as saved_entry in /boot/grub/grubenv is empty")


def test_a_saved_entry_for_a_removed_kernel_falls_back_as_grub_does(host):
    (host.root / "boot" / "grub").mkdir(exist_ok=True)
    (host.root / "boot" / "grub" / "grubenv").write_text("saved_entry=gnulinux-6.1.0-3-amd64-advanced-x\n")
    release, how = host("grub-saved.cfg", None, "GRUB_DEFAULT=saved")
    assert release == "6.1.0-27-amd64"
    assert "'gnulinux-6.1.0-3-amd64-advanced-x' is not in the menu, so GRUB falls back to its first entry" in how


def test_a_default_naming_a_submenu_is_refused(host):
    release, how = host("grub-flat-2.cfg", None, None)
    assert release == "6.1.0-18-amd64"
    (host.root / "boot" / "grub" / "grubenv").write_text("next_entry=1\n")
    release, how = host("grub-default-0.cfg", None, None)
    assert release is None
    assert how == ("next_entry in /boot/grub/grubenv (grub-reboot): '1' names the submenu 'Advanced options for "
                   "Debian GNU/Linux', not an entry in it")


def test_an_unreadable_grub_cfg_is_refused(host):
    (host.root / "boot" / "grub" / "grub.cfg").mkdir()
    release, how = next_boot(str(host.root))
    assert release is None and how.startswith("cannot read %s" % (host.root / "boot" / "grub" / "grub.cfg"))


def test_no_boot_loader_configuration_is_refused_not_the_newest_kernel(tmp_path):
    (tmp_path / "boot").mkdir()
    (tmp_path / "boot" / "vmlinuz-0-rescue-0123456789abcdef").write_text("rescue")
    assert next_boot(str(tmp_path)) == (None, "no boot loader configuration was found (neither /boot/grub/grub.cfg, "
                                              "/boot/grub2/grub.cfg nor /boot/loader/entries)")


def test_grubby_decides_on_the_rhel_family(tmp_path):
    assert next_boot(str(tmp_path), "/boot/vmlinuz-5.14.0-427.el9.x86_64\n") == \
        ("5.14.0-427.el9.x86_64", "grubby --default-kernel")


def bls(root, entries, loader=None):
    folder = root / "boot" / "loader" / "entries"
    folder.mkdir(parents=True)
    for name, (version, extra) in entries.items():
        (folder / ("%s.conf" % name)).write_text(
            "title Fedora Linux (%s)\nversion %s\nlinux /vmlinuz-%s\ninitrd /initramfs-%s.img\n%s"
            % (version, version, version, version, extra))
    if loader is not None:
        (root / "boot" / "loader" / "loader.conf").write_text(loader)


def efi_variable(folder, name, value):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ("%s-%s" % (name, SYSTEMD_BOOT_VENDOR))).write_bytes(b"\x07\x00\x00\x00" + (value + "\x00").encode("utf-16-le"))


BLS_ENTRIES = {"abc-6.11.4-301.fc41.x86_64": ("6.11.4-301.fc41.x86_64", ""),
               "abc-6.9.2-200.fc40.x86_64": ("6.9.2-200.fc40.x86_64", ""),
               "abc-6.10.1-100.fc40.x86_64": ("6.10.1-100.fc40.x86_64", "")}


def test_systemd_boot_without_a_default_takes_the_newest_version_first(tmp_path):
    bls(tmp_path, BLS_ENTRIES)
    assert next_boot(str(tmp_path)) == ("6.11.4-301.fc41.x86_64", "the first entry in /boot/loader/entries, in the "
                                        "Boot Loader Specification's order, the entry abc-6.11.4-301.fc41.x86_64")


def test_systemd_boot_loader_conf_pattern_and_efi_variables(tmp_path):
    bls(tmp_path, BLS_ENTRIES, "timeout 3\ndefault abc-6.9*\n")
    efivars = tmp_path / "efivars"
    assert next_boot(str(tmp_path), efivars=str(efivars))[0] == "6.9.2-200.fc40.x86_64"
    efi_variable(efivars, "LoaderEntryDefault", "abc-6.10.1-100.fc40.x86_64.conf")
    assert next_boot(str(tmp_path), efivars=str(efivars))[0] == "6.10.1-100.fc40.x86_64"
    efi_variable(efivars, "LoaderEntryOneShot", "abc-6.11.4-301.fc41.x86_64.conf")
    assert next_boot(str(tmp_path), efivars=str(efivars)) == (
        "6.11.4-301.fc41.x86_64", "the EFI variable LoaderEntryOneShot, the entry abc-6.11.4-301.fc41.x86_64")


def test_systemd_boot_default_matching_nothing_is_refused(tmp_path):
    bls(tmp_path, BLS_ENTRIES, "default @saved\n")
    assert next_boot(str(tmp_path))[0] is None
    (tmp_path / "boot" / "loader" / "loader.conf").write_text("default windows.conf\n")
    assert next_boot(str(tmp_path)) == (
        None, "default in /boot/loader/loader.conf is 'windows.conf', which matches no entry in /boot/loader/entries")


def test_grub_with_blscfg_walks_the_bls_entries(tmp_path):
    bls(tmp_path, BLS_ENTRIES)
    (tmp_path / "boot" / "grub2").mkdir()
    (tmp_path / "boot" / "grub2" / "grub.cfg").write_text(
        'load_env\nif [ "${next_entry}" ] ; then\n   set default="${next_entry}"\nelse\n'
        '   set default="${saved_entry}"\nfi\nblscfg\n')
    (tmp_path / "boot" / "grub2" / "grubenv").write_text("saved_entry=abc-6.10.1-100.fc40.x86_64\n")
    assert next_boot(str(tmp_path)) == ("6.10.1-100.fc40.x86_64", "saved_entry in /boot/grub2/grubenv, the entry "
                                        "'Fedora Linux (6.10.1-100.fc40.x86_64)'")
    os.remove(tmp_path / "boot" / "grub2" / "grubenv")
    assert next_boot(str(tmp_path))[0] == "6.11.4-301.fc41.x86_64"
