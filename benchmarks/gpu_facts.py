"""Benchmark of gpu_facts's collection work on the NVML simulator.

Measures, for 1, 8 and 64 simulated GPUs (H100 SXM cards), the wall time of
one collection (module_utils.nvml.collect.collect, no Ansible start-up), per GPU, and
the NVML calls it makes per GPU, for gather_subset=all and =min, and the same
for one read of the agent's long-lived NVML session after its first; each on
the simulator's real-cost model (what each call costs on a real H100) and on
its no-cost model. Then the wall time of a whole
`ansible-playbook playbooks/gpu_facts.yml` run on localhost. Prints Markdown
tables for docs/benchmarks.md.

Run it with `make benchmark-gpu-facts` (it builds the simulator and puts it on
LD_LIBRARY_PATH, which has to be set before Python starts).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from ansible_collections.scv.gpu.plugins.module_utils.common.gpu_info import GATHER_SUBSETS
from ansible_collections.scv.gpu.plugins.module_utils.nvml.collect import collect
from ansible_collections.scv.gpu.plugins.module_utils.nvml.session import Session
from harness.paths import COLLECTIONS, ROOT, SIMULATOR_DIR, scenario_path


def simulator():
    try:
        library = ctypes.CDLL("libnvidia-ml.so.1")
        library.nvmlsimCallCount.restype = ctypes.c_ulonglong
    except (OSError, AttributeError):
        sys.exit("the NVML simulator is not on LD_LIBRARY_PATH: run `make benchmark`")
    return library


def node_scenario(directory, count):
    """A scenario with `count` H100 cards, each with its own UUID and bus id."""
    template = json.loads(scenario_path("h100_sxm_x8").read_text())
    card = template["devices"][0]
    devices = []
    for index in range(count):
        device = json.loads(json.dumps(card))
        device["uuid"] = "GPU-%08x-0000-4000-8000-000000000000" % index
        device["pciBusId"] = "%08X:%02X:00.0" % (index // 256, index % 256)
        devices.append(device)
    path = pathlib.Path(directory) / ("gpus-%d.json" % count)
    path.write_text(json.dumps(dict(template, devices=devices)))
    return path


def measure_collection(library, path, subsets, repeats, session=False):
    """Median seconds and NVML calls of one collection; with ``session``, of one Session read after the first."""
    os.environ["NVMLSIM_CONFIG"] = str(path)
    reader = Session() if session else None
    read = reader.read if session else collect
    read(subsets)  # warm-up: imports, first dlsym lookups; a session's init and static readings
    timings = []
    calls = []
    for _repeat in range(repeats):
        library.nvmlsimResetCallCount()
        start = time.perf_counter()
        facts = read(subsets)
        timings.append(time.perf_counter() - start)
        calls.append(library.nvmlsimCallCount())
    if reader is not None:
        assert reader.inits == 1, reader.inits
        reader.close()
    assert facts["nvml_available"], facts
    return statistics.median(timings), statistics.median(calls), facts["cardNumber"]


def measure_playbook(repeats):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), LD_LIBRARY_PATH=str(SIMULATOR_DIR),
               NVMLSIM_CONFIG=str(scenario_path("h100_sxm_x8")))
    command = [str(pathlib.Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
               "-e", "ansible_python_interpreter=%s" % sys.executable, str(ROOT / "playbooks" / "gpu_facts.yml")]
    timings = []
    for _repeat in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, env=env, check=True, capture_output=True)
        timings.append(time.perf_counter() - start)
    return statistics.median(timings), min(timings), max(timings)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="collections per configuration, no-cost model")
    parser.add_argument("--real-repeats", type=int, default=10, help="collections per configuration, real-cost model")
    parser.add_argument("--playbook-repeats", type=int, default=5, help="playbook runs (median taken)")
    args = parser.parse_args()

    library = simulator()
    machine = platform.processor() or platform.machine()
    print("Machine: %s, %s, Python %s, %d CPUs" % (platform.node(), machine, platform.python_version(), os.cpu_count()))
    print()
    print("| cost model | reader | GPUs | gather_subset | median per collection | per GPU | NVML calls | calls per GPU |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as directory:
        empty = node_scenario(directory, 0)
        for model, repeats in (("real", args.real_repeats), ("none", args.repeats)):
            os.environ["NVMLSIM_LATENCY"] = model
            for reader, session in (("gpu_facts (collect)", False), ("agent (Session read)", True)):
                for label, subsets in (("all", list(GATHER_SUBSETS)), ("min", [])):
                    base_calls = measure_collection(library, empty, subsets, 3, session)[1]
                    for count in (1, 8, 64):
                        scenario = node_scenario(directory, count)
                        median, calls, cards = measure_collection(library, scenario, subsets, repeats, session)
                        assert cards == count
                        print("| %s | %s | %d | %s | %.3f ms | %.3f ms | %d | %.1f |" % (
                            model, reader, count, label, median * 1000, median * 1000 / count, calls,
                            (calls - base_calls) / count))
    os.environ.pop("NVMLSIM_LATENCY")
    print()
    median, fastest, slowest = measure_playbook(args.playbook_repeats)
    print("ansible-playbook playbooks/gpu_facts.yml, 8 simulated H100, localhost, real-cost model: median %.2f s "
          "(min %.2f s, max %.2f s, %d runs)" % (median, fastest, slowest, args.playbook_repeats))


if __name__ == "__main__":
    main()
