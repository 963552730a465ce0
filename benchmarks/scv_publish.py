"""Benchmark of Scv publishing against a real kube-apiserver (tests/harness/control_plane.py).

1. API requests per node per publish cycle, read from kube-apiserver's
   apiserver_request_total: first publish, unchanged rerun, one changed card.
2. Publishing 1000 nodes' Scv (8 simulated H100 cards each) through the
   module's code path (module_utils, no Ansible start-up): wall time of the
   first publish, an unchanged rerun, and a rerun where one card of every node
   changed, with the request counts of each.
3. The same through Ansible: one ansible-playbook run looping scv.gpu.scv over
   100 nodes, first publish and unchanged rerun.

Run it with `make benchmark-scv`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

from ansible_collections.scv.gpu.plugins.module_utils.kube.client import ResourceClient
from ansible_collections.scv.gpu.plugins.module_utils.scv.publisher import publish
from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import SCV
from harness import scenario_expectations as expected
from harness.control_plane import ControlPlane, install_scv_crd
from harness.paths import COLLECTIONS


def request_counts(plane):
    """apiserver_request_total for scvs, keyed by (verb, subresource)."""
    counts = {}
    for line in plane.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="scvs"' in line:
            labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")].split(","))
            key = (labels["verb"].strip('"'), labels.get("subresource", '""').strip('"'))
            counts[key] = counts.get(key, 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts


def delta(before, after):
    return {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}


def describe(requests, nodes):
    total = sum(requests.values())
    writes = sum(count for (verb, _sub), count in requests.items() if verb not in ("GET", "LIST", "WATCH"))
    parts = ", ".join("%s%s %g" % (verb, "/" + sub if sub else "", count / nodes)
                      for (verb, sub), count in sorted(requests.items()))
    return total / nodes, writes / nodes, parts or "none"


def changed_card(facts, index):
    facts = copy.deepcopy(facts)
    facts["cardList"][index % len(facts["cardList"])]["freeMemory"] -= 1024
    return facts


def cycle(plane, client, names, facts_for):
    before = request_counts(plane)
    start = time.perf_counter()
    for name in names:
        publish(client, name, facts_for(name), 1000)
    elapsed = time.perf_counter() - start
    return elapsed, delta(before, request_counts(plane))


def ansible_cycle(plane, names, facts, workdir):
    variables = workdir / "nodes.json"
    variables.write_text(json.dumps({"bench_nodes": names, "bench_facts": facts,
                                     "bench_kubeconfig": str(plane.admin_kubeconfig)}))
    playbook = workdir / "publish.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: Publish\n      scv.gpu.scv:\n        name: '{{ item }}'\n        gpu_facts: '{{ bench_facts }}'\n"
        "        kubeconfig: '{{ bench_kubeconfig }}'\n      loop: '{{ bench_nodes }}'\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS))
    command = [str(pathlib.Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
               "-e", "ansible_python_interpreter=%s" % sys.executable, "-e", "@%s" % variables, str(playbook)]
    before = request_counts(plane)
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    return time.perf_counter() - start, delta(before, request_counts(plane))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--ansible-nodes", type=int, default=100)
    args = parser.parse_args()

    facts = expected.H100_SXM_X8
    with tempfile.TemporaryDirectory() as directory:
        workdir = pathlib.Path(directory)
        plane = ControlPlane(workdir / "plane").start()
        try:
            install_scv_crd(plane)
            client = ResourceClient.connect(resource=SCV, kubeconfig=str(plane.admin_kubeconfig))
            print("Machine: %s, Python %s, %d CPUs; kube-apiserver %s on 127.0.0.1" % (
                platform.machine(), platform.python_version(), os.cpu_count(),
                json.loads(plane.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]))
            print()
            print("| cycle | nodes | wall time | per node | requests per node | writes per node | by verb, per node |")
            print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
            names = ["node-%04d" % i for i in range(args.nodes)]
            rows = (
                ("first publish", lambda name: facts),
                ("unchanged rerun", lambda name: facts),
                ("one card changed on every node", lambda name: changed_card(facts, int(name[5:]))),
            )
            for label, facts_for in rows:
                elapsed, requests = cycle(plane, client, names, facts_for)
                total, writes, parts = describe(requests, len(names))
                print("| %s (module_utils) | %d | %.2f s | %.2f ms | %g | %g | %s |" % (
                    label, len(names), elapsed, elapsed * 1000 / len(names), total, writes, parts))
            names = ["ansible-%04d" % i for i in range(args.ansible_nodes)]
            for label in ("first publish", "unchanged rerun"):
                elapsed, requests = ansible_cycle(plane, names, facts, workdir)
                total, writes, parts = describe(requests, len(names))
                print("| %s (ansible-playbook, loop) | %d | %.2f s | %.2f ms | %g | %g | %s |" % (
                    label, len(names), elapsed, elapsed * 1000 / len(names), total, writes, parts))
        finally:
            plane.stop()


if __name__ == "__main__":
    main()
