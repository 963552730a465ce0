"""The host's TOML parser: tomllib (Python 3.11+), else tomli (python3-tomli on Ubuntu 22.04's Python 3.10 and
Debian), else none, where parse() refuses and containerd_config_info reads only version and imports (host.toml_keys).

Each case imports host.containerd and the host-side code that takes its parser from it afresh, on a Python where the
modules named cannot be imported (None in sys.modules); the copies the other tests use are put back afterwards.
"""

from __future__ import annotations

import importlib
import sys
import tomllib
import types

import pytest
import tomli

from harness.in_process import run_module

PREFIX = "ansible_collections.scv.gpu.plugins."
FRESH = ("module_utils.host.containerd", "modules.containerd_config_info", "module_utils.node.validation_host")
V3 = ("plugins", "io.containerd.cri.v1.runtime", "containerd")
NVIDIA = "/usr/bin/nvidia-container-runtime"
NESTED = """version = 3

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  SystemdCgroup = true
"""


@pytest.fixture
def host_python(monkeypatch):
    """hiding(*names): the modules of FRESH, by their last name, imported anew where ``names`` cannot be imported."""
    def hiding(*names):
        for name in FRESH:
            # the copy the other tests hold (imported, with what it imports, while nothing is hidden), put back at
            # the end: in sys.modules and as its package's attribute
            package, child = (PREFIX + name).rsplit(".", 1)
            module = importlib.import_module(PREFIX + name)
            monkeypatch.setattr(sys.modules[package], child, module)
        for name in names:
            monkeypatch.setitem(sys.modules, name, None)
        for name in FRESH:
            monkeypatch.delitem(sys.modules, PREFIX + name)
        return types.SimpleNamespace(**{name.rsplit(".", 1)[1]: importlib.import_module(PREFIX + name)
                                        for name in FRESH})
    return hiding


def test_without_tomllib_tomli_parses_the_whole_config(host_python):
    host = host_python("tomllib")
    assert host.containerd.tomllib is tomli
    assert host.containerd_config_info.tomllib is tomli and host.validation_host.tomllib is tomli
    config = host.containerd.parse(NESTED, "config.toml")
    assert config == tomllib.loads(NESTED)
    assert host.containerd.lookup(config, V3 + ("runtimes", "runc", "options", "SystemdCgroup")) is True
    with pytest.raises(host.containerd.ContainerdConfigError, match="c.toml is not valid TOML"):
        host.containerd.parse('version = 3\n[plugins."io.containerd.cri.v1.runtime"\n', "c.toml")


def test_without_tomllib_the_runtime_is_added_from_what_tomli_read(host_python):
    host = host_python("tomllib")
    new, settings = host.containerd.add_runtime(NESTED, "config.toml", NVIDIA, default_runtime=True)
    containerd = host.containerd.lookup(tomllib.loads(new), V3)
    # SystemdCgroup comes from runc's nested options table, which only a whole parse reads
    assert containerd["runtimes"]["nvidia"]["options"] == {"BinaryName": NVIDIA, "SystemdCgroup": True}
    assert containerd["default_runtime_name"] == "nvidia" and (V3, "default_runtime_name", "nvidia") in settings


def test_without_tomllib_validation_reads_containerds_runtimes_with_tomli(host_python, tmp_path):
    host = host_python("tomllib")
    path = tmp_path / "config.toml"
    path.write_text(NESTED.replace('"runc"', '"nvidia"', 1) + '[plugins."io.containerd.cri.v1.runtime".containerd'
                    '.runtimes.nvidia.options]\n  BinaryName = "%s"\n' % NVIDIA)
    assert host.validation_host._containerd(str(path)) == ("nvidia", {"runc": "runc", "nvidia": NVIDIA})


def test_with_neither_parse_refuses_and_names_python3_tomli(host_python, tmp_path):
    host = host_python("tomllib", "tomli")
    assert host.containerd.tomllib is None and host.validation_host.tomllib is None
    with pytest.raises(host.containerd.ContainerdConfigError,
                       match=r"reading c.toml needs Python 3.11 or newer, or the host's python3-tomli package"):
        host.containerd.parse(NESTED, "c.toml")
    path = tmp_path / "config.toml"
    path.write_text("accept-nvidia-visible-devices-as-volume-mounts = true\n")
    found = host.validation_host._isolation_check("gpu-a", str(path))
    assert found["outcome"] == "skipped" and "python3-tomli" in found["reason"]


def _containerd_dir(tmp_path, main):
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "10-site.toml").write_text(NESTED)
    (tmp_path / "conf.d" / "20-broken.toml").write_text('version = 3\n[plugins."io.containerd.cri.v1.runtime"\n')
    path = tmp_path / "config.toml"
    path.write_text(main + 'imports = ["conf.d/*.toml"]\n\n' + NESTED.split("\n", 1)[1])
    return str(path)


def test_containerd_config_info_parses_with_tomli_and_falls_back_to_the_top_level_keys(
        host_python, capsys, tmp_path):
    main = _containerd_dir(tmp_path, "version = 0x3\n")      # TOML's hexadecimal 3, which toml_keys does not read
    code, result = run_module(capsys, host_python("tomllib").containerd_config_info, {"path": main})
    # tomli reads every file whole: the broken table in an import is found on the host
    assert code == 1 and "20-broken.toml is not valid TOML" in result["msg"]
    (tmp_path / "conf.d" / "20-broken.toml").unlink()
    code, result = run_module(capsys, host_python("tomllib").containerd_config_info, {"path": main})
    assert code == 0 and result["version"] == 3 and len(result["imports"]) == 1

    neither = host_python("tomllib", "tomli").containerd_config_info
    code, result = run_module(capsys, neither, {"path": main})
    assert code == 1 and "version = 0x3 is not an integer" in result["msg"] and "python3-tomli" in result["msg"]
    (tmp_path / "conf.d" / "20-broken.toml").write_text('version = 3\n[plugins."io.containerd.cri.v1.runtime"\n')
    (tmp_path / "config.toml").write_text((tmp_path / "config.toml").read_text().replace("0x3", "3"))
    code, result = run_module(capsys, neither, {"path": main})
    # only version and imports are read on the host; the texts go to the controller whole, the broken one too
    assert code == 0 and result["version"] == 3
    assert [entry["path"][len(str(tmp_path)) + 1:] for entry in result["imports"]] == [
        "conf.d/10-site.toml", "conf.d/20-broken.toml"]
