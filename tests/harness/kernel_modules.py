"""Kernel module files for the next-kernel preflight's tests: relocatable ELF objects that gcc
builds with a .modinfo section, as a kernel module has one."""

from __future__ import annotations

import subprocess

VERMAGIC = "vermagic=%s SMP preempt mod_unload modversions "


def compile_module(path, version, release="6.1.0-18-amd64", fields=None):
    """Write ``path``: an object whose .modinfo has license, version, srcversion (holding a decoy
    'version=') and the vermagic of ``release``, or exactly ``fields`` when given."""
    source = path.with_suffix(".c")
    if fields is None:
        fields = ("license=NVIDIA", "version=%s" % version, "srcversion=ABC123version=9", VERMAGIC % release)
    source.write_text("int nvidia_init(void) { return 0; }\n" + "".join(
        'static const char m%d[] __attribute__((section(".modinfo"), used, aligned(1))) = "%s";\n' % (index, text)
        for index, text in enumerate(fields)))
    subprocess.run(["gcc", "-c", "-o", str(path), str(source)], check=True)
    source.unlink()
    return path
