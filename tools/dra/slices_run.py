"""python slices_run.py --cluster DIR --node NAME --scenario NAME --commit SHA --log LOG --scenario-file FILE
                        --out FIXTURE [--feature-gates GATES] -- PLUGIN...

Runs NVIDIA's DRA kubelet plugin (PLUGIN, the command that starts it) against the test control plane
in DIR, waits until the ResourceSlices it publishes for NODE are complete (every slice of the pool's
newest generation is there) and have stayed so for a moment, or until the plugin exits, then stops it
and writes FIXTURE: the slices, normalised, with what was run, and how many MIG devices each GPU of
the simulator's scenario FILE has left after the run (the simulator writes MIG changes back to it).

Normalised: the fields the API server fills in (uid, resourceVersion, creationTimestamp, generation,
managedFields, the owner's uid) and the random suffix of each slice's name are dropped; slices are
sorted by pool, then by their first device, and each slice's devices by name. JSON keys are sorted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from harness.control_plane import ControlPlane  # noqa: E402  pylint: disable=wrong-import-position

# klog lines: a level letter, the date, the time, the thread, file:line] message.
KLOG = re.compile(r"^([IWEF])[0-9]{4} [0-9:.]+ +[0-9]+ ([a-z_.-]+\.go):[0-9]+\] (.*)$")
DRIVER = "gpu.nvidia.com"
SETTLE_SECONDS = 2.0
MAX_WAIT_SECONDS = 60
DROPPED_METADATA = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "name")


def ensure_node(plane, node):
    if plane.kubectl("get", "node", node, check=False).returncode != 0:
        plane.kubectl("create", "-f", "-", input_text=json.dumps({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}}))


def published(plane, node):
    """The plugin's ResourceSlices for NODE, as the API server holds them."""
    answer = plane.kubectl("get", "resourceslices.v1.resource.k8s.io", "-o", "json",
                           "--field-selector", "spec.nodeName=%s,spec.driver=%s" % (node, DRIVER))
    return json.loads(answer.stdout)["items"]


def complete(slices):
    """True when every slice of each pool's newest generation is there."""
    if not slices:
        return False
    pools = {}
    for item in slices:
        pool = item["spec"]["pool"]
        newest = pools.setdefault(pool["name"], [pool["generation"], pool["resourceSliceCount"], 0])
        if pool["generation"] > newest[0]:
            newest[:] = [pool["generation"], pool["resourceSliceCount"], 0]
        if pool["generation"] == newest[0]:
            newest[2] += 1
    return all(count == wanted for _generation, wanted, count in pools.values())


def normalised(item):
    metadata = {key: value for key, value in item["metadata"].items() if key not in DROPPED_METADATA}
    for owner in metadata.get("ownerReferences", []):
        owner.pop("uid", None)
    spec = dict(item["spec"])
    if "devices" in spec:
        spec["devices"] = sorted(spec["devices"], key=lambda device: device["name"])
    return {"apiVersion": item["apiVersion"], "kind": item["kind"], "metadata": metadata, "spec": spec}


def slice_order(item):
    devices = item["spec"].get("devices") or [{"name": ""}]
    return item["spec"]["pool"]["name"], devices[0]["name"]


def klog_messages(path, levels):
    """The plugin's log messages of LEVELS (klog letters); with E, also the "Error: ..." line its
    command-line framework prints when it gives up."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        lines = handle.read().splitlines()
    messages = [match.group(3) for match in map(KLOG.match, lines) if match and match.group(1) in levels]
    if "E" in levels:
        messages += [line for line in lines if line.startswith("Error: ")]
    return messages


def run(options):
    plane = ControlPlane.attach(options.cluster)
    ensure_node(plane, options.node)
    for item in published(plane, options.node):
        plane.kubectl("delete", "resourceslices.v1.resource.k8s.io", item["metadata"]["name"])
    with open(options.log, "wb") as log:
        process = subprocess.Popen(options.command, stdout=log, stderr=subprocess.STDOUT)  # pylint: disable=consider-using-with
    deadline = time.monotonic() + MAX_WAIT_SECONDS
    seen, since = None, time.monotonic()
    while time.monotonic() < deadline and process.poll() is None:
        slices = sorted((normalised(item) for item in published(plane, options.node)), key=slice_order)
        if slices != seen:
            seen, since = slices, time.monotonic()
        elif complete(slices) and time.monotonic() - since > SETTLE_SECONDS:
            break
        time.sleep(0.25)
    status = process.poll()
    if status is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    slices = sorted((normalised(item) for item in published(plane, options.node)), key=slice_order)
    with open(options.scenario_file, encoding="utf-8") as handle:
        left = [sum(1 for entry in gpu.get("migDevices") or [] if "computeInstanceId" in entry)
                for gpu in json.load(handle).get("devices", [])]
    return {
        "source": "kubernetes-sigs/dra-driver-nvidia-gpu",
        "commit": options.commit,
        "command": "tools/dra/make-fixtures PATH-TO-dra-driver-nvidia-gpu",
        "scenario": options.scenario,
        "node": options.node,
        "featureGates": options.feature_gates or "the defaults",
        "migDevicesLeft": left,
        # null: the plugin was still serving when it was stopped, as it should be.
        "exitStatus": status,
        "complete": complete(slices),
        "warnings": sorted(set(klog_messages(options.log, "W"))),
        "errors": sorted(set(klog_messages(options.log, "EF"))),
        "resourceSlices": slices,
    }


def main():
    parser = argparse.ArgumentParser()
    for flag in ("--cluster", "--node", "--scenario", "--commit", "--log", "--scenario-file", "--out"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--feature-gates", default="", help="given to the plugin as --feature-gates")
    parser.add_argument("command", nargs="+")
    options = parser.parse_args()
    if options.feature_gates:
        options.command += ["--feature-gates", options.feature_gates]
    fixture = run(options)
    with open(options.out, "w", encoding="utf-8") as handle:
        json.dump(fixture, handle, indent=1, sort_keys=True)
        handle.write("\n")
    devices = sum(len(item["spec"].get("devices") or []) for item in fixture["resourceSlices"])
    summary = (options.scenario, len(fixture["resourceSlices"]), devices, fixture["exitStatus"])
    print("%s: %d slice(s), %d device(s), exit %s" % summary)


if __name__ == "__main__":
    main()
