"""Run on a machine with a real NVIDIA GPU: what the agent's per-GPU-instance reading does there (MIG left as it is).

    python3 tools/device/mig-check.py OUT.json      (from the collection root)

For each GPU: its MIG mode, whether GPM is supported, and what NVML answers to a GPM sample of GPU instance 0
(nvmlGpmMigSampleGet, which the agent calls only for GPUs with MIG on) and of the whole GPU. Then the agent's own
reading, a long-lived nvml.session.Session read twice with the counters and its GPU instances read after each
(nvml.mig_instances), timed, and which DCGM series the metrics would serve from it: with MIG off, no GPU instance
and no GPU_I_* label. Changes no setting of the GPU (no MIG mode, no layout).
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

from ansible_collections.scv.gpu.plugins.module_utils.agent.metrics import families  # noqa: E402
from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import pynvml  # noqa: E402
from ansible_collections.scv.gpu.plugins.module_utils.nvml.session import Session  # noqa: E402


def _answer(function, *args):
    try:
        function(*args)
        return "SUCCESS"
    except pynvml.NVMLError as error:
        return "%s (%d)" % (error, error.value)


def calls():
    pynvml.nvmlInit()
    found = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            entry = {"index": index, "name": pynvml.nvmlDeviceGetName(handle)}
            try:
                entry["migMode"] = list(pynvml.nvmlDeviceGetMigMode(handle))
            except pynvml.NVMLError as error:
                entry["migMode"] = str(error)
            entry["gpmSupported"] = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            sample = pynvml.nvmlGpmSampleAlloc()
            entry["nvmlGpmMigSampleGet(gi 0)"] = _answer(pynvml.nvmlGpmMigSampleGet, handle, 0, sample)
            entry["nvmlGpmSampleGet"] = _answer(pynvml.nvmlGpmSampleGet, handle, sample)
            pynvml.nvmlGpmSampleFree(sample)
            entry["nvmlDeviceGetUtilizationRates"] = _answer(pynvml.nvmlDeviceGetUtilizationRates, handle)
            found.append(entry)
    finally:
        pynvml.nvmlShutdown()
    return found


def agent_reads():
    session, reads = Session(counters_interval_s=0.0), []
    facts = instances = None
    for _round in range(3):
        facts = session.read(["telemetry", "counters", "fabric"])
        session.slow.ask()
        started = time.perf_counter()
        instances = session.mig.read(session, facts["cardList"])
        reads.append(round((time.perf_counter() - started) * 1000, 4))
    snapshot = {"node": "real", "facts": facts, "last_xids": {}, "counters": {}, "served": None, "pods": None,
                "instances": instances}
    served = {name: len(rows) for name, _kind, _text, names, rows in families(snapshot) if name.startswith("DCGM_")}
    labels = sorted({label for _name, _kind, _text, names, _rows in families(snapshot) for label in names})
    session.close()
    return {"instances": instances, "instance_reads_ms": reads, "listed": session.mig.lists,
            "dcgm_series_rows": served, "labels": labels}


def main():
    result = {"calls": calls(), "agent": agent_reads()}
    with open(sys.argv[1], "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1, default=str)
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
