"""Benchmark of the Scv agent against a real kube-apiserver, 8 simulated H100s, side by side with SCV.

The agent runs as the scv_agent role installs it: Debian's Python 3.11 in a virtual
environment holding only the role's packages (from --wheels), and the zipapp that the
scv.gpu.agent_zipapp lookup builds from the collection.

1. Resident memory (VmRSS) and CPU use (utime+stime from /proc) of the agent process at a 1 s
   updateInterval, over a steady-state window, sampled every second: median and maximum. RSS is
   split by /proc/<pid>/smaps into the NVML library's mappings and the rest (Python + agent).
   NVML time per GPU per tick comes from the agent's own scv_agent_nvml_seconds_total.
2. API requests per minute at steady state, counted from kube-apiserver's
   apiserver_request_total for scvs, against SCV's one GET per second (60 per minute).
3. Freshness: the seconds from a simulated memory change to the new value in the Scv, polled
   with kubectl: the median of 5 changes made at different points of the tick.
4. playbooks/site.yml wall time on this machine as the demo node (API stages for real, host
   stages in check mode): first run and rerun.

With ``--foreign-devices N``, the agent reads pods from a stand-in kubelet (the kubelet's own
pod-resources protobuf, served by grpcio) whose answer names N MIG devices this node does not
have, as a busy node's or another node's answer can: the agent must look each up in NVML once,
not at every tick.

With ``--sharing``, every GPU is time-sliced among 4 pods (replicas ``::0`` to ``::3`` from a
stand-in kubelet), each pod with a real process in a cgroup named as the kubelet names a pod's
(root needed), and that process on its GPU in the scenario with its own memory and a utilization
sample at every query (the GPUs busy): each scrape reads every GPU's processes and samples, and
ties each process to its pod, at the full cost.

Each measurement runs on the simulator's real-cost model (every NVML call costs what it costs on
a real H100), then on its no-cost model. Run it with `make benchmark-agent`; `--window` sets the
steady-state seconds per model (default 330, more than one watch of the default 300 s).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from harness.agent import install_agent
from harness.agent_fleet import process_sample as sample
from harness.common import free_port, wait_until
from harness.control_plane import ControlPlane, install_scv_crd
from harness.kubelet_podresources import StandInKubelet, generate, pod
from harness.paths import COLLECTIONS, ROOT, SIMULATOR_DIR, scenario_path
from harness.pod_cgroups import PodProcesses, cgroup_root, time_slice

TICK = os.sysconf("SC_CLK_TCK")
FRESHNESS_CHANGES = 5


def scv_requests(plane):
    total = 0
    for line in plane.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="scvs"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def library_rss_mib(pid):
    """RSS of the mappings of libnvidia-ml.so.1 in the process, from /proc/<pid>/smaps."""
    total_kib, current = 0, False
    with open("/proc/%d/smaps" % pid, encoding="utf-8") as handle:
        for line in handle:
            head = line.split()
            if head and "-" in head[0] and len(head[0]) > 8 and ":" not in head[0]:
                current = line.rstrip().endswith(("libnvidia-ml.so.1", "libnvidia-ml.so"))
            elif current and line.startswith("Rss:"):
                total_kib += int(head[1])
    return total_kib / 1024.0


def agent_metrics(port):
    """The agent's unlabelled series (its counters), parsed by Prometheus's own text parser."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as response:
        text = response.read().decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}


def series_count(port):
    """How many series the agent's /metrics serves."""
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as response:
        return sum(1 for line in response.read().decode().splitlines() if line and not line.startswith("#"))


def thread_cpu(pid):
    """Each live thread's CPU seconds (the scheduler's, to the nanosecond), by thread id: (name, seconds)."""
    threads = {}
    for task in pathlib.Path("/proc/%d/task" % pid).iterdir():
        try:
            name = (task / "comm").read_text().strip()
            on_cpu_ns = int((task / "schedstat").read_text().split()[0])
        except OSError:
            continue   # it ended
        threads[task.name] = (name, on_cpu_ns / 1e9)
    return threads


def thread_shares(before, after, elapsed):
    """% of a core per thread that lived through the window; what ended threads used is the rest."""
    shares = {}
    main_tid = min(after, key=int)   # the process's first thread has the lowest id
    for tid, (name, seconds) in after.items():
        if tid in before:
            label = "main" if tid == main_tid else name
            shares[label] = shares.get(label, 0.0) + (seconds - before[tid][1]) / elapsed * 100
    return shares


def site_runs(plane, work):
    """Wall seconds of two site.yml runs on this machine as demo-node (the make demo inventory)."""
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "demo-node"}}))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), LD_LIBRARY_PATH=str(SIMULATOR_DIR),
               NVMLSIM_CONFIG=str(scenario_path("h100_sxm_x8")), ANSIBLE_LOCAL_TEMP=str(work / "ansible-tmp"))
    command = [str(pathlib.Path(sys.executable).parent / "ansible-playbook"),
               "-i", str(ROOT / "playbooks" / "inventory" / "demo.yml"),
               "-e", "ansible_python_interpreter=%s" % sys.executable,
               "-e", "scv_gpu_kubeconfig=%s" % plane.admin_kubeconfig, str(ROOT / "playbooks" / "site.yml")]
    times = []
    for _run in range(2):
        start = time.monotonic()
        for stages in (["--tags", "host_roles", "--check"], ["--skip-tags", "host_roles"]):
            done = subprocess.run(command + stages, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError("site.yml failed:\n%s%s" % (done.stdout[-3000:], done.stderr[-2000:]))
        times.append(time.monotonic() - start)
    return times


def every_counter(scenario):
    """The 8 H100s with every counter dcgm-exporter serves by default answering, at the values the real
    H100 gave (memory temperature, energy, PCIe replays, encoder, decoder), NVLink traffic as on SXM
    cards, a vGPU guest's licence, and GPM's metrics: every series is read, at its real cost."""
    data = json.loads(scenario.read_text())
    for device in data["devices"]:
        device.update(fields={"82": 43, "83": 2742790, "94": 0, "66": 0}, encoderUtilization=0, decoderUtilization=0,
                      virtualizationMode=2, vgpuLicensed=1,
                      gpm={"anyTensorUtil": 0, "graphicsUtil": 0, "dramBwUtil": 0, "pcieTxMiBPerSecond": 1,
                           "pcieRxMiBPerSecond": 1})
    scenario.write_text(json.dumps(data))


def foreign_kubelet(work, devices):
    """A started stand-in kubelet whose pod-resources answer names ``devices`` MIG devices of no GPU here."""
    kubelet = StandInKubelet(generate(work / "podresources"), work / "pod-resources.sock")
    kubelet.pods = [pod("busy", "elsewhere", ("c", [("nvidia.com/mig-1g.10gb", [
        "MIG-%08x-0000-5000-8000-%012x" % (number, number) for number in range(devices)])]))]
    return kubelet.__enter__()


PODS_PER_GPU = 4


def sharing_kubelet(work, scenario, processes):
    """A started stand-in kubelet whose answer time-slices every GPU of ``scenario`` among 4 pods, each with a
    process (from ``processes``, a PodProcesses) on its GPU in the scenario; the pod logs directory naming them."""
    data = json.loads(scenario.read_text())
    logs = work / "pod-logs"
    pods = [pod(name, "bench", ("main", [("nvidia.com/gpu", ["%s::%d" % (gpu, replica)])]))
            for name, gpu, replica in time_slice(data, processes, logs, PODS_PER_GPU)]
    scenario.write_text(json.dumps(data))
    kubelet = StandInKubelet(generate(work / "podresources"), work / "pod-resources.sock")
    kubelet.pods = pods
    return kubelet.__enter__(), logs


# GPU instances per GPU: a 7g.80gb, or seven 1g.10gb, as the mig_layout role would make them
MIG_LAYOUTS = {1: [("7g.80gb", 0, 81152)], 7: [("1g.10gb", slot, 9984) for slot in range(7)]}


def with_mig(scenario, per_gpu):
    """Turns MIG on on each GPU of ``scenario`` with ``per_gpu`` GPU instances (MIG_LAYOUTS); returns their UUIDs."""
    data, uuids = json.loads(scenario.read_text()), []
    for index, device in enumerate(data["devices"]):
        entries = []
        for number, (profile, placement, mib) in enumerate(MIG_LAYOUTS[per_gpu]):
            uuid = "MIG-%08x-0000-5000-8000-%012x" % (index, number)
            entries.append({"name": "%s MIG %s" % (device["name"], profile), "uuid": uuid,
                            "gpuInstanceId": number + 1, "computeInstanceId": 0, "placement": placement,
                            "memory": {"total": mib << 20, "free": (mib - 13) << 20}, "processes": []})
            uuids.append(uuid)
        device.update(migMode={"current": 1, "pending": 1}, maxMigDevices=7, migDevices=entries)
    scenario.write_text(json.dumps(data))
    return uuids


def held_kubelet(work, resource, devices):
    """A started stand-in kubelet whose answer gives each of ``devices`` to a pod of its own."""
    kubelet = StandInKubelet(generate(work / "podresources"), work / "pod-resources.sock")
    kubelet.pods = [pod("job-%d" % number, "bench", ("main", [(resource, [device])]))
                    for number, device in enumerate(devices)]
    return kubelet.__enter__()


def run_agent(plane, work, wheels, model, window, watch_timeout, counters=False, counters_interval=None,
              scrape_interval=0, foreign_devices=0, sharing=None, mig=None):
    """One agent run on one cost model; returns its figures. ``sharing``: a PodProcesses for --sharing. ``mig``: GPU
    instances per GPU, each held by a pod (0: MIG off, a pod on each GPU; None: no pods)."""
    work.mkdir(parents=True, exist_ok=True)
    scenario = work / ("scenario-%s.json" % model)
    shutil.copy(scenario_path("h100_sxm_x8"), scenario)
    if counters:
        every_counter(scenario)
    node = "bench-node-%s" % model
    port = free_port()
    env = dict(os.environ, LD_LIBRARY_PATH=str(SIMULATOR_DIR), NVMLSIM_CONFIG=str(scenario), NVMLSIM_LATENCY=model)
    command = install_agent(work / ("agent-%s" % model), pathlib.Path(wheels)) + [
        "--kubeconfig", str(plane.node_kubeconfig(node)), "--node-name", node, "--log-level", "WARNING",
        "--watch-timeout", str(watch_timeout), "--metrics-address", "127.0.0.1:%d" % port] + (
            ["--counters-interval", str(counters_interval)] if counters_interval else [])
    kubelet = foreign_kubelet(work / ("kubelet-%s" % model), foreign_devices) if foreign_devices else None
    if sharing is not None:
        kubelet, logs = sharing_kubelet(work / ("kubelet-%s" % model), scenario, sharing)
        command += ["--pod-logs-dir", str(logs)]
    if mig is not None:
        devices = with_mig(scenario, mig) if mig else [device["uuid"] for device in json.loads(
            scenario.read_text())["devices"]]
        kubelet = held_kubelet(work / ("kubelet-%s" % model), "nvidia.com/mig-1g.10gb" if mig else "nvidia.com/gpu",
                               devices)
    if kubelet is not None:
        command += ["--pod-resources-socket", kubelet.socket]
    # The node's Node, as its kubelet registered it: the agent sets its GPUHealthy condition.
    plane.kubectl("delete", "node", node, "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "Node",
                                                              "metadata": {"name": node}}))
    agent = subprocess.Popen(command, env=env)
    try:
        wait_until(lambda: plane.kubectl("get", "scv", node, check=False).returncode == 0, 30,
                   "the agent's first Scv", step=0.2)
        time.sleep(5)   # start-up done, the watch is up
        if scrape_interval:
            # Prometheus has been scraping: the second counters read (GPM's first metrics, its cold call
            # charged once per session) comes before the window, which then holds only steady state
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as response:
                response.read()
            time.sleep(2)
        before = agent_metrics(port)
        requests_before, (_rss, cpu_before), start = scv_requests(plane), sample(agent.pid), time.monotonic()
        threads_before = thread_cpu(agent.pid)
        rss, scrapes, next_scrape = [], 0, start + scrape_interval
        while time.monotonic() - start < window:
            time.sleep(1)
            rss.append(sample(agent.pid)[0])
            if scrape_interval and time.monotonic() >= next_scrape:   # as a Prometheus would
                with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as response:
                    response.read()
                scrapes += 1
                next_scrape += scrape_interval
        elapsed = time.monotonic() - start
        cpu_after = sample(agent.pid)[1]
        threads = thread_shares(threads_before, thread_cpu(agent.pid), elapsed)
        # the metrics GETs and kubectl's are not the agent's: count only scvs requests
        requests = scv_requests(plane) - requests_before
        after = agent_metrics(port)
        series = series_count(port)
        library = library_rss_mib(agent.pid)

        freshness = []
        for change in range(FRESHNESS_CHANGES):
            free_mib = 10240 + change
            data = json.loads(scenario.read_text())
            data["devices"][0]["memory"]["free"] = free_mib * 2 ** 20
            staged = scenario.with_suffix(".new")
            staged.write_text(json.dumps(data))
            changed_at = time.monotonic()
            staged.rename(scenario)
            while True:
                status = json.loads(plane.kubectl("get", "scv", node, "-o", "json").stdout)["status"]
                if status["cardList"][0]["freeMemory"] == free_mib:
                    break
                time.sleep(0.05)
            freshness.append(time.monotonic() - changed_at)
            time.sleep(0.3 * change)   # spread the changes over the tick's phase
    finally:
        agent.terminate()
        agent.wait(timeout=15)
        if kubelet is not None:
            kubelet.__exit__(None, None, None)
    ticks = after["scv_agent_ticks_total"] - before["scv_agent_ticks_total"]
    nvml = after["scv_agent_nvml_seconds_total"] - before["scv_agent_nvml_seconds_total"]
    return {
        "elapsed": elapsed, "rss_median": statistics.median(rss), "rss_max": max(rss), "library_rss": library,
        "cpu": (cpu_after - cpu_before) / elapsed * 100, "threads": threads, "requests": requests,
        "per_minute": requests / elapsed * 60, "freshness": statistics.median(freshness),
        "freshness_max": max(freshness), "ticks": ticks,
        "nvml_ms_per_gpu_tick": nvml / ticks / 8 * 1000 if ticks else float("nan"),
        "inits": after["scv_agent_nvml_inits_total"], "static_reads": after["scv_agent_nvml_static_reads_total"],
        "scrapes": scrapes, "series": series,
        "counter_reads": after["scv_agent_nvml_counter_reads_total"] - before["scv_agent_nvml_counter_reads_total"],
        "pod_reads": after.get("scv_agent_pod_resources_reads_total", 0) - before.get(
            "scv_agent_pod_resources_reads_total", 0),
        "shared_reads": after.get("scv_agent_shared_gpu_reads_total", 0) - before.get(
            "scv_agent_shared_gpu_reads_total", 0),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--window", type=int, default=330, help="steady-state seconds to measure, per cost model")
    parser.add_argument("--watch-timeout", type=int, default=300, help="the agent's --watch-timeout")
    parser.add_argument("--models", default="real,none", help="simulator cost models to run, in order")
    parser.add_argument("--no-site", action="store_true", help="skip the site.yml runs")
    parser.add_argument("--wheels", required=True, help="folder with the agent's wheels (make agent-wheels)")
    parser.add_argument("--every-counter", action="store_true",
                        help="make every default counter of dcgm-exporter answer (energy, GPM, ...), at its cost")
    parser.add_argument("--counters-interval", type=float, help="the agent's --counters-interval")
    parser.add_argument("--foreign-devices", type=int, default=0,
                        help="pods hold this many MIG devices the node does not have (a stand-in kubelet)")
    parser.add_argument("--sharing", action="store_true",
                        help="time-slice every GPU among 4 pods with real processes (root, for their cgroups)")
    parser.add_argument("--mig", help="GPU instances per GPU (MIG on), each held by a pod: 0 (MIG off, a pod on each "
                                      "GPU), 1 or 7, or several (0,1,7), each run in turn on the same control plane")
    parser.add_argument("--scrape-interval", type=float, default=0,
                        help="scrape /metrics every this many seconds during the window, as Prometheus would (0: none)")
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="scv-agent-bench-"))
    sharing = None
    if args.sharing:
        root = cgroup_root()
        if root is None:
            parser.error("--sharing needs root and a writable cgroup hierarchy")
        sharing = PodProcesses(root)
    plane = ControlPlane(work / "plane").start()
    results = {}
    try:
        install_scv_crd(plane)
        plane.kubectl("create", "clusterrolebinding", "bench-nodes-scv", "--clusterrole=cluster-admin",
                      "--group=system:nodes")
        layouts = [None] if args.mig is None else [int(per_gpu) for per_gpu in args.mig.split(",")]
        for model in args.models.split(","):
            for per_gpu in layouts:
                results[model, per_gpu] = run_agent(
                    plane, work / ("mig-%s" % per_gpu), args.wheels, model, args.window, args.watch_timeout,
                    args.every_counter, args.counters_interval, args.scrape_interval, args.foreign_devices, sharing,
                    per_gpu)
        site = None if args.no_site else site_runs(plane, work)
    finally:
        plane.stop()
        if sharing is not None:
            sharing.stop()
        shutil.rmtree(work, ignore_errors=True)

    print("machine: %s, %d cores; agent on %s" % (platform.platform(), os.cpu_count(), subprocess.run(
        ["/usr/bin/python3", "--version"], capture_output=True, text=True, check=True).stdout.strip()))
    for (model, per_gpu), result in results.items():
        print("agent, 8 simulated H100s, %s-cost NVML model, updateInterval 1000 ms, watch timeout %d s, "
              "metrics on, %.0f s steady state:" % (model, args.watch_timeout, result["elapsed"]))
        print("  RSS: median %.1f MiB, max %.1f MiB; of it the NVML library's mappings %.2f MiB, "
              "Python + agent %.1f MiB (target < 30 MiB)" % (
                  result["rss_median"], result["rss_max"], result["library_rss"],
                  result["rss_median"] - result["library_rss"]))
        print("  CPU: %.3f %% of one core (target <= 0.3 %%)" % result["cpu"])
        shares = result["threads"]
        print("  CPU by thread: %s; threads that ended in the window (the scrapes') %.3f %%" % (
            ", ".join("%s %.3f %%" % item for item in sorted(shares.items())), result["cpu"] - sum(shares.values())))
        print("  scrapes: %d (every %g s); costly counters read %d times"
              % (result["scrapes"], args.scrape_interval, result["counter_reads"]))
        if args.foreign_devices:
            print("  pod-resources: %d reads of an answer naming %d MIG devices this node does not have"
                  % (result["pod_reads"], args.foreign_devices))
        if per_gpu is not None:
            print("  MIG: %d GPU instances (%d per GPU), each held by a pod; series: %d"
                  % (8 * per_gpu, per_gpu, result["series"]) if per_gpu else
                  "  MIG off: each GPU held by a pod; series: %d" % result["series"])
        if args.sharing:
            print("  sharing: %d pods on each of 8 GPUs; shared GPUs' processes read %d times (%d reads of the "
                  "kubelet)" % (PODS_PER_GPU, result["shared_reads"], result["pod_reads"]))
        print("  NVML: %.3f ms per GPU per tick over %d ticks (target <= 0.5 ms); NVML initialised %d time(s), "
              "static readings read %d time(s)"
              % (result["nvml_ms_per_gpu_tick"], result["ticks"], result["inits"], result["static_reads"]))
        print("  API requests: %d in %.0f s = %.2f per minute; SCV: 60 per minute (1 GET/s)"
              % (result["requests"], result["elapsed"], result["per_minute"]))
        print("  freshness: a memory change reached the Scv after %.2f s, median of %d changes (max %.2f s), "
              "polled with kubectl; one interval is 1 s"
              % (result["freshness"], FRESHNESS_CHANGES, result["freshness_max"]))
    if site:
        print("site.yml on the demo node (API stages for real, host stages in check mode): first run %.1f s, "
              "rerun %.1f s" % tuple(site))


if __name__ == "__main__":
    main()
