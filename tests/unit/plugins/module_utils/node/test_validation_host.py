"""The validation's host checks on a host laid out in a folder: device nodes made with mknod, the driver's
/proc/driver/nvidia/gpus, a sysfs holding the module's version, a CDI spec and NVIDIA's runtime configuration."""

from __future__ import annotations

import os

import pytest
import yaml

from ansible_collections.scv.gpu.plugins.module_utils.node.validation_host import driver_gpus, host_checks

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
    return {"sysfs": str(tmp_path / "sys"), "proc_driver": str(tmp_path / "proc-driver"), "dev": str(dev),
            "cdi_spec": str(tmp_path / "nvidia.yaml"), "runtime_config": str(tmp_path / "config.toml")}


def outcomes(paths, pinned=None):
    return {item["check"]: (item["outcome"], item["reason"]) for item in host_checks("gpu-a", paths, pinned)}


def test_gpus_from_the_drivers_own_list(host):
    assert driver_gpus(host["proc_driver"]) == [{"bus": "0000:18:00.0", "uuid": UUIDS[0], "minor": 0},
                                                {"bus": "0000:2a:00.0", "uuid": UUIDS[1], "minor": 2}]


def test_a_host_as_the_roles_leave_it_passes_every_check(host):
    assert outcomes(host, "580") == {name: ("passed", "") for name in (
        "driver", "device_nodes", "dev_char_links", "cdi_spec", "runtime_isolation")}
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
