"""python3 mig_capabilities.py SCENARIO.json ROOT: the files a driver makes under /proc/driver for each MIG
GPU and compute instance of a simulator scenario, which NVIDIA's device plugin reads to give a
container its MIG device: ROOT/nvidia-caps/mig-minors (the device minor of each capability) and
ROOT/nvidia/capabilities/gpu<N>/mig/gi<G>[/ci<C>]/access."""

import json
import os
import sys


def main(scenario_path, root):
    with open(scenario_path, encoding="utf-8") as handle:
        scenario = json.load(handle)
    minors, minor = [], 1
    for index, gpu in enumerate(scenario.get("devices", [])):
        for entry in gpu.get("migDevices") or []:
            paths = ["gpu%d/mig/gi%d/access" % (index, entry["gpuInstanceId"])]
            if "computeInstanceId" in entry:
                paths.append("gpu%d/mig/gi%d/ci%d/access" % (index, entry["gpuInstanceId"], entry["computeInstanceId"]))
            for relative in paths:
                path = os.path.join(root, "nvidia", "capabilities", relative)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="ascii") as handle:
                    handle.write("DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n" % minor)
                minors.append("%s %d" % (relative.replace("/mig/", "/"), minor))
                minor += 1
    os.makedirs(os.path.join(root, "nvidia-caps"), exist_ok=True)
    with open(os.path.join(root, "nvidia-caps", "mig-minors"), "w", encoding="ascii") as handle:
        handle.write("".join(line + "\n" for line in minors))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
