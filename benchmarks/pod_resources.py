"""Benchmark of the agent's client of the kubelet's pod-resources API against grpcio's.

The agent asks the kubelet ``v1.PodResourcesLister/List`` with HTTP/2 and HPACK framed by hand
(no package beyond the standard library) and a decoder of the few protobuf fields it reads
(kube/podresources.py). The usual way is grpcio with code generated from the kubelet's api.proto. This measures, in fresh interpreters (Python
3.11, as on Debian 12, the agent's own), what each adds to a process's resident memory once it
has made a call, and the wall time of one call, against a stand-in kubelet (grpcio, the real
protobuf) answering for 8 GPUs held by 8 pods, and for 110 pods (a full node). Medians of
``--runs`` interpreters each. Prints a Markdown table for docs/benchmarks.md.

Run it with `make benchmark-pod-resources`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile

from harness.kubelet_podresources import StandInKubelet, generate, pod
from harness.paths import COLLECTIONS, ROOT

# Run in a fresh interpreter: the RSS a client adds with 20 calls; wall time per call.
PROBE = r"""
import json, sys, time

def rss_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))

client, socket_path = sys.argv[1], sys.argv[2]
before = rss_kib()
if client == "ours":
    from ansible_collections.scv.gpu.plugins.module_utils.kube.podresources import list_pod_resources
    call = lambda: list_pod_resources(socket_path, timeout=5)
else:
    import grpc, podresources_pb2, podresources_pb2_grpc
    def call():
        with grpc.insecure_channel("unix:" + socket_path) as channel:
            return podresources_pb2_grpc.PodResourcesListerStub(channel).List(
                podresources_pb2.ListPodResourcesRequest(), timeout=5).pod_resources
times = []
for _ in range(20):
    started = time.perf_counter()
    answer = call()
    times.append(time.perf_counter() - started)
times.sort()
print(json.dumps({"total_kib": rss_kib() - before,
                  "call_ms": times[len(times) // 2] * 1000, "pods": len(answer)}))
"""


def python311():
    done = subprocess.run([str(ROOT / "tools" / "find-python"), "3.11"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or sys.executable


def venv_with(work, python, packages):
    """A virtual environment of ``python`` holding ``packages`` (the versions the tests pin)."""
    target = pathlib.Path(work) / "venv"
    subprocess.run([python, "-m", "venv", str(target)], check=True)
    subprocess.run([str(target / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"] + packages, check=True)
    return target / "bin" / "python"


def pins(*names):
    wanted = {}
    for line in (ROOT / "tests" / "requirements" / "dev-py311.txt").read_text().splitlines():
        name = line.split("==")[0].strip()
        if name in names:
            wanted[name] = line.strip()
    return [wanted[name] for name in names]


def measure(python, client, socket_path, paths, runs):
    results = []
    for _run in range(runs):
        # the probe finds the collection and the generated code through PYTHONPATH, as any program does
        done = subprocess.run([str(python), "-c", PROBE, client, socket_path], capture_output=True, text=True,
                              check=True, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
                                                   PYTHONPATH=os.pathsep.join(str(path) for path in paths)))
        results.append(json.loads(done.stdout))
    return {key: statistics.median(result[key] for result in results) for key in results[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        generated = generate(work)
        python = venv_with(work, python311(), pins("grpcio", "protobuf"))
        paths = [str(COLLECTIONS), str(pathlib.Path(work) / "generated")]   # the probe's own Python path
        rows = []
        for pods in (8, 110):
            with StandInKubelet(generated, pathlib.Path(work) / ("kubelet-%d.sock" % pods)) as kubelet:
                kubelet.pods = [pod("job-%d" % n, "team-%d" % (n % 5),
                                    ("main", [("nvidia.com/gpu", ["GPU-%032x" % (n % 8)])] if n < 8 else []))
                                for n in range(pods)]
                for client in ("ours", "grpcio"):
                    rows.append((pods, client, measure(python, client, kubelet.socket, paths, args.runs)))
        version = subprocess.run([str(python), "-c", "import platform; print(platform.python_version())"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    print("Python %s on %s, %d CPUs; medians of %d interpreters, each making 20 calls (call time: their median)\n"
          % (version, platform.platform(), os.cpu_count(), args.runs))
    print("| pods on the node | client | RSS added (import and 20 calls) | one call |")
    print("| --- | --- | --- | --- |")
    for pods, client, result in rows:
        name = "our HTTP/2 and HPACK, our decoder" if client == "ours" else "grpcio + generated protobuf"
        print("| %d | %s | %.1f MiB | %.2f ms |" % (pods, name, result["total_kib"] / 1024.0, result["call_ms"]))


if __name__ == "__main__":
    main()
