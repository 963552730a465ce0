"""What gpu_facts must report for each simulator scenario, field by field.

Worked out by hand from the scenario files (bytes // 2**20 for MiB, mW // 1000
for W, the PCIe per-lane table times the width), not captured from the code.
Unit tests compare the collector's output with these in-process; integration
tests compare what ansible returns from the module.
"""

from __future__ import annotations

import json

from harness.paths import ROOT

LOST = ("GPU is lost: it fell off the bus or stopped responding (XID 79); "
        "reset the GPU or reboot the node")

# SCV's README example: TITAN Xp at PCIe gen3 x16.
TITAN_XP_CARD = {
    "id": 0,
    "model": "TITAN Xp",
    "uuid": "GPU-8d3c1f0a-6b2e-4a1d-9c7e-2f4b6a8d0c1e",
    "pciBusId": "00000000:01:00.0",
    "totalMemory": 12194,          # 12194 MiB + 417792 bytes
    "freeMemory": 11950,           # 11950 MiB + 4096 bytes
    "usedMemory": 244,             # total - free - reserved, in MiB as nvidia-smi shows them
    "reservedMemory": 0,
    "virtualizationMode": 0,
    "clock": 5705,
    "core": 1911,
    "power": 250,
    "pcieGeneration": 3,
    "pcieWidth": 16,
    "bandwidth": 15760,            # 985 MB/s x 16
    "computeCapability": "6.1",
    "family": "pascal",
    "persistenceMode": False,
    "retiredPagesPending": False,
    "clockEventReasons": 1,
    "temperature": 38,
    "gpuUtilization": 0,
    "memoryUtilization": 0,
    "powerDraw": 15,               # 15432 mW
    "processCount": 0,
    "health": "Healthy",
    "healthReasons": [],
}

TITAN_XP = {
    "nvml_available": True,
    "nvml_error": None,
    "driver_version": "535.183.01",
    "nvml_version": "12.535.183.01",
    "cuda_driver_version": "12.2",
    "cardNumber": 1,
    "totalMemorySum": 12194,
    "freeMemorySum": 11950,
    "cardList": [TITAN_XP_CARD],
}

H100_BUSES = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]


def h100_card(i):
    return {
        "id": i,
        "model": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-%08x-1f2e-4d3c-8b4a-%012x" % (0x5a7c0000 + i, 0x9e8d7c6b5a40 + i),
        "pciBusId": "00000000:%s:00.0" % H100_BUSES[i],
        "totalMemory": 81559,
        "freeMemory": 81005 - 1000 * i,
        "usedMemory": 19 + 1000 * i,   # without the 535 MiB the driver reserves, as nvidia-smi's Used
        "reservedMemory": 535,
        "virtualizationMode": 0,
        "clock": 2619,
        "core": 1980,
        "power": 700,
        "pcieGeneration": 5,
        "pcieWidth": 16,
        "bandwidth": 63008,            # 3938 MB/s x 16: SCV would report 0
        "computeCapability": "9.0",
        "family": "hopper",
        "persistenceMode": True,
        "eccEnabled": True,
        "eccErrors": {
            "uncorrectedVolatile": 0,
            "uncorrectedAggregate": 0,
            "correctedVolatile": i,
            "correctedAggregate": 10 + i,
        },
        "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False},
        "recoveryAction": 0,
        "clockEventReasons": 0,
        "temperature": 30 + i,
        "gpuUtilization": 10 * i,
        "memoryUtilization": 5 * i,
        "powerDraw": 71 + i,
        "smClock": 345,                # the idle clocks of a real H100
        "memClock": 2619,
        # what a real H100 answers beside (memory temperature, codecs, energy, PCIe replays), and an HGX
        # board's NVLink: 18 NVLink 4 links per GPU, every one to an NVSwitch, and the fabric trained
        "memoryTemperature": 40 + i % 3,
        "encoderUtilization": 0,
        "decoderUtilization": 0,
        "energyConsumption": 2742790 + 137000 * i,
        "pcieReplayCount": 0,
        "nvlinkBandwidthTotal": 0,
        "powerCapThrottling": 1000000 * i,   # ns the power cap held the clocks down: i ms
        "fabric": {"state": "completed", "status": "Success", "cliqueId": 0,
                   "clusterUuid": "00000000-0000-0000-0000-000000000000", "healthSummary": "healthy"},
        "nvlink": {"links": 18, "activeLinks": 18, "switchLinks": 18, "speedMBps": 26562, "version": "4.0"},
        "migEnabled": False,
        "migPendingEnabled": False,
        "processCount": i % 3,
        "health": "Healthy",
        "healthReasons": [],
    }


H100_SXM_X8 = {
    "nvml_available": True,
    "nvml_error": None,
    "driver_version": "550.54.15",
    "nvml_version": "12.550.54.15",
    "cuda_driver_version": "12.4",
    "cardNumber": 8,
    "totalMemorySum": 8 * 81559,
    "freeMemorySum": sum(81005 - 1000 * i for i in range(8)),
    "cardList": [h100_card(i) for i in range(8)],
}


def _a100_card(i, bus, mig_enabled, mig_pending):
    return {
        "id": i,
        "model": "NVIDIA A100-SXM4-40GB",
        "uuid": "GPU-%08x-3c2b-4a19-8f7e-6d5c4b3a2910" % (0x1e2d3c40 + i),
        "pciBusId": "00000000:%s:00.0" % bus,
        "totalMemory": 40960,
        "freeMemory": 40327,
        "usedMemory": 0,
        "reservedMemory": 633,
        "virtualizationMode": 0,
        "clock": 1215,
        "core": 1410,
        "power": 400,
        "pcieGeneration": 4,
        "pcieWidth": 16,
        "bandwidth": 31504,            # 1969 MB/s x 16
        "computeCapability": "8.0",
        "family": "ampere",
        "persistenceMode": True,
        "eccEnabled": True,
        "eccErrors": {
            "uncorrectedVolatile": 0,
            "uncorrectedAggregate": 0,
            "correctedVolatile": 0,
            "correctedAggregate": 0,
        },
        "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False},
        "recoveryAction": 0,
        "clockEventReasons": 1,
        "temperature": 31,
        "gpuUtilization": 0,
        "memoryUtilization": 0,
        "powerDraw": 54,
        "migEnabled": mig_enabled,
        "migPendingEnabled": mig_pending,
        "processCount": 0,
        "health": "Healthy",
        "healthReasons": [],
    }


# A GPU with MIG on has no utilization of its own (NVML answers NOT_SUPPORTED; nvidia-smi shows N/A).
A100_MIG_CARD0 = dict(
    {key: value for key, value in _a100_card(0, "07", True, True).items()
     if key not in ("gpuUtilization", "memoryUtilization")},
    migDevices=[
        {"index": 0, "uuid": "MIG-2f4e6d8c-0b1a-5c3d-9e8f-7a6b5c4d3e21", "model": "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
         "gpuInstanceId": 1, "computeInstanceId": 0, "totalMemory": 19968, "freeMemory": 19955,
         "profile": "3g.20gb", "attributes": {"memory": 19968, "multiprocessors": 42, "gpuInstanceSlices": 3,
                                              "computeInstanceSlices": 3, "copyEngines": 3, "decoders": 2,
                                              "encoders": 0, "jpegEngines": 0, "ofaEngines": 0}},
        {"index": 1, "uuid": "MIG-3a5b7c9d-1e2f-5a4b-8c6d-0e1f2a3b4c52", "model": "NVIDIA A100-SXM4-40GB MIG 2g.10gb",
         "gpuInstanceId": 5, "computeInstanceId": 0, "totalMemory": 9856, "freeMemory": 9843,
         "profile": "2g.10gb", "attributes": {"memory": 9856, "multiprocessors": 28, "gpuInstanceSlices": 2,
                                              "computeInstanceSlices": 2, "copyEngines": 2, "decoders": 1,
                                              "encoders": 0, "jpegEngines": 0, "ofaEngines": 0}},
        {"index": 2, "uuid": "MIG-4b6c8d0e-2f3a-5b5c-9d7e-1f2a3b4c5d63", "model": "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
         "gpuInstanceId": 13, "computeInstanceId": 0, "totalMemory": 4864, "freeMemory": 4851,
         "profile": "1g.5gb", "attributes": {"memory": 4864, "multiprocessors": 14, "gpuInstanceSlices": 1,
                                             "computeInstanceSlices": 1, "copyEngines": 1, "decoders": 0,
                                             "encoders": 0, "jpegEngines": 0, "ofaEngines": 0}},
    ],
)

A100_MIG = {
    "nvml_available": True,
    "nvml_error": None,
    "driver_version": "550.54.15",
    "nvml_version": "12.550.54.15",
    "cuda_driver_version": "12.4",
    "cardNumber": 2,
    "totalMemorySum": 81920,
    "freeMemorySum": 80654,
    "cardList": [A100_MIG_CARD0, _a100_card(1, "0F", False, True)],
}


def _v100_card(i, bus):
    return {
        "id": i,
        "model": "Tesla V100-SXM2-16GB",
        "uuid": "GPU-%08x-7d6c-4b5a-9e8f-0a1b2c3d4e5f" % (0x6c5b4a30 + i),
        "pciBusId": "00000000:%s:00.0" % bus,
        "totalMemory": 16384,
        "freeMemory": 16150,
        "usedMemory": 234,
        "reservedMemory": 0,
        "virtualizationMode": 0,
        "clock": 877,
        "core": 1530,
        "power": 300,
        "pcieGeneration": 3,
        "pcieWidth": 16,
        "bandwidth": 15760,
        "computeCapability": "7.0",
        "family": "volta",
        "persistenceMode": True,
        "eccEnabled": True,
        "eccErrors": {
            "uncorrectedVolatile": 0,
            "uncorrectedAggregate": 0,
            "correctedVolatile": 0,
            "correctedAggregate": 0,
        },
        "retiredPagesPending": False,
        "clockEventReasons": 0,
        "temperature": 35,
        "gpuUtilization": 0,
        "memoryUtilization": 0,
        "powerDraw": 42,
        "processCount": 0,
        "health": "Healthy",
        "healthReasons": [],
    }


LOST_CARD = {
    "nvml_available": True,
    "nvml_error": None,
    "driver_version": "535.183.01",
    "nvml_version": "12.535.183.01",
    "cuda_driver_version": "12.2",
    "cardNumber": 4,
    "totalMemorySum": 3 * 16384,   # the lost card has no memory to count
    "freeMemorySum": 3 * 16150,
    "cardList": [
        _v100_card(0, "15"),
        _v100_card(1, "16"),
        {"id": 2, "health": "Unhealthy", "healthReasons": [LOST]},
        _v100_card(3, "3B"),
    ],
}

POWER_NOT_SUPPORTED_CARD = {
    "id": 0,
    "model": "NVIDIA GeForce RTX 3090",
    "uuid": "GPU-0a9b8c7d-6e5f-4a3b-8c2d-1e0f9a8b7c6d",
    "pciBusId": "00000000:2B:00.0",
    "totalMemory": 24576,
    "freeMemory": 24257,
    "usedMemory": 13,
    "reservedMemory": 306,
    "virtualizationMode": 0,
    "clock": 9751,
    "core": 2100,
    # no "power": the driver answered NOT_SUPPORTED, which is not a failure
    "pcieGeneration": 4,
    "pcieWidth": 16,
    "bandwidth": 31504,
    "computeCapability": "8.6",
    "family": "ampere",
    "persistenceMode": False,
    "clockEventReasons": 1,
    "temperature": 45,
    "gpuUtilization": 3,
    "memoryUtilization": 1,
    "powerDraw": 30,
    "processCount": 0,
    "health": "Healthy",
    "healthReasons": [],
}

POWER_NOT_SUPPORTED = {
    "nvml_available": True,
    "nvml_error": None,
    "driver_version": "550.54.15",
    "nvml_version": "12.550.54.15",
    "cuda_driver_version": "12.4",
    "cardNumber": 1,
    "totalMemorySum": 24576,
    "freeMemorySum": 24257,
    "cardList": [POWER_NOT_SUPPORTED_CARD],
}

NO_GPUS = {
    "nvml_available": True,
    "nvml_error": None,
    "driver_version": "550.54.15",
    "nvml_version": "12.550.54.15",
    "cuda_driver_version": "12.4",
    "cardNumber": 0,
    "totalMemorySum": 0,
    "freeMemorySum": 0,
    "cardList": [],
}

DRIVER_NOT_LOADED = {
    "nvml_available": False,
    "nvml_error": ("the NVIDIA kernel driver is not loaded (is the nvidia module loaded? "
                   "a reboot may be pending after a driver install)"),
    "cardNumber": 0,
    "totalMemorySum": 0,
    "freeMemorySum": 0,
    "cardList": [],
}

NO_LIBRARY = {
    "nvml_available": False,
    "nvml_error": ("libnvidia-ml.so.1 was not found: the NVIDIA driver is not installed "
                   "(or its library is not in the loader's search path)"),
    "cardNumber": 0,
    "totalMemorySum": 0,
    "freeMemorySum": 0,
    "cardList": [],
}

# health_reasons: the reasons each card must give, in order.
HEALTH_REASONS = [
    ["2 uncorrectable ECC errors since the driver loaded"],
    ["row remapping is pending: reset the GPU"],
    ["row remapping failed: the GPU needs service"],
    ["the driver asks for a node reboot after a critical XID error"],
    ["hardware thermal slowdown: the GPU is too hot and its clocks are cut",
     "software thermal slowdown: the GPU runs above its target temperature"],
    ["reading the memory information failed: Unknown Error"],
    ["GPU requires a reset before it can be used again"],
    [],
    ["memory pages are pending retirement: reset the GPU or reboot the node"],
    # a driver before r535: the query is only known by its older name
    ["hardware thermal slowdown: the GPU is too hot and its clocks are cut"],
]

# A real H100 80GB HBM3: what gpu_facts (gather_subset all) returned on the card itself, through
# ansible-playbook with the real driver 580.159.04. h100_real.json holds that card's values as
# nvidia-smi -q -x showed them, telemetry included, so every field must come out the same.
REAL_H100_DIR = ROOT / "tests" / "nvml_simulator" / "real-h100"
H100_REAL = json.loads((REAL_H100_DIR / "gpu_facts.json").read_text(encoding="utf-8"))
# That reading was taken when usedMemory still counted the driver's reserve. The card's
# nvidia-smi -q (nvidia-smi-q.xml) says FB Memory Usage Reserved 480 MiB, Used 0 MiB: what
# gpu_facts reports now, usedMemory as nvidia-smi's Used and the reserve apart.
H100_REAL["cardList"][0].update(usedMemory=0, reservedMemory=480)
# Read later on the same card (dcgm-counter-calls.txt): NVML's virtualization mode 1, passthrough.
H100_REAL["cardList"][0].update(virtualizationMode=1)
# Its nvidia-smi -q shows the clock event reason "GPU idle" active alone: NVML's mask 0x1, which gpu_facts
# reports since it serves DCGM_FI_DEV_CLOCKS_EVENT_REASONS.
H100_REAL["cardList"][0].update(clockEventReasons=1)

BY_SCENARIO = {
    "titan_xp": TITAN_XP,
    "h100_real": H100_REAL,
    "h100_sxm_x8": H100_SXM_X8,
    "a100_mig": A100_MIG,
    "lost_card": LOST_CARD,
    "power_not_supported": POWER_NOT_SUPPORTED,
    "no_gpus": NO_GPUS,
    "driver_not_loaded": DRIVER_NOT_LOADED,
}
