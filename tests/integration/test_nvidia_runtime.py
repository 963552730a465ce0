"""NVIDIA's own container runtime on the simulator: which GPUs a container gets, and from what.

The runtime, nvidia-ctk and the CDI hook are NVIDIA's, built from the Go module proxy
(tools/nvidia-container-toolkit/build); runc is Debian's. The CDI specification is what NVIDIA's
``nvidia-ctk cdi generate`` writes for a stand-in driver root of the test's own (harness.nvidia_toolkit), and
the runtime runs with the configuration file NVIDIA's packages install, the host's own settings made by
``nvidia-ctk config --set`` (the specification's folder, runc underneath), and the container_toolkit role's
settings (isolation and ``cdi`` mode) written by the role's own task; ``nvidia-ctk config`` judges the result. Each container runs gpus.c's program, which
lists the NVIDIA device nodes it has and the GPUs NVML answers for from inside.

What these establish: a request through CDI (an annotation, as the device plugin's cdi-annotations strategy
makes) or through a volume mount (its volume-mounts strategy) gives exactly the GPU asked for; and
NVIDIA_VISIBLE_DEVICES in an unprivileged container's environment gives every GPU under the runtime's default
configuration (in cdi mode), and none under the role's.
"""

from __future__ import annotations

import subprocess

import pytest

from harness.ansible import recap
from harness.nvidia_toolkit import (
    CONTROL_NODES, Bundles, DriverRoot, host_config, nvidia_config, seen, toolkit, toolkit_tasks_play)
from harness.paths import ROOT, scenario_path

CONTROL = CONTROL_NODES
ROLE_PLAY = toolkit_tasks_play("runtime-config.yml")


def cdi_mode(bin_dir, path, spec_dir):
    """A host's file in cdi mode, every other key NVIDIA's default."""
    host_config(bin_dir, path, spec_dir)
    subprocess.run([str(bin_dir / "nvidia-ctk"), "config", "--config-file", str(path), "--in-place",
                    "--set=nvidia-container-runtime.mode=cdi"], check=True, capture_output=True)
    return path


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """(driver root, the toolkit's folder, the CDI spec folder) for h100_sxm_x8's eight GPUs."""
    work = tmp_path_factory.mktemp("nvidia-runtime")
    bin_dir = toolkit()
    root = DriverRoot(work / "driver-root", scenario_path("h100_sxm_x8"))
    spec = root.generate(work / "cdi" / "nvidia.yaml", bin_dir)
    assert {device["name"] for device in spec["devices"]} >= {"all"} | {str(index) for index in range(8)}, spec
    return root, bin_dir, work / "cdi"


@pytest.fixture(scope="module")
def role_config(ansible, node, tmp_path_factory):
    """The host's file after the container_toolkit role's runtime-config.yml with its defaults, and NVIDIA's reading
    of it before and after."""
    _root, bin_dir, spec_dir = node
    work = tmp_path_factory.mktemp("role-config")
    path = host_config(bin_dir, work / "config.toml", spec_dir)
    before = nvidia_config(bin_dir, path)
    play = work / "play.yml"
    play.write_text(ROLE_PLAY)
    done = ansible.playbook(play, None, "-e", "container_toolkit_nvidia_config=%s" % path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert recap(done.stdout)["changed"] == 1, done.stdout
    again = ansible.playbook(play, None, "-e", "container_toolkit_nvidia_config=%s" % path)
    assert recap(again.stdout)["changed"] == 0, again.stdout
    return path, before, nvidia_config(bin_dir, path)


@pytest.fixture
def isolated(node, role_config, tmp_path):
    root, bin_dir, _spec_dir = node
    return Bundles(tmp_path, bin_dir, root, role_config[0])


def test_the_role_sets_isolation_and_cdi_mode_and_nvidia_reads_every_other_setting_as_before(role_config):
    _path, before, after = role_config
    owned = {"accept-nvidia-visible-devices-envvar-when-unprivileged": False,
             "accept-nvidia-visible-devices-as-volume-mounts": True}
    assert {key: after.get(key) for key in owned} == owned
    assert after["nvidia-container-runtime"].pop("mode") == "cdi"
    before["nvidia-container-runtime"].pop("mode")
    assert {key: value for key, value in after.items() if key not in owned} == \
        {key: value for key, value in before.items() if key not in owned}
    assert before["nvidia-container-runtime"]["runtimes"] == ["runc"]      # the host's own settings, kept


def test_a_cdi_request_gives_exactly_that_gpu_even_beside_the_variable(node, isolated):
    root, _bin_dir, _spec_dir = node
    lines, log = isolated.run(env=["NVIDIA_VISIBLE_DEVICES=all"],
                              annotations={"cdi.k8s.io/nvidia-device-plugin_test": "nvidia.com/gpu=3"})
    assert seen(lines) == ({"nvidia3"} | CONTROL, [root.uuids[3]]), (lines, log)


def test_a_volume_mount_request_gives_exactly_that_gpu(node, isolated):
    root, _bin_dir, _spec_dir = node
    lines, log = isolated.run(mounts=[("/dev/null", "/var/run/nvidia-container-devices/%s" % root.uuids[5])])
    assert seen(lines) == ({"nvidia5"} | CONTROL, [root.uuids[5]]), (lines, log)


def test_the_variable_alone_gives_an_unprivileged_container_nothing_under_the_roles_settings(isolated):
    lines, log = isolated.run(env=["NVIDIA_VISIBLE_DEVICES=all"])
    devices, gpus = seen(lines)
    assert (devices, gpus) == (set(), []), (lines, log)
    assert any(line.startswith("nvml-error") for line in lines), lines


def test_the_variable_still_gives_a_privileged_container_every_gpu(node, isolated):
    root, _bin_dir, _spec_dir = node
    lines, log = isolated.run(env=["NVIDIA_VISIBLE_DEVICES=all"], privileged=True)
    assert seen(lines) == ({"nvidia%d" % index for index in range(8)} | CONTROL, root.uuids), (lines, log)


def test_under_nvidias_defaults_the_variable_gives_an_unprivileged_container_every_gpu(node, tmp_path):
    """The risk that the refusal above removes: the runtime's own defaults honour the variable, which CUDA
    base images set to all."""
    root, bin_dir, spec_dir = node
    bundles = Bundles(tmp_path, bin_dir, root, cdi_mode(bin_dir, tmp_path / "config.toml", spec_dir))
    lines, log = bundles.run(env=["NVIDIA_VISIBLE_DEVICES=all"])
    assert seen(lines) == ({"nvidia%d" % index for index in range(8)} | CONTROL, root.uuids), (lines, log)


def test_the_nvml_entry_points_listed_for_nvidia_ctk_are_those_of_the_pinned_build():
    """tests/fixtures/nvml-symbols/nvidia-ctk.txt, whose every name the simulator exports, was read from this
    build: a new pin that links against more of NVML fails here until ``tools/nvml-symbols --toolkit`` lists it."""
    listed = (ROOT / "tests" / "fixtures" / "nvml-symbols" / "nvidia-ctk.txt").read_text(encoding="utf-8").splitlines()
    bin_dir = toolkit()
    for program in ("nvidia-ctk", "nvidia-container-runtime", "nvidia-cdi-hook"):
        symbols = subprocess.run(["nm", "-D", "--undefined-only", str(bin_dir / program)],
                                 capture_output=True, text=True, check=True).stdout.split()
        linked = {name for name in symbols if name.startswith("nvml")}
        assert linked, program
        assert linked <= set(listed[1:]), (program, sorted(linked - set(listed[1:])))
        if program == "nvidia-ctk":
            assert sorted(linked) == listed[1:]
