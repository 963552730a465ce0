"""Benchmark of the Go builds' garbage collector setting: Go's default against what tools/lib/go.sh sets.

make test builds the control plane, containerd, dockerd, CRI-O, Prometheus and more from source on a fresh
machine, and those builds take more of its two cores than any other stage. The compiler spends part of its time
collecting garbage; tools/lib/go.sh turns the collector off for the builds, up to a heap limit. This builds what
the tests need first (kube-apiserver, kubectl and etcd, tools/control-plane) from an empty build cache once with
each setting, the order swapped from one run to the next, and prints a Markdown table for docs/benchmarks.md:
the medians of wall time, user and system CPU time, and the largest process's resident memory.

Run it with `make benchmark-go-build` (about 10 minutes a run on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import tempfile

from harness.paths import ROOT

TARGETS = ("k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kubectl", "./etcd")
GO_ENVIRONMENT = ("GOGC", "GOMEMLIMIT")


def go_sh_setting():
    """GOGC and GOMEMLIMIT as tools/lib/go.sh sets them for a caller that sets neither, and the go it finds."""
    script = 'source tools/lib/go.sh && need_go benchmark "Go is needed" && command -v go && echo "$GOGC $GOMEMLIMIT"'
    env = {k: v for k, v in os.environ.items() if k not in GO_ENVIRONMENT}
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    go, setting = done.stdout.splitlines()
    gogc, limit = setting.split()
    return go, {"GOGC": gogc, "GOMEMLIMIT": limit}


def build(go, setting, work):
    """One build from an empty build cache under ``setting``: wall s, user s, system s, largest RSS in MiB."""
    cache, out, timing = work / "cache", work / "out", work / "time.txt"
    for folder in (cache, out):
        shutil.rmtree(folder, ignore_errors=True)
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in GO_ENVIRONMENT}
    env.update(setting, GOCACHE=str(cache), CGO_ENABLED="0")
    subprocess.run(["/usr/bin/time", "-o", str(timing), "-f", "%e %U %S %M",
                    go, "build", "-trimpath", "-ldflags", "-s -w", "-o", "%s/" % out, *TARGETS],
                   cwd=ROOT / "tools" / "control-plane", env=env, check=True)
    wall, user, system, rss_kib = timing.read_text().split()[-4:]
    return float(wall), float(user), float(system), int(rss_kib) / 1024.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    go, ours = go_sh_setting()
    settings = {"Go's default (GOGC=100, no limit)": {"GOGC": "100"},
                "tools/lib/go.sh (GOGC=%s, GOMEMLIMIT=%s)" % (ours["GOGC"], ours["GOMEMLIMIT"]): ours}
    results = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as directory:
        work = pathlib.Path(directory)
        # the module sources in Go's module cache before the first timed build, so that neither pays the download
        subprocess.run([go, "mod", "download"], cwd=ROOT / "tools" / "control-plane", check=True)
        for run in range(args.runs):
            order = list(settings) if run % 2 == 0 else list(reversed(settings))
            for name in order:
                results[name].append(build(go, settings[name], work))
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True).stdout.strip()
    print("%s on %s, %d CPUs; medians of %d build(s) each, from an empty build cache\n"
          % (version, platform.platform(), os.cpu_count(), args.runs))
    print("| setting | wall time | user CPU | system CPU | user + system | largest process |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    cpu = []
    for name, rows in results.items():
        wall, user, system, rss = (statistics.median(column) for column in zip(*rows))
        cpu.append(user + system)
        print("| %s | %.0f s | %.0f s | %.0f s | %.0f s | %.0f MiB |" % (name, wall, user, system, user + system, rss))
    print("\nCPU time (user + system) with tools/lib/go.sh: %.0f %% of Go's default" % (100.0 * cpu[1] / cpu[0]))


if __name__ == "__main__":
    main()
