"""The simulator exports every NVML entry point that NVIDIA's tools link against (the lists in
tests/fixtures/nvml-symbols, read from their binaries by tools/nvml-symbols); those it does not model
answer as a driver does for a feature the GPU lacks, and never win go-nvml's choice of a version."""

from __future__ import annotations

import ctypes
import re
import subprocess

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import pynvml

from harness.paths import ROOT, SIMULATOR_DIR

SYMBOLS = ROOT / "tests" / "fixtures" / "nvml-symbols"
TOOLS = sorted(path for path in SYMBOLS.glob("*.txt") if not path.name.startswith("go-nvml-"))
GO_NVML = sorted(SYMBOLS.glob("go-nvml-*.txt"))
# The programs of NVIDIA's that run on the simulator in this project's fixtures and tests.
EXPECTED_TOOLS = {"gpu-feature-discovery", "nvidia-device-plugin", "mps-control-daemon", "gpu-kubelet-plugin",
                  "nvidia-mig-parted", "nvidia-ctk"}
VERSION = re.compile(r"^(?P<family>nvml\w+?)(?:_v(?P<version>[0-9]+))?$")


def names(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    return lines[0], [line for line in lines[1:] if line]


def unmodelled():
    """The entry points tools/build-simulator generated for the library, as it wrote them beside it."""
    return set((SIMULATOR_DIR / "unmodelled.txt").read_text(encoding="utf-8").split())


def modelled():
    """The NVML entry points the library exports that nvml_simulator.c defines itself."""
    exported = subprocess.run(["nm", "-D", "--defined-only", str(SIMULATOR_DIR / "libnvidia-ml.so.1")],
                              capture_output=True, text=True, check=True).stdout.split()
    return {name for name in exported if name.startswith("nvml") and not name.startswith("nvmlsim")} - unmodelled()


@pytest.fixture(scope="module")
def library():
    return ctypes.CDLL(str(SIMULATOR_DIR / "libnvidia-ml.so.1"))


def exports(library, name):
    try:
        getattr(library, name)
    except AttributeError:
        return False
    return True


def test_a_list_for_each_tool_names_what_it_was_read_from():
    assert {path.stem for path in TOOLS} == EXPECTED_TOOLS
    for path in TOOLS + GO_NVML:
        header, entries = names(path)
        assert re.search(r"\b(built from [\w/-]+ [0-9a-f]{40}|v[0-9]+\.[0-9]+\.[0-9]+)", header), path.name
        assert len(entries) == len(set(entries)) and all(VERSION.match(name) for name in entries), path.name
    assert all(len(names(path)[1]) > 300 for path in TOOLS)   # go-nvml names every function of its version


def test_the_simulator_models_the_functions_its_readers_ask_and_generates_only_the_rest():
    ours = modelled()
    # Those defined by a macro (a plain number or an enable state) count as modelled as well.
    assert len(ours) > 90 and {"nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPersistenceMode",
                               "nvmlDeviceGetHandleByPciBusId_v2"} <= ours


@pytest.mark.parametrize("path", TOOLS, ids=lambda path: path.stem)
def test_every_entry_point_a_tool_links_against_is_exported(library, path):
    missing = [name for name in names(path)[1] if not exports(library, name)]
    assert not missing, "%s would stop at: %s" % (path.stem, ", ".join(missing))


def test_an_entry_point_it_does_not_model_answers_not_supported_and_is_counted(library, nvml_simulator):
    assert "nvmlDeviceGetFanSpeed" in unmodelled()   # an H100 has no fan: NOT_SUPPORTED on the real card too
    nvml_simulator.use("h100_sxm_x8")
    speed = ctypes.c_uint()
    assert library.nvmlDeviceGetFanSpeed(None, ctypes.byref(speed)) == pynvml.NVML_ERROR_UNINITIALIZED
    pynvml.nvmlInit()
    try:
        before = nvml_simulator.calls_of("nvmlDeviceGetFanSpeed")
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetFanSpeed(pynvml.nvmlDeviceGetHandleByIndex(0))
        assert nvml_simulator.calls_of("nvmlDeviceGetFanSpeed") == before + 1
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.parametrize("path", GO_NVML, ids=lambda path: path.stem)
def test_go_nvml_never_chooses_a_version_the_simulator_does_not_model(library, path):
    # go-nvml starts from a function's first version and takes each newer one the library exports.
    chosen = {}
    for name in sorted(names(path)[1], key=lambda name: int(VERSION.match(name).group("version") or 1)):
        family = VERSION.match(name).group("family")
        chosen.setdefault(family, family)
        if exports(library, name):
            chosen[family] = name
    ours = modelled()
    wrong = {family: name for family, name in chosen.items()
             if name not in ours and any(other.startswith(family) for other in ours)}
    assert not wrong, "go-nvml would call these stubs while an older version is modelled: %s" % wrong


@pytest.mark.parametrize("bus_id", ["00000000:3A:00.0", "0000:3a:00.0", "3a:00.0"])
def test_a_gpu_is_found_by_its_pci_bus_id_in_each_form_the_driver_takes(nvml_simulator, bus_id):
    nvml_simulator.use("h100_sxm_x8")
    pynvml.nvmlInit()
    try:
        by_index = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(8)]
        wanted = [pynvml.nvmlDeviceGetPciInfo(handle).busId for handle in by_index]
        assert "00000000:3A:00.0" in wanted
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        assert pynvml.nvmlDeviceGetUUID(handle) == pynvml.nvmlDeviceGetUUID(by_index[wanted.index("00000000:3A:00.0")])
        for elsewhere in ("0000:ff:1f.7", "0001:3a:00.0", "0000:3a:00.1"):
            with pytest.raises(pynvml.NVMLError_NotFound):
                pynvml.nvmlDeviceGetHandleByPciBusId(elsewhere)
        for malformed in ("3a:00", "0000:3a:00.0 and more"):
            with pytest.raises(pynvml.NVMLError_InvalidArgument):
                pynvml.nvmlDeviceGetHandleByPciBusId(malformed)
    finally:
        pynvml.nvmlShutdown()
