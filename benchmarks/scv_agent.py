"""Benchmark of the Scv agent against a real kube-apiserver, 8 simulated H100s, side by side with SCV.

The agent runs as the scv_agent role installs it: Debian's Python 3.11 in a virtual
environment holding only the role's packages (from --wheels), and the zipapp that the
scv.gpu.agent_zipapp lookup builds from the collection.

1. Resident memory (VmRSS) and CPU use (utime+stime from /proc) of the agent process at a 1 s
   updateInterval, over a steady-state window, sampled every second: median and maximum.
2. API requests per minute at steady state, counted from kube-apiserver's
   apiserver_request_total for scvs, against SCV's one GET per second (60 per minute).
3. Freshness: the seconds from a simulated memory change to the new value in the Scv.
4. playbooks/site.yml wall time on this machine as the demo node (API stages for real, host
   stages in check mode): first run and rerun.

Run it with `make benchmark-agent`; `--window` sets the steady-state seconds (default 330, more
than one watch of the default 300 s).
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

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]

# pylint: disable=wrong-import-position
from control_plane import ControlPlane  # noqa: E402
from support import COLLECTIONS, SIMULATOR_DIR, install_agent, install_scv_crd, scenario_path  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def scv_requests(plane):
    total = 0
    for line in plane.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="scvs"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def sample(pid):
    with open("/proc/%d/status" % pid, encoding="utf-8") as handle:
        rss_kib = next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))
    with open("/proc/%d/stat" % pid, encoding="utf-8") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return rss_kib / 1024.0, (int(fields[11]) + int(fields[12])) / TICK


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--window", type=int, default=330, help="steady-state seconds to measure")
    parser.add_argument("--watch-timeout", type=int, default=300, help="the agent's --watch-timeout")
    parser.add_argument("--wheels", required=True, help="folder with the agent's wheels (make agent-wheels)")
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="scv-agent-bench-"))
    plane = ControlPlane(work / "plane").start()
    try:
        install_scv_crd(plane)
        plane.kubectl("create", "clusterrolebinding", "bench-nodes-scv", "--clusterrole=cluster-admin",
                      "--group=system:nodes")
        scenario = work / "scenario.json"
        shutil.copy(scenario_path("h100_sxm_x8"), scenario)
        node = "bench-node"
        env = dict(os.environ, LD_LIBRARY_PATH=str(SIMULATOR_DIR), NVMLSIM_CONFIG=str(scenario))
        command = install_agent(work, pathlib.Path(args.wheels)) + [
            "--kubeconfig", str(plane.node_kubeconfig(node)), "--node-name", node, "--log-level", "WARNING",
            "--watch-timeout", str(args.watch_timeout)]
        agent = subprocess.Popen(command, env=env)
        try:
            deadline = time.monotonic() + 30
            while plane.kubectl("get", "scv", node, check=False).returncode != 0:
                if time.monotonic() > deadline:
                    raise RuntimeError("the agent published nothing in 30 s")
                time.sleep(0.2)
            time.sleep(5)   # start-up done, the watch is up
            requests_before, (_rss, cpu_before), start = scv_requests(plane), sample(agent.pid), time.monotonic()
            rss = []
            while time.monotonic() - start < args.window:
                time.sleep(1)
                rss.append(sample(agent.pid)[0])
            elapsed = time.monotonic() - start
            cpu_after = sample(agent.pid)[1]
            # the metrics GET itself is not the agent's: count only scvs requests (the agent's)
            requests = scv_requests(plane) - requests_before
            per_minute = requests / elapsed * 60

            data = json.loads(scenario.read_text())
            data["devices"][0]["memory"]["free"] = 10 * 2 ** 30
            staged = scenario.with_suffix(".new")
            staged.write_text(json.dumps(data))
            changed_at = time.monotonic()
            staged.rename(scenario)
            while True:
                status = json.loads(plane.kubectl("get", "scv", node, "-o", "json").stdout)["status"]
                if status["cardList"][0]["freeMemory"] == 10240:
                    break
                time.sleep(0.05)
            freshness = time.monotonic() - changed_at
        finally:
            agent.terminate()
            agent.wait(timeout=15)
        site = site_runs(plane, work)
    finally:
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)

    cpu_percent = (cpu_after - cpu_before) / elapsed * 100
    print("machine: %s, %d cores; agent on %s" % (platform.platform(), os.cpu_count(), subprocess.run(
        ["/usr/bin/python3", "--version"], capture_output=True, text=True, check=True).stdout.strip()))
    print("agent, 8 simulated GPUs, updateInterval 1000 ms, watch timeout %d s, %.0f s steady state:"
          % (args.watch_timeout, elapsed))
    print("  RSS: median %.1f MiB, max %.1f MiB (target < 50 MB; SCV's DaemonSet requests 200Mi)"
          % (statistics.median(rss), max(rss)))
    print("  CPU: %.2f %% of one core (target < 1 %%; SCV's DaemonSet requests 100m = 10 %%)" % cpu_percent)
    print("  API requests: %d in %.0f s = %.2f per minute; SCV: 60 per minute (1 GET/s); ratio 1/%.0f"
          % (requests, elapsed, per_minute, 60 / per_minute if per_minute else float("inf")))
    print("  freshness: a memory change reached the Scv after %.2f s (one interval is 1 s)" % freshness)
    print("site.yml on the demo node (API stages for real, host stages in check mode): first run %.1f s, rerun %.1f s"
          % tuple(site))


if __name__ == "__main__":
    main()
