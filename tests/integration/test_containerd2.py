"""containerd_runtime against a real containerd 2, built from the Go module proxy.

tools/containerd/build compiles github.com/containerd/containerd/v2 (pinned in
tools/containerd/go.mod) once per pin; every result below is read back with that binary's
`config dump`, which is what containerd 2 runs with: the main file with its imports merged in.
The molecule scenario container_toolkit_containerd2 runs the same binary as a daemon.
"""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.scv.gpu.plugins.modules import containerd_runtime
from harness.containerd import NVIDIA, VALUES, dump, edit_generated
from harness.containerd import containerd2 as built_containerd2
from harness.in_process import run_module

RUNTIME = "io.containerd.cri.v1.runtime"


@pytest.fixture(scope="session")
def containerd2():
    binary = built_containerd2()
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout
    assert " v2." in version, version
    return binary


def runtime_plugin(config):
    return config["plugins"][RUNTIME]


@pytest.fixture
def default_v3(containerd2, tmp_path):
    """containerd 2's own default config (version 3, single-quoted headers, imports of conf.d/*.toml),
    as a site tuned it: systemd cgroups on runc, and a drop-in that pins its own pause image."""
    text = subprocess.run([str(containerd2), "config", "default"], capture_output=True, text=True, check=True).stdout
    assert text.startswith("version = 3") and "imports = ['/etc/containerd/conf.d/*.toml']" in text
    assert "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]" in text
    dropins = tmp_path / "conf.d"
    dropins.mkdir()
    (dropins / "10-site.toml").write_text(
        "version = 3\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\n"
        "  sandbox = 'registry.example.com/pause:3.10'\n")
    text = text.replace("imports = ['/etc/containerd/conf.d/*.toml']", "imports = ['%s/*.toml']" % dropins)
    text = text.replace("SystemdCgroup = false", "SystemdCgroup = true")
    path = tmp_path / "config.toml"
    path.write_text("# site comment: keep me\n" + text)
    return path


def test_containerd2_default_config_gets_the_runtime_cdi_and_keeps_the_import(capsys, containerd2, default_v3):
    before = dump(containerd2, default_v3)
    assert "nvidia" not in runtime_plugin(before)["containerd"]["runtimes"]
    args = dict(path=str(default_v3), containerd=str(containerd2), default_runtime=True, enable_cdi=True)
    code, result = run_module(capsys, containerd_runtime, args)
    assert code == 0 and result["changed"] is True and result["version"] == 3, result
    config = dump(containerd2, default_v3)
    containerd = runtime_plugin(config)["containerd"]
    assert containerd["default_runtime_name"] == "nvidia"
    assert containerd["runtimes"]["nvidia"]["runtime_type"] == "io.containerd.runc.v2"
    assert containerd["runtimes"]["nvidia"]["options"]["BinaryName"] == NVIDIA
    assert containerd["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
    assert containerd["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    assert runtime_plugin(config)["enable_cdi"] is True
    # the import still decides the pause image, and nothing else moved
    assert config["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == \
        "registry.example.com/pause:3.10"
    assert default_v3.read_text().startswith("# site comment: keep me\n")
    code, again = run_module(capsys, containerd_runtime, args)
    assert code == 0 and again["changed"] is False, again


def test_kubernetes_docs_style_config(capsys, containerd2, tmp_path):
    """The systemd cgroup driver as the Kubernetes documentation configures containerd 2."""
    path = tmp_path / "config.toml"
    path.write_text("version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n"
                    "  runtime_type = 'io.containerd.runc.v2'\n"
                    "  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n"
                    "    SystemdCgroup = true\n")
    code, result = run_module(capsys, containerd_runtime, dict(path=str(path), containerd=str(containerd2), default_runtime=True))
    assert code == 0 and result["changed"] is True, result
    text = path.read_text()
    assert '"io.containerd.cri.v1.runtime"' not in text          # the file's own quoting is kept
    containerd = runtime_plugin(dump(containerd2, path))["containerd"]
    assert containerd["default_runtime_name"] == "nvidia"
    assert containerd["runtimes"]["nvidia"]["options"]["BinaryName"] == NVIDIA
    assert containerd["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True


def test_an_import_that_overrides_the_runtime_fails_and_containerd2_agrees(capsys, containerd2, default_v3):
    dropin = default_v3.parent / "conf.d" / "50-runtime.toml"
    dropin.write_text("version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n"
                      "  default_runtime_name = 'runc'\n")
    before = default_v3.read_text()
    code, result = run_module(capsys, containerd_runtime, dict(path=str(default_v3), containerd=str(containerd2), default_runtime=True))
    assert code == 1, result
    assert str(dropin) in result["msg"] and "default_runtime_name would be" in result["msg"], result["msg"]
    assert default_v3.read_text() == before
    # containerd 2 merges imports key by key, and the import wins, as the message says
    edited = before.replace("default_runtime_name = 'runc'", "default_runtime_name = 'nvidia'")
    assert edited != before
    default_v3.write_text(edited)
    assert runtime_plugin(dump(containerd2, default_v3))["containerd"]["default_runtime_name"] == "runc"


def test_a_version_2_file_edited_here_is_what_containerd2_runs(capsys, containerd2, tmp_path):
    """containerd 2 still reads version 2 files, migrating them in memory."""
    path = tmp_path / "config.toml"
    path.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
                    '  runtime_type = "io.containerd.runc.v2"\n'
                    '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
                    '    SystemdCgroup = true\n')
    code, result = run_module(capsys, containerd_runtime, dict(path=str(path), containerd=str(containerd2)))
    assert code == 0 and result["changed"] is True and result["version"] == 2, result
    runtimes = runtime_plugin(dump(containerd2, path))["containerd"]["runtimes"]
    assert runtimes["nvidia"]["options"]["BinaryName"] == NVIDIA
    assert runtimes["nvidia"]["options"]["SystemdCgroup"] is True


@settings(max_examples=30, deadline=None)
@given(containerd_values=st.lists(VALUES, max_size=4), runc_values=st.lists(VALUES, max_size=4),
       systemd=st.booleans(), default_runtime=st.booleans())
def test_generated_version_3_configs_keep_every_value_as_containerd_2_reads_them(
        containerd2, tmp_path_factory, containerd_values, runc_values, systemd, default_runtime):
    """The version 3 layout through the same generated values: only the intended keys change in containerd 2's dump."""
    edit_generated(containerd2, tmp_path_factory.mktemp("generated3"), 3, containerd_values, runc_values, systemd,
                   default_runtime)
