"""Paths shared by the tests and the benchmarks."""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "tests" / "nvml_simulator" / "scenarios"
SIMULATOR_DIR = pathlib.Path(os.environ.get("NVMLSIM_LIBRARY_DIR", ROOT / "build" / "nvml-simulator"))
COLLECTIONS = ROOT / "build" / "collections"
SCV_CRD = ROOT / "roles" / "scv_publish" / "files" / "scvs.core.run-linux.com.yml"


def scenario_path(name):
    path = SCENARIOS / ("%s.json" % name)
    assert path.is_file(), "no scenario %s" % path
    return path


def install_scv_crd(plane):
    """Applies the Scv CRD to a running control plane and waits until it is served."""
    plane.kubectl("apply", "-f", str(SCV_CRD))
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/scvs.core.run-linux.com")
