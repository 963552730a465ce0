"""The nvidia_driver role's nvidia_driver_module_params (tasks/module-params.yml) on a prepared host.

The kernel is a prepared sysfs and procfs (nvidia loaded, with nvidia_uvm, nvidia_modeset and nvidia_drm
using it, and /proc/driver/nvidia/params as the driver prints it), and a stand-in modprobe, first in PATH,
that acts on them as the kernel would: it refuses to unload a module that another module uses or that a
process holds open (an fd on a /dev/nvidia* node), and loads nvidia with the options of the modprobe.d
file. The whole host method (install, reboot decision) runs in molecule (extensions/molecule/nvidia_driver_host).
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from harness.ansible import recap

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Run the role's module-params tasks
      ansible.builtin.include_role:
        name: scv.gpu.nvidia_driver
        tasks_from: module-params

    - name: Decide as host.yml does, for a host that runs its installed driver
      ansible.builtin.set_fact:
        scv_test_decision: "{{ {} | scv.gpu.nvidia_driver_reboot(policy, 'ssh', pending=nvidia_driver_module_params_pending) }}"

    - name: Keep what the tests read
      ansible.builtin.copy:
        dest: "{{ out }}"
        content: "{{ {'pending': nvidia_driver_module_params_pending, 'decision': scv_test_decision} | to_json }}"
        mode: "0644"
      check_mode: false
      changed_when: false
"""

# As the driver prints /proc/driver/nvidia/params: registry keys without NVreg_, numbers with %u.
PARAMS = {"ResmanDebugLevel": "4294967295", "EnableStreamMemOPs": "0", "RestrictProfilingToAdminUsers": "1",
          "CoherentGPUMemoryMode": '""', "RmMsg": '""'}

MODPROBE = r'''#!/usr/bin/env python3
"""stand-in modprobe for the tests: -r MODULE... and MODULE, on SCV_TEST_SYSFS and SCV_TEST_PROCFS."""
import json, os, re, shutil, sys
sysfs, procfs, conf = os.environ["SCV_TEST_SYSFS"], os.environ["SCV_TEST_PROCFS"], os.environ["SCV_TEST_CONF"]
with open(os.environ["SCV_TEST_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\n")
USERS = json.loads(os.environ["SCV_TEST_USERS"])      # module -> the modules it uses
def held():
    for pid in filter(str.isdigit, os.listdir(procfs)):
        fds = os.path.join(procfs, pid, "fd")
        for fd in os.listdir(fds) if os.path.isdir(fds) else []:
            if os.readlink(os.path.join(fds, fd)).startswith("/dev/nvidia"):
                return True
    return False
if sys.argv[1] == "-r":
    for name in sys.argv[2:]:
        folder = os.path.join(sysfs, "module", name)
        if not os.path.isdir(folder):
            continue
        busy = os.path.exists(os.path.join(folder, "refcnt")) and open(os.path.join(folder, "refcnt")).read().strip() != "0"
        if os.listdir(os.path.join(folder, "holders")) or busy or (name == "nvidia" and held()):
            sys.exit("modprobe: FATAL: Module %s is in use." % name)
        shutil.rmtree(folder)
        for used in USERS.get(name, []):
            os.unlink(os.path.join(sysfs, "module", used, "holders", name))
        if name == "nvidia":
            os.unlink(os.path.join(procfs, "driver", "nvidia", "params"))
    sys.exit(0)
name = sys.argv[1]
folder = os.path.join(sysfs, "module", name)
if os.path.isdir(folder):
    sys.exit(0)
for used in USERS.get(name, []):
    if not os.path.isdir(os.path.join(sysfs, "module", used)):
        sys.exit("stand-in modprobe: load %s first" % used)
os.makedirs(os.path.join(folder, "holders"))
for used in USERS.get(name, []):
    os.symlink("../../" + name, os.path.join(sysfs, "module", used, "holders", name))
if name == "nvidia":
    params = json.loads(os.environ["SCV_TEST_PARAMS"])
    text = open(conf).read() if os.path.exists(conf) else ""
    for line in text.splitlines():
        words = line.split()
        if words[:2] == ["options", "nvidia"]:
            for option in words[2:]:
                key, _sep, value = option.partition("=")
                params[re.sub("^NVreg_", "", key)] = value
    with open(os.path.join(procfs, "driver", "nvidia", "params"), "w") as handle:
        handle.write("".join("%s: %s\n" % item for item in params.items()))
'''

USERS = {"nvidia_uvm": ["nvidia"], "nvidia_modeset": ["nvidia"], "nvidia_drm": ["nvidia_modeset"]}


@pytest.fixture
def node(tmp_path, monkeypatch):
    """The prepared kernel, the stand-in modprobe first in PATH, and a runner of the play."""
    sysfs, procfs, conf = tmp_path / "sys", tmp_path / "proc", tmp_path / "modprobe.d" / "scv-gpu-nvidia.conf"
    (procfs / "driver" / "nvidia").mkdir(parents=True)
    conf.parent.mkdir()
    (procfs / "driver" / "nvidia" / "params").write_text("".join("%s: %s\n" % item for item in PARAMS.items()))
    for name in ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"):
        (sysfs / "module" / name / "holders").mkdir(parents=True)
    for name, used in USERS.items():
        for module in used:
            (sysfs / "module" / module / "holders" / name).symlink_to("../../%s" % name)
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "modprobe").write_text(MODPROBE)
    (tools / "modprobe").chmod(0o755)
    log = tmp_path / "modprobe.log"
    for key, value in (("SYSFS", sysfs), ("PROCFS", procfs), ("CONF", conf), ("LOG", log),
                       ("USERS", json.dumps(USERS)), ("PARAMS", json.dumps(PARAMS))):
        monkeypatch.setenv("SCV_TEST_" + key, str(value))
    monkeypatch.setenv("PATH", "%s:%s" % (tools, os.environ["PATH"]))
    play = tmp_path / "play.yml"
    play.write_text(PLAY)

    class Node:
        path, initramfs, out = conf, tmp_path / "initramfs-rebuilt", tmp_path / "out.json"

        def __init__(self):
            self.sysfs, self.procfs, self.log = sysfs, procfs, log

        def run(self, ansible, params, *extra, policy="never"):
            settings = {"nvidia_driver_module_params": params, "nvidia_driver_sysfs": str(sysfs),
                        "nvidia_driver_procfs": str(procfs), "nvidia_driver_module_params_file": str(conf),
                        "nvidia_driver_plan": {"initramfs_command": ["touch", str(self.initramfs)]},
                        "policy": policy, "out": str(self.out)}
            if self.out.exists():
                self.out.unlink()
            return ansible.playbook(play, None, "-e", json.dumps(settings), *extra)

        def running(self, key):
            for line in (procfs / "driver" / "nvidia" / "params").read_text().splitlines():
                name, _sep, value = line.partition(": ")
                if name == key:
                    return value
            return None

        def calls(self):
            return log.read_text().splitlines() if log.exists() else []

        def hold(self, pid, command, device="/dev/nvidia0"):
            (procfs / str(pid) / "fd").mkdir(parents=True)
            (procfs / str(pid) / "cmdline").write_text(command + "\0")
            (procfs / str(pid) / "fd" / "3").symlink_to(device)

        def report(self):
            return json.loads(self.out.read_text())

    return Node()


WANTED = {"NVreg_EnableStreamMemOPs": 1, "NVreg_RestrictProfilingToAdminUsers": False}
LINE = "options nvidia NVreg_EnableStreamMemOPs=1 NVreg_RestrictProfilingToAdminUsers=0\n"
UNLOAD = "-r nvidia_drm nvidia_modeset nvidia_uvm nvidia"
LOADS = ["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]


@pytest.mark.every_ansible_line
def test_an_idle_node_is_reloaded_with_the_options_check_mode_first_then_a_rerun_changes_nothing(ansible, node):
    check = node.run(ansible, WANTED, "--check", "--diff")
    assert check.returncode == 0, check.stdout + check.stderr
    assert recap(check.stdout)["changed"] == 2, check.stdout  # the file, and the reload the read reports
    assert "+options nvidia NVreg_EnableStreamMemOPs=1" in check.stdout
    assert ("check mode: the loaded nvidia module runs with NVreg_EnableStreamMemOPs=0 (1 wanted), "
            "NVreg_RestrictProfilingToAdminUsers=1 (0 wanted), and no process holds a GPU: reloading nvidia_drm, "
            "nvidia_modeset, nvidia_uvm, nvidia") in check.stdout
    assert not node.path.exists() and node.calls() == [] and not node.initramfs.exists()
    assert node.running("EnableStreamMemOPs") == "0"

    done = node.run(ansible, WANTED)
    assert done.returncode == 0, done.stdout + done.stderr
    assert node.path.read_text().splitlines()[1:] == [LINE.strip()]
    assert node.path.read_text().startswith("# Managed by the scv.gpu.nvidia_driver role")
    assert stat.S_IMODE(node.path.stat().st_mode) == 0o644
    assert node.calls() == [UNLOAD] + LOADS
    assert (node.running("EnableStreamMemOPs"), node.running("RestrictProfilingToAdminUsers")) == ("1", "0")
    assert sorted(os.listdir(node.sysfs / "module" / "nvidia" / "holders")) == ["nvidia_modeset", "nvidia_uvm"]
    assert node.initramfs.exists()                    # the initramfs carries modprobe.d
    assert node.report() == {"pending": [], "decision": {"reboot": False, "reasons": [], "message": "no reboot is needed"}}

    node.initramfs.unlink()
    again = node.run(ansible, WANTED)
    assert again.returncode == 0, again.stdout + again.stderr
    assert recap(again.stdout)["changed"] == 0
    assert node.calls() == [UNLOAD] + LOADS and not node.initramfs.exists()
    assert "the loaded nvidia module runs with the options of %s" % node.path in again.stdout


def test_a_held_gpu_leaves_the_module_loaded_and_the_options_wait_for_a_reboot(ansible, node):
    node.hold(4242, "/usr/bin/python3")
    reason = ("the loaded nvidia module runs with NVreg_EnableStreamMemOPs=0 (1 wanted), "
              "NVreg_RestrictProfilingToAdminUsers=1 (0 wanted), and processes hold the GPUs (4242 python3), so it "
              "is not reloaded: the options of %s take effect at the next boot" % node.path)
    check = node.run(ansible, WANTED, "--check", policy="auto")
    assert check.returncode == 0, check.stdout + check.stderr
    assert recap(check.stdout)["changed"] == 1        # the file only: a reboot is no change of these tasks
    assert node.report()["pending"] == [reason]

    done = node.run(ansible, WANTED)
    assert done.returncode == 0, done.stdout + done.stderr
    assert node.path.read_text().endswith(LINE)
    assert node.calls() == [] and node.running("EnableStreamMemOPs") == "0"
    report = node.report()
    assert report["pending"] == [reason]
    assert report["decision"] == {"reboot": False, "reasons": [reason], "message": "a reboot is needed (%s), and "
                                  "nvidia_driver_reboot is never: reboot this host yourself" % reason}

    again = node.run(ansible, WANTED, policy="auto")
    assert again.returncode == 0, again.stdout + again.stderr
    assert recap(again.stdout)["changed"] == 0 and node.calls() == []
    assert node.report()["decision"] == {"reboot": True, "reasons": [reason], "message": "rebooting: " + reason}


def test_a_failed_unload_loads_every_module_again_and_the_options_wait_for_a_reboot(ansible, node):
    """A user of nvidia that no process shows (the stand-in reads a refcnt other than 0 as one, as for a user
    inside the kernel) keeps it loaded: the modules unloaded before it are loaded again, and the options wait
    for a reboot, with modprobe's words."""
    (node.sysfs / "module" / "nvidia" / "refcnt").write_text("1\n")
    done = node.run(ansible, {"NVreg_EnableStreamMemOPs": 1})
    assert done.returncode == 0, done.stdout + done.stderr
    assert node.calls() == [UNLOAD] + LOADS
    assert sorted(os.listdir(node.sysfs / "module")) == ["nvidia", "nvidia_drm", "nvidia_modeset", "nvidia_uvm"]
    assert node.report()["pending"] == [
        "modprobe -r nvidia_drm nvidia_modeset nvidia_uvm nvidia failed (modprobe: FATAL: Module nvidia is in "
        "use.), so the nvidia module still runs with NVreg_EnableStreamMemOPs=0: the options of %s take effect at the "
        "next boot" % node.path]


@pytest.mark.every_ansible_line
@pytest.mark.parametrize("params, message", [
    ({"EnableStreamMemOPs": 1, "NVreg_A": "x y"},
     "nvidia_driver_module_params: EnableStreamMemOPs: the nvidia module's options are named NVreg_<key>: write "
     "NVreg_EnableStreamMemOPs; nvidia_driver_module_params: NVreg_A: 'x y' holds whitespace, a quote or a "
     "backslash, which modprobe.d cannot carry in one option: give one word (a RegistryDwords list is written "
     "'Key1=1;Key2=2'). Nothing was changed."),
    ({"NVreg_EnableStreamMemOPs": "on"},
     "nvidia_driver_module_params: NVreg_EnableStreamMemOPs: the loaded nvidia module holds a number there ("),
])
def test_bad_names_and_values_are_refused_before_anything_changes(ansible, node, params, message):
    node.path.write_text("# the site's\n")
    done = node.run(ansible, params)
    assert done.returncode != 0
    assert message in done.stdout.replace("\\'", "'"), done.stdout
    assert "Nothing was changed." in done.stdout
    assert node.path.read_text() == "# the site's\n" and node.calls() == [] and not node.initramfs.exists()


@pytest.mark.every_ansible_line
def test_a_value_that_is_not_a_dict_is_refused_by_the_argument_spec(ansible, node, tmp_path):
    play = tmp_path / "role.yml"
    play.write_text("- hosts: localhost\n  gather_facts: false\n  roles: [scv.gpu.nvidia_driver]\n")
    done = ansible.playbook(play, None, "-e", json.dumps({"nvidia_driver_module_params": ["NVreg_EnableStreamMemOPs=1"],
                                                          "nvidia_driver_module_params_file": str(node.path)}))
    assert done.returncode != 0
    assert "Validating arguments against arg spec" in done.stdout
    assert "nvidia_driver_module_params" in done.stdout and "dict" in done.stdout
    assert recap(done.stdout)["ok"] == 0
    assert not node.path.exists() and node.calls() == []


def test_no_options_remove_the_file(ansible, node):
    node.path.write_text(LINE)
    done = node.run(ansible, {})
    assert done.returncode == 0, done.stdout + done.stderr
    assert not node.path.exists() and node.initramfs.exists() and node.calls() == []
    again = node.run(ansible, {})
    assert recap(again.stdout)["changed"] == 0


def test_the_info_module_reports_the_options_and_refuses_bad_ones(ansible, node):
    node.hold(4242, "/usr/bin/python3", "/dev/nvidiactl")
    args = {"sysfs": str(node.sysfs), "procfs": str(node.procfs), "nvml": False,
            "module_params": {"NVreg_EnableStreamMemOPs": True}, "module_params_file": str(node.path)}
    ok, result = ansible.module(args, name="scv.gpu.nvidia_driver_info")
    assert ok and result["changed"] is False, ansible.last_output
    state = result["module_params"]
    assert (state["action"], state["loaded"], state["unknown"], state["problems"]) == ("reboot", True, [], [])
    assert state["holders"] == [{"pid": 4242, "command": "python3", "devices": ["/dev/nvidiactl"]}]
    assert state["differ"] == [{"name": "NVreg_EnableStreamMemOPs", "wanted": "1", "running": "0",
                                "source": str(node.procfs / "driver" / "nvidia" / "params")}]
    assert state["unload"] == ["nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia"]

    ok, result = ansible.module(dict(args, module_params={"NVreg_X": "a b"}), name="scv.gpu.nvidia_driver_info")
    assert not ok
    assert result["msg"].startswith("nvidia_driver_module_params: NVreg_X: 'a b' holds whitespace")
    assert result["msg"].endswith(". Nothing was read.")
    assert "module_params" not in ansible.module(dict(args, module_params=None), name="scv.gpu.nvidia_driver_info")[1]
