"""Paths shared by the tests and the benchmarks."""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "tests" / "nvml_simulator" / "scenarios"
SIMULATOR_DIR = pathlib.Path(os.environ.get("NVMLSIM_LIBRARY_DIR", ROOT / "build" / "nvml-simulator"))
COLLECTIONS = ROOT / "build" / "collections"


def scenario_path(name):
    path = SCENARIOS / ("%s.json" % name)
    assert path.is_file(), "no scenario %s" % path
    return path
