"""The kernel that boots next and its nvidia module, on prepared /boot, GRUB and /lib/modules trees."""

from __future__ import annotations

import gzip
import lzma
import subprocess

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.host.kernel import (
    installed_kernels,
    module_files,
    module_version,
    next_kernel,
    preflight,
)


def compile_module(path, version):
    """A relocatable ELF object with a .modinfo section, as a kernel module has (gcc builds it)."""
    source = path.with_suffix(".c")
    source.write_text("".join(
        'static const char m%d[] __attribute__((section(".modinfo"), used, aligned(1))) = "%s";\n' % (index, text)
        for index, text in enumerate(("license=NVIDIA", "version=%s" % version, "srcversion=ABC123version=9"))))
    subprocess.run(["gcc", "-c", "-o", str(path), str(source)], check=True)
    source.unlink()
    return path


@pytest.fixture
def root(tmp_path):
    for release in ("6.1.0-9-amd64", "6.1.0-18-amd64", "6.1.0-27-amd64"):
        (tmp_path / "boot").mkdir(exist_ok=True)
        (tmp_path / "boot" / ("vmlinuz-%s" % release)).write_text("kernel")
    dkms = tmp_path / "lib" / "modules" / "6.1.0-18-amd64" / "updates" / "dkms"
    dkms.mkdir(parents=True)
    compile_module(dkms / "nvidia-current.ko", "535.216.01")
    return tmp_path


def test_installed_kernels_sort_as_versions_not_strings(root):
    assert installed_kernels(str(root)) == ["6.1.0-9-amd64", "6.1.0-18-amd64", "6.1.0-27-amd64"]


def test_next_kernel_is_the_newest_without_grub_settings(root):
    assert next_kernel(str(root), "6.1.0-18-amd64") == ("6.1.0-27-amd64", "the newest kernel in /boot")


@pytest.mark.parametrize("default, grubenv, expected", [
    ('GRUB_DEFAULT="Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux 6.1.0-18-amd64"', None,
     ("6.1.0-18-amd64", "GRUB_DEFAULT in /etc/default/grub")),
    ("GRUB_DEFAULT=saved", "saved_entry=gnulinux-advanced-1234>gnulinux-6.1.0-9-amd64-advanced-1234\n",
     ("6.1.0-9-amd64", "saved_entry in /boot/grub/grubenv")),
    ("GRUB_DEFAULT=0", None, ("6.1.0-27-amd64", "the newest kernel in /boot")),
    ("GRUB_DEFAULT=saved", "saved_entry=\n", ("6.1.0-27-amd64", "the newest kernel in /boot")),
])
def test_grub_default_decides_when_it_names_a_kernel(root, default, grubenv, expected):
    (root / "etc" / "default").mkdir(parents=True)
    (root / "etc" / "default" / "grub").write_text("# site\nGRUB_TIMEOUT=5\n%s\n" % default)
    if grubenv:
        (root / "boot" / "grub").mkdir()
        (root / "boot" / "grub" / "grubenv").write_text("# GRUB Environment Block\n" + grubenv)
    assert next_kernel(str(root), "6.1.0-18-amd64") == expected


def test_grubby_decides_on_the_rhel_family(root):
    assert next_kernel(str(root), "x", "/boot/vmlinuz-5.14.0-427.el9.x86_64\n") == \
        ("5.14.0-427.el9.x86_64", "grubby --default-kernel")


def test_no_image_in_boot_is_the_running_kernel(tmp_path):
    assert next_kernel(str(tmp_path), "6.1.0-18-amd64") == \
        ("6.1.0-18-amd64", "the running kernel, as /boot has no kernel image")


def test_module_version_from_the_elf_modinfo_section_plain_xz_and_gz(root, tmp_path):
    plain = root / "lib" / "modules" / "6.1.0-18-amd64" / "updates" / "dkms" / "nvidia-current.ko"
    assert module_version(str(plain)) == "535.216.01"       # not srcversion's 'version=9'
    data = plain.read_bytes()
    (tmp_path / "nvidia.ko.xz").write_bytes(lzma.compress(data))
    (tmp_path / "nvidia.ko.gz").write_bytes(gzip.compress(data))
    assert module_version(str(tmp_path / "nvidia.ko.xz")) == "535.216.01"
    assert module_version(str(tmp_path / "nvidia.ko.gz")) == "535.216.01"
    (tmp_path / "nvidia.ko.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    assert module_version(str(tmp_path / "nvidia.ko.zst")) is None
    assert module_version(str(tmp_path / "nvidia.ko.zst"), read_compressed=lambda path: data) == "535.216.01"
    (tmp_path / "broken.ko").write_bytes(b"\x7fELF\x02\x01" + b"\x00" * 10)
    assert module_version(str(tmp_path / "broken.ko")) is None


def test_module_files_find_dkms_prebuilt_and_kmod_layouts(root):
    prebuilt = root / "lib" / "modules" / "6.8.0-45-generic" / "kernel" / "nvidia-580srv"
    prebuilt.mkdir(parents=True)
    compile_module(prebuilt / "nvidia.ko", "580.95.05")
    extra = root / "usr" / "lib" / "modules" / "5.14.0-427.el9.x86_64" / "extra"
    extra.mkdir(parents=True)
    compile_module(extra / "nvidia.ko", "580.95.05")
    (extra / "nvidia-uvm.ko").write_text("not the nvidia module")
    assert module_files("6.8.0-45-generic", str(root)) == [str(prebuilt / "nvidia.ko")]
    assert module_files("5.14.0-427.el9.x86_64", str(root)) == [str(extra / "nvidia.ko")]
    assert module_files("6.1.0-27-amd64", str(root)) == []


def test_preflight_refuses_a_kernel_without_the_module():
    result = preflight("6.1.0-27-amd64", "the newest kernel in /boot", [], "535.216.01", "6.1.0-18-amd64")
    assert result["ok"] is False
    assert result["message"] == ("the kernel that boots next, 6.1.0-27-amd64 (the newest kernel in /boot), has no "
                                 "nvidia module under /lib/modules/6.1.0-27-amd64")


def test_preflight_refuses_a_module_of_another_release():
    modules = [{"path": "/lib/modules/k/updates/dkms/nvidia-current.ko", "version": "535.216.01"}]
    result = preflight("k", "how", modules, "535.247.01", "k")
    assert result["ok"] is False and "another driver release than the installed 535.247.01" in result["message"]
    assert "version mismatch" in result["message"]


@pytest.mark.parametrize("version, installed", [("535.247.01", "535.247.01"), (None, "535.247.01"),
                                                ("535.216.01", None)])
def test_preflight_accepts(version, installed):
    modules = [{"path": "/lib/modules/k/updates/dkms/nvidia-current.ko", "version": version}]
    assert preflight("k", "how", modules, installed, "k")["ok"] is True
