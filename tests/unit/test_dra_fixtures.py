"""The ResourceSlices NVIDIA's DRA kubelet plugin published for each simulator scenario, against the scenario.

tests/fixtures/dra/<scenario>.json hold what the plugin (kubernetes-sigs/dra-driver-nvidia-gpu, driver
gpu.nvidia.com) published for a node with that scenario's GPUs, or why it would not start
(tools/dra/make-fixtures, which names the plugin's commit in each file); tests/fixtures/dra/dynamic-mig/
the same with its DynamicMIG feature gate on. The tests here read those files and the scenarios (and,
for the MIG profiles a GPU offers, ask the simulator through pynvml), so a fixture that no longer
matches its scenario (a scenario changed, a fixture edited or made from another build) fails here.
"""

from __future__ import annotations

import json
import re
from xml.etree import ElementTree

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import pynvml
from ansible_collections.scv.gpu.plugins.module_utils.nvml.mig import MigGpu

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


# ----------------------------------------------------------------- DynamicMIG
# tests/fixtures/dra/dynamic-mig/: the same runs with the plugin's DynamicMIG feature gate on. A GPU
# whose MIG profiles NVML lists (the simulator lists them while MIG mode is on) gets a counter set of its
# engines and memory slices; the whole GPU (unless it is an Ampere, which cannot leave MIG mode without a
# reset) and every MIG profile at every placement are offered as devices that consume from it. Other GPUs
# are offered whole, as without the gate.

def dynamic(name):
    return json.loads((FIXTURES / "dynamic-mig" / ("%s.json" % name)).read_text(encoding="utf-8"))


DYNAMIC_PUBLISHED = [name for name in PUBLISHED if (FIXTURES / "dynamic-mig" / ("%s.json" % name)).exists()
                     and dynamic(name)["resourceSlices"]]


def counter_sets(found):
    return {counter_set["name"]: counter_set["counters"]
            for item in found["resourceSlices"] for counter_set in item["spec"].get("sharedCounters") or []}


def memory_slices(counters):
    return sorted(int(key[len("memory-slice-"):]) for key in counters if key.startswith("memory-slice-"))


def test_every_scenario_has_a_dynamic_mig_fixture_from_the_same_build():
    assert sorted(path.stem for path in (FIXTURES / "dynamic-mig").glob("*.json")) == SCENARIOS
    assert {dynamic(name)["commit"] for name in SCENARIOS} == {fixture(SCENARIOS[0])["commit"]}
    assert {dynamic(name)["featureGates"] for name in SCENARIOS} == {"DynamicMIG=true"}
    assert {fixture(name)["featureGates"] for name in SCENARIOS} == {"the defaults"}


@pytest.mark.parametrize("name", SCENARIOS)
def test_dynamic_mig_starts_or_refuses_as_the_plugin_does_without_it(name):
    found, static = dynamic(name), fixture(name)
    assert found["exitStatus"] == static["exitStatus"]
    if static["exitStatus"] is None:
        # With no GPU at all it publishes nothing, not even an empty slice as it does without the gate.
        assert bool(found["resourceSlices"]) == bool(scenario(name).get("devices"))
        assert found["complete"] == bool(found["resourceSlices"])
        check_teardown_errors(scenario(name), found["errors"])
    else:
        assert found["resourceSlices"] == []
        assert found["errors"][-1].rsplit(": ", 1)[1] == static["errors"][-1].rsplit(": ", 1)[1]


def check_teardown_errors(described, errors):
    """At start the plugin destroys the MIG devices it finds and turns MIG mode off on each Hopper or
    newer GPU left without one. A process on the GPU or MIG device makes that IN_USE: the plugin logs
    it as an error and goes on."""
    busy = any((gpu.get("processes") and "migMode" in gpu and gpu["architecture"] >= 9)
               or any(entry.get("processes") for entry in gpu.get("migDevices") or [])
               for gpu in described.get("devices", []))
    if not busy:
        assert errors == []
        return
    (error,) = errors
    assert error.startswith("Destroy unknown MIG devices: ") and error.endswith(": In use by another client")


@pytest.mark.parametrize("name", SCENARIOS)
def test_only_dynamic_mig_tears_down_the_mig_devices_it_finds(name):
    described = scenario(name)
    made = [sum(1 for entry in gpu.get("migDevices") or [] if "computeInstanceId" in entry)
            for gpu in described.get("devices", [])]
    if fixture(name)["exitStatus"] is not None:
        return
    assert fixture(name)["migDevicesLeft"] == made
    # Each one it does not offer itself; a MIG device a process holds stays (IN_USE), the rest go.
    held = [sum(1 for entry in gpu.get("migDevices") or [] if "computeInstanceId" in entry and entry.get("processes"))
            for gpu in described.get("devices", [])]
    left = dynamic(name)["migDevicesLeft"]
    assert all(kept == 0 if busy == 0 else kept >= busy for kept, busy in zip(left, held))


@pytest.mark.parametrize("name", DYNAMIC_PUBLISHED)
def test_dynamic_mig_offers_counter_sets_the_whole_gpu_and_each_placement(name):
    described, found = scenario(name), dynamic(name)
    (pool,) = {(item["spec"]["pool"]["name"], item["spec"]["pool"]["resourceSliceCount"]) for item in found["resourceSlices"]}
    assert pool == (NODE, len(found["resourceSlices"]))
    sets = counter_sets(found)
    published = {device["name"]: device for device in devices(found)}
    static = {device["name"]: device for device in devices(fixture(name))}
    capable = {index: gpu for index, gpu in enumerate(described.get("devices", [])) if mig_on(gpu)}
    assert set(sets) == {"gpu-%d-counter-set" % gpu.get("minorNumber", index) for index, gpu in capable.items()}
    offered = set()
    for index, gpu in enumerate(described.get("devices", [])):
        gpu_name, attributes, _capacity = expected_gpu(described, index, gpu)
        if index not in capable:
            assert published[gpu_name] == static[gpu_name]
            offered.add(gpu_name)
            continue
        counters = sets["%s-counter-set" % gpu_name]
        assert memory_slices(counters) == list(range(len(memory_slices(counters))))
        # Ampere cannot leave MIG mode without a GPU reset: with MIG on, its whole GPU is not offered.
        if not (mig_on(gpu) and gpu["architecture"] < 9):
            whole = published[gpu_name]
            assert strings(whole) == attributes
            assert whole["consumesCounters"] == [{"counterSet": "%s-counter-set" % gpu_name, "counters": counters}]
            assert whole["capacity"]["memory"] == counters["memory"]
            offered.add(gpu_name)
        offered |= check_offered_mig_devices(published, gpu_name, attributes, gpu, counters)
    assert set(published) == offered


def check_offered_mig_devices(published, gpu_name, parent, gpu, counters):
    """Checks the MIG devices offered on one GPU; returns their names."""
    names = {name for name in published if name.startswith(gpu_name + "-mig-")}
    assert names, "no MIG device offered on %s" % gpu_name
    for name in names:
        device = published[name]
        attributes = strings(device)
        assert attributes == dict({key: value for key, value in parent.items() if key not in ("uuid", "addressingMode")},
                                  type="mig", parentUUID=gpu["uuid"], profile=attributes["profile"])
        assert name.startswith("%s-mig-%s-" % (gpu_name, attributes["profile"].replace(".", "").replace("+", "-")))
        ((consumed),) = device["consumesCounters"]
        assert consumed["counterSet"] == "%s-counter-set" % gpu_name
        used = memory_slices(consumed["counters"])
        assert used and used == list(range(used[0], used[0] + len(used))) and name.endswith("-%d" % used[0])
        assert all(quantity(value["value"]) <= quantity(counters[key]["value"])
                   for key, value in consumed["counters"].items())
        assert device["capacity"]["memory"] == consumed["counters"]["memory"]
    # The profiles of the MIG devices the scenario made are among those offered.
    made = {entry["name"].rsplit(" ", 1)[1] for entry in gpu.get("migDevices") or [] if "computeInstanceId" in entry}
    assert made <= {strings(published[name])["profile"] for name in names}
    return names


@pytest.mark.parametrize("name", [name for name in DYNAMIC_PUBLISHED
                                  if any(mig_on(gpu) for gpu in scenario(name).get("devices", []))])
def test_dynamic_mig_offers_each_profile_at_each_placement_the_simulator_lists(nvml_simulator, name):
    """Every MIG profile and placement NVML lists for the GPU (read here through the real pynvml on the
    same scenario), each consuming the memory slices of its placement; no other."""
    described = scenario(name)
    nvml_simulator.use(name)
    pynvml.nvmlInit()
    try:
        tables = {index: MigGpu(index).profiles() for index, gpu in enumerate(described["devices"]) if mig_on(gpu)}
    finally:
        pynvml.nvmlShutdown()
    published = {device["name"]: device for device in devices(dynamic(name)) if strings(device)["type"] == "mig"}
    wanted = {}
    for index, table in tables.items():
        minor = described["devices"][index].get("minorNumber", index)
        for profile, offered in table.items():
            for start in offered["starts"]:
                wanted["gpu-%d-mig-%s-%d-%d" % (minor, profile.replace(".", "").replace("+", "-"), offered["id"], start)] = (
                    profile, list(range(start, start + offered["size"])))
    assert sorted(published) == sorted(wanted)
    for device_name, (profile, placement) in wanted.items():
        device = published[device_name]
        assert strings(device)["profile"] == profile
        assert memory_slices(device["consumesCounters"][0]["counters"]) == placement
