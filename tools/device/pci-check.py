"""Run on a machine with a real NVIDIA GPU: the PCI reading of scv.gpu against NVML's own answer.

    python3 tools/device/pci-check.py      (from the collection root; prints JSON, exits 1 on a mismatch)

Checks that every GPU NVML answers for is on the PCI bus list (and none is missing from NVML),
that the model table names each card as NVML does, and how long the sysfs reading takes.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
collections = tempfile.mkdtemp()
os.makedirs(os.path.join(collections, "ansible_collections", "scv"))
os.symlink(root, os.path.join(collections, "ansible_collections", "scv", "gpu"))
sys.path.insert(0, collections)

from ansible_collections.scv.gpu.plugins.module_utils.nvml.probe import probe_library  # noqa: E402
from ansible_collections.scv.gpu.plugins.module_utils.host.pci import missing_from_nvml, nvidia_gpus  # noqa: E402

timings = []
for _ in range(50):
    started = time.perf_counter()
    gpus = nvidia_gpus("/sys")
    timings.append(time.perf_counter() - started)
timings.sort()
nvml = probe_library()
import pynvml  # noqa: E402

pynvml.nvmlInit()
names = {}
for index in range(pynvml.nvmlDeviceGetCount()):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    pci = pynvml.nvmlDeviceGetPciInfo(handle)
    busid = pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId
    name = pynvml.nvmlDeviceGetName(handle)
    names[busid] = (name.decode() if isinstance(name, bytes) else name, "0x%08x" % pci.pciDeviceId)
pynvml.nvmlShutdown()
missing = missing_from_nvml(gpus, nvml["bus_ids"])
model_mismatch = [(gpu, names.get(bus)) for gpu in gpus for bus in names
                  if bus.lower().endswith(gpu["busId"].lower()[-12:]) and gpu["model"] != names[bus][0]]
report = {"pci_gpus": gpus, "nvml": nvml, "nvml_names": names, "nvml_missing": missing,
          "model_mismatch": model_mismatch, "nvidia_gpus_median_ms": round(timings[len(timings) // 2] * 1000, 3),
          "pci_functions": len(os.listdir("/sys/bus/pci/devices"))}
print(json.dumps(report, indent=2))
sys.exit(1 if missing or model_mismatch or len(gpus) != nvml["gpu_count"] else 0)
