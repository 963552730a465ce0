"""The labels each simulator scenario's node must carry, written out by hand from
scenario_expectations.py and the label formats of NVIDIA's GPU feature discovery."""

from __future__ import annotations


def _labels(product, count, memory, family, compute, driver, cuda, mig):
    major, minor, revision = driver.split(".")
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": count,
        "nvidia.com/gpu.memory": memory,
        "nvidia.com/gpu.family": family,
        "nvidia.com/gpu.compute.major": compute[0],
        "nvidia.com/gpu.compute.minor": compute[1],
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": revision,
        "nvidia.com/cuda.driver-version.full": driver,
        "nvidia.com/cuda.runtime-version.major": cuda.split(".")[0],
        "nvidia.com/cuda.runtime-version.minor": cuda.split(".")[1],
        "nvidia.com/cuda.runtime-version.full": cuda,
        "nvidia.com/mig.capable": mig,
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": revision,
        "nvidia.com/cuda.runtime.major": cuda.split(".")[0],
        "nvidia.com/cuda.runtime.minor": cuda.split(".")[1],
        "nvidia.com/gpu.mode": "unknown",       # no PCI entry for the GPUs: GFD says the same
        "nvidia.com/vgpu.present": "false",
        # no device plugin config: GFD's defaults, one replica of each GPU and no MPS
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mps.capable": "false",
        "gpu/nvidia": product,
    }
    return labels


LABELS = {
    "titan_xp": _labels("TITAN-Xp", "1", "12194", "pascal", ("6", "1"), "535.183.01", "12.2", "false"),
    "h100_sxm_x8": _labels("NVIDIA-H100-80GB-HBM3", "8", "81559", "hopper", ("9", "0"), "550.54.15", "12.4", "true"),
    "a100_mig": _labels("NVIDIA-A100-SXM4-40GB", "2", "40960", "ampere", ("8", "0"), "550.54.15", "12.4", "true"),
    "no_gpus": {"nvidia.com/vgpu.present": "false"},
    "driver_not_loaded": {},
}
