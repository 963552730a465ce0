"""A fleet of Scv agents on one machine: what 50, 100 and 200 nodes ask of one kube-apiserver.

Every agent runs as the scv_agent role installs it (its own virtual environment's Python, the
zipapp), with its own node name, Node, node identity and 8 simulated H100s, against one real
kube-apiserver and etcd on 127.0.0.1. The API server's audit log records every request the
nodes make; the figures are read from it. For each fleet size:

1. steady state: requests per node per minute by verb and resource over one watch period (the
   agent's default 300 s), watches apart; kube-apiserver's CPU and RSS; etcd's bytes per node;
2. a fleet-wide fault (every node's first GPU lost at once) and its recovery: writes and Events
   per node in the 30 s after, and the seconds until every Node's GPUHealthy condition says so;
3. an API server restart (down 10 s): requests per node in the first 20 s after it is ready, and
   when each node's watch came back;
4. every node's client certificate issued again in place: requests per node in the next 20 s.

The simulator runs its no-cost model: the API traffic does not depend on what NVML costs, and
the agents' own CPU is ``benchmarks/scv_agent.py``'s subject. Run it with ``make benchmark-fleet``.
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

from harness.agent import install_agent
from harness.agent_fleet import audited_plane, by_kind, etcd_bytes, per_node, process_sample, start_fleet, writes

FAULT_WINDOW_S = 30
RESTART_WINDOW_S = 20
DOWN_S = 10


def quantiles(values):
    """(min, median, max), or Nones for nothing."""
    return (min(values), statistics.median(values), max(values)) if values else (None, None, None)


def per_node_counts(requests, nodes):
    table = per_node(requests, nodes)
    return [len(table[node]) for node in nodes]


def apiserver_use(plane, window):
    """kube-apiserver's (CPU %% of one core, median RSS MiB, start, end) over ``window`` seconds."""
    pid = plane.state["pids"]["kube-apiserver"]
    start, (_rss, cpu_before) = time.time(), process_sample(pid)
    rss = []
    while time.time() - start < window:
        time.sleep(5)
        rss.append(process_sample(pid)[0])
    end, (_rss, cpu_after) = time.time(), process_sample(pid)
    return (cpu_after - cpu_before) / (end - start) * 100, statistics.median(rss), start, end


def steady(plane, fleet, window):
    cpu, rss, start, end = apiserver_use(plane, window)
    requests = plane.audit_log.requests(start, end)
    size, minutes = len(fleet.nodes), (end - start) / 60
    kinds = by_kind(requests)
    return {
        "window_s": end - start,
        "per_node_per_minute": len(requests) / size / minutes,
        "watches_per_node_per_minute": sum(1 for request in requests if request.verb == "watch") / size / minutes,
        "others_per_node_per_minute": sum(1 for request in requests if request.verb != "watch") / size / minutes,
        "by_kind_per_node_per_minute": {kind: count / size / minutes for kind, count in sorted(kinds.items())},
        "apiserver_cpu_percent": cpu,
        "apiserver_rss_mib": rss,
    }


def transition(plane, fleet, lost):
    """Every node's first card lost (or back) at once: writes, Events and the time the fleet took."""
    at = fleet.lose_first_cards(lost)
    converged = fleet.wait_condition("False" if lost else "True", timeout=180)
    time.sleep(max(0.0, at + FAULT_WINDOW_S - time.time()))
    requests = plane.audit_log.requests(at, at + FAULT_WINDOW_S)
    table = per_node(requests, fleet.nodes)
    node_writes = [len(writes(table[node])) for node in fleet.nodes]
    events = [sum(1 for request in table[node] if request.what == "events") for node in fleet.nodes]
    return {
        "converged_s": converged,
        "writes_per_node": quantiles(node_writes),
        "events_per_node": quantiles(events),
        "requests_per_node": quantiles([len(table[node]) for node in fleet.nodes]),
        "by_kind_per_node": {kind: count / len(fleet.nodes) for kind, count in sorted(by_kind(requests).items())},
    }


def object_bytes(plane, node):
    """JSON bytes of what one node keeps in etcd beside its Node: its Scv, its condition and an Event."""
    scv = plane.kubectl("get", "scv", node, "-o", "json").stdout
    conditions = json.loads(plane.kubectl("get", "node", node, "-o", "json").stdout)["status"]["conditions"]
    condition = next(item for item in conditions if item["type"] == "GPUHealthy")
    events = json.loads(plane.kubectl("get", "events", "-n", "default", "--field-selector",
                                      "involvedObject.name=%s" % node, "-o", "json").stdout)["items"]
    return {"scv": len(json.dumps(json.loads(scv), separators=(",", ":"))),
            "condition": len(json.dumps(condition, separators=(",", ":"))),
            "event": max(len(json.dumps(event, separators=(",", ":"))) for event in events)}


def restart(plane, fleet):
    """kube-apiserver down DOWN_S seconds, then the first RESTART_WINDOW_S seconds after it is ready."""
    down = time.time()
    plane.stop_apiserver()
    time.sleep(DOWN_S)
    plane.start_apiserver()
    ready = time.time()
    time.sleep(RESTART_WINDOW_S)
    requests = plane.audit_log.requests(ready, ready + RESTART_WINDOW_S)
    counts = per_node_counts(requests, fleet.nodes)
    firsts = [min(request.at for request in mine) - ready
              for mine in per_node(requests, fleet.nodes).values() if mine]
    # Every node's watch back, however long it took (its pauses reach 30 s); a starting server may answer one
    # before its /readyz says so, hence times below 0.
    fleet.wait(lambda: all(any(request.verb == "watch" and request.code == 200 for request in mine) for mine in
                           per_node(plane.audit_log.requests(down), fleet.nodes).values()), 120, "every watch back")
    watches = [min(request.at for request in mine if request.verb == "watch" and request.code == 200) - ready
               for mine in per_node(plane.audit_log.requests(down), fleet.nodes).values()]
    return {
        "requests_per_node": quantiles(counts),
        "requests_per_node_mean": statistics.mean(counts),
        "nodes_asking": len(firsts),
        "first_request_s": quantiles(firsts),
        "watch_back_s": quantiles(watches),
        "by_kind_per_node": {kind: count / len(fleet.nodes) for kind, count in sorted(by_kind(requests).items())},
    }


def rotation(plane, fleet):
    at = fleet.rotate_certificates()
    time.sleep(RESTART_WINDOW_S)
    requests = plane.audit_log.requests(at, at + RESTART_WINDOW_S)
    return {"requests_per_node": quantiles(per_node_counts(requests, fleet.nodes)),
            "by_kind_per_node": {kind: count / len(fleet.nodes) for kind, count in sorted(by_kind(requests).items())}}


def run_size(work, command, size, window):
    plane = audited_plane(work / ("plane-%d" % size))
    fleet = None
    try:
        empty = etcd_bytes(plane)
        idle = apiserver_use(plane, 30)[:2]
        started = time.monotonic()
        fleet = start_fleet(plane, work / ("fleet-%d" % size), command, size)
        result = {"size": size, "published_s": time.monotonic() - started, "idle": idle}
        time.sleep(20)   # start-up done
        result["steady"] = steady(plane, fleet, window)
        result["etcd_bytes_per_node"] = (etcd_bytes(plane) - empty) / size
        result["fault"] = transition(plane, fleet, lost=True)
        result["object_bytes"] = object_bytes(plane, fleet.nodes[0])
        result["recovery"] = transition(plane, fleet, lost=False)
        result["restart"] = restart(plane, fleet)
        result["rotation"] = rotation(plane, fleet)
        result["agents_ended"] = sorted(fleet.exited())
        return result
    finally:
        if fleet is not None:
            fleet.stop()
        plane.stop()


def report(result):
    def triple(values, unit=""):
        return "min %s, median %s, max %s%s" % (*("-" if value is None else "%.3g" % value for value in values), unit)

    size, steady_ = result["size"], result["steady"]
    print("N = %d agents (published in %.0f s); kube-apiserver before them: %.2f %% of one core, %.0f MiB RSS" % (
        size, result["published_s"], *result["idle"]))
    print("  steady state, %.0f s: %.3f requests per node per minute (watches %.3f, others %.3f); %s" % (
        steady_["window_s"], steady_["per_node_per_minute"], steady_["watches_per_node_per_minute"],
        steady_["others_per_node_per_minute"], json.dumps(steady_["by_kind_per_node_per_minute"])))
    print("  kube-apiserver: %.2f %% of one core, %.0f MiB RSS; etcd: %.0f bytes per node (JSON: Scv %d, "
          "condition %d, Event %d)" % (steady_["apiserver_cpu_percent"], steady_["apiserver_rss_mib"],
                                       result["etcd_bytes_per_node"], result["object_bytes"]["scv"],
                                       result["object_bytes"]["condition"], result["object_bytes"]["event"]))
    for phase in ("fault", "recovery"):
        figures = result[phase]
        print("  %s: every Node's condition in %.1f s; per node in %d s: writes %s, Events %s, requests %s; %s" % (
            phase, figures["converged_s"], FAULT_WINDOW_S, triple(figures["writes_per_node"]),
            triple(figures["events_per_node"]), triple(figures["requests_per_node"]),
            json.dumps(figures["by_kind_per_node"])))
    figures = result["restart"]
    print("  API server restart (%d s down): per node in the first %d s: %s (mean %.2f), %d nodes asked; "
          "first request %s; watch back %s; %s" % (
              DOWN_S, RESTART_WINDOW_S, triple(figures["requests_per_node"]), figures["requests_per_node_mean"],
              figures["nodes_asking"], triple(figures["first_request_s"], " s"), triple(figures["watch_back_s"], " s"),
              json.dumps(figures["by_kind_per_node"])))
    print("  certificates rotated: per node in %d s: %s; %s" % (
        RESTART_WINDOW_S, triple(result["rotation"]["requests_per_node"]),
        json.dumps(result["rotation"]["by_kind_per_node"])))
    if result["agents_ended"]:
        print("  agents that ended: %s" % ", ".join(result["agents_ended"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--sizes", default="50,100,200", help="fleet sizes to run, in order")
    parser.add_argument("--steady", type=int, default=300, help="steady-state seconds (default: one watch period)")
    parser.add_argument("--wheels", required=True, help="folder with the agent's wheels (make agent-wheels)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="scv-fleet-bench-"))
    results = []
    try:
        command = install_agent(work / "agent", pathlib.Path(args.wheels))
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
        print("machine: %s, %d cores, %.0f GiB" % (platform.platform(), os.cpu_count(), memory_gib))
        for size in (int(text) for text in args.sizes.split(",")):
            results.append(run_size(work, command, size, args.steady))
            report(results[-1])
            sys.stdout.flush()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
