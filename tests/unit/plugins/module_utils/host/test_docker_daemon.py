"""daemon.json on a host: the link written through, the unit's flags, and dockerd's own check of the file,
here against a stand-in dockerd that accepts or refuses as it is told."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.host.daemon_json import DaemonJsonError
from ansible_collections.scv.gpu.plugins.module_utils.host.docker_daemon import (
    check_with_dockerd,
    merged_daemon_json,
    read_document,
    written_path,
)

REFUSAL = "unable to configure the Docker daemon with file /tmp/x/daemon.json: the following directives don't " \
          "match any configuration option: nvidia-magic"


class StandInModule:
    """An AnsibleModule's params, tmpdir, get_bin_path and run_command (which really runs the command)."""

    def __init__(self, tmp_path, **params):
        self.tmpdir = str(tmp_path / "module-tmp")
        os.makedirs(self.tmpdir, exist_ok=True)
        self.params = dict(path=str(tmp_path / "daemon.json"), runtime_path="/usr/bin/nvidia-container-runtime",
                           runtime_args=[], default_runtime=True, settings={}, check_unit_flags=True,
                           validate="auto", dockerd="dockerd", unit="docker.service",
                           unit_search_paths=[str(tmp_path / "units")])
        self.params.update(params)
        self.validated = []

    def get_bin_path(self, name, opt_dirs=None):
        return None

    def run_command(self, command):
        self.validated.append(open(command[-1], encoding="utf-8").read())
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        return done.returncode, done.stdout, done.stderr


def dockerd(tmp_path, refuses=None):
    """A dockerd that accepts every file, refuses one holding ``refuses``, or (refuses=True) knows no --validate."""
    path = tmp_path / "dockerd"
    if refuses is True:
        body = 'echo "unknown flag: --validate" >&2; exit 125'
    else:
        body = 'if grep -q %s "$3"; then echo "%s" >&2; exit 1; fi; echo "configuration OK"' % (
            json.dumps(refuses or "never-there"), REFUSAL)
    path.write_text("#!/bin/sh\n%s\n" % body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_an_accepted_file_says_so(tmp_path):
    module = StandInModule(tmp_path)
    name = dockerd(tmp_path)
    assert check_with_dockerd(module, "/etc/docker/daemon.json", None, '{"a": 1}', name) == \
        "accepted by %s --validate" % name
    assert module.validated == ['{"a": 1}']


def test_a_refused_merge_names_the_reason_and_that_nothing_was_written(tmp_path):
    module = StandInModule(tmp_path)
    with pytest.raises(DaemonJsonError) as caught:
        check_with_dockerd(module, "/etc/docker/daemon.json", '{"a": 1}', '{"nvidia-magic": 1}',
                           dockerd(tmp_path, "nvidia-magic"))
    assert str(caught.value).startswith("the merged /etc/docker/daemon.json would be refused by Docker: ")
    assert "don't match any configuration option: nvidia-magic" in str(caught.value)
    assert "unable to configure" not in str(caught.value)
    assert module.validated == ['{"nvidia-magic": 1}', '{"a": 1}']


def test_a_file_refused_before_the_merge_is_blamed_on_the_file(tmp_path):
    module = StandInModule(tmp_path)
    with pytest.raises(DaemonJsonError, match=r"^/etc/docker/daemon.json is refused by Docker already, before"):
        check_with_dockerd(module, "/etc/docker/daemon.json", '{"nvidia-magic": 1}', '{"nvidia-magic": 1, "b": 2}',
                           dockerd(tmp_path, "nvidia-magic"))


@pytest.mark.parametrize("validate, says", [("auto", "not checked: this dockerd has no --validate"),
                                            ("always", None)])
def test_a_dockerd_that_cannot_check_is_said_or_refused_when_validate_is_always(tmp_path, validate, says):
    module = StandInModule(tmp_path)
    name = dockerd(tmp_path, refuses=True)
    if says:
        assert check_with_dockerd(module, "d.json", None, "{}", name, validate).startswith(says)
    else:
        with pytest.raises(DaemonJsonError, match="validate is always, but the new d.json cannot be checked"):
            check_with_dockerd(module, "d.json", None, "{}", name, validate)


def test_no_dockerd_at_all_is_not_checked(tmp_path):
    assert check_with_dockerd(StandInModule(tmp_path), "d.json", None, "{}", "dockerd") == \
        "not checked: no dockerd found (dockerd)"


def test_the_merge_is_checked_only_when_it_changes_something_and_validate_allows(tmp_path):
    name = dockerd(tmp_path)
    module = StandInModule(tmp_path, dockerd=name)
    update = merged_daemon_json(module)
    assert update["changed"] is True and update["previous"] is None
    assert update["validation"] == "accepted by %s --validate" % name
    assert json.loads(module.validated[0]) == update["config"] == json.loads(update["text"])
    path = tmp_path / "daemon.json"
    path.write_text(update["text"])
    again = merged_daemon_json(StandInModule(tmp_path, dockerd=name))
    assert again["changed"] is False and again["validation"] == "not checked: unchanged"
    path.write_text("{}")
    never = merged_daemon_json(StandInModule(tmp_path, dockerd=name, validate="never"))
    assert never["changed"] is True and never["validation"] == "not checked: validate is never"


def test_a_link_is_written_through_and_a_dangling_folder_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "daemon.json"
    link.symlink_to(tmp_path / "elsewhere" / "daemon.json")
    assert written_path(str(link)) == str(tmp_path / "elsewhere" / "daemon.json")
    assert written_path(str(tmp_path / "plain.json")) == str(tmp_path / "plain.json")
    link.unlink()
    link.symlink_to(tmp_path / "gone" / "daemon.json")
    with pytest.raises(DaemonJsonError, match="is a symbolic link to .*gone/daemon.json, whose folder does not exist"):
        written_path(str(link))


def test_a_file_that_is_not_utf8_is_named_with_the_byte(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(DaemonJsonError, match=r"daemon.json is not UTF-8 text \(byte 7\)"):
        read_document(str(path), str(path))
    path.write_text('{"a": 1}')
    assert read_document(str(path), str(path)) == ('{"a": 1}', {"a": 1})


def test_a_broken_file_behind_a_link_is_named_with_both(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text("{broken")
    link = tmp_path / "daemon.json"
    link.symlink_to(target)
    with pytest.raises(DaemonJsonError, match=r"%s \(-> %s\)" % (link, target)):
        read_document(str(link), str(target))
