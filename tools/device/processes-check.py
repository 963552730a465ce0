"""Run on a machine with a real NVIDIA GPU: what NVML says about the processes sharing one GPU.

    python3 tools/device/processes-check.py OUT.json [--workers N] [--no-mps]

Starts N worker processes (PyTorch) on GPU 0, each holding its own amount of memory and keeping
the GPU busy for its own share of the time, as pods that time-slice one GPU do. Then reads, through
pynvml, each process's memory (nvmlDeviceGetComputeRunningProcesses) and utilization samples
(nvmlDeviceGetProcessUtilization, asked only for samples newer than the last one seen), compares
them with nvidia-smi, and times each call (median of many) with no process and with N. Where the
MPS control daemon is installed, the same is read with the workers as MPS clients. Writes what it
saw as JSON; changes no setting of the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import pynvml

WORKER = r"""
import os, sys, time
import torch
gib, duty = float(sys.argv[1]), float(sys.argv[2])
held = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
a = torch.randn(4096, 4096, device="cuda")
print(os.getpid(), flush=True)
period = 0.1
while True:
    start = time.perf_counter()
    while time.perf_counter() - start < period * duty:
        a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    rest = period - (time.perf_counter() - start)
    if rest > 0:
        time.sleep(rest)
"""


def median_ms(call, times=200):
    samples = []
    for _time in range(times):
        started = time.perf_counter()
        try:
            call()
        except pynvml.NVMLError:
            pass
        samples.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(samples), 4)


def outcome(call):
    try:
        return call()
    except pynvml.NVMLError as error:
        return "NVMLError: %s" % error


def processes(handle):
    answer = outcome(lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    if isinstance(answer, str):
        return answer
    return [{"pid": p.pid, "usedGpuMemoryMiB": None if p.usedGpuMemory is None else p.usedGpuMemory >> 20}
            for p in answer]


def samples(handle, since):
    answer = outcome(lambda: pynvml.nvmlDeviceGetProcessUtilization(handle, since))
    if isinstance(answer, str):
        return answer
    return [{"pid": s.pid, "timeStamp": s.timeStamp, "smUtil": s.smUtil, "memUtil": s.memUtil,
             "encUtil": s.encUtil, "decUtil": s.decUtil} for s in answer]


def costs(handle):
    found = {
        "nvmlDeviceGetComputeRunningProcesses": median_ms(
            lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle)),
        "nvmlDeviceGetProcessUtilization(since 0)": median_ms(
            lambda: pynvml.nvmlDeviceGetProcessUtilization(handle, 0)),
    }
    now = int(time.time() * 1e6)
    found["nvmlDeviceGetProcessUtilization(since now)"] = median_ms(
        lambda: pynvml.nvmlDeviceGetProcessUtilization(handle, now))
    if hasattr(pynvml, "nvmlDeviceGetProcessesUtilizationInfo"):
        found["nvmlDeviceGetProcessesUtilizationInfo"] = median_ms(lambda: processes_info(handle))
    return found


def processes_info(handle, since=0):
    answer = outcome(lambda: pynvml.nvmlDeviceGetProcessesUtilizationInfo(handle, since))
    if isinstance(answer, str):
        return answer
    return [{"pid": s.pid, "timeStamp": s.timeStamp, "smUtil": s.smUtil, "memUtil": s.memUtil} for s in answer]


def smi(*args):
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return str(error)


def start_workers(count, env=None):
    workers = []
    for index in range(count):
        gib, duty = index + 1, 0.2 * (index + 1)
        worker = subprocess.Popen([sys.executable, "-c", WORKER, str(gib), str(duty)], stdout=subprocess.PIPE,
                                  text=True, env=env)
        workers.append((worker, gib, duty))
    started = []
    for worker, gib, duty in workers:
        ready, _w, _x = select.select([worker.stdout], [], [], 90)
        line = worker.stdout.readline().strip() if ready else "no pid within 90 s"
        started.append({"pid": worker.pid, "ownPid": line, "gib": gib, "duty": duty,
                        "cgroup": open("/proc/%d/cgroup" % worker.pid).read().strip()})
    return workers, started


def stop_workers(workers, handle):
    for worker, _gib, _duty in workers:
        worker.terminate()
    for worker, _gib, _duty in workers:
        worker.wait(30)
    started = time.perf_counter()
    while time.perf_counter() - started < 20:
        left = processes(handle)
        if not left:
            break
        time.sleep(0.05)
    return {"left": left, "goneAfterS": round(time.perf_counter() - started, 3)}


def watch(handle, seconds):
    readings, since = [], 0
    for _second in range(seconds):
        time.sleep(1)
        got = samples(handle, since)
        if isinstance(got, list) and got:
            since = max(s["timeStamp"] for s in got)
        readings.append({"processes": processes(handle), "samples": got,
                         "since0": samples(handle, 0) if not readings else None,
                         "info": processes_info(handle, 0) if not readings else None})
    return readings


def shared(handle, count, report, key, env=None):
    workers, started = start_workers(count, env)
    try:
        time.sleep(4)
        report[key] = {"workers": started, "readings": watch(handle, 6), "costs": costs(handle),
                       "smiApps": smi("--query-compute-apps=pid,process_name,used_memory", "--format=csv"),
                       "smiPmon": smi("pmon", "-c", "1", "-s", "um")}
    finally:
        report[key]["after"] = stop_workers(workers, handle)


def mps(handle, count, report):
    control = shutil.which("nvidia-cuda-mps-control")
    if not control:
        report["mps"] = "nvidia-cuda-mps-control not on PATH"
        return
    tmp = tempfile.mkdtemp()
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=tmp + "/pipe", CUDA_MPS_LOG_DIRECTORY=tmp + "/log")
    os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"])
    os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"])
    daemon = subprocess.run([control, "-d"], env=env, capture_output=True, text=True, timeout=30, check=False)
    report["mps"] = {"start": [daemon.returncode, daemon.stdout, daemon.stderr]}
    try:
        shared(handle, count, report["mps"], "clients", env)
    except Exception as error:  # noqa: BLE001 - a report of what failed is the point here
        report["mps"]["error"] = repr(error)
    finally:
        stop = subprocess.run([control], input="quit\n", env=env, capture_output=True, text=True, timeout=30,
                              check=False)
        report["mps"]["quit"] = [stop.returncode, stop.stdout, stop.stderr]
        time.sleep(2)
        report["mps"]["afterQuit"] = processes(handle)
        logs = env["CUDA_MPS_LOG_DIRECTORY"]
        report["mps"]["logs"] = {name: open(os.path.join(logs, name)).read()[-3000:] for name in os.listdir(logs)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--no-mps", action="store_true")
    args = parser.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    report = {"gpu": pynvml.nvmlDeviceGetName(handle), "driver": pynvml.nvmlSystemGetDriverVersion(),
              "pynvml": getattr(pynvml, "__version__", "?"), "kernel": os.uname().release,
              "computeMode": outcome(lambda: pynvml.nvmlDeviceGetComputeMode(handle)),
              "idle": {"processes": processes(handle), "samples0": samples(handle, 0), "costs": costs(handle)}}

    def save():
        with open(args.out, "w") as out:
            json.dump(report, out, indent=1, default=str)

    try:
        save()
        if args.workers:
            shared(handle, args.workers, report, "timeSliced")
            save()
        if not args.no_mps:
            mps(handle, 2, report)
    finally:
        save()
        pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
