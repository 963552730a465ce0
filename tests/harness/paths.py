"""Where the checkout keeps what the tests and the benchmarks use: the collection, the simulator, the scenarios."""

from __future__ import annotations

import json
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
SCENARIOS = ROOT / "tests" / "nvml_simulator" / "scenarios"
SIMULATOR_DIR = pathlib.Path(os.environ.get("NVMLSIM_LIBRARY_DIR", ROOT / "build" / "nvml-simulator"))
COLLECTIONS = ROOT / "build" / "collections"
SCV_CRD = ROOT / "roles" / "scv_publish" / "files" / "scvs.core.run-linux.com.yml"
AGENT_WHEELS = pathlib.Path(os.environ.get("SCV_GPU_WHEELS", ROOT / "build" / "agent-wheels"))
AGENT_ROLE = ROOT / "roles" / "scv_agent"


def scenario_path(name):
    path = SCENARIOS / ("%s.json" % name)
    assert path.is_file(), "no scenario %s" % path
    return path


def scenario_uuids(name):
    """The GPU UUIDs of a shipped scenario, in device order."""
    return [device["uuid"] for device in json.loads(scenario_path(name).read_text())["devices"]]
