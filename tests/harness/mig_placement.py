"""Where a scenario file's GPU instances sit, as the NVML simulator writes them back: per GPU, the sorted
(profile, first slice) of each GPU instance. tools/mig-parted/make-fixtures records what NVIDIA's nvidia-mig-parted
placed with it, and test_mig_layout compares scv.gpu.mig_layout's placements in the same form."""

from __future__ import annotations

import json


def placed_in(path):
    """Per GPU of the scenario file at ``path``, the sorted (profile, first slice) of each GPU instance."""
    return [sorted((entry["name"].rpartition(" MIG ")[2], entry["placement"]) for entry in gpu.get("migDevices") or []
                   if "computeInstanceId" in entry)
            for gpu in json.loads(path.read_text())["devices"]]
