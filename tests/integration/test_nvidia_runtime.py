"""NVIDIA's own container runtime on the simulator: which GPUs a container gets, and from what.

The runtime, nvidia-ctk and the CDI hook are NVIDIA's, built from the Go module proxy
(tools/nvidia-container-toolkit/build); runc is Debian's. The CDI specification is what NVIDIA's
``nvidia-ctk cdi generate`` writes for a stand-in driver root of the test's own (harness.nvidia_toolkit), and
the runtime runs in ``cdi`` mode with that specification's folder. Each container runs gpus.c's program, which
lists the NVIDIA device nodes it has and the GPUs NVML answers for from inside.

What these establish: a request through CDI (an annotation, as the device plugin's cdi-annotations strategy
makes) or through a volume mount (its volume-mounts strategy) gives exactly the GPU asked for; and
NVIDIA_VISIBLE_DEVICES in an unprivileged container's environment gives every GPU under the runtime's default
configuration, and none once ``accept-nvidia-visible-devices-envvar-when-unprivileged = false``.
"""

from __future__ import annotations

import pytest

from harness.nvidia_toolkit import Bundles, DriverRoot, seen, toolkit
from harness.paths import scenario_path

CONTROL = {"nvidiactl", "nvidia-uvm"}
ISOLATED = ("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"
            "accept-nvidia-visible-devices-as-volume-mounts = true\n")


def runtime_config(path, spec_dir, top=""):
    """The runtime's configuration: ``top`` (the keys under test), then the host's own facts (CDI mode, its
    specification folder, runc underneath)."""
    path.write_text(top + '[nvidia-container-runtime]\nmode = "cdi"\nruntimes = ["runc"]\nlog-level = "info"\n'
                    'debug = "%s"\n[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["%s"]\n'
                    % (path.with_name("nvidia-container-runtime.log"), spec_dir))
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


@pytest.fixture
def isolated(node, tmp_path):
    root, bin_dir, spec_dir = node
    return Bundles(tmp_path, bin_dir, root, runtime_config(tmp_path / "config.toml", spec_dir, ISOLATED))


def test_a_cdi_request_gives_exactly_that_gpu_even_beside_the_variable(node, isolated):
    root, _bin_dir, _spec_dir = node
    lines, log = isolated.run(env=["NVIDIA_VISIBLE_DEVICES=all"],
                              annotations={"cdi.k8s.io/nvidia-device-plugin_test": "nvidia.com/gpu=3"})
    assert seen(lines) == ({"nvidia3"} | CONTROL, [root.uuids[3]]), (lines, log)


def test_a_volume_mount_request_gives_exactly_that_gpu(node, isolated):
    root, _bin_dir, _spec_dir = node
    lines, log = isolated.run(mounts=[("/dev/null", "/var/run/nvidia-container-devices/%s" % root.uuids[5])])
    assert seen(lines) == ({"nvidia5"} | CONTROL, [root.uuids[5]]), (lines, log)


def test_the_variable_alone_gives_an_unprivileged_container_nothing_once_refused(isolated):
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
    bundles = Bundles(tmp_path, bin_dir, root, runtime_config(tmp_path / "config.toml", spec_dir))
    lines, log = bundles.run(env=["NVIDIA_VISIBLE_DEVICES=all"])
    assert seen(lines) == ({"nvidia%d" % index for index in range(8)} | CONTROL, root.uuids), (lines, log)
