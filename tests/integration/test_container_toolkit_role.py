"""The container_toolkit role's CRI-O drop-in and package choices, through ansible-playbook.

The molecule scenarios cover Docker and containerd in systemd containers. CRI-O has no
Debian 12 package, and the RHEL path needs an EL host, so these run the role's own task and
vars files on localhost: the drop-in is written to a temporary folder and read back with a
TOML parser, the package names are the ones the apt and dnf tasks receive.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib

import pytest

from harness.ansible import recap
from harness.paths import ROOT

CRIO_PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Run the role's CRI-O tasks
      ansible.builtin.include_role:
        name: scv.gpu.container_toolkit
        tasks_from: crio.yml
"""

PACKAGES_PLAY = """
- hosts: localhost
  gather_facts: false
  vars_files:
    - {root}/roles/container_toolkit/defaults/main.yml
    - {root}/roles/container_toolkit/vars/main.yml
  tasks:
"""


def run_crio(ansible, tmp_path, *extra):
    play = tmp_path / "crio.yml"
    play.write_text(CRIO_PLAY)
    dropin = tmp_path / "crio.conf.d" / "99-nvidia.toml"
    done = ansible.playbook(play, None, "-e", json.dumps({
        "container_toolkit_crio_dropin": str(dropin),
        "container_toolkit_restart_runtime": False,
    }), *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    return done, dropin


@pytest.mark.every_ansible_line
def test_crio_dropin_check_mode_writes_nothing(ansible, tmp_path):
    done, dropin = run_crio(ansible, tmp_path, "--check", "--diff")
    assert recap(done.stdout)["changed"] == 2
    assert 'runtime_path = "/usr/bin/nvidia-container-runtime"' in done.stdout
    assert not dropin.parent.exists()


@pytest.mark.every_ansible_line
def test_crio_dropin_adds_runtime_then_changes_nothing(ansible, tmp_path):
    first, dropin = run_crio(ansible, tmp_path)
    assert recap(first.stdout)["changed"] == 2
    assert tomllib.loads(dropin.read_text()) == {"crio": {"runtime": {
        "default_runtime": "nvidia",
        "runtimes": {"nvidia": {"runtime_path": "/usr/bin/nvidia-container-runtime", "runtime_type": "oci"}},
    }}}
    assert oct(dropin.stat().st_mode & 0o777) == "0o644"

    second = run_crio(ansible, tmp_path)[0]
    assert recap(second.stdout)["changed"] == 0


def test_crio_default_runtime_on_and_off(ansible, tmp_path):
    # key=value extra vars arrive as the strings "true" and "false", as from many inventories
    dropin = run_crio(ansible, tmp_path, "-e", "container_toolkit_crio_default_runtime=true")[1]
    assert tomllib.loads(dropin.read_text())["crio"]["runtime"]["default_runtime"] == "nvidia"

    off = run_crio(ansible, tmp_path, "--diff", "-e", "container_toolkit_crio_default_runtime=false")[0]
    assert recap(off.stdout)["changed"] == 1
    assert '-default_runtime = "nvidia"' in off.stdout
    assert "default_runtime" not in tomllib.loads(dropin.read_text())["crio"]["runtime"]


@pytest.mark.parametrize("version, apt, dnf", [
    ("", ["nvidia-container-toolkit", "nvidia-container-toolkit-base"],
     ["nvidia-container-toolkit", "nvidia-container-toolkit-base"]),
    ("1.17.8-1", ["nvidia-container-toolkit=1.17.8-1", "nvidia-container-toolkit-base=1.17.8-1"],
     ["nvidia-container-toolkit-1.17.8-1", "nvidia-container-toolkit-base-1.17.8-1"]),
])
def test_package_names_pin_both_packages(ansible, tmp_path, version, apt, dnf):
    play = tmp_path / "packages.yml"
    play.write_text(PACKAGES_PLAY.format(root=ROOT) + """
    - name: Show the package lists
      ansible.builtin.debug:
        msg: "{{ {'apt': container_toolkit_apt_packages, 'dnf': container_toolkit_dnf_packages} | to_json }}"
""")
    done = ansible.playbook(play, None, "-e", json.dumps({"container_toolkit_version": version}))
    assert done.returncode == 0, done.stdout + done.stderr
    shown = json.loads(done.stdout.split('"msg": ', 1)[1].split("\n", 1)[0])
    assert json.loads(shown) == {"apt": apt, "dnf": dnf}


DEV_CHAR_PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Run the role's /dev/char tasks
      ansible.builtin.include_role:
        name: scv.gpu.container_toolkit
        tasks_from: dev-char.yml
"""


def make_node(path, major, minor):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    os.mknod(str(path), 0o666 | stat.S_IFCHR, os.makedev(major, minor))


def run_dev_char(ansible, tmp_path, *extra):
    play = tmp_path / "dev-char.yml"
    play.write_text(DEV_CHAR_PLAY)
    done = ansible.playbook(play, None, "-e", json.dumps({
        "container_toolkit_dev": str(tmp_path / "dev"),
        "container_toolkit_dev_char_rule": str(tmp_path / "rules.d" / "71-nvidia-dev-char.rules"),
    }), *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_dev_char_links_check_mode_then_made_then_no_change_then_made_again_after_a_driver_reload(ansible, tmp_path):
    dev, rule = tmp_path / "dev", tmp_path / "rules.d" / "71-nvidia-dev-char.rules"
    for name, major, minor in (("nvidia0", 195, 0), ("nvidiactl", 195, 255), ("nvidia-uvm", 509, 0)):
        make_node(dev / name, major, minor)

    check = run_dev_char(ansible, tmp_path, "--check", "--diff")
    assert recap(check.stdout)["changed"] == 3          # the rules folder (a host without udev yet), the rule, the links
    assert "+195:0 -> ../nvidia0" in check.stdout and "+509:0 -> ../nvidia-uvm" in check.stdout
    assert not (dev / "char").exists() and not rule.parent.exists()

    done = run_dev_char(ansible, tmp_path)
    assert recap(done.stdout)["changed"] == 3
    assert {name: os.readlink(dev / "char" / name) for name in os.listdir(dev / "char")} == {
        "195:0": "../nvidia0", "195:255": "../nvidiactl", "509:0": "../nvidia-uvm"}
    assert rule.read_text().splitlines()[-1] == (
        'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
        'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"')
    assert stat.S_IMODE(rule.stat().st_mode) == 0o644
    assert recap(run_dev_char(ansible, tmp_path).stdout)["changed"] == 0

    # The driver reloaded: UVM came back at another major number, and its old link dangles.
    (dev / "nvidia-uvm").unlink()
    make_node(dev / "nvidia-uvm", 508, 0)
    check = run_dev_char(ansible, tmp_path, "--check")
    assert recap(check.stdout)["changed"] == 1 and not (dev / "char" / "508:0").exists()
    assert recap(run_dev_char(ansible, tmp_path).stdout)["changed"] == 1
    assert os.stat(dev / "char" / "508:0").st_rdev == os.makedev(508, 0)
    assert recap(run_dev_char(ansible, tmp_path).stdout)["changed"] == 0


def test_dev_char_links_module_names_what_is_in_the_way(ansible, tmp_path):
    dev = tmp_path / "dev"
    make_node(dev / "nvidia0", 195, 0)
    (dev / "char" / "195:0").mkdir(parents=True)
    ok, result = ansible.module({"dev": str(dev)}, name="scv.gpu.nvidia_dev_char_links")
    assert not ok
    assert result["msg"] == ("cannot link %s/char/195:0 to %s/nvidia0: Is a directory; remove what is at %s/char/195:0, "
                             "then run again" % (dev, dev, dev))
    assert result["links"][0]["state"] == "wrong"

    ok, result = ansible.module({"dev": str(tmp_path / "empty")}, name="scv.gpu.nvidia_dev_char_links")
    assert ok and result["changed"] is False and result["links"] == []
    assert result["message"].startswith("no NVIDIA device node in ")


ROLE_PLAY = """
- hosts: localhost
  gather_facts: false
  roles:
    - role: scv.gpu.container_toolkit
"""


@pytest.mark.every_ansible_line
@pytest.mark.parametrize("version, named", [
    ("1.17.8-1", ["CVE-2026-24260"]),
    ("1.16.1-1", ["CVE-2024-0132", "CVE-2025-23266", "CVE-2026-24260"]),
])
def test_a_toolkit_with_a_known_container_escape_is_refused_before_anything_changes(ansible, tmp_path, version, named):
    play = tmp_path / "toolkit.yml"
    play.write_text(ROLE_PLAY)
    daemon_json = tmp_path / "daemon.json"
    done = ansible.playbook(play, None, "-e", json.dumps({
        "container_toolkit_version": version, "container_toolkit_runtime": "docker",
        "container_toolkit_docker_daemon_json": str(daemon_json)}))
    said = " ".join(done.stdout.split())
    assert done.returncode != 0
    assert "container_toolkit_version %s predates the fixes of" % version in said
    assert all(cve in said for cve in named), said
    assert "Pin 1.19.1 or newer" in said and "https://nvidia.custhelp.com/app/answers/detail/a_id/5850" in said
    assert "container_toolkit_accept_vulnerable_version: true" in said and "Nothing was changed." in said
    # after the argument spec, the refusal is the first task: nothing ran before it
    assert recap(done.stdout)["changed"] == 0 and "Read the host's distribution" not in said, said
    tasks = [line for line in done.stdout.splitlines() if line.startswith("TASK [")]
    assert [task.split(" : ", 1)[1].split("]")[0] for task in tasks][1:] == [
        "Refuse a pinned toolkit release with a known container escape"] * 2, tasks
    assert not daemon_json.exists()


def test_a_current_release_or_no_pin_passes_the_refusal_and_an_accepted_one_warns(ansible, tmp_path):
    play = tmp_path / "refusal.yml"
    play.write_text("""
- hosts: localhost
  gather_facts: false
  tasks:
    - name: The role's refusal alone
      ansible.builtin.include_role:
        name: scv.gpu.container_toolkit
        tasks_from: refuse-vulnerable.yml
""")
    for version in ("", "1.19.1-1", "1.20.2-1", "1.21.0-1"):
        done = ansible.playbook(play, None, "-e", json.dumps({"container_toolkit_version": version}))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "WARNING" not in done.stdout
    accepted = ansible.playbook(play, None, "-e", json.dumps({"container_toolkit_version": "1.17.8-1",
                                                              "container_toolkit_accept_vulnerable_version": True}))
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "WARNING: nvidia-container-toolkit 1.17.8-1 is installed although it predates the fixes of " \
           "CVE-2026-24260" in " ".join(accepted.stdout.split())
