"""scv-gpu-cdi-refresh (the container_toolkit role's script and boot unit's command) on this host.

nvidia-ctk is NVIDIA's, built from the Go module proxy (harness.nvidia_toolkit), at the release pinned for the
tests and at 1.19.1 for a toolkit change; it writes the spec from a stand-in driver root of the test's own whose
NVML is the simulator (so the GPUs, their MIG devices and the driver version come from a scenario file this test
edits). nvidia-smi, the driver's program, is the stand-in that asks that NVML. The script runs in a mount
namespace where /proc/driver is the root's (MIG's capability minors). The molecule scenario
container_toolkit_docker runs the same script through the role and its unit. Where a test needs nvidia-ctk to hang
or print garbage, a shell script takes its place for that test alone.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest
import yaml

from harness.nvidia_toolkit import DriverRoot, host_bin, install_toolkit
from harness.paths import ROOT, SIMULATOR_DIR, scenario_path

SCRIPT = ROOT / "roles" / "container_toolkit" / "files" / "scv-gpu-cdi-refresh"
OLDER_TOOLKIT = "1.19.1"


@pytest.fixture
def host(tmp_path):
    bin_dir = host_bin(tmp_path / "bin", OLDER_TOOLKIT)
    root = DriverRoot(tmp_path / "driver-root", scenario_path("a100_mig"))

    class Host:
        driver = root
        scenario = root.scenario
        spec = tmp_path / "etc" / "cdi" / "nvidia.yaml"
        state = tmp_path / "var" / "lib" / "scv-gpu" / "cdi.fingerprint"

        @staticmethod
        def toolkit(version=None):
            """NVIDIA's nvidia-ctk and CDI hook of ``version`` (None: the pinned release) on the host's PATH."""
            install_toolkit(bin_dir, version)

        @staticmethod
        def edit(change):
            root.edit(change)

        @classmethod
        def command(cls, extra, timeout_s=None):
            env = root.env()
            env.update(PATH="%s:/usr/sbin:/usr/bin:/sbin:/bin" % bin_dir, LD_LIBRARY_PATH=str(SIMULATOR_DIR))
            if timeout_s is not None:
                env["SCV_GPU_CDI_TIMEOUT"] = str(timeout_s)
            return root.namespaced([SCRIPT, "--output", cls.spec, "--state", cls.state] + list(extra)), env

        @classmethod
        def refresh(cls, *extra, timeout_s=None):
            command, env = cls.command(extra, timeout_s)
            return subprocess.run(command, env=env, capture_output=True, text=True, check=False)

        @classmethod
        def start(cls):
            command, env = cls.command(())
            return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    return Host


def refreshed(host, expected):
    done = host.refresh()
    assert done.returncode == 0 and done.stdout.strip() == expected, done.stdout + done.stderr
    return host.spec.read_text()


def devices(text):
    return {device["name"] for device in yaml.safe_load(text)["devices"]}


def test_the_spec_follows_the_driver_the_toolkit_and_the_mig_layout(host):
    driver = host.driver.driver_version
    text = refreshed(host, "generated")
    assert "libnvidia-ml.so.%s" % driver in text
    migs = [device["uuid"] for device in json.loads(host.scenario.read_text())["devices"][0]["migDevices"]]
    assert set(migs) <= devices(text)
    assert oct(host.spec.stat().st_mode & 0o777) == "0o644"
    refreshed(host, "unchanged")

    # a MIG device goes away (the layout changes): the spec is regenerated, and no longer names it
    host.edit(lambda scenario: scenario["devices"][0]["migDevices"].pop())
    text = refreshed(host, "generated")
    assert migs[-1] not in devices(text) and set(migs[:-1]) <= devices(text)
    refreshed(host, "unchanged")

    host.toolkit()
    refreshed(host, "generated")

    host.driver.upgrade("580.95.05")
    check = host.refresh("--check")
    assert check.returncode == 0 and check.stdout.strip() == "would generate"
    assert "libnvidia-ml.so.%s" % driver in host.spec.read_text()         # --check wrote nothing
    text = refreshed(host, "generated")
    assert "libnvidia-ml.so.580.95.05" in text and driver not in text
    assert sorted(path.name for path in host.spec.parent.iterdir()) == ["nvidia.yaml"]   # no partial file left


def test_a_missing_spec_is_regenerated_even_with_the_same_fingerprint(host):
    refreshed(host, "generated")
    host.spec.unlink()
    refreshed(host, "generated")


def test_no_driver_leaves_the_spec_and_says_so(host):
    refreshed(host, "generated")
    before = host.spec.read_text()
    shutil.copy(scenario_path("driver_not_loaded"), host.scenario)
    done = host.refresh()
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout.startswith("the NVIDIA driver does not answer")
    assert host.spec.read_text() == before


def test_a_failing_generate_keeps_the_old_spec(host):
    refreshed(host, "generated")
    before = host.spec.read_text()
    stand_in(host, "nvidia-ctk", "case \"$1\" in --version) echo 'NVIDIA Container Toolkit CLI version 9 (stand-in)';;"
                                 " *) echo 'could not load NVML' >&2; exit 1;; esac\n")
    done = host.refresh()
    assert done.returncode == 1 and "left as it was" in done.stderr, done.stdout + done.stderr
    assert host.spec.read_text() == before
    assert not list(host.spec.parent.glob("*partial*"))


def stand_in(host, name, body):
    """Replaces one of the host's programs with a shell script."""
    program = host.spec.parent.parent.parent / "bin" / name
    program.unlink(missing_ok=True)
    program.write_text("#!/bin/sh\n" + body)
    program.chmod(0o755)


VERSION_ONLY = "case \"$1\" in --version) echo 'NVIDIA Container Toolkit CLI version 9 (stand-in)'; exit 0;; esac\n"


@pytest.mark.parametrize("program, body, code, message", [
    ("nvidia-smi", "sleep 60\n", 3, "nvidia-smi did not answer within 2 s; the CDI specification is left as it is"),
    ("nvidia-ctk", "sleep 60\n", 1, "nvidia-ctk --version failed or did not answer within 2 s (exit 124)"),
    ("nvidia-ctk", VERSION_ONLY + "sleep 60\n", 1, "nvidia-ctk cdi generate did not finish within 2 s"),
    ("nvidia-ctk", VERSION_ONLY + "echo 'WARN: could not find libcuda; continuing'\n", 1,
     "nvidia-ctk cdi generate printed no CDI specification"),
    ("nvidia-ctk", VERSION_ONLY + "printf 'cdiVersion: 0.5.0\\nkind: nvidia.com/gpu\\n'\n", 1,
     "nvidia-ctk cdi generate printed no CDI specification"),
])
def test_a_hanging_or_garbage_printing_program_leaves_the_spec(host, program, body, code, message):
    refreshed(host, "generated")
    before = host.spec.read_text()
    host.toolkit()             # something changed, so a refresh would generate
    stand_in(host, program, body)
    started = time.monotonic()
    done = host.refresh(timeout_s=2)
    assert time.monotonic() - started < 15
    assert done.returncode == code, done.stdout + done.stderr
    assert message in done.stdout + done.stderr
    assert host.spec.read_text() == before
    assert sorted(path.name for path in host.spec.parent.iterdir()) == ["nvidia.yaml"]


def test_a_symlinked_spec_stays_a_symlink_and_its_target_is_replaced(host):
    real = host.spec.parent.parent / "site-cdi" / "gpu.yaml"
    real.parent.mkdir(parents=True)
    real.write_text("cdiVersion: 0.3.0\nkind: nvidia.com/gpu\ndevices: []\n")
    host.spec.parent.mkdir(parents=True)
    host.spec.symlink_to(real)
    refreshed(host, "generated")
    assert host.spec.is_symlink() and host.spec.resolve() == real
    assert "libnvidia-ml.so." in real.read_text()


def test_a_read_only_spec_folder_is_named_and_nothing_is_lost(host):
    refreshed(host, "generated")
    before = host.spec.read_text()
    host.toolkit()
    subprocess.run(["chattr", "+i", str(host.spec.parent)], check=True)   # read-only even for root
    try:
        done = host.refresh()
    finally:
        subprocess.run(["chattr", "-i", str(host.spec.parent)], check=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "(read-only?); %s is left as it was" % host.spec in done.stderr
    assert host.spec.read_text() == before


def test_runs_at_the_same_time_generate_once(host):
    counter = host.spec.parent.parent / "generated-times"
    stand_in(host, "nvidia-ctk", VERSION_ONLY + "echo x >> %s\nsleep 1\n"
             "printf 'cdiVersion: 0.5.0\\nkind: nvidia.com/gpu\\ndevices:\\n  - name: all\\n'\n" % counter)
    runs = [host.start() for _run in range(4)]
    outputs = sorted(run.communicate(timeout=60)[0].strip() for run in runs)
    assert [run.returncode for run in runs] == [0, 0, 0, 0]
    assert outputs == ["generated", "unchanged", "unchanged", "unchanged"], outputs
    assert counter.read_text() == "x\n"
    assert sorted(path.name for path in host.spec.parent.iterdir()) == ["nvidia.yaml"]
