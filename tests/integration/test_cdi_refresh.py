"""scv-gpu-cdi-refresh (the container_toolkit role's script and boot unit's command) on this host.

nvidia-smi is the stand-in that asks NVML (the simulator, so the GPUs, their MIG devices and the
driver version come from a scenario file this test edits), and nvidia-ctk the stand-in toolkit
CLI, whose spec names the driver's libraries by version as the real one does. The molecule
scenario container_toolkit_docker runs the same script through the role and its unit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from harness.paths import ROOT, SIMULATOR_DIR, scenario_path

SCRIPT = ROOT / "roles" / "container_toolkit" / "files" / "scv-gpu-cdi-refresh"
STANDIN = ROOT / "tests" / "molecule" / "standin"


@pytest.fixture
def host(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    subprocess.run(["gcc", "-O2", "-o", str(bin_dir / "nvidia-smi"), str(STANDIN / "nvidia-smi.c"), "-ldl"], check=True)

    class Host:
        scenario = tmp_path / "scenario.json"
        spec = tmp_path / "etc" / "cdi" / "nvidia.yaml"
        state = tmp_path / "var" / "lib" / "scv-gpu" / "cdi.fingerprint"

        @staticmethod
        def toolkit(version):
            text = (STANDIN / "nvidia-ctk").read_text().replace("@VERSION@", version)
            (bin_dir / "nvidia-ctk").write_text(text)
            (bin_dir / "nvidia-ctk").chmod(0o755)

        @classmethod
        def edit(cls, change):
            scenario = json.loads(cls.scenario.read_text())
            change(scenario)
            cls.scenario.write_text(json.dumps(scenario))

        @classmethod
        def command(cls, extra, timeout_s=None):
            env = dict(os.environ, PATH="%s:/usr/bin:/bin" % bin_dir, LD_LIBRARY_PATH=str(SIMULATOR_DIR),
                       NVMLSIM_CONFIG=str(cls.scenario))
            if timeout_s is not None:
                env["SCV_GPU_CDI_TIMEOUT"] = str(timeout_s)
            return [str(SCRIPT), "--output", str(cls.spec), "--state", str(cls.state)] + list(extra), env

        @classmethod
        def refresh(cls, *extra, timeout_s=None):
            command, env = cls.command(extra, timeout_s)
            return subprocess.run(command, env=env, capture_output=True, text=True, check=False)

        @classmethod
        def start(cls):
            command, env = cls.command(())
            return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    shutil.copy(scenario_path("a100_mig"), Host.scenario)
    Host.toolkit("1.17.8")
    return Host


def refreshed(host, expected):
    done = host.refresh()
    assert done.returncode == 0 and done.stdout.strip() == expected, done.stdout + done.stderr
    return host.spec.read_text()


def test_the_spec_follows_the_driver_the_toolkit_and_the_mig_layout(host):
    driver = json.loads(host.scenario.read_text())["driverVersion"]
    assert "libnvidia-ml.so.%s" % driver in refreshed(host, "generated")
    assert oct(host.spec.stat().st_mode & 0o777) == "0o644"
    refreshed(host, "unchanged")

    # a MIG device goes away (the layout changes): the spec is regenerated
    host.edit(lambda scenario: scenario["devices"][0]["migDevices"].pop())
    refreshed(host, "generated")
    refreshed(host, "unchanged")

    host.toolkit("1.18.0")
    refreshed(host, "generated")

    host.edit(lambda scenario: scenario.update(driverVersion="580.95.05"))
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
    ctk = host.spec.parent.parent.parent / "bin" / "nvidia-ctk"
    ctk.write_text("#!/bin/sh\ncase \"$1\" in --version) echo 'NVIDIA Container Toolkit CLI version 9 (stand-in)';;"
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
    host.toolkit("1.18.0")             # something changed, so a refresh would generate
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
    host.toolkit("1.18.0")
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
