"""``make demo-pod``: a pod on a GPU node is given a GPU, through NVIDIA's own container runtime, and prints it.

The node is harness.gpu_node's (8 simulated H100s, the roles' defaults, NVIDIA's runtime built from the Go module
proxy, the real kubelet on containerd 2) joined to a local control plane; nothing outside build/demo-pod changes.
Needs root.
"""

from __future__ import annotations

import pathlib
import shutil
import sys

from harness.ansible import Ansible
from harness.control_plane import ControlPlane
from harness.gpu_node import GpuNode
from harness.paths import ROOT

NAMESPACE = "demo"


def show(title, output):
    print("\n$ %s" % title)
    for container, lines in output.items():
        for line in lines:
            print("  %s| %s" % (container, line))


def main():
    work = ROOT / "build" / "demo-pod"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    plane = ControlPlane(work / "plane")
    plane.start()
    try:
        node = GpuNode(plane, Ansible(pathlib.Path(sys.prefix)), work / "node", "demo-gpu-node")
        print("# node demo-gpu-node: containerd 2 and NVIDIA's runtime configured by scv.gpu.container_toolkit's "
              "defaults, 8 simulated H100s")
        with node.running(NAMESPACE):
            node.deploy_device_plugin()
            print("# scv.gpu.device_plugin's DaemonSet runs; the node offers nvidia.com/gpu: %s"
                  % node.kubelet.allocatable("nvidia.com/gpu"))
            show("a pod asking for nvidia.com/gpu: 1 lists its NVIDIA devices and NVML's GPUs",
                 node.run_pod(node.pod(NAMESPACE, "cuda-job", [("trainer", 1, {})])))
            show("a pod asking for no GPU (its image sets NVIDIA_VISIBLE_DEVICES=all) does the same",
                 node.run_pod(node.pod(NAMESPACE, "web", [("server", 0, {})])))
    finally:
        plane.stop()


if __name__ == "__main__":
    main()
