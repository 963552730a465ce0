"""docker_daemon_config's main(), in-process, on real files."""

from __future__ import annotations

import json
import os
import stat

import pytest

from ansible_collections.scv.gpu.plugins.modules import docker_daemon_config
from harness.in_process import run_module

SEED = {
    "exec-opts": ["native.cgroupdriver=systemd"],
    "log-driver": "json-file",
    "log-opts": {"max-size": "100m"},
    "storage-driver": "overlay2",
    "registry-mirrors": ["https://mirror.example.com"],
    "insecure-registries": ["registry.example.com:5000"],
    "features": {"buildkit": True},
    "runtimes": {"crun": {"path": "/usr/bin/crun"}},
    "x-site-owned": {"keep": [1, "me"]},
}
NVIDIA = {"path": "/usr/bin/nvidia-container-runtime", "runtimeArgs": []}


@pytest.fixture
def paths(tmp_path):
    units = tmp_path / "units"
    units.mkdir()
    return tmp_path / "docker" / "daemon.json", units


def args_for(paths, **extra):
    path, units = paths
    return dict(path=str(path), unit_search_paths=[str(units)], **extra)


def snapshot(path):
    info = path.stat()
    return path.read_bytes(), info.st_mtime_ns, info.st_ino


def test_missing_file_is_created(capsys, paths):
    path, _units = paths
    code, result = run_module(capsys, docker_daemon_config, args_for(paths))
    assert code == 0 and result["changed"] is True
    assert json.loads(path.read_text()) == {"runtimes": {"nvidia": NVIDIA}, "default-runtime": "nvidia"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 & ~current_umask()


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_seed_settings_and_foreign_keys_are_kept_and_rerun_changes_nothing(capsys, paths):
    path, _units = paths
    path.parent.mkdir()
    path.write_text(json.dumps(SEED, indent=2))
    code, result = run_module(capsys, docker_daemon_config, args_for(paths))
    assert code == 0 and result["changed"] is True
    on_disk = json.loads(path.read_text())
    expected = json.loads(json.dumps(SEED))
    expected["runtimes"]["nvidia"] = NVIDIA
    expected["default-runtime"] = "nvidia"
    assert on_disk == expected
    assert path.read_text().startswith('{\n  "exec-opts"')     # indentation kept
    before = snapshot(path)
    code, result = run_module(capsys, docker_daemon_config, args_for(paths))
    assert code == 0 and result["changed"] is False
    assert snapshot(path) == before


@pytest.mark.parametrize("text, message", [
    ('{"debug": true,,}', "is not valid JSON: Expecting property name enclosed in double quotes at line 1, column 16"),
    ('["not", "an", "object"]', "holds a JSON array at the top level"),
    ('{"a": 1, "a": 2}', 'the key "a" appears more than once'),
])
def test_bad_file_is_refused_and_left_untouched(capsys, paths, text, message):
    path, _units = paths
    path.parent.mkdir()
    path.write_text(text)
    before = snapshot(path)
    code, result = run_module(capsys, docker_daemon_config, args_for(paths))
    assert code == 1
    assert result["msg"].startswith(str(path))
    assert message in result["msg"]
    assert snapshot(path) == before
    assert sorted(os.listdir(path.parent)) == ["daemon.json"]   # no temporary file left behind


def test_owner_and_mode_are_kept(capsys, paths):
    path, _units = paths
    path.parent.mkdir()
    path.write_text("{}")
    os.chmod(path, 0o600)
    os.chown(path, 65534, 65534)
    code, result = run_module(capsys, docker_daemon_config, args_for(paths))
    assert code == 0 and result["changed"] is True
    info = path.stat()
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o600, 65534, 65534)


def test_backup_keeps_the_previous_file(capsys, paths):
    path, _units = paths
    path.parent.mkdir()
    path.write_text('{"debug": true}\n')
    code, result = run_module(capsys, docker_daemon_config, args_for(paths, backup=True))
    assert code == 0 and result["changed"] is True
    with open(result["backup_file"], encoding="utf-8") as backup:
        assert backup.read() == '{"debug": true}\n'


def test_check_mode_and_diff_write_nothing(capsys, paths):
    path, _units = paths
    path.parent.mkdir()
    path.write_text('{\n    "debug": true\n}\n')
    before = snapshot(path)
    code, result = run_module(capsys, docker_daemon_config, args_for(paths, _ansible_check_mode=True, _ansible_diff=True))
    assert code == 0 and result["changed"] is True
    assert snapshot(path) == before
    assert result["diff"]["before"] == '{\n    "debug": true\n}\n'
    assert json.loads(result["diff"]["after"]) == {"debug": True, "runtimes": {"nvidia": NVIDIA},
                                                   "default-runtime": "nvidia"}


def test_check_mode_on_a_fresh_host(capsys, paths):
    path, _units = paths
    code, result = run_module(capsys, docker_daemon_config, args_for(paths, _ansible_check_mode=True))
    assert code == 0 and result["changed"] is True
    assert not path.exists()


def test_setting_also_given_as_dockerd_flag_fails_before_writing(capsys, paths):
    path, units = paths
    (units / "docker.service").write_text(
        "[Service]\nExecStart=/usr/bin/dockerd -H fd:// --default-runtime=runc --log-driver journald\n")
    path.parent.mkdir()
    path.write_text('{"log-driver": "json-file"}')
    before = snapshot(path)
    code, result = run_module(capsys, docker_daemon_config, args_for(paths))
    assert code == 1
    assert result["msg"].startswith("%s would set default-runtime, log-driver, which dockerd also gets as a flag"
                                    % path)
    assert "%s: --default-runtime" % (units / "docker.service") in result["msg"]
    assert snapshot(path) == before
    code, result = run_module(capsys, docker_daemon_config, args_for(paths, check_unit_flags=False))
    assert code == 0 and result["changed"] is True


def test_extra_settings_merge(capsys, paths):
    path, _units = paths
    path.parent.mkdir()
    path.write_text('{"log-opts": {"max-file": "3"}, "default-runtime": "crun"}')
    settings = {"log-opts": {"max-size": "100m"}, "storage-driver": "overlay2"}
    code, result = run_module(capsys, docker_daemon_config, args_for(paths, default_runtime=False, settings=settings))
    assert code == 0, result
    assert json.loads(path.read_text()) == {
        "log-opts": {"max-file": "3", "max-size": "100m"}, "default-runtime": "crun",
        "storage-driver": "overlay2", "runtimes": {"nvidia": NVIDIA}}


# ------------------------------------------------------------ hostile and unlucky input

@pytest.mark.parametrize("text, message", [
    ('{"mtu": 1e400}', "1e400 at line 1, column 9 is not a number dockerd can read"),
    ('{"mtu": NaN}', "NaN at line 1, column 9 is not a number dockerd can read"),
    ('{"a": ' + "[" * 3000 + "]" * 3000 + "}", "nests arrays or objects"),
])
def test_unholdable_numbers_and_deep_nesting_are_refused_and_left_untouched(capsys, paths, text, message):
    path, _units = paths
    path.parent.mkdir()
    path.write_text(text)
    before = snapshot(path)
    code, result = run_module(capsys, docker_daemon_config, args_for(paths))
    assert code == 1 and message in result["msg"] and str(path) in result["msg"]
    assert snapshot(path) == before


def test_a_json_true_replaces_a_one_and_the_rerun_is_clean(capsys, paths):
    path, _units = paths
    path.parent.mkdir()
    path.write_text(json.dumps({"debug": 1, "live-restore": 1.0, "runtimes": {"nvidia": NVIDIA},
                                "default-runtime": "nvidia"}))
    code, result = run_module(capsys, docker_daemon_config, args_for(paths, settings={"debug": True, "live-restore": 1}))
    assert code == 0 and result["changed"] is True
    on_disk = json.loads(path.read_text())
    assert on_disk["debug"] is True
    assert isinstance(on_disk["live-restore"], int) and not isinstance(on_disk["live-restore"], bool)
    assert result["config"] == on_disk
    code, result = run_module(capsys, docker_daemon_config, args_for(paths, settings={"debug": True, "live-restore": 1}))
    assert code == 0 and result["changed"] is False


def test_lone_surrogate_escapes_survive_two_runs(capsys, paths):
    path, _units = paths
    path.parent.mkdir()
    path.write_text('{"labels": ["tag=\\udc80", "x=\\ud800"]}')
    code, result = run_module(capsys, docker_daemon_config, args_for(paths))
    assert code == 0 and result["changed"] is True
    path.read_bytes().decode("utf-8")
    assert json.loads(path.read_text())["labels"] == ["tag=\udc80", "x=\ud800"]
    code, result = run_module(capsys, docker_daemon_config, args_for(paths))
    assert code == 0 and result["changed"] is False


def test_a_symlinked_daemon_json_is_written_through_and_stays_a_link(capsys, paths, tmp_path):
    path, _units = paths
    kept = tmp_path / "config" / "docker-daemon.json"
    kept.parent.mkdir()
    kept.write_text(json.dumps({"log-driver": "journald"}))
    path.parent.mkdir()
    path.symlink_to(kept)
    code, result = run_module(capsys, docker_daemon_config, args_for(paths, backup=True))
    assert code == 0 and result["changed"] is True
    assert path.is_symlink() and os.readlink(path) == str(kept)
    assert result["written_path"] == str(kept)
    assert json.loads(kept.read_text())["log-driver"] == "journald"
    assert json.loads(kept.read_text())["default-runtime"] == "nvidia"
    assert result["backup_file"].startswith(str(kept))
    code, result = run_module(capsys, docker_daemon_config, args_for(paths))
    assert code == 0 and result["changed"] is False


def test_a_link_into_a_missing_folder_is_refused(capsys, paths, tmp_path):
    path, _units = paths
    path.parent.mkdir()
    path.symlink_to(tmp_path / "gone" / "daemon.json")
    code, result = run_module(capsys, docker_daemon_config, args_for(paths))
    assert code == 1 and "is a symbolic link to" in result["msg"] and "nothing was written" in result["msg"]
    assert path.is_symlink() and not (tmp_path / "gone").exists()


def test_a_runtime_added_by_flag_is_no_conflict(capsys, paths):
    path, units = paths
    (units / "docker.service").write_text(
        "[Service]\nExecStart=/usr/bin/dockerd -H fd:// --add-runtime crun=/usr/bin/crun\n")
    code, result = run_module(capsys, docker_daemon_config, args_for(paths))
    assert code == 0 and result["changed"] is True
    (units / "docker.service").write_text(
        "[Service]\nExecStart=/usr/bin/dockerd --add-runtime nvidia=/usr/bin/nvidia-container-runtime\n")
    code, result = run_module(capsys, docker_daemon_config, args_for(paths))
    assert code == 1 and "runtimes.nvidia" in result["msg"]


def test_a_setting_that_contradicts_default_runtime_fails(capsys, paths):
    path, _units = paths
    code, result = run_module(capsys, docker_daemon_config, args_for(paths, settings={"default-runtime": "runc"}))
    assert code == 1 and "default_runtime is true" in result["msg"]
    assert not path.exists()
