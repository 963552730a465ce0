"""Docker gives a container its GPUs through CDI (``--device`` or ``--gpus``), and nothing from NVIDIA_VISIBLE_DEVICES,
under the role's defaults.

The real dockerd (tools/dockerd/build) with containerd 2, NVIDIA's own runtime, nvidia-ctk and CDI hook (built from
the Go module proxy) and runc (tools/runc/build: Docker asks for a time namespace, which Debian 12's runc does not
know). The container_toolkit role's own tasks, with their defaults, merge the nvidia runtime (the default),
``features.cdi`` into daemon.json and write NVIDIA's config.toml; the host's own settings, set before (its data
folders, no bridge or iptables, its CDI folder), are kept. The CDI specification is NVIDIA's ``nvidia-ctk cdi
generate`` for h100_sxm_x8 from a driver root of the test's own. Containers run gpus.c's image, which sets
``NVIDIA_VISIBLE_DEVICES=all`` as CUDA base images do, with no network and without seccomp (runc is built without
libseccomp).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from harness.common import wait_until
from harness.containerd import containerd2
from harness.control_plane import terminate_group
from harness.gpu_images import GPUS_IMAGE, gpu_images
from harness.nvidia_toolkit import CONTROL_NODES, DriverRoot, host_config, seen, toolkit, toolkit_tasks_play
from harness.paths import ROOT, scenario_path

CONTROL = CONTROL_NODES
PLAY = toolkit_tasks_play("docker.yml", "runtime-config.yml")


def built(tool):
    done = subprocess.run([str(ROOT / "tools" / tool / "build")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, "tools/%s/build failed:\n%s" % (tool, done.stderr[-4000:])
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def docker(ansible, tmp_path_factory):
    """The docker command line for a dockerd configured by the role, its image loaded; and the driver root."""
    work = tmp_path_factory.mktemp("docker-gpus")
    bin_dir = toolkit()
    root = DriverRoot(work / "driver-root", scenario_path("h100_sxm_x8"))
    root.generate(work / "cdi" / "nvidia.yaml", bin_dir)
    runtime_config = host_config(bin_dir, work / "nvidia-container-runtime.toml", work / "cdi")
    daemon_json = work / "daemon.json"
    socket = work / "docker.sock"
    daemon_json.write_text(json.dumps({
        "data-root": str(work / "data"), "exec-root": str(work / "exec"), "pidfile": str(work / "docker.pid"),
        "hosts": ["unix://%s" % socket], "storage-driver": "vfs", "bridge": "none", "iptables": False,
        "ip6tables": False, "cdi-spec-dirs": [str(work / "cdi")]}, indent=2))
    play = work / "play.yml"
    play.write_text(PLAY)
    done = ansible.playbook(play, None, "-e", json.dumps({
        "container_toolkit_docker_daemon_json": str(daemon_json), "container_toolkit_docker_validate": "never",
        "container_toolkit_nvidia_config": str(runtime_config),
        "container_toolkit_runtime_path": str(bin_dir / "nvidia-container-runtime"),
        "container_toolkit_restart_runtime": False}))
    assert done.returncode == 0, done.stdout + done.stderr
    dockerd = built("dockerd")
    env = dict(os.environ, NVIDIA_CTK_CONFIG_FILE_PATH=str(runtime_config),
               # the toolkit's folder, as its package puts nvidia-cdi-hook in /usr/bin: dockerd then turns --gpus into CDI
               PATH=":".join([built("runc"), dockerd, str(containerd2().parent), str(bin_dir), os.environ["PATH"]]))
    with open(work / "dockerd.log", "wb") as log:
        process = subprocess.Popen([dockerd + "/dockerd", "--config-file", str(daemon_json)], env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    command = ["docker", "-H", "unix://%s" % socket]
    try:
        wait_until(lambda: subprocess.run(command + ["info"], capture_output=True, check=False).returncode == 0,
                   60, "dockerd answering (log %s)" % (work / "dockerd.log"), 0.5)
        loaded = subprocess.run(command + ["load", "-i", str(gpu_images(work / "images")[0])], capture_output=True,
                                text=True, check=False)
        assert loaded.returncode == 0, loaded.stderr
        yield command, root, json.loads(daemon_json.read_text())
    finally:
        terminate_group(process.pid)


def run(docker, *options):
    command, _root, _config = docker
    done = subprocess.run(command + ["run", "--rm", "--network", "none", "--security-opt", "seccomp=unconfined",
                                     "--entrypoint", "/usr/bin/gpus"] + list(options) + [GPUS_IMAGE],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    return seen(done.stdout.splitlines())


def test_the_role_made_nvidia_the_default_with_cdi_and_kept_the_hosts_settings(docker):
    _command, _root, config = docker
    assert config["default-runtime"] == "nvidia" and config["features"] == {"cdi": True}
    assert config["storage-driver"] == "vfs" and config["bridge"] == "none"


@pytest.mark.parametrize("options", [["--device", "nvidia.com/gpu=3"], ["--gpus", "device=3"]])
def test_a_cdi_device_request_or_gpus_gives_exactly_that_gpu(docker, options):
    _command, root, _config = docker
    assert run(docker, *options) == ({"nvidia3"} | CONTROL, [root.uuids[3]])


def test_gpus_all_gives_every_gpu(docker):
    _command, root, _config = docker
    devices, uuids = run(docker, "--gpus", "all")
    assert uuids == root.uuids and devices == {"nvidia%d" % index for index in range(8)} | CONTROL


@pytest.mark.parametrize("options", [
    [],                                                        # the image's NVIDIA_VISIBLE_DEVICES=all
    ["-e", "NVIDIA_VISIBLE_DEVICES=all", "--runtime", "nvidia"],
    ["-e", "NVIDIA_VISIBLE_DEVICES=0,1"],
])
def test_the_variable_alone_gives_nothing(docker, options):
    assert run(docker, *options) == (set(), [])


def test_a_privileged_container_still_gets_what_the_variable_names(docker):
    _command, root, _config = docker
    devices, uuids = run(docker, "--privileged", "-e", "NVIDIA_VISIBLE_DEVICES=all")
    assert uuids == root.uuids and {"nvidia%d" % index for index in range(8)} <= devices
