"""Where a scrape's time goes on a node whose GPUs pods share: the agent's parts, timed in-process.

8 simulated H100s, each time-sliced among 4 pods, each pod with a real process in a cgroup named as
the kubelet's cgroupfs driver names a pod's (root needed), on its GPU in the scenario. Times, as CPU
of this process (the simulator's no-cost model, so NVML's own figures come on top), the mean of
``--runs``:

- reading the shared GPUs' processes and tying each to its pod (agent.shares.PodShares.read), with
  and without the utilization samples;
- the exposition with the per-pod series, with the pod labels but no per-pod series, and with no pods.

    LD_LIBRARY_PATH=build/nvml-simulator PYTHONPATH=tests:build/collections \
        .venv/bin/python benchmarks/agent_shares.py
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import tempfile
import time

from ansible_collections.scv.gpu.plugins.module_utils.agent.metrics import exposition
from ansible_collections.scv.gpu.plugins.module_utils.agent.pod_attribution import device_holders, device_replicas
from ansible_collections.scv.gpu.plugins.module_utils.agent.readings import Readings
from ansible_collections.scv.gpu.plugins.module_utils.agent.shares import PodShares
from ansible_collections.scv.gpu.plugins.module_utils.agent.xid import XidPolicy
from ansible_collections.scv.gpu.plugins.module_utils.nvml.session import Session

from harness.paths import scenario_path
from harness.pod_cgroups import PodProcesses, cgroup_root, time_slice

PODS_PER_GPU = 4


class Holders:
    """What a PodAttribution would say of ``answer`` (pod-resources entries), without a kubelet."""

    def __init__(self, answer):
        self.holders, self.replicas, self.ids = device_holders(answer), device_replicas(answer), {}

    def by_card(self, _cards):
        return {self.ids[device]: held for device, held in self.holders.items()}

    def replicas_by_card(self, _cards):
        return {self.ids[device]: {holder: ",".join(sorted(numbers)) for holder, numbers in held.items()}
                for device, held in self.replicas.items()}

    @staticmethod
    def mig_gpus():
        return set()


def shared_node(work, processes):
    """The scenario's path, the pod logs directory and the pod-resources entries of 8 GPUs x 4 pods."""
    data = json.loads(scenario_path("h100_sxm_x8").read_text())
    logs = work / "pod-logs"
    answer = [{"namespace": "bench", "pod": name, "container": "main", "resource": "nvidia.com/gpu",
               "device_ids": ["%s::%d" % (gpu, replica)]}
              for name, gpu, replica in time_slice(data, processes, logs, PODS_PER_GPU)]
    scenario = work / "scenario.json"
    scenario.write_text(json.dumps(data))
    return scenario, logs, answer


def cpu_ms(function, runs):
    started = time.process_time()
    for _run in range(runs):
        function()
    return (time.process_time() - started) / runs * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    root = cgroup_root()
    if root is None:
        parser.error("needs root and a writable cgroup hierarchy")
    work, processes = pathlib.Path(tempfile.mkdtemp(prefix="agent-shares-")), PodProcesses(root)
    readings = None
    try:
        scenario, logs, answer = shared_node(work, processes)
        os.environ.update(NVMLSIM_CONFIG=str(scenario), NVMLSIM_LATENCY="none")
        readings = Readings(Session(), XidPolicy(), metrics=True)
        cards = readings.tick()["cardList"]
        holders = Holders(answer)
        holders.ids = {card["uuid"]: card["id"] for card in cards}
        readings.shares = PodShares(holders, str(logs))
        readings.scrape()
        figures = {}
        for utilization in (False, True):
            readings.shares.utilization = utilization
            figures["read, utilization %s" % ("on" if utilization else "off")] = cpu_ms(
                lambda: readings._read_shares(readings.facts()["cardList"]), args.runs)  # pylint: disable=protected-access

        def snapshot(pods=True, shares=True):
            return {"node": "n", "facts": readings.facts(), "last_xids": {}, "counters": {}, "served": None,
                    "pods": holders.by_card(None) if pods else None, "shares": readings.shares.last if shares else {}}
        figures["exposition, per-pod series"] = cpu_ms(lambda: exposition(snapshot), args.runs)
        figures["exposition, pod labels only"] = cpu_ms(lambda: exposition(lambda: snapshot(shares=False)), args.runs)
        figures["exposition, no pods"] = cpu_ms(lambda: exposition(lambda: snapshot(False, False)), args.runs)
    finally:
        if readings is not None:
            readings.close()
        processes.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("machine: %s, %d cores; Python %s; 8 GPUs x %d pods; CPU per scrape, mean of %d"
          % (platform.platform(), os.cpu_count(), platform.python_version(), PODS_PER_GPU, args.runs))
    for what, value in figures.items():
        print("  %s: %.2f ms" % (what, value))


if __name__ == "__main__":
    main()
