"""The nvidia module's options: checked and spelt for modprobe.d, compared with a loaded module's (a prepared
sysfs and procfs), and the processes that hold the GPUs, which decide between a reload and a reboot."""

from __future__ import annotations

import os

import pytest

from ansible_collections.scv.gpu.plugins.filter.nvidia_driver_reboot import FilterModule, nvidia_driver_reboot
from ansible_collections.scv.gpu.plugins.filter.nvidia_module_options import FilterModule as OptionsFilters
from ansible_collections.scv.gpu.plugins.filter.nvidia_module_options import nvidia_module_options
from ansible_collections.scv.gpu.plugins.module_utils.host.module_params import (
    check_options,
    dependants,
    gpu_holders,
    kernel_number,
    options_state,
    proc_params,
    same_value,
)

FILE = "/etc/modprobe.d/scv-gpu-nvidia.conf"
# As the driver prints it: registry keys without the prefix, numbers with %u, strings in double quotes.
PARAMS = ('ResmanDebugLevel: 4294967295\nEnableStreamMemOPs: 0\nRestrictProfilingToAdminUsers: 1\n'
          'CoherentGPUMemoryMode: ""\nRegistryDwords: ""\nRmMsg: ""\n')


def test_options_are_spelt_as_one_modprobe_line_sorted_by_name():
    checked = check_options({"NVreg_RestrictProfilingToAdminUsers": 0, "NVreg_EnableStreamMemOPs": True,
                             "NVreg_RegistryDwords": "RMFoo=1;RMBar=0x2", "nv_cap_enable_devfs": False})
    assert checked["problems"] == []
    assert checked["options"] == {"NVreg_RestrictProfilingToAdminUsers": "0", "NVreg_EnableStreamMemOPs": "1",
                                  "NVreg_RegistryDwords": "RMFoo=1;RMBar=0x2", "nv_cap_enable_devfs": "0"}
    lines = checked["content"].splitlines()
    assert lines[0].startswith("# Managed by the scv.gpu.nvidia_driver role")
    assert lines[1:] == ["options nvidia NVreg_EnableStreamMemOPs=1 NVreg_RegistryDwords=RMFoo=1;RMBar=0x2 "
                         "NVreg_RestrictProfilingToAdminUsers=0 nv_cap_enable_devfs=0"]


@pytest.mark.parametrize("params", [{}, None])
def test_no_options_no_file(params):
    assert check_options(params) == {"options": {}, "problems": [], "content": ""}


@pytest.mark.parametrize("name, value, problem", [
    ("EnableStreamMemOPs", 1, "EnableStreamMemOPs: the nvidia module's options are named NVreg_<key>: "
                              "write NVreg_EnableStreamMemOPs"),
    ("NVreg-Foo", 1, "NVreg-Foo: not an option of the nvidia module: the names are NVreg_ followed by letters"),
    ("NVreg_", 1, "NVreg_: not an option of the nvidia module"),
    ("NVreg_A B", 1, "NVreg_A B: not an option of the nvidia module"),
    ("modeset", 1, "modeset: modeset is an option of nvidia_drm, not of nvidia, and this variable writes "
                   "'options nvidia': set it in a modprobe.d file of your own ('options nvidia_drm modeset=...')"),
    ("NVreg_X", "a b", "NVreg_X: 'a b' holds whitespace, a quote or a backslash"),
    ("NVreg_X", "a\nb", "NVreg_X: 'a\\nb' holds whitespace"),
    ("NVreg_X", '"1"', "NVreg_X: '\"1\"' holds whitespace, a quote"),
    ("NVreg_X", "it's", "NVreg_X: \"it's\" holds whitespace, a quote"),
    ("NVreg_X", "a\\b", "NVreg_X: 'a\\\\b' holds whitespace, a quote or a backslash"),
    ("NVreg_X", "", "NVreg_X: the value is empty"),
    ("NVreg_X", None, "NVreg_X: it has no value"),
    # the kernel takes an int option with kstrtoint: a C int, signed
    ("NVreg_X", 2 ** 31, "NVreg_X: 2147483648, outside the range of the nvidia module's int options (-2147483648 to "
                         "2147483647): the kernel refuses it, and the module does not load"),
    ("NVreg_X", -2 ** 31 - 1, "NVreg_X: -2147483649, outside the range"),
    ("NVreg_X", "0x80000000", "NVreg_X: '0x80000000' is 2147483648, outside the range"),
    ("NVreg_X", "4294967295", "NVreg_X: '4294967295' is 4294967295, outside the range"),
    # "$" matches before a trailing newline, which would end modprobe.d's line and cost the next option
    ("NVreg_X", "1\n", "NVreg_X: '1\\n' holds whitespace"),
    ("NVreg_X\n", 1, "NVreg_X\n: not an option of the nvidia module"),
    ("NVreg_X", 1.5, "NVreg_X: 1.5 is not a whole number"),
    ("NVreg_X", [1], "NVreg_X: a list is not a value"),
    ("NVreg_X", {"a": 1}, "NVreg_X: a dict is not a value"),
])
def test_bad_names_and_values_are_refused_naming_the_key(name, value, problem):
    checked = check_options({"NVreg_EnableStreamMemOPs": 1, name: value})
    assert len(checked["problems"]) == 1
    assert checked["problems"][0].startswith("nvidia_driver_module_params: " + problem)
    # nothing is written while any key is wrong, not even the good ones
    assert checked["options"] == {} and checked["content"] == ""


def test_every_wrong_key_is_named_at_once_and_a_negative_int_passes_where_it_is_signed():
    checked = check_options({"Foo": 1, "NVreg_Bar": "x y", "nv_cap_enable_devfs": -1})
    assert [problem.split(":")[1].strip() for problem in checked["problems"]] == ["Foo", "NVreg_Bar"]


def test_the_ends_of_a_c_int_pass_and_a_string_option_takes_any_word():
    checked = check_options({"NVreg_A": -1, "NVreg_B": 2 ** 31 - 1, "NVreg_C": -2 ** 31, "NVreg_D": "0x7fffffff",
                             "NVreg_RegistryDwords": "4294967296", "NVreg_E": "-0x10"})
    assert checked["problems"] == []
    assert checked["content"].endswith("options nvidia NVreg_A=-1 NVreg_B=2147483647 NVreg_C=-2147483648 "
                                       "NVreg_D=0x7fffffff NVreg_E=-0x10 NVreg_RegistryDwords=4294967296\n")


def test_not_a_dict_is_refused():
    assert check_options(["NVreg_A=1"])["problems"] == [
        "nvidia_driver_module_params must be a dict of option names and values, not list"]


def test_the_filter_is_check_options():
    assert nvidia_module_options({"NVreg_A": 1}) == check_options({"NVreg_A": 1})
    assert OptionsFilters().filters() == {"nvidia_module_options": nvidia_module_options}


def test_proc_params_parse_numbers_and_quoted_words(tmp_path):
    (tmp_path / "driver" / "nvidia").mkdir(parents=True)
    (tmp_path / "driver" / "nvidia" / "params").write_text(PARAMS + 'TemporaryFilePath: "/var/tmp x"\n')
    listed = proc_params(str(tmp_path))
    assert listed["EnableStreamMemOPs"] == "0"
    assert listed["ResmanDebugLevel"] == "4294967295"
    assert listed["RegistryDwords"] == "" and listed["TemporaryFilePath"] == "/var/tmp x"
    assert proc_params(str(tmp_path / "none")) is None


@pytest.mark.parametrize("wanted, running, same", [
    ("1", "1", True), ("0x10", "16", True), ("017", "15", True), ("1", "0", False),
    ("abc", "abc", True), ("abc", "", False), ("08", "8", False), ("", "", True),
])
def test_values_compare_as_the_kernel_reads_them(wanted, running, same):
    assert same_value(wanted, running) is same


def test_kernel_number():
    assert [kernel_number(text) for text in ("10", "0x1f", "010", "0", "x", None)] == [10, 31, 8, 0, None, None]
    # signs as kstrtoint takes them; what Python's int() takes and the kernel does not is a word
    assert [kernel_number(text) for text in ("-1", "+7", "-0x10", "1_000", "0x", "09", " 12 ")] == [
        -1, 7, -16, None, None, None, 12]


def host(tmp_path, params=PARAMS, sysfs_values=None, holders=None, loaded=True):
    """A sysfs and procfs: nvidia loaded (with nvidia_uvm and nvidia_modeset using it, and nvidia_drm using
    nvidia_modeset), its /proc params, and processes with fds on the given devices."""
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    procfs.mkdir(parents=True)
    if loaded:
        for module, users in (("nvidia", ["nvidia_uvm", "nvidia_modeset"]), ("nvidia_modeset", ["nvidia_drm"]),
                              ("nvidia_uvm", []), ("nvidia_drm", [])):
            (sysfs / "module" / module / "holders").mkdir(parents=True)
            for user in users:
                (sysfs / "module" / module / "holders" / user).symlink_to("../../%s" % user)
        (procfs / "driver" / "nvidia").mkdir(parents=True)
        (procfs / "driver" / "nvidia" / "params").write_text(params)
    for name, value in (sysfs_values or {}).items():
        (sysfs / "module" / "nvidia" / "parameters").mkdir(parents=True, exist_ok=True)
        (sysfs / "module" / "nvidia" / "parameters" / name).write_text(value + "\n")
    for pid, (argv, devices) in (holders or {}).items():
        (procfs / str(pid) / "fd").mkdir(parents=True)
        (procfs / str(pid) / "cmdline").write_text("\0".join(argv) + "\0")
        (procfs / str(pid) / "comm").write_text(os.path.basename(argv[0])[:15] + "\n")
        for fd, device in enumerate(devices):
            (procfs / str(pid) / "fd" / str(fd)).symlink_to(device)
    return str(sysfs), str(procfs)


def test_the_unload_order_puts_each_user_before_the_module_it_uses(tmp_path):
    sysfs, _procfs = host(tmp_path)
    assert dependants(sysfs) == ["nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia"]


def test_holders_are_the_processes_with_a_driver_device_open(tmp_path):
    _sysfs, procfs = host(tmp_path, holders={
        4242: (["/usr/bin/python3", "train.py"], ["/dev/nvidia0", "/dev/nvidiactl", "/dev/null"]),
        77: (["/usr/bin/nvidia-persistenced", "--user", "nvidia-persistenced"], ["/dev/nvidia-uvm"]),
        90: (["/bin/bash"], ["/dev/pts/0", "/dev/nvidia-foo"]),
    })
    (tmp_path / "proc" / "self").mkdir()
    assert gpu_holders(procfs) == [
        {"pid": 77, "command": "nvidia-persistenced", "devices": ["/dev/nvidia-uvm"]},
        {"pid": 4242, "command": "python3", "devices": ["/dev/nvidia0", "/dev/nvidiactl"]},
    ]


def test_a_module_running_the_options_needs_nothing(tmp_path):
    sysfs, procfs = host(tmp_path, sysfs_values={"NVreg_EnableStreamMemOPs": "1"})
    state = options_state({"NVreg_EnableStreamMemOPs": "1", "NVreg_RestrictProfilingToAdminUsers": "1"}, FILE,
                          sysfs, procfs)
    assert (state["action"], state["differ"], state["pending"], state["problems"]) == ("none", [], None, [])
    assert state["message"] == "the loaded nvidia module runs with the options of %s" % FILE


def test_differing_options_on_an_idle_node_are_reloaded_persistenced_stopped_for_it(tmp_path):
    sysfs, procfs = host(tmp_path, holders={77: (["/usr/bin/nvidia-persistenced"], ["/dev/nvidiactl"])})
    state = options_state({"NVreg_EnableStreamMemOPs": "1"}, FILE, sysfs, procfs)
    assert state["action"] == "reload" and state["pending"] is None
    assert state["differ"] == [{"name": "NVreg_EnableStreamMemOPs", "wanted": "1", "running": "0",
                                "source": os.path.join(procfs, "driver", "nvidia", "params")}]
    assert state["services"] == ["nvidia-persistenced"] and state["holders"] == []
    assert state["unload"] == ["nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia"]
    assert state["message"] == ("the loaded nvidia module runs with NVreg_EnableStreamMemOPs=0 (1 wanted), and no "
                                "process holds a GPU: reloading nvidia_drm, nvidia_modeset, nvidia_uvm, nvidia")


def test_sysfs_is_read_before_proc(tmp_path):
    sysfs, procfs = host(tmp_path, sysfs_values={"NVreg_EnableStreamMemOPs": "1"})
    assert options_state({"NVreg_EnableStreamMemOPs": "0"}, FILE, sysfs, procfs)["differ"][0]["source"] == (
        os.path.join(sysfs, "module", "nvidia", "parameters", "NVreg_EnableStreamMemOPs"))


def test_differing_options_wait_for_a_reboot_while_a_process_holds_a_gpu(tmp_path):
    sysfs, procfs = host(tmp_path, holders={
        4242: (["/usr/bin/python3"], ["/dev/nvidia0"]), 77: (["/usr/bin/nvidia-persistenced"], ["/dev/nvidiactl"])})
    state = options_state({"NVreg_EnableStreamMemOPs": "1"}, FILE, sysfs, procfs)
    assert state["action"] == "reboot"
    assert [holder["pid"] for holder in state["holders"]] == [4242]
    assert state["pending"] == ("the loaded nvidia module runs with NVreg_EnableStreamMemOPs=0 (1 wanted), and "
                                "processes hold the GPUs (4242 python3), so it is not reloaded: the options of %s "
                                "take effect at the next boot" % FILE)
    decision = nvidia_driver_reboot({"loaded_version": "580.95.05", "installed_version": "580.95.05"}, "auto", "ssh",
                                    pending=[state["pending"]])
    assert decision == {"reboot": True, "reasons": [state["pending"]], "message": "rebooting: " + state["pending"]}
    decision = nvidia_driver_reboot({}, "never", "ssh", pending=[state["pending"]])
    assert not decision["reboot"] and decision["message"].endswith("reboot this host yourself")
    assert nvidia_driver_reboot({}, "auto", "ssh", pending=[])["reasons"] == []
    assert nvidia_driver_reboot({}, "always", "ssh", pending=[None, ""])["reboot"] is False   # nothing changed
    assert FilterModule().filters()["nvidia_driver_reboot"] is nvidia_driver_reboot


def test_many_holders_are_counted(tmp_path):
    sysfs, procfs = host(tmp_path, holders={pid: (["/bin/app%d" % pid], ["/dev/nvidia0"]) for pid in range(1, 8)})
    state = options_state({"NVreg_EnableStreamMemOPs": "1"}, FILE, sysfs, procfs)
    assert "(1 app1, 2 app2, 3 app3, 4 app4, 5 app5 and 2 more)" in state["pending"]


def test_no_module_loaded_needs_nothing(tmp_path):
    sysfs, procfs = host(tmp_path, loaded=False)
    state = options_state({"NVreg_EnableStreamMemOPs": "1"}, FILE, sysfs, procfs)
    assert (state["loaded"], state["action"]) == (False, "none")
    assert state["message"] == "no nvidia module is loaded: it loads with the options in %s" % FILE
    assert options_state({}, FILE, sysfs, procfs)["message"] == ""


def test_an_option_the_module_lists_nowhere_is_named_not_reloaded_for(tmp_path):
    sysfs, procfs = host(tmp_path)
    state = options_state({"NVreg_EnableStreamMemOPS": "1"}, FILE, sysfs, procfs)
    assert state["action"] == "none" and state["unknown"] == ["NVreg_EnableStreamMemOPS"]
    assert state["message"].startswith("the loaded nvidia module lists no NVreg_EnableStreamMemOPS in ")
    assert "check the spelling" in state["message"]


def test_a_word_where_the_module_holds_a_number_is_a_problem(tmp_path):
    sysfs, procfs = host(tmp_path)
    state = options_state({"NVreg_EnableStreamMemOPs": "on", "NVreg_CoherentGPUMemoryMode": "driver"}, FILE,
                          sysfs, procfs)
    assert state["problems"] == [
        "nvidia_driver_module_params: NVreg_EnableStreamMemOPs: the loaded nvidia module holds a number there "
        "(%s reads 0), and the module would refuse to load with 'on': give a number"
        % os.path.join(procfs, "driver", "nvidia", "params")]


def test_sysfs_null_string_is_empty(tmp_path):
    sysfs, procfs = host(tmp_path, sysfs_values={"rm_firmware_active": "(null)"})
    state = options_state({"rm_firmware_active": "all"}, FILE, sysfs, procfs)
    assert state["differ"][0]["running"] == "" and state["problems"] == []


def test_a_name_that_is_not_a_string_is_refused():
    assert check_options({1: 1})["problems"] == ["nvidia_driver_module_params: 1: the name must be a string"]


def test_proc_params_strip_only_a_pair_of_quotes(tmp_path):
    (tmp_path / "driver" / "nvidia").mkdir(parents=True)
    (tmp_path / "driver" / "nvidia" / "params").write_text('Lone: "\nHalf: "abc\nTail: abc"\nPair: "a"\nBare\n')
    assert proc_params(str(tmp_path)) == {"Lone": '"', "Half": '"abc', "Tail": 'abc"', "Pair": "a"}


def test_no_procfs_no_holders(tmp_path):
    assert gpu_holders(str(tmp_path / "none")) == []


def test_a_process_without_a_command_line_is_named_by_comm(tmp_path):
    holders = {12: (["/usr/bin/dcgm-exporter"], ["/dev/nvidia0"]), 13: (["/usr/bin/x"], ["/dev/nvidia1"])}
    _sysfs, procfs = host(tmp_path, holders=holders)
    (tmp_path / "proc" / "12" / "cmdline").write_text("")
    (tmp_path / "proc" / "13" / "cmdline").unlink()
    (tmp_path / "proc" / "13" / "comm").unlink()
    assert [(h["pid"], h["command"]) for h in gpu_holders(procfs)] == [(12, "dcgm-exporter"), (13, "?")]


def test_five_holders_are_all_named(tmp_path):
    sysfs, procfs = host(tmp_path, holders={pid: (["/bin/app%d" % pid], ["/dev/nvidia0"]) for pid in range(1, 6)})
    state = options_state({"NVreg_EnableStreamMemOPs": "1"}, FILE, sysfs, procfs)
    assert "(1 app1, 2 app2, 3 app3, 4 app4, 5 app5), so" in state["pending"]
