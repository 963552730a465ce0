"""containerd_runtime, in-process, with every result read back by a real containerd (`config dump`).

The containerd binary is Debian's package, unpacked under build/ (`apt-get download`), or the
one on PATH. Only `containerd config dump` and `config default` run: no daemon is started.
"""

from __future__ import annotations

import re
import subprocess
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.scv.gpu.plugins.module_utils.host.containerd import add_runtime
from ansible_collections.scv.gpu.plugins.modules import containerd_runtime
from harness.containerd import NVIDIA, VALUES, debian_containerd, dump, edit_generated
from harness.in_process import run_module

CRI = ("plugins", "io.containerd.grpc.v1.cri", "containerd")


@pytest.fixture(scope="session")
def containerd():
    return debian_containerd()


def cri(config):
    return config["plugins"]["io.containerd.grpc.v1.cri"]


@pytest.fixture
def site_config(containerd, tmp_path):
    """Debian containerd's default config as a site tuned it: systemd cgroups, its own pause image."""
    text = subprocess.run([str(containerd), "config", "default"], capture_output=True, text=True, check=True).stdout
    assert "SystemdCgroup = false" in text
    text = text.replace("SystemdCgroup = false", "SystemdCgroup = true")
    text = text.replace('sandbox_image = "registry.k8s.io/pause:3.6"', 'sandbox_image = "registry.example.com/pause:3.9"')
    text = "# site comment: keep me\n" + text
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_runtime_added_and_everything_else_kept(capsys, containerd, site_config):
    before_text = site_config.read_text()
    code, result = run_module(capsys, containerd_runtime, dict(path=str(site_config), containerd=str(containerd)))
    assert code == 0 and result["changed"] is True and result["version"] == 2, result
    config = dump(containerd, site_config)
    runtimes = cri(config)["containerd"]["runtimes"]
    assert runtimes["nvidia"]["runtime_type"] == "io.containerd.runc.v2"
    assert runtimes["nvidia"]["options"]["BinaryName"] == NVIDIA
    assert runtimes["nvidia"]["options"]["SystemdCgroup"] is True        # carried over from runc
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True          # runc kept
    assert cri(config)["sandbox_image"] == "registry.example.com/pause:3.9"
    assert cri(config)["containerd"]["default_runtime_name"] == "runc"
    after_text = site_config.read_text()
    assert after_text.startswith(before_text)                            # only appended: every line kept
    code, again = run_module(capsys, containerd_runtime, dict(path=str(site_config), containerd=str(containerd)))
    assert code == 0 and again["changed"] is False
    assert site_config.read_text() == after_text


def test_default_runtime_on_and_off(capsys, containerd, site_config):
    code, result = run_module(capsys, containerd_runtime, dict(path=str(site_config), containerd=str(containerd), default_runtime=True))
    assert code == 0 and result["changed"] is True
    assert cri(dump(containerd, site_config))["containerd"]["default_runtime_name"] == "nvidia"
    code, result = run_module(capsys, containerd_runtime, dict(path=str(site_config), containerd=str(containerd), default_runtime=False))
    assert code == 0 and result["changed"] is True
    config = dump(containerd, site_config)
    assert cri(config)["containerd"]["default_runtime_name"] == "runc"
    assert "nvidia" in cri(config)["containerd"]["runtimes"]


def test_missing_file_starts_from_containerd_defaults(capsys, containerd, tmp_path):
    path = tmp_path / "etc" / "containerd" / "config.toml"
    code, result = run_module(capsys, containerd_runtime, dict(path=str(path), containerd=str(containerd)))
    assert code == 0 and result["changed"] is True, result
    runtimes = cri(dump(containerd, path))["containerd"]["runtimes"]
    assert runtimes["nvidia"]["options"] == dict(runtimes["nvidia"]["options"], BinaryName=NVIDIA, SystemdCgroup=False)
    assert "runc" in runtimes


def test_a_containerd_whose_default_is_not_toml_is_named_not_the_missing_file(capsys, tmp_path):
    """A `containerd` that prints something else for `config default` (a wrapper, another program): the message
    names it; the site's file, which does not exist, is not blamed."""
    fake = tmp_path / "containerd"
    fake.write_text("#!/bin/sh\necho 'containerd: unknown command \"config\" [oops'\n")
    fake.chmod(0o755)
    path = tmp_path / "etc" / "containerd" / "config.toml"
    code, result = run_module(capsys, containerd_runtime, dict(path=str(path), containerd=str(fake)))
    assert code != 0 and not path.exists()
    assert result["msg"].startswith("%s is missing or empty, and `%s config default` printed no containerd "
                                    "configuration (" % (path, fake)), result["msg"]
    assert result["msg"].endswith("is %s containerd? Nothing was written" % fake), result["msg"]
    assert "fix it, the file was left untouched" not in result["msg"]


def test_check_mode_and_diff_write_nothing(capsys, containerd, site_config):
    before = site_config.read_bytes()
    args = dict(path=str(site_config), containerd=str(containerd), _ansible_check_mode=True, _ansible_diff=True)
    code, result = run_module(capsys, containerd_runtime, args)
    assert code == 0 and result["changed"] is True
    assert site_config.read_bytes() == before
    assert result["diff"]["before"] == before.decode()
    assert 'BinaryName = "%s"' % NVIDIA in result["diff"]["after"]


@pytest.mark.parametrize("text, message", [
    ('version = 2\n[plugins\n', "is not valid TOML"),
    ('[plugins]\n', "has config version (none)"),
    ('version = 1\n', "has config version 1"),
    ('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
     'runtimes = { runc = { runtime_type = "io.containerd.runc.v2" } }\n', "in a form this module does not edit"),
])
def test_unusable_config_is_refused_untouched(capsys, containerd, tmp_path, text, message):
    path = tmp_path / "config.toml"
    path.write_text(text)
    code, result = run_module(capsys, containerd_runtime, dict(path=str(path), containerd=str(containerd)))
    assert code == 1
    assert result["msg"].startswith(str(path)) and message in result["msg"]
    assert path.read_text() == text


def test_containerd_2_layout():
    """Config version 3 puts the runtimes under io.containerd.cri.v1.runtime (no containerd 2 binary here)."""
    text = ('version = 3\n\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]\n'
            '  SystemdCgroup = true\n')
    new, _settings = add_runtime(text, "config.toml", NVIDIA, True)
    config = tomllib.loads(new)
    containerd = config["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
    assert containerd["default_runtime_name"] == "nvidia"
    assert containerd["runtimes"]["nvidia"]["options"] == {"BinaryName": NVIDIA, "SystemdCgroup": True}
    assert containerd["runtimes"]["runc"]["options"] == {"SystemdCgroup": True}


def test_enable_cdi(capsys, containerd, site_config):
    code, result = run_module(capsys, containerd_runtime, dict(path=str(site_config), containerd=str(containerd), enable_cdi=True))
    assert code == 0 and result["changed"] is True, result
    config = tomllib.loads(site_config.read_text())
    assert cri(config)["enable_cdi"] is True
    dump(containerd, site_config)   # containerd 1.6 still accepts the file (it ignores the key)
    code, result = run_module(capsys, containerd_runtime, dict(path=str(site_config), containerd=str(containerd), enable_cdi=True))
    assert code == 0 and result["changed"] is False


# ------------------------------------------------------------ hostile and unlucky input

@pytest.mark.parametrize("text, message", [
    ("version = 2.0\n", "has version = 2.0, a float; containerd refuses it and reads only an integer: write version = 2"),
    ('version = "2"\n', 'has version = "2", a string; containerd reads only an integer there: write version = 2'),
    ("version = true\n", "has config version True"),
])
def test_a_version_containerd_would_not_read_is_refused(capsys, containerd, tmp_path, text, message):
    path = tmp_path / "config.toml"
    path.write_text(text)
    code, result = run_module(capsys, containerd_runtime, dict(path=str(path), containerd=str(containerd)))
    assert code == 1 and message in result["msg"], result["msg"]
    assert path.read_text() == text
    if text.startswith("version = 2.0"):   # the reason: containerd itself refuses the float
        assert subprocess.run([str(containerd), "--config", str(path), "config", "dump"], capture_output=True,
                              check=False).returncode != 0


def test_single_quoted_headers_of_the_kubernetes_docs_are_edited():
    """Config version 3 as the Kubernetes documentation writes it: literal-string keys in table headers."""
    text = ("version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'runc'\n"
            "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  SystemdCgroup = true\n")
    new, _settings = add_runtime(text, "config.toml", NVIDIA, True)
    assert new.count("[plugins.'io.containerd.cri.v1.runtime'.containerd]") == 1   # edited, not duplicated
    containerd = tomllib.loads(new)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
    assert containerd["default_runtime_name"] == "nvidia"
    assert containerd["runtimes"]["nvidia"]["options"] == {"BinaryName": NVIDIA, "SystemdCgroup": True}


def test_inline_comments_and_crlf_line_endings_are_kept(capsys, containerd, site_config):
    text = site_config.read_text().replace('default_runtime_name = "runc"',
                                           'default_runtime_name = "runc"  # chosen by the site, 2026')
    site_config.write_bytes(text.replace("\n", "\r\n").encode())
    code, result = run_module(capsys, containerd_runtime, dict(path=str(site_config), containerd=str(containerd), default_runtime=True))
    assert code == 0 and result["changed"] is True, result
    data = site_config.read_bytes()
    assert b'default_runtime_name = "nvidia"  # chosen by the site, 2026\r\n' in data
    assert data.count(b"\n") == data.count(b"\r\n")           # every line still ends in CRLF
    assert cri(dump(containerd, site_config))["containerd"]["default_runtime_name"] == "nvidia"


def test_text_inside_multi_line_strings_never_becomes_configuration():
    text = ('version = 2\nnote = """\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
            'default_runtime_name = "pretend"\n"""\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "runc"\n')
    new, _settings = add_runtime(text, "config.toml", NVIDIA, True)
    config = tomllib.loads(new)
    assert config["note"] == tomllib.loads(text)["note"]     # the string is untouched
    assert cri(config)["containerd"]["default_runtime_name"] == "nvidia"


def _with_import(site_config, dropin_text):
    dropins = site_config.parent / "conf.d"
    dropins.mkdir(exist_ok=True)
    (dropins / "50-site.toml").write_text(dropin_text)
    text = site_config.read_text().replace("imports = []", 'imports = ["%s/*.toml"]' % dropins)
    assert str(dropins) in text
    site_config.write_text(text)
    return dropins / "50-site.toml"


def test_an_import_that_overrides_the_edit_fails_and_names_it(capsys, containerd, site_config):
    dropin = _with_import(site_config, 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
                                       '  default_runtime_name = "runc"\n')
    before = site_config.read_text()
    code, result = run_module(capsys, containerd_runtime, dict(path=str(site_config), containerd=str(containerd), default_runtime=True))
    assert code == 1, result
    assert str(dropin) in result["msg"] and "default_runtime_name would be" in result["msg"]
    assert site_config.read_text() == before
    # what the message says is what containerd does: the import wins over the main file
    imports = 'imports = ["%s/*.toml"]' % dropin.parent
    edited, _settings = add_runtime(before.replace(imports, "imports = []"), str(site_config), NVIDIA, True)
    site_config.write_text(edited.replace("imports = []", imports))
    assert cri(dump(containerd, site_config))["containerd"]["default_runtime_name"] == "runc"


def test_an_import_that_already_holds_the_runtime_is_no_change(capsys, containerd, site_config):
    _with_import(site_config, subprocess.run(
        [str(containerd), "config", "default"], capture_output=True, text=True, check=True).stdout.replace(
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes]",
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes]\n\n"
        "        [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\n"
        "          runtime_type = \"io.containerd.runc.v2\"\n"
        "          [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n"
        "            BinaryName = \"%s\"\n            SystemdCgroup = true\n" % NVIDIA).replace(
        "SystemdCgroup = false", "SystemdCgroup = true"))
    before = site_config.read_text()
    assert "nvidia" in cri(dump(containerd, site_config))["containerd"]["runtimes"]
    code, result = run_module(capsys, containerd_runtime, dict(path=str(site_config), containerd=str(containerd)))
    assert code == 0 and result["changed"] is False, result
    assert site_config.read_text() == before


def test_arrays_spanning_lines_do_not_end_the_table():
    """A nested array spanning lines, with lines that look like headers, sits before the key to change."""
    text = ('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  snapshotter = "overlayfs"\n'
            '  x = [\n    [1, 2],\n    ["runtimes"],\n    { a = "[" },\n  ]\n  default_runtime_name = "runc"\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n')
    new, _settings = add_runtime(text, "config.toml", NVIDIA, True)
    config = tomllib.loads(new)
    assert cri(config)["containerd"]["default_runtime_name"] == "nvidia"
    assert cri(config)["containerd"]["x"] == tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["x"]
    assert new.count("default_runtime_name") == 1


@settings(max_examples=40, deadline=None)
@given(containerd_values=st.lists(VALUES, max_size=4), runc_values=st.lists(VALUES, max_size=4),
       systemd=st.booleans(), default_runtime=st.booleans())
def test_generated_configs_keep_every_value_as_containerd_reads_them(
        containerd, tmp_path_factory, containerd_values, runc_values, systemd, default_runtime):
    """Only the intended keys change, in what containerd's own `config dump` reads from the file."""
    text, new = edit_generated(containerd, tmp_path_factory.mktemp("generated"), 2, containerd_values, runc_values,
                               systemd, default_runtime)
    assert tomllib.loads(new)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"] == \
        tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]


def test_crun_as_the_default_gives_the_nvidia_runtime_its_cgroup_driver_and_base_spec(capsys, containerd, tmp_path):
    """Read back by Debian's containerd: with crun the default runtime, systemd cgroups and a base OCI spec on it,
    the nvidia runtime runs with both too (runc's own options, unset here, were all it took before)."""
    path = tmp_path / "config.toml"
    path.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "crun"\n'
                    '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun]\n'
                    '  runtime_type = "io.containerd.runc.v2"\n  base_runtime_spec = "/etc/containerd/base.json"\n'
                    '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun.options]\n'
                    '  BinaryName = "/usr/bin/crun"\n  SystemdCgroup = true\n')
    code, result = run_module(capsys, containerd_runtime, dict(path=str(path), containerd=str(containerd)))
    assert code == 0 and result["changed"] is True, result
    nvidia = cri(dump(containerd, path))["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"]["SystemdCgroup"] is True and nvidia["options"]["BinaryName"] == NVIDIA
    assert nvidia["base_runtime_spec"] == "/etc/containerd/base.json"


def test_nvidia_ctks_drop_in_keeps_the_settings_but_freezes_them(containerd, tmp_path):
    """Why this module edits the main file (docs/containerd.md): NVIDIA's own nvidia-ctk, run as its docs say on a
    containerd 1.x file with imports, copies the whole CRI section into its drop-in. containerd then runs with that
    copy, so nothing is lost at first, but a later edit of the main file's CRI settings no longer takes effect."""
    from harness.nvidia_toolkit import toolkit
    main = tmp_path / "config.toml"
    text = subprocess.run([str(containerd), "config", "default"], capture_output=True, text=True, check=True).stdout
    text = text.replace("SystemdCgroup = false", "SystemdCgroup = true", 1)
    text = re.sub(r'sandbox_image = ".*"', 'sandbox_image = "registry.example.com/pause:3.9"', text, count=1)
    main.write_text('imports = ["%s/conf.d/*.toml"]\n' % tmp_path + text.replace("imports = []\n", ""))
    done = subprocess.run([str(toolkit() / "nvidia-ctk"), "runtime", "configure", "--runtime=containerd",
                           "--config=%s" % main, "--drop-in-config=%s/conf.d/99-nvidia.toml" % tmp_path],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    cri_of = cri(dump(containerd, main))
    assert cri_of["sandbox_image"] == "registry.example.com/pause:3.9"             # kept: the drop-in copied it
    assert cri_of["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    assert "nvidia" in cri_of["containerd"]["runtimes"]
    main.write_text(main.read_text().replace("pause:3.9", "pause:3.10"))
    assert cri(dump(containerd, main))["sandbox_image"] == "registry.example.com/pause:3.9"   # the edit is lost
