"""The ResourceSlices NVIDIA's DRA kubelet plugin published for each simulator scenario, against the scenario.

tests/fixtures/dra/<scenario>.json hold what the plugin (kubernetes-sigs/dra-driver-nvidia-gpu, driver
gpu.nvidia.com) published for a node with that scenario's GPUs, or why it would not start
(tools/dra/make-fixtures, which names the plugin's commit in each file). The tests here read only
those files and the scenarios, so a fixture that no longer matches its scenario (a scenario changed,
a fixture edited or made from another build) fails here.
"""

from __future__ import annotations

import json
import re
from xml.etree import ElementTree

import pytest

from harness.paths import ROOT, scenario_path

FIXTURES = ROOT / "tests" / "fixtures" / "dra"
SCENARIOS = sorted(path.stem for path in (ROOT / "tests" / "nvml_simulator" / "scenarios").glob("*.json"))
DRIVER = "gpu.nvidia.com"
NODE = "gpu-node"
# nvmlDeviceArchitecture_t as the plugin names it.
ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere", 8: "Ada Lovelace",
                 9: "Hopper", 10: "Blackwell"}
# nvmlBrandType_t as the plugin names it; the simulator's default brand follows the product name.
BRANDS = {1: "Quadro", 2: "Tesla", 3: "NVS", 5: "GeForce", 6: "Titan", 12: "QuadroRTX", 13: "NvidiaRTX",
          14: "Nvidia"}
BRAND_BY_NAME = (("Tesla ", "Tesla"), ("TITAN", "Titan"), ("NVIDIA TITAN", "Titan"), ("Quadro RTX", "QuadroRTX"),
                 ("Quadro", "Quadro"), ("NVS", "NVS"), ("GeForce", "GeForce"), ("NVIDIA GeForce", "GeForce"),
                 ("NVIDIA RTX", "NvidiaRTX"))
ADDRESSING_MODES = {0: "None", 1: "HMM", 2: "ATS"}
# The NVML calls the plugin makes for every GPU while it enumerates them, before it publishes anything:
# an error injected into one of them stops it; errors elsewhere do not concern it.
CALLS_AT_START = {"*", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetUUID",
                  "nvmlDeviceGetMigMode", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetName", "nvmlDeviceGetArchitecture",
                  "nvmlDeviceGetBrand", "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetPciInfo_v3",
                  "nvmlDeviceGetAddressingMode"}
# nvmlErrorString of the error names a scenario injects.
ERROR_TEXT = {"UNKNOWN": "Unknown Error", "GPU_IS_LOST": "GPU is lost", "DRIVER_NOT_LOADED": "Driver Not Loaded"}
QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti)?$")
SUFFIX = {None: 1, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40}


def fixture(name):
    return json.loads((FIXTURES / ("%s.json" % name)).read_text(encoding="utf-8"))


def scenario(name):
    return json.loads(scenario_path(name).read_text(encoding="utf-8"))


def quantity(text):
    """A Kubernetes quantity in bytes (the binary suffixes the plugin's capacities use)."""
    match = QUANTITY.match(text)
    assert match, "not a binary quantity: %r" % text
    return int(match.group(1)) * SUFFIX[match.group(2)]


def version(text):
    """A version as the plugin writes it: semantic, without leading zeros (580.159.04 is 580.159.4)."""
    parts = [int(part) for part in text.split(".")] + [0, 0]
    return "%d.%d.%d" % tuple(parts[:3])


def devices(found):
    return [device for item in found["resourceSlices"] for device in item["spec"].get("devices") or []]


def strings(device):
    return {key: next(iter(value.values())) for key, value in device["attributes"].items()}


def brand(gpu):
    if "brand" in gpu:
        return BRANDS[gpu["brand"]]
    names = [name for prefix, name in BRAND_BY_NAME if gpu["name"].startswith(prefix)]
    return names[-1] if names else "Nvidia"


def mig_on(gpu):
    return (gpu.get("migMode") or {}).get("current") == 1


def first_failing_gpu(described):
    """(index, error name) of the first GPU whose injected errors hit a call the plugin makes at start."""
    for index, gpu in enumerate(described.get("devices", [])):
        for call, error in (gpu.get("errors") or {}).items():
            if call in CALLS_AT_START:
                return index, error
    return None


# The scenarios whose fixture holds slices (a missing fixture fails the test below).
PUBLISHED = [name for name in SCENARIOS if (FIXTURES / ("%s.json" % name)).exists() and fixture(name)["resourceSlices"]]


def test_every_scenario_has_a_fixture_from_one_build():
    assert sorted(path.stem for path in FIXTURES.glob("*.json")) == SCENARIOS
    commits = {fixture(name)["commit"] for name in SCENARIOS}
    assert len(commits) == 1 and re.match(r"^[0-9a-f]{40}$", commits.pop())
    readme = (FIXTURES / "README.md").read_text(encoding="utf-8")
    assert fixture(SCENARIOS[0])["commit"] in readme
    assert all(fixture(name)["source"] == "kubernetes-sigs/dra-driver-nvidia-gpu" for name in SCENARIOS)


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_plugin_starts_unless_the_scenario_breaks_a_call_it_needs(name):
    found, described = fixture(name), scenario(name)
    failing = first_failing_gpu(described)
    if described.get("initError"):
        failing = (None, described["initError"])
    if failing is None:
        assert found["exitStatus"] is None and found["complete"] and found["errors"] == []
        assert len(found["resourceSlices"]) == 1
        return
    index, error = failing
    assert found["exitStatus"] == 1 and found["resourceSlices"] == []
    refusal = [message for message in found["errors"] if message.startswith("Error: error creating driver: ")]
    assert len(refusal) == 1 and refusal[0].endswith(ERROR_TEXT[error])
    if index is not None:
        assert re.search(r"\b(GPU |device |index ')%d\b" % index, refusal[0])


@pytest.mark.parametrize("name", PUBLISHED)
def test_one_pool_for_the_node(name):
    (published,) = fixture(name)["resourceSlices"]
    assert published["apiVersion"] == "resource.k8s.io/v1" and published["kind"] == "ResourceSlice"
    assert published["spec"]["driver"] == DRIVER and published["spec"]["nodeName"] == NODE
    assert published["spec"]["pool"] == {"generation": 1, "name": NODE, "resourceSliceCount": 1}
    assert published["metadata"]["generateName"] == "00000-%s-%s-" % (DRIVER, NODE)
    assert [(owner["kind"], owner["name"]) for owner in published["metadata"]["ownerReferences"]] == [("Node", NODE)]


def expected_gpu(described, index, gpu):
    """The attributes and capacity the plugin publishes for a whole GPU of the scenario."""
    major, minor = gpu["computeCapability"]
    cuda = described["cudaDriverVersion"]
    attributes = {
        "type": "gpu", "uuid": gpu["uuid"], "productName": gpu["name"], "brand": brand(gpu),
        "architecture": ARCHITECTURES[gpu["architecture"]], "cudaComputeCapability": "%d.%d.0" % (major, minor),
        "driverVersion": version(described["driverVersion"]),
        "cudaDriverVersion": "%d.%d.0" % (cuda // 1000, cuda % 1000 // 10),
        "resource.kubernetes.io/pciBusID": gpu["pciBusId"][4:].lower(),
        # Every GPU of a scenario's sysfs tree sits under one root complex.
        "resource.kubernetes.io/pcieRoot": "pci0000:00",
    }
    if "addressingMode" in gpu:
        attributes["addressingMode"] = ADDRESSING_MODES[gpu["addressingMode"]]
    return "gpu-%d" % gpu.get("minorNumber", index), attributes, {"memory": gpu["memory"]["total"]}


def expected_migs(described, index, gpu):
    """(name prefix, placement or None, attributes, memory) of each MIG device of a GPU in MIG mode."""
    _name, parent, _capacity = expected_gpu(described, index, gpu)
    for entry in gpu.get("migDevices") or []:
        if "computeInstanceId" not in entry:
            continue
        profile = entry["name"].rsplit(" ", 1)[1]
        attributes = dict(parent, type="mig", uuid=entry["uuid"], parentUUID=gpu["uuid"], profile=profile)
        attributes.pop("addressingMode", None)
        prefix = "gpu-%d-mig-%s-" % (gpu.get("minorNumber", index), profile.replace(".", ""))
        yield prefix, entry.get("placement"), attributes, entry["memory"]["total"]


@pytest.mark.parametrize("name", PUBLISHED)
def test_one_device_per_gpu_or_mig_device_as_the_scenario_says(name):
    described = scenario(name)
    published = {strings(device)["uuid"]: device for device in devices(fixture(name))}
    wanted = set()
    for index, gpu in enumerate(described.get("devices", [])):
        if not mig_on(gpu):
            device_name, attributes, capacity = expected_gpu(described, index, gpu)
            device = published[gpu["uuid"]]
            assert device["name"] == device_name
            assert strings(device) == attributes
            assert {key: quantity(value["value"]) for key, value in device["capacity"].items()} == capacity
            wanted.add(gpu["uuid"])
            continue
        for prefix, placement, attributes, memory in expected_migs(described, index, gpu):
            device = published[attributes["uuid"]]
            assert device["name"].startswith(prefix) and strings(device) == attributes
            assert quantity(device["capacity"]["memory"]["value"]) == memory
            slices = sorted(int(key[len("memorySlice"):]) for key in device["capacity"] if key.startswith("memorySlice"))
            assert slices and slices == list(range(slices[0], slices[0] + len(slices)))
            assert device["name"].endswith("-%d" % slices[0])
            if placement is not None:
                assert slices[0] == placement
            wanted.add(attributes["uuid"])
    assert set(published) == wanted


def test_the_real_h100_reads_as_nvidia_smi_read_the_card():
    """Brand and addressing mode of h100_real against nvidia-smi -q -x on the real card."""
    gpu = ElementTree.parse(ROOT / "tests" / "nvml_simulator" / "real-h100" / "nvidia-smi-q.xml").getroot().find("gpu")
    (device,) = devices(fixture("h100_real"))
    attributes = strings(device)
    assert attributes["brand"].upper() == gpu.findtext("product_brand")
    assert attributes["addressingMode"] == gpu.findtext("addressing_mode")
    assert attributes["productName"] == gpu.findtext("product_name")
