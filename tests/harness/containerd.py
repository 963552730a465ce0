"""Debian's containerd for the tests, and configs generated to check an edit against its own reading.

``debian_containerd`` serves the containerd_runtime tests (which only run ``config dump`` and ``config
default``: no daemon) and the real kubelet's runtime. ``edit_generated`` writes a config in every form TOML
allows, edits it with containerd_runtime's ``add_runtime`` and asks a containerd binary (1.6's or 2's) what
changed.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import tomllib

from hypothesis import assume
from hypothesis import strategies as st

from ansible_collections.scv.gpu.plugins.module_utils.host.containerd import add_runtime
from harness.paths import ROOT

NVIDIA = "/usr/bin/nvidia-container-runtime"


def debian_containerd():
    """Debian's containerd: the one on PATH, or its package unpacked under build/containerd (``apt-get
    download``, which needs no root and changes nothing on this machine). Its folder holds ``ctr`` and
    ``containerd-shim-runc-v2`` too."""
    found = shutil.which("containerd")
    if found:
        return pathlib.Path(found)
    unpacked = ROOT / "build" / "containerd"
    binary = unpacked / "usr" / "bin" / "containerd"
    if not binary.exists():
        unpacked.mkdir(parents=True, exist_ok=True)
        download = ["apt-get", "download", "containerd"]
        if subprocess.run(download, cwd=unpacked, capture_output=True, check=False).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], check=True, capture_output=True)
            subprocess.run(download, cwd=unpacked, check=True, capture_output=True)
        package = next(unpacked.glob("containerd_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(package), str(unpacked)], check=True)
    return binary


def containerd2(release=None):
    """containerd 2's binary (or ``release`` "1.7"'s), built once from the pinned module (tools/containerd/build);
    its folder holds its runc shim and ``ctr``."""
    done = subprocess.run([str(ROOT / "tools" / "containerd" / "build")] + ([release] if release else []),
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, "tools/containerd/build failed:\n%s" % done.stderr[-4000:]
    return pathlib.Path(done.stdout.strip().splitlines()[-1]) / "containerd"


def dump(containerd, path):
    """The configuration ``containerd`` runs with when given ``path`` (its ``config dump``), parsed."""
    done = subprocess.run([str(containerd), "--config", str(path), "config", "dump"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return tomllib.loads(done.stdout)


# Generated TOML: values in every form TOML has, whose text looks like configuration where it can.
LOOKALIKE = st.sampled_from(['[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]',
                             'Root = "/evil"', "SystemdCgroup = false", 'default_runtime_name = "x"', "[", "]",
                             "[[x]]", "# not a comment", "y = 1", "{", "}", ""])


def _body(quote):
    """A multi-line string's body: lookalike lines, free text, the other kind's delimiter, backslashes that end
    a line (a basic string's line continuation), and one or two of its own quotes right before its end."""
    other = "'" if quote == '"' else '"'
    free = st.text(alphabet=st.sampled_from(list("ab =[]{}#.,\t") + [other]), max_size=12)
    tricky = st.sampled_from([other * 3, "x %s y" % (other * 3), "x\\", "x \\", "\\\\", "%s x" % quote])
    lines = st.lists(st.one_of(LOOKALIKE, free, tricky), max_size=4).map("\n".join)
    return st.tuples(lines, st.sampled_from(["", quote, quote * 2])).map("".join)


VALUES = st.one_of(
    st.integers(-2 ** 63, 2 ** 63 - 1).map(str),
    st.booleans().map(lambda flag: "true" if flag else "false"),
    # No control characters: containerd 1.6's dump writes them unescaped, so no TOML parser could read its answer.
    st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=10).map(
        lambda text: json.dumps(text, ensure_ascii=False)),
    LOOKALIKE.map(lambda text: "'%s'" % text.replace("'", "")),
    _body('"').map(lambda body: '"""\n%s"""' % body),
    _body("'").map(lambda body: "'''\n%s'''" % body),
    st.lists(st.one_of(st.integers(0, 9).map(str), LOOKALIKE.map(json.dumps)), max_size=3).map(
        lambda items: "[\n    %s,\n  ]" % ",\n    ".join(["[%s]" % item for item in items] or ["[]"])),
    st.lists(LOOKALIKE.map(json.dumps), max_size=3).map(
        lambda items: "{ %s }" % ", ".join("k%d = %s" % pair for pair in enumerate(items))),
)


def toml_table(header, values):
    return header + "\n" + "".join("  v%d = %s  # note [x]\n" % (index, value) for index, value in enumerate(values))


def edit_generated(binary, folder, version, containerd_values, runc_values, systemd, default_runtime):
    """Writes a generated config of ``version`` (2: Debian's layout with "basic" keys; 3: containerd 2's with
    'literal' ones), edits it, and checks with ``binary``'s own config dump that only the intended keys
    changed; returns (text, edited text)."""
    plugin, quote = ("io.containerd.grpc.v1.cri", '"') if version == 2 else ("io.containerd.cri.v1.runtime", "'")
    table = "[plugins.%s%s%s.containerd" % (quote, plugin, quote)
    text = ("version = %d\n" % version + toml_table(table + "]", containerd_values)
            + "  default_runtime_name = %srunc%s\n" % (quote, quote)
            + toml_table(table + ".runtimes.runc.options]", runc_values)
            + "  SystemdCgroup = %s\n" % ("true" if systemd else "false"))
    (folder / "before.toml").write_text(text)
    # A file the judge itself cannot read is no case for it: containerd 1.6's TOML parser refuses some that
    # TOML 1.0 allows, such as a quote right before a multi-line string's closing delimiter.
    read = subprocess.run([str(binary), "--config", str(folder / "before.toml"), "config", "dump"],
                          capture_output=True, text=True, check=False)
    assume(read.returncode == 0)
    new, _settings = add_runtime(text, "config.toml", NVIDIA, default_runtime)
    (folder / "after.toml").write_text(new)
    before, after = tomllib.loads(read.stdout), dump(binary, folder / "after.toml")
    nvidia = after["plugins"][plugin]["containerd"]["runtimes"].pop("nvidia")
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert (nvidia["options"]["BinaryName"], nvidia["options"]["SystemdCgroup"]) == (NVIDIA, systemd)
    assert after["plugins"][plugin]["containerd"].pop("default_runtime_name") == \
        ("nvidia" if default_runtime else "runc")
    before["plugins"][plugin]["containerd"].pop("default_runtime_name")
    before.pop("imports", None), after.pop("imports", None)     # the dump names the file it read
    assert after == before
    return text, new
