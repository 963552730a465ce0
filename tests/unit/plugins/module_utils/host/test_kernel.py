"""The kernel that boots next and its nvidia module, on prepared /boot, GRUB and /lib/modules trees."""

from __future__ import annotations

import gzip
import lzma

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.host.kernel import (
    module_entry,
    module_files,
    module_info,
    preflight,
)
from harness.kernel_modules import compile_module


@pytest.fixture
def root(tmp_path):
    dkms = tmp_path / "lib" / "modules" / "6.1.0-18-amd64" / "updates" / "dkms"
    dkms.mkdir(parents=True)
    compile_module(dkms / "nvidia-current.ko", "535.216.01")
    return tmp_path


def version(path, read_compressed=None):
    return module_info(str(path), read_compressed)[0].get("version")


def test_module_version_from_the_elf_modinfo_section_plain_xz_and_gz(root, tmp_path):
    plain = root / "lib" / "modules" / "6.1.0-18-amd64" / "updates" / "dkms" / "nvidia-current.ko"
    assert version(plain) == "535.216.01"       # not srcversion's 'version=9'
    data = plain.read_bytes()
    (tmp_path / "nvidia.ko.xz").write_bytes(lzma.compress(data))
    (tmp_path / "nvidia.ko.gz").write_bytes(gzip.compress(data))
    assert version(tmp_path / "nvidia.ko.xz") == "535.216.01"
    assert version(tmp_path / "nvidia.ko.gz") == "535.216.01"
    (tmp_path / "nvidia.ko.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    assert module_info(str(tmp_path / "nvidia.ko.zst")) == ({}, "it cannot be decompressed here (install zstd)")
    assert version(tmp_path / "nvidia.ko.zst", read_compressed=lambda path: data) == "535.216.01"
    (tmp_path / "broken.ko").write_bytes(b"\x7fELF\x02\x01" + b"\x00" * 10)
    assert module_info(str(tmp_path / "broken.ko"))[1] == (
        "it has no readable .modinfo section (cut short, or not a kernel module)")


RELEASE = "6.1.0-27-amd64"


@pytest.mark.parametrize("case, problem", [
    ("good", None),
    ("another kernel", "it was built for the kernel 6.1.0-18-amd64 (vermagic), and modprobe refuses it on "
                       "6.1.0-27-amd64"),
    ("no modinfo", "it has no readable .modinfo section (cut short, or not a kernel module)"),
    ("cut short", "it has no readable .modinfo section (cut short, or not a kernel module)"),
    ("no vermagic", "its .modinfo has no vermagic"),
    ("not elf", "it is not an ELF object"),
])
def test_a_module_counts_only_when_modinfo_parses_and_vermagic_names_the_kernel(tmp_path, case, problem):
    path = tmp_path / "nvidia.ko"
    if case == "good":
        compile_module(path, "580.95.05", RELEASE)
    elif case == "another kernel":
        compile_module(path, "580.95.05")
    elif case == "no modinfo":
        compile_module(path, "580.95.05", RELEASE, fields=())
    elif case == "cut short":
        compile_module(path, "580.95.05", RELEASE)
        path.write_bytes(path.read_bytes()[:300])
    elif case == "no vermagic":
        compile_module(path, "580.95.05", RELEASE, fields=("version=580.95.05",))
    else:
        path.write_text("nvidia.ko: placeholder\n")
    entry = module_entry(str(path), RELEASE)
    assert entry["problem"] == problem
    result = preflight(RELEASE, "how", [entry], "580.95.05", "6.1.0-18-amd64")
    assert result["ok"] is (problem is None)
    if problem:
        assert result["message"] == ("the kernel that boots next, %s (how), has no nvidia module that modprobe "
                                     "would load: %s: %s" % (RELEASE, path, problem))


def test_preflight_refuses_when_the_next_kernel_is_not_certain():
    result = preflight(None, "no boot loader configuration was found", [], "580.95.05", "6.1.0-18-amd64")
    assert result["ok"] is False
    assert result["message"] == ("cannot tell which kernel boots next: no boot loader configuration was found. "
                                 "Name it with nvidia_driver_next_kernel (the module's next_kernel_release) to "
                                 "check that kernel")


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
    result = preflight("6.1.0-27-amd64", "GRUB_DEFAULT=0", [], "535.216.01", "6.1.0-18-amd64")
    assert result["ok"] is False
    assert result["message"] == ("the kernel that boots next, 6.1.0-27-amd64 (GRUB_DEFAULT=0), has no "
                                 "nvidia module under /lib/modules/6.1.0-27-amd64")


def test_preflight_refuses_a_module_of_another_release():
    modules = [{"path": "/lib/modules/k/updates/dkms/nvidia-current.ko", "version": "535.216.01", "problem": None}]
    result = preflight("k", "how", modules, "535.247.01", "k")
    assert result["ok"] is False and "another driver release than the installed 535.247.01" in result["message"]
    assert "version mismatch" in result["message"]


@pytest.mark.parametrize("found, installed", [("535.247.01", "535.247.01"), ("535.216.01", None)])
def test_preflight_accepts(found, installed):
    modules = [{"path": "/lib/modules/k/updates/dkms/nvidia-current.ko", "version": found, "problem": None}]
    assert preflight("k", "how", modules, installed, "k")["ok"] is True
