"""The apt_source role through ansible-playbook on this machine: refusals and check mode, which change nothing.

Its real runs (a new source, lists never downloaded, lists two hours old) are in the molecule
scenarios, where the roles that use it install packages in containers.
"""

from __future__ import annotations

import pathlib
import re

import pytest
import yaml

from harness.ansible import recap

SOURCE = pathlib.Path("/etc/apt/sources.list.d/scv-gpu-test-source.sources")
KEY = pathlib.Path("/etc/apt/keyrings/scv-gpu-test-source.asc")


def _play(tmp_path, **role_vars):
    path = tmp_path / "apt_source.yml"
    path.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "Add the source", "ansible.builtin.include_role": {"name": "scv.gpu.apt_source"}, "vars": role_vars},
        {"name": "Show readiness", "ansible.builtin.debug": {"msg": "ready={{ apt_source_ready }}"}},
    ]}]))
    return str(path)


def test_a_source_without_a_key_is_refused_before_anything_changes(ansible, tmp_path):
    done = ansible.playbook(_play(tmp_path, apt_source_name="scv-gpu-test-source",
                                  apt_source_uris=["http://deb.example.invalid/debian"],
                                  apt_source_suites=["bookworm"]), None, "--check")
    assert done.returncode != 0
    assert "apt refuses an unsigned source" in done.stdout and "http://deb.example.invalid/debian" in done.stdout
    assert not SOURCE.exists()


@pytest.mark.every_ansible_line
def test_a_bad_variable_fails_the_argument_spec(ansible, tmp_path):
    play = _play(tmp_path, apt_source_name="scv-gpu-test-source", apt_source_uris="not a list",
                 apt_source_suites=["bookworm"], apt_source_cache_valid_time="an hour")
    done = ansible.playbook(play, None, "--check")
    assert done.returncode != 0
    assert "apt_source_cache_valid_time" in done.stdout
    assert not SOURCE.exists()


@pytest.mark.every_ansible_line
def test_check_mode_on_a_new_source_reports_and_writes_nothing(ansible, tmp_path):
    done = ansible.playbook(_play(tmp_path, apt_source_name="scv-gpu-test-source",
                                  apt_source_uris=["http://deb.example.invalid/debian"], apt_source_suites=["bookworm"],
                                  apt_source_components=["main"], apt_source_packages=["hello"],
                                  apt_source_key_url="http://deb.example.invalid/key.asc"), None, "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    # the key and the package are reported as changes, by the file module and by dpkg's answer
    assert re.search(r"would fetch the signing key from http://deb\.example\.invalid/key\.asc\] \**\nchanged: ",
                     done.stdout), done.stdout
    # a new source needs new lists, which check mode cannot download: the caller is told to wait
    assert re.search(r"would install once the package lists are refreshed hello\] \**\nchanged: ", done.stdout)
    assert "ready=False" in done.stdout
    assert recap(done.stdout)["failed"] == 0
    assert not SOURCE.exists() and not KEY.exists()
