"""What the agent's NVML reads alone cost a node of 8 H100s, by MIG layout and counters interval: timed in-process.

The agent's own reads (agent.readings.Readings, as the agent makes them: a tick every second, a scrape
every ``--scrape-interval`` seconds, the costly counters read on demand at most once per counters
interval) on the simulator's real-cost model, with every default counter of dcgm-exporter answering
(as ``scv_agent.py --every-counter``). The session's clock is simulated, so an hour of ticks takes a
few seconds; the NVML calls still cost what they cost on a real H100, as CPU of this process. The
figure is the reads' share of one core: the floor under the agent's whole CPU (``scv_agent.py``
adds the HTTP server, the exposition, the API client and the other threads), and, unlike the whole
agent's, steady from run to run on a shared machine.

    LD_LIBRARY_PATH=build/nvml-simulator PYTHONPATH=tests:build/collections \\
        .venv/bin/python benchmarks/agent_reads.py
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import statistics
import sys
import tempfile
import time

from ansible_collections.scv.gpu.plugins.module_utils.agent.readings import Readings
from ansible_collections.scv.gpu.plugins.module_utils.agent.xid import XidPolicy
from ansible_collections.scv.gpu.plugins.module_utils.nvml.session import Session

from harness.common import Clock
from harness.paths import scenario_path
from scv_agent import every_counter, with_mig


def reads_cost(scenario, counters_interval, scrape_interval, seconds):
    """(tick seconds, scrape seconds) of CPU the reads of ``seconds`` simulated seconds took, after a warm-up."""
    os.environ.update(NVMLSIM_CONFIG=str(scenario), NVMLSIM_LATENCY="real")
    clock = Clock()
    session = Session(clock=clock, counters_interval_s=counters_interval)
    session.slow.on_demand = True   # as the agent serving metrics
    readings = Readings(session, XidPolicy(), metrics=True)
    try:
        for _warm_up in range(2):   # NVML started, static readings, GPM's cold first metrics request
            readings.tick()
            readings.scrape()
            clock.now += counters_interval
        tick = scrape = 0.0
        for second in range(seconds):
            clock.now += 1.0
            if second % scrape_interval == 0:
                started = time.process_time()
                readings.scrape()
                scrape += time.process_time() - started
            started = time.process_time()
            readings.tick()
            tick += time.process_time() - started
        return tick, scrape
    finally:
        readings.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--mig", default="0,1,7", help="GPU instances per GPU, each layout in turn: 0 (MIG off), 1, 7")
    parser.add_argument("--counters-interval", default="30,60", help="the agent's counters intervals to run, in s")
    parser.add_argument("--scrape-interval", type=int, default=30, help="seconds between scrapes")
    parser.add_argument("--seconds", type=int, default=1800, help="simulated seconds of ticks per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per row, of which the median is shown")
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="scv-agent-reads-"))
    print("machine: %s, %d cores; Python %s; %d simulated s per run, a scrape every %d s, median of %d runs"
          % (platform.platform(), os.cpu_count(), sys.version.split()[0], args.seconds, args.scrape_interval,
             args.runs))
    print("| GPU instances | counters interval | reads' CPU, % of a core | ticks' | scrapes' | per GPU per tick |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    try:
        for per_gpu in (int(value) for value in args.mig.split(",")):
            scenario = work / ("mig-%d.json" % per_gpu)
            shutil.copy(scenario_path("h100_sxm_x8"), scenario)
            every_counter(scenario)
            if per_gpu:
                with_mig(scenario, per_gpu)
            gpus = len(json.loads(scenario.read_text())["devices"])
            for interval in (float(value) for value in args.counters_interval.split(",")):
                runs = [reads_cost(scenario, interval, args.scrape_interval, args.seconds) for _run in range(args.runs)]
                tick, scrape = (statistics.median(part) for part in zip(*runs))
                share = 100.0 / args.seconds
                print("| %d | %g s | **%.3f %%** | %.3f %% | %.3f %% | %.3f ms |" % (
                    per_gpu * gpus, interval, (tick + scrape) * share, tick * share, scrape * share,
                    (tick + scrape) * 1000 / args.seconds / gpus))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
