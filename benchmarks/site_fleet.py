"""playbooks/site.yml over an inventory of many hosts: wall time, controller work and API requests per host.

Every host is this machine through a local connection, with GPUs of its own: its
``ansible_python_interpreter`` is a small wrapper that points the NVML simulator at the host's
scenario file, so ``gpu_facts`` on host-017 reads host-017's eight H100s. The Nodes exist, as their
kubelets would have registered them. The kube-apiserver's audit log records every request.

- **API stages** (Scv, labels, device plugin), for real, over ``--hosts`` hosts (100) with each
  number of ``--forks`` (10 and 50), each on a fresh control plane: a first run, then an unchanged
  rerun. Reported: wall time, CPU time split into the controller's (ansible-playbook, its workers
  and connection plugins) and the hosts' (each module run, with what it started: with local
  connections it runs here too, and the interpreter wrapper records it), API requests per host (those naming the host's
  Node or Scv) and cluster-wide ones (the CRD, RBAC, the admission policy, the DaemonSet: once per
  run), write requests, and the objects whose resourceVersion moved (what was really stored).
- **Host stages** (driver, toolkit, agent: tag ``host_roles``) in check mode, as ``make demo``
  runs them, over ``--host-stage-hosts`` hosts (10), once: check mode changes nothing, so a rerun
  is the same work. With local connections each host's share runs on this machine too (about 25 s
  of CPU), which is why the controller's share is reported apart.

The driver play runs on every host at once (``scv_gpu_serial=100%``, a first install of idle
machines). Run it with ``make benchmark-site-fleet``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from harness.agent_fleet import WRITE_VERBS, audited_plane
from harness.paths import COLLECTIONS, ROOT, SIMULATOR_DIR, scenario_path


def write_inventory(work, hosts):
    """An inventory of ``hosts`` local hosts, each with its own simulated GPUs; returns its path.

    Each host's interpreter is a wrapper that runs the module and appends the CPU times (the shell's
    ``times``: its own, then its children's) to ``HOST.cpu``: the hosts' share of a run. A host runs
    one module at a time, so its file has one writer at a time.
    """
    entries = {}
    for host in hosts:
        scenario = work / ("%s.json" % host)
        shutil.copy(scenario_path("h100_sxm_x8"), scenario)
        interpreter = work / ("%s-python" % host)
        interpreter.write_text(
            "#!/bin/sh\nNVMLSIM_CONFIG=%s LD_LIBRARY_PATH=%s %s \"$@\"\nstatus=$?\n"
            "times >> %s\nexit $status\n" % (scenario, SIMULATOR_DIR, sys.executable, work / ("%s.cpu" % host)))
        interpreter.chmod(0o755)
        entries[host] = {"ansible_connection": "local", "ansible_python_interpreter": str(interpreter),
                         "k8s_node_name": host}
    inventory = work / "inventory.json"
    inventory.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": entries}}}}))
    return inventory


HOST_STAGES = ["--tags", "host_roles", "--check"]
API_STAGES = ["--skip-tags", "host_roles"]
# What the API stages write, by kind: a storage write shows as a new resourceVersion.
WRITTEN_KINDS = "customresourcedefinitions,clusterroles,clusterrolebindings,validatingadmissionpolicies," \
                "validatingadmissionpolicybindings,daemonsets,nodes,scvs"


def versions(plane):
    """{kind/namespace/name: resourceVersion} of every object the API stages may write.

    Asked as another identity than the playbook's, so that these reads are not counted as its own.
    """
    observer = plane.kubeconfig("observer", "bench-observer", "system:masters")
    kinds = WRITTEN_KINDS if plane.kubectl("get", "crd", "scvs.core.run-linux.com", check=False,
                                           kubeconfig=observer).returncode == 0 \
        else WRITTEN_KINDS.replace(",scvs", "")   # before the first run installs the CRD
    listed = json.loads(plane.kubectl("get", kinds, "-A", "-o", "json", kubeconfig=observer).stdout)["items"]
    return {"%s/%s/%s" % (item["kind"], item["metadata"].get("namespace", ""), item["metadata"]["name"]):
            item["metadata"]["resourceVersion"] for item in listed}


def host_cpu(work):
    """CPU seconds the hosts' module runs used so far: the children's line of each ``times`` (``0m1.23s 0m0.21s``)."""
    total = 0.0
    for log in work.glob("*.cpu"):
        for line in log.read_text().splitlines()[1::2]:
            for part in line.split():
                minutes, seconds = part.rstrip("s").split("m")
                total += int(minutes) * 60 + float(seconds)
    return total


def site_run(inventory, plane, forks, work, stages):
    """site.yml with ``stages``; (wall seconds, CPU seconds of ansible-playbook and all it started, of them the hosts')."""
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_LOCAL_TEMP=str(work / "tmp"),
               ANSIBLE_HOST_KEY_CHECKING="False")
    command = [str(pathlib.Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
               "--forks", str(forks), "-e", "scv_gpu_kubeconfig=%s" % plane.admin_kubeconfig,
               # A first install of idle machines, as site.yml's header says: the driver play on every host at
               # once (its default, one host at a time, is for drivers changed under a working cluster).
               "-e", "scv_gpu_serial=100%",
               str(ROOT / "playbooks" / "site.yml")]
    before, hosts_before = resource.getrusage(resource.RUSAGE_CHILDREN), host_cpu(work)
    start = time.monotonic()
    done = subprocess.run(command + stages, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError("site.yml failed:\n%s%s" % (done.stdout[-4000:], done.stderr[-2000:]))
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), host_cpu(work) - hosts_before


def api_requests(plane, hosts, since, until):
    """Requests by the run's identity: per host (naming its Node or Scv) and cluster-wide, and writes of each."""
    per_host, cluster = collections.Counter(), collections.Counter()
    host_writes, cluster_writes = collections.Counter(), collections.Counter()
    names = set(hosts)
    for request in plane.audit_log.requests(since, until, users=("scv-test-admin",)):
        if request.name in names:
            per_host[request.name] += 1
            host_writes[request.name] += request.verb in WRITE_VERBS
        else:
            cluster["%s %s" % (request.verb, request.what)] += 1
            cluster_writes["%s %s" % (request.verb, request.what)] += request.verb in WRITE_VERBS
    counts = [per_host[host] for host in hosts]
    return {
        "per_host_mean": sum(counts) / len(hosts), "per_host_max": max(counts),
        "host_writes": sum(host_writes.values()),
        "cluster_wide": dict(cluster), "cluster_writes": sum(cluster_writes.values()),
    }


def run_forks(work, size, forks, stages, names=("first run", "unchanged rerun")):
    hosts = ["host-%03d" % index for index in range(size)]
    plane = audited_plane(work / ("plane-%d-%d" % (size, forks)), everyone=True)
    try:
        items = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": host}} for host in hosts]
        plane.kubectl("create", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        inventory = write_inventory(work, hosts)
        runs = []
        for name in names:
            since, before = time.time(), versions(plane)
            wall, cpu, hosts_cpu = site_run(inventory, plane, forks, work, stages)
            time.sleep(2)   # the audit log's last lines
            after = versions(plane)
            stored = sorted(key for key, version in after.items() if before.get(key) != version)
            runs.append(dict(api_requests(plane, hosts, since, time.time()), name=name, wall=wall, cpu=cpu,
                             hosts_cpu=hosts_cpu,
                             stored=stored))
        return runs
    finally:
        plane.stop()


def print_run(stages, hosts, forks, run):
    controller = run["cpu"] - run["hosts_cpu"]
    print("%s, %d hosts, forks %d, %s: %.0f s wall, CPU %.1f s (%.2f s per host), of which the controller's %.1f s "
          "(%.2f s per host) and the hosts' modules' %.1f s (%.2f s per host); API requests per host mean %.2f, "
          "max %d, writes %d in all; cluster-wide: %d requests, %d writes %s; objects stored anew: %d %s" % (
              stages, hosts, forks, run["name"], run["wall"], run["cpu"], run["cpu"] / hosts, controller,
              controller / hosts, run["hosts_cpu"], run["hosts_cpu"] / hosts, run["per_host_mean"],
              run["per_host_max"], run["host_writes"], sum(run["cluster_wide"].values()), run["cluster_writes"],
              json.dumps(run["cluster_wide"]), len(run["stored"]), " ".join(run["stored"][:12])))
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--hosts", type=int, default=100, help="hosts for the API stages")
    parser.add_argument("--forks", default="10,50", help="numbers of forks for the API stages ('' for none)")
    parser.add_argument("--host-stage-hosts", type=int, default=10,
                        help="hosts for the host stages in check mode (each costs this machine about 25 s of CPU)")
    parser.add_argument("--host-stage-forks", default="10",
                        help="numbers of forks for the host stages (at most the number of hosts)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="scv-site-fleet-"))
    results = {"api": {}, "host": {}}
    try:
        print("machine: %s, %d cores" % (platform.platform(), os.cpu_count()))
        for forks in (int(text) for text in args.forks.split(",") if text):   # --forks '': host stages only
            results["api"][forks] = run_forks(work, args.hosts, forks, API_STAGES)
            for run in results["api"][forks]:
                print_run("API stages", args.hosts, forks, run)
        for forks in (min(int(text), args.host_stage_hosts) for text in args.host_stage_forks.split(",")
                      if args.host_stage_hosts):
            results["host"][forks] = run_forks(work, args.host_stage_hosts, forks, HOST_STAGES, names=("check mode",))
            for run in results["host"][forks]:
                print_run("host stages (check mode)", args.host_stage_hosts, forks, run)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
