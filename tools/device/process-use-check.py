"""Run on a machine with a real NVIDIA GPU: the agent's per-process reader (nvml.processes) against nvidia-smi.

    python3 tools/device/process-use-check.py OUT.json      (from the collection root)

Starts three PyTorch processes on GPU 0 (1 to 3 GiB held, busy 30 to 90 % of the time, as
tools/device/processes-check.py does), then reads them five times, 2 s apart, with
nvml.processes.ProcessUse as the agent does at scrapes, beside nvidia-smi's --query-compute-apps.
Writes what it saw, and each read's time, as JSON; changes no setting of the GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
collections = tempfile.mkdtemp()
os.makedirs(os.path.join(collections, "ansible_collections", "scv"))
os.symlink(root, os.path.join(collections, "ansible_collections", "scv", "gpu"))
sys.path.insert(0, collections)

from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import pynvml  # noqa: E402
from ansible_collections.scv.gpu.plugins.module_utils.nvml.processes import ProcessUse  # noqa: E402

spec = importlib.util.spec_from_file_location("processes_check", os.path.join(root, "tools", "device",
                                                                              "processes-check.py"))
processes_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(processes_check)


def main():
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    workers = [subprocess.Popen([sys.executable, "-c", processes_check.WORKER, str(gib), str(duty)],
                                stdout=subprocess.PIPE, text=True) for gib, duty in ((1, 0.3), (2, 0.6), (3, 0.9))]
    report = {"gpu": pynvml.nvmlDeviceGetName(handle), "pids": [], "reads": []}
    try:
        report["pids"] = [int(worker.stdout.readline()) for worker in workers]
        time.sleep(4)
        use = ProcessUse()
        for _read in range(5):
            time.sleep(2)
            started = time.perf_counter()
            got = use.read(uuid, handle, session=1)
            took = (time.perf_counter() - started) * 1000
            smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=30, check=False).stdout
            report["reads"].append({
                "ms": round(took, 3),
                "memoryMiB": {str(pid): used >> 20 for pid, used in (got["memory"] or {}).items()},
                "utilization": {str(pid): fields for pid, fields in (got["utilization"] or {}).items()},
                "nvidiaSmiMiB": dict(line.replace(" ", "").split(",") for line in smi.splitlines() if line)})
    finally:
        for worker in workers:
            worker.terminate()
            worker.wait(30)
        time.sleep(1)
        report["after"] = use.read(uuid, handle, session=1) if report["reads"] else None
        report["afterMemory"] = report["after"] and {str(k): v for k, v in (report["after"]["memory"] or {}).items()}
        report.pop("after", None)
        with open(sys.argv[1], "w") as out:
            json.dump(report, out, indent=1)
        pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
