"""python plugin_probe.py --proto DIR --log LOG [--mps-log FILE] [--path-prefix DIR] -- PLUGIN [ARGS...]

Runs NVIDIA's device plugin (PLUGIN ARGS) and acts as the kubelet would towards it, then prints what it
saw, sorted, for a fixture:

- the resources it serves, or the error it refuses to start with, or why a resource failed to start;
- the warnings it gives about the config file (settings it accepts but ignores);
- for each served resource, the device IDs and health of the first ListAndWatch answer, the answer to an
  Allocate of the first ID and of the first two IDs (or the refusal text), and from how many
  different devices GetPreferredAllocation picks two IDs out of all of them;
- with --mps-log, what the plugin asked the MPS control program (see make-fixtures).

It must run in the mount namespace where the plugin's sockets are (make-fixtures gives it a private
/var/lib), so it starts the plugin itself. The kubelet's deviceplugin v1beta1 Python module is generated
once into DIR (python plugin_probe.py --generate DIR, from the repository's tests/harness).
"""

import argparse
import importlib
import os
import re
import signal
import subprocess
import sys
import time

# klog lines: a level letter, the date, the time, the thread, file:line] message.
KLOG = re.compile(r"^([IWEF])[0-9]{4} [0-9:.]+ +[0-9]+ ([a-z_.-]+\.go):[0-9]+\] (.*)$")
SETTLE_SECONDS = 0.7
MAX_WAIT_SECONDS = 15


def generate(directory):
    """Writes deviceplugin_pb2{,_grpc}.py into DIRECTORY/generated, as the test harness does."""
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    sys.path.insert(0, os.path.join(root, "tests"))
    from harness.kubelet_podresources import DEVICEPLUGIN, generate as generate_proto
    generate_proto(directory, DEVICEPLUGIN, "deviceplugin")


def load(directory):
    sys.path.insert(0, os.path.join(directory, "generated"))
    return importlib.import_module("deviceplugin_pb2"), importlib.import_module("deviceplugin_pb2_grpc")


def klog_lines(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except FileNotFoundError:
        return []
    return [match.groups() for match in map(KLOG.match, text.splitlines()) if match]


def settled(process, log):
    """True once the plugin has exited, refused, failed a start, found nothing, or has served something
    and then logged nothing more for a moment (it starts every resource at once, within milliseconds)."""
    if process.poll() is not None:
        return True
    lines = klog_lines(log)
    for _level, _source, message in lines:
        if (message.startswith(("error starting plugins", "Failed to start plugin", "No devices found"))
                or "Retrying in" in message):
            return True
    if any(message.startswith("Starting to serve") for _l, _s, message in lines):
        return time.time() - os.path.getmtime(log) > SETTLE_SECONDS
    return False


def describe_allocation(response):
    lines = []
    for container in response.container_responses:
        lines += ["    env %s=%s" % item for item in sorted(container.envs.items())]
        lines += ["    mount %s <- %s%s" % (m.container_path, m.host_path, " (ro)" if m.read_only else "")
                  for m in sorted(container.mounts, key=lambda m: m.container_path)]
        lines += ["    device %s <- %s %s" % (d.container_path, d.host_path, d.permissions)
                  for d in sorted(container.devices, key=lambda d: d.container_path)]
        lines += ["    annotation %s=%s" % item for item in sorted(container.annotations.items())]
        lines += ["    cdi-device %s" % d.name for d in sorted(container.cdi_devices, key=lambda d: d.name)]
    return lines


def probe_resource(pb2, pb2_grpc, resource, socket):
    import grpc

    lines = ["resource %s (socket %s)" % (resource, os.path.basename(socket))]
    with grpc.insecure_channel("unix:" + socket) as channel:
        stub = pb2_grpc.DevicePluginStub(channel)
        stream = stub.ListAndWatch(pb2.Empty(), timeout=10)
        first = next(stream)
        stream.cancel()
        devices = sorted(first.devices, key=lambda d: d.ID)
        lines.append("  advertises %d devices" % len(devices))
        lines += ["  device %s %s" % (d.ID, d.health) for d in devices]
        ids = [d.ID for d in devices]
        for count in (1, 2):
            if len(ids) < count:
                continue
            request = pb2.AllocateRequest(container_requests=[pb2.ContainerAllocateRequest(devices_ids=ids[:count])])
            try:
                response = stub.Allocate(request, timeout=10)
            except grpc.RpcError as error:
                lines.append("  allocate %s: refused (%s) %s" % (" ".join(ids[:count]), error.code().name,
                                                                 error.details()))
                continue
            lines.append("  allocate %s: granted" % " ".join(ids[:count]))
            lines += describe_allocation(response)
        if len(ids) >= 2:
            request = pb2.PreferredAllocationRequest(container_requests=[
                pb2.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=2)])
            try:
                response = stub.GetPreferredAllocation(request, timeout=10)
                # Which IDs are picked among equals is random (map order), so only how many
                # different underlying devices they come from is recorded.
                picked = [i for r in response.container_responses for i in r.deviceIDs]
                lines.append("  preferred 2 of %d: %d IDs from %d underlying device(s)" % (
                    len(ids), len(picked), len(set(i.split("::")[0] for i in picked))))
            except grpc.RpcError as error:
                lines.append("  preferred 2 of %d: refused (%s) %s" % (len(ids), error.code().name, error.details()))
    return lines


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--generate")
    parser.add_argument("--proto")
    parser.add_argument("--log")
    parser.add_argument("--mps-log")
    parser.add_argument("--path-prefix")
    parser.add_argument("command", nargs="*")
    options = parser.parse_args()
    if options.generate:
        generate(options.generate)
        return
    pb2, pb2_grpc = load(options.proto)

    environment = dict(os.environ)
    if options.path_prefix:
        environment["PATH"] = options.path_prefix + os.pathsep + environment.get("PATH", "")
    with open(options.log, "wb") as log:
        process = subprocess.Popen(options.command, stdout=log, stderr=subprocess.STDOUT, env=environment)
    deadline = time.time() + MAX_WAIT_SECONDS
    while not settled(process, options.log) and time.time() < deadline:
        time.sleep(0.1)

    out = []
    served = {}
    for level, source, message in klog_lines(options.log):
        found = re.match(r"Starting to serve '([^']+)' on (\S+)", message)
        if found:
            served[found.group(1)] = found.group(2)
        elif message.startswith("error starting plugins: "):
            out.append("refuses: " + message[len("error starting plugins: "):])
        elif message.startswith("Failed to start plugin: "):
            out.append("fails to start: " + message[len("Failed to start plugin: "):])
        elif level == "W" and source in ("config.go", "replicas.go"):
            out.append("warns: " + message)
    out = sorted(set(out))
    for resource in sorted(served):
        out.append("serves " + resource)
    if process.poll() is None:
        for resource in sorted(served):
            out += probe_resource(pb2, pb2_grpc, resource, served[resource])
    if options.mps_log and os.path.exists(options.mps_log):
        with open(options.mps_log, encoding="utf-8") as handle:
            asked = sorted(set(line.rstrip("\n") for line in handle if line.strip()))
        out += ["asks the MPS control program: " + line for line in asked]

    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    print("\n".join(out))


if __name__ == "__main__":
    main()
