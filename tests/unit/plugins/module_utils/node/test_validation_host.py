"""The validation's host checks on a host laid out in a folder: device nodes made with mknod, the driver's
/proc/driver/nvidia/gpus, a sysfs holding the module's version, a CDI spec and NVIDIA's runtime configuration."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from ansible_collections.scv.gpu.plugins.module_utils.node.validation_host import (
    container_runtime_check, driver_gpus, fabric_check, host_checks)

UUIDS = ["GPU-5a7c0000-1f2e-4d3c-8b4a-9e8d7c6b5a40", "GPU-5a7c0001-1f2e-4d3c-8b4a-9e8d7c6b5a41"]
ISOLATED = ("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"
            "accept-nvidia-visible-devices-as-volume-mounts = true\n")


@pytest.fixture
def host(tmp_path):
    dev, char = tmp_path / "dev", tmp_path / "dev" / "char"
    char.mkdir(parents=True)
    for name, major, minor in (("nvidia0", 195, 0), ("nvidia2", 195, 2), ("nvidiactl", 195, 255),
                               ("nvidia-uvm", 509, 0), ("nvidia-uvm-tools", 509, 1)):
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(major, minor))
        os.symlink("../%s" % name, char / ("%d:%d" % (major, minor)))
    for bus, uuid, minor in (("0000:18:00.0", UUIDS[0], 0), ("0000:2a:00.0", UUIDS[1], 2)):
        folder = tmp_path / "proc-driver" / "nvidia" / "gpus" / bus
        folder.mkdir(parents=True)
        information = ("Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t %s\nBus Location: \t %s\n"
                       "Device Minor: \t %d\n" % (uuid, bus, minor))
        (folder / "information").write_text(information)
    (tmp_path / "sys" / "module" / "nvidia").mkdir(parents=True)
    (tmp_path / "sys" / "module" / "nvidia" / "version").write_text("580.95.05\n")
    (tmp_path / "nvidia.yaml").write_text(yaml.safe_dump({"devices": [{"name": "0"}, {"name": UUIDS[0]},
                                                                      {"name": UUIDS[1]}, {"name": "all"}]}))
    (tmp_path / "config.toml").write_text(ISOLATED)
    runtime = _runtime_binary(tmp_path, "1.20.2")
    (tmp_path / "containerd.toml").write_text(CONTAINERD % runtime)
    return {"sysfs": str(tmp_path / "sys"), "proc_driver": str(tmp_path / "proc-driver"), "dev": str(dev),
            "cdi_spec": str(tmp_path / "nvidia.yaml"), "runtime_config": str(tmp_path / "config.toml"),
            "containerd": str(tmp_path / "containerd.toml"), "runtime": runtime}


# as the container_toolkit role writes containerd's configuration (version 2, which containerd 2 reads too)
CONTAINERD = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
  BinaryName = "%s"
"""


def _runtime_binary(folder, version):
    """An executable that answers --version as NVIDIA's runtime does."""
    binary = folder / "bin" / "nvidia-container-runtime"
    binary.parent.mkdir(exist_ok=True)
    binary.write_text("#!/bin/sh\necho 'NVIDIA Container Runtime version %s'\necho 'spec: 1.3.0'\n" % version)
    binary.chmod(0o755)
    return str(binary)


def run(command):
    """A command runner as AnsibleModule.run_command."""
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout, done.stderr


def nvml(*states):
    """gpu_facts' nvidia_gpu fact with a card per fabric ``states`` item: (state, status, health) or None."""
    cards = []
    for number, state in enumerate(states):
        card = {"id": number, "uuid": "GPU-%d" % number}
        if state:
            card["fabric"] = {"state": state[0], "status": state[1], "healthSummary": state[2], "cliqueId": 0}
        cards.append(card)
    return {"nvml_available": True, "nvml_error": None, "cardList": cards}


TRAINED = ("completed", "Success", "healthy")


def outcomes(paths, pinned=None):
    runtime = {"kind": "containerd", "config": paths["containerd"], "default": True, "run": run}
    return {item["check"]: (item["outcome"], item["reason"])
            for item in host_checks("gpu-a", paths, pinned, runtime, nvml(TRAINED, TRAINED))}


def runtime_outcome(kind, config, default=True):
    found = container_runtime_check("gpu-a", {"kind": kind, "config": str(config), "default": default, "run": run})
    return found["outcome"], found["reason"]


def test_gpus_from_the_drivers_own_list(host):
    assert driver_gpus(host["proc_driver"]) == [{"bus": "0000:18:00.0", "uuid": UUIDS[0], "minor": 0},
                                                {"bus": "0000:2a:00.0", "uuid": UUIDS[1], "minor": 2}]


def test_a_host_as_the_roles_leave_it_passes_every_check(host):
    assert outcomes(host, "580") == {name: ("passed", "") for name in (
        "driver", "device_nodes", "dev_char_links", "cdi_spec", "fabric", "container_runtime", "runtime_isolation")}
    assert outcomes(host, "580.95.05")["driver"] == ("passed", "")


@pytest.mark.parametrize("pinned", ["570", "580.82", "58", "580.95.0"])
def test_another_pinned_version_fails_the_driver_check(host, pinned):
    outcome, reason = outcomes(host, pinned)["driver"]
    assert outcome == "failed" and "580.95.05" in reason and pinned in reason


def test_no_module_loaded_fails_the_driver_check(host):
    os.unlink(os.path.join(host["sysfs"], "module", "nvidia", "version"))
    assert "no nvidia kernel module" in outcomes(host)["driver"][1]


def test_a_missing_uvm_node_is_named_with_the_fix(host):
    os.unlink(os.path.join(host["dev"], "nvidia-uvm-tools"))
    outcome, reason = outcomes(host)["device_nodes"]
    assert outcome == "failed" and "%s/nvidia-uvm-tools" % host["dev"] in reason and "nvidia-modprobe" in reason


def test_a_gpus_node_is_found_by_its_minor_not_its_position(host):
    os.rename(os.path.join(host["dev"], "nvidia2"), os.path.join(host["dev"], "nvidia1"))
    assert "%s/nvidia2" % host["dev"] in outcomes(host)["device_nodes"][1]


def test_a_missing_char_link_fails(host):
    os.unlink(os.path.join(host["dev"], "char", "195:2"))
    outcome, reason = outcomes(host)["dev_char_links"]
    assert outcome == "failed" and "195:2 is missing" in reason


def test_a_spec_without_the_second_gpu_fails(host):
    with open(host["cdi_spec"], "w", encoding="utf-8") as handle:
        yaml.safe_dump({"devices": [{"name": UUIDS[0]}]}, handle)
    outcome, reason = outcomes(host)["cdi_spec"]
    assert outcome == "failed" and UUIDS[1] in reason and host["cdi_spec"] in reason


@pytest.mark.parametrize("text, said", [(None, "cannot be read"), ("devices: [", "is not YAML")])
def test_an_unreadable_spec_fails_naming_the_file(host, text, said):
    if text is None:
        os.unlink(host["cdi_spec"])
    else:
        with open(host["cdi_spec"], "w", encoding="utf-8") as handle:
            handle.write(text)
    outcome, reason = outcomes(host)["cdi_spec"]
    assert outcome == "failed" and said in reason and host["cdi_spec"] in reason


@pytest.mark.parametrize("text", ["", "accept-nvidia-visible-devices-envvar-when-unprivileged = true\n"
                                      "accept-nvidia-visible-devices-as-volume-mounts = true\n", "= broken"])
def test_a_runtime_config_that_does_not_isolate_fails(host, text):
    with open(host["runtime_config"], "w", encoding="utf-8") as handle:
        handle.write(text)
    outcome, reason = outcomes(host)["runtime_isolation"]
    assert outcome == "failed" and host["runtime_config"] in reason


def test_runc_as_containerds_default_with_no_runtime_of_nvidias_fails(host):
    path = host["containerd"]
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    text = text.replace('default_runtime_name = "nvidia"', 'default_runtime_name = "runc"')
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text.split('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]')[0])
    outcome, reason = outcomes(host)["container_runtime"]
    assert outcome == "failed" and path in reason and "no runtime runs nvidia-container-runtime" in reason
    assert "the default is runc" in reason


def test_nvidias_runtime_not_the_default_fails_only_where_the_roles_made_it_the_default(host):
    path = host["containerd"]
    with open(path, encoding="utf-8") as handle:
        text = handle.read().replace('default_runtime_name = "nvidia"', 'default_runtime_name = "runc"')
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    outcome, reason = runtime_outcome("containerd", path)
    assert outcome == "failed" and "the default runtime is runc, not NVIDIA's (nvidia)" in reason
    assert "container_toolkit_containerd_default_runtime" in reason
    assert runtime_outcome("containerd", path, default=False) == ("passed", "")


def test_containerd_2s_own_layout_and_imported_files_are_read(tmp_path, host):
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "99-nvidia.toml").write_text(
        'version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd]\n  default_runtime_name = "nvidia"\n'
        '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]\n  BinaryName = "%s"\n'
        % host["runtime"])
    main = tmp_path / "main.toml"
    main.write_text('version = 3\nimports = ["conf.d/*.toml"]\n')
    assert runtime_outcome("containerd", main) == ("passed", "")
    main.write_text('version = 3\n')
    assert "no runtime runs" in runtime_outcome("containerd", main)[1]


def test_a_release_before_the_last_security_fix_is_named(tmp_path, host):
    _runtime_binary(tmp_path, "1.17.3")
    outcome, reason = outcomes(host)["container_runtime"]
    assert outcome == "failed" and "release 1.17.3 predates the fixes of CVE-2025-23359" in reason, reason
    assert "(1.19.1 has them all)" in reason


def test_a_runtime_binary_that_is_not_there_is_named(tmp_path, host):
    os.unlink(host["runtime"])
    outcome, reason = outcomes(host)["container_runtime"]
    assert outcome == "failed" and host["runtime"] in reason and "not an executable file" in reason


def test_crio_reads_its_drop_ins_recursively_in_byte_order(tmp_path, host):
    main = tmp_path / "crio.conf"
    main.write_text('[crio.runtime]\ndefault_runtime = "crun"\n')
    drop_ins = tmp_path / "crio.conf.d"
    (drop_ins / "sub").mkdir(parents=True)
    (drop_ins / "10-nvidia.conf").write_text(
        '[crio.runtime]\ndefault_runtime = "nvidia"\n[crio.runtime.runtimes.nvidia]\nruntime_path = "%s"\n'
        % host["runtime"])
    assert runtime_outcome("crio", main) == ("passed", "")
    # 10-nvidia.conf/... sorts after 10-nvidia.conf, and "sub/..." after both: the last word is crun's
    (drop_ins / "sub" / "01-crun.conf").write_text('[crio.runtime]\ndefault_runtime = "crun"\n')
    outcome, reason = runtime_outcome("crio", main)
    assert outcome == "failed" and "the default runtime is crun" in reason


def test_dockers_daemon_json_is_read(tmp_path, host):
    daemon = tmp_path / "daemon.json"
    daemon.write_text('{"default-runtime": "nvidia", "runtimes": {"nvidia": {"path": "%s"}}}' % host["runtime"])
    assert runtime_outcome("docker", daemon) == ("passed", "")
    daemon.write_text('{"runtimes": {"nvidia": {"path": "%s"}}}' % host["runtime"])
    assert "the default runtime is runc" in runtime_outcome("docker", daemon)[1]
    daemon.write_text("[]")
    outcome, reason = runtime_outcome("docker", daemon)
    assert outcome == "failed" and "holds no JSON object" in reason


def test_no_container_runtime_skips_the_check():
    found = container_runtime_check("gpu-a", {"kind": None})
    assert found["outcome"] == "skipped" and "no container runtime" in found["reason"]


@pytest.mark.parametrize("state, said", [
    (("not started", "Success", "healthy"), "GPU 1 (GPU-1): its NVLink fabric is not started, not completed"),
    (("in progress", "Success", "healthy"), "GPU 1 (GPU-1): its NVLink fabric is in progress"),
    (("completed", "NVML_ERROR_INSUFFICIENT_RESOURCES", "healthy"), "GPU 1 (GPU-1): its NVLink fabric failed"),
    (("completed", "Success", "degraded bandwidth"), "GPU 1 (GPU-1): its NVLink fabric is degraded bandwidth"),
])
def test_a_gpu_whose_fabric_is_not_up_fails_naming_it_and_fabric_manager(state, said):
    found = fabric_check("gpu-a", nvml(TRAINED, state, TRAINED))
    assert found["outcome"] == "failed" and found["reason"].startswith(said), found
    assert "GPU 0" not in found["reason"] and "nvidia-fabricmanager" in found["reason"]


def test_no_fabric_or_no_nvml_skips_the_fabric_check():
    assert fabric_check("gpu-a", nvml(None, None))["outcome"] == "skipped"
    unread = fabric_check("gpu-a", {"nvml_available": False, "nvml_error": "libnvidia-ml.so.1: cannot open"})
    assert unread["outcome"] == "skipped" and "libnvidia-ml.so.1" in unread["reason"]
    assert fabric_check("gpu-a", nvml(TRAINED, None))["outcome"] == "passed"
