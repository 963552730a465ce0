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


AGENT_WHEELS = pathlib.Path(os.environ.get("SCV_GPU_WHEELS", ROOT / "build" / "agent-wheels"))
AGENT_ROLE = ROOT / "roles" / "scv_agent"


def agent_python():
    """Debian 12's Python (3.11), the one the agent wheels are downloaded for (make agent-wheels)."""
    import subprocess
    for candidate in ("/usr/bin/python3", None):
        if candidate is None:
            done = subprocess.run([str(ROOT / "tools" / "find-python"), "3.11"], capture_output=True, text=True,
                                  check=False)
            candidate = done.stdout.strip()
        if candidate and subprocess.run([candidate, "-c", "import sys, venv, ensurepip; "
                                         "sys.exit(sys.version_info[:2] != (3, 11))"], check=False).returncode == 0:
            return candidate
    raise AssertionError("no Python 3.11 with venv here: the agent's wheels are for Debian 12's Python 3.11")


def install_agent(work, wheels=AGENT_WHEELS):
    """The agent as roles/scv_agent installs it; returns the command that runs it.

    A virtual environment holding only the role's packages (installed from ``wheels``, as an
    air-gapped site would) and the zipapp that the scv.gpu.agent_zipapp lookup builds.
    """
    import subprocess
    import sys

    import yaml

    sys.path.insert(0, str(COLLECTIONS))
    from ansible_collections.scv.gpu.plugins.plugin_utils._agent_zipapp import write

    packages = yaml.safe_load((AGENT_ROLE / "defaults" / "main.yml").read_text())["scv_agent_python_packages"]
    work = pathlib.Path(work)
    venv = work / "venv"
    if not (venv / "bin" / "python").exists():
        subprocess.run([agent_python(), "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", "--no-index",
                        "--find-links", str(wheels)] + packages, check=True)
    zipapp = work / "scv-gpu-agent.pyz"
    write(str(zipapp))
    return [str(venv / "bin" / "python"), str(zipapp)]


def debian_containerd():
    """Debian's containerd: the one on PATH, or its package unpacked under build/containerd (``apt-get
    download``, which needs no root and changes nothing on this machine). Its folder holds ``ctr`` and
    ``containerd-shim-runc-v2`` too."""
    import shutil
    import subprocess

    found = shutil.which("containerd")
    if found:
        return pathlib.Path(found)
    unpacked = ROOT / "build" / "containerd"
    binary = unpacked / "usr" / "bin" / "containerd"
    if not binary.exists():
        unpacked.mkdir(parents=True, exist_ok=True)
        download = ["apt-get", "download", "containerd"]
        if subprocess.run(download, cwd=unpacked, capture_output=True, check=False).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], check=True, capture_output=True)
            subprocess.run(download, cwd=unpacked, check=True, capture_output=True)
        package = next(unpacked.glob("containerd_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(package), str(unpacked)], check=True)
    return binary
