# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What each process uses of a GPU: its memory and its utilization samples (private).

For GPUs that several pods share, so that each pod's own part can be told. Two NVML queries:

- ``nvmlDeviceGetComputeRunningProcesses``: each compute process and the memory it holds. Cheap
  (0.06 ms with 4 processes on an H200), and exact: the same figures as nvidia-smi.
- ``nvmlDeviceGetProcessUtilization``: the driver's utilization samples of processes since a given
  timestamp. Costly (1.7 ms with samples, 2.4 ms answering NOT_FOUND, on the same H200) and sparse:
  a sample exists only for a process the driver sampled busy, so a process without one is not known
  to be idle. Each read asks only for samples newer than the newest one the last read saw (kept per
  GPU), so a sample is counted once.

Nothing here runs unless asked: a node whose GPUs nobody shares never makes either query.
"""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import NOT_FOUND, error_code, pynvml
from ansible_collections.scv.gpu.plugins.module_utils.nvml.mig import mig_handles

# The fields of a utilization sample that are kept, as NVML names them (percent).
SAMPLE_FIELDS = ("smUtil", "memUtil", "encUtil", "decUtil")


def process_memory(handles):
    """{pid: bytes of GPU memory} of the compute processes on ``handles`` (a GPU, or its MIG devices);
    None when the driver cannot tell. A process NVML gives no figure for is left out."""
    found, answered = {}, False
    for handle in handles:
        try:
            processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except pynvml.NVMLError:
            continue
        answered = True
        for process in processes:
            used = getattr(process, "usedGpuMemory", None)
            if isinstance(used, int):
                found[process.pid] = found.get(process.pid, 0) + used
    return found if answered else None


def mean_samples(samples):
    """{pid: {field: mean of the samples}} and the newest timestamp among ``samples``."""
    sums, counts, newest = {}, {}, 0
    for sample in samples:
        total = sums.setdefault(sample.pid, dict.fromkeys(SAMPLE_FIELDS, 0))
        for field in SAMPLE_FIELDS:
            total[field] += getattr(sample, field)
        counts[sample.pid] = counts.get(sample.pid, 0) + 1
        newest = max(newest, sample.timeStamp)
    means = {pid: {field: value / counts[pid] for field, value in total.items()} for pid, total in sums.items()}
    return means, newest


class ProcessUse:
    """Per-process reads of GPUs, keeping each GPU's newest utilization sample timestamp between reads."""

    def __init__(self):
        self._seen = {}     # GPU key (its UUID): the newest sample timestamp read so far
        self._session = None
        self.reads = 0      # utilization queries made (the costly ones)

    def read(self, key, handle, mig=False, utilization=True, session=None):
        """What the processes of the GPU ``handle`` use: {"memory": {pid: bytes} or None,
        "utilization": {pid: {field: percent}} or None}.

        ``mig``: the GPU is in MIG mode, so its processes are those of its MIG devices, and NVML has no
        utilization samples for it. ``utilization`` False skips the costly query ("utilization" None).
        An empty "utilization" means no process was sampled since the last read. ``session`` names the NVML
        session the handle belongs to (``Session.inits``): a new one starts from the driver's whole buffer.
        """
        if session != self._session:
            self._seen.clear()
            self._session = session
        handles = [handle]
        if mig:
            try:
                handles.extend(mig_handles(handle))
            except pynvml.NVMLError:
                pass   # the GPU's own answer is all there is
        memory = process_memory(handles)
        samples = None
        if utilization and not mig:
            samples = self._samples(key, handle)
        return {"memory": memory, "utilization": samples}

    def _samples(self, key, handle):
        self.reads += 1
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, self._seen.get(key, 0))
        except pynvml.NVMLError as error:
            # NOT_FOUND: no sample since the last read; anything else: the driver cannot tell
            return {} if error_code(error) == NOT_FOUND else None
        means, newest = mean_samples(samples)
        if newest > self._seen.get(key, 0):
            self._seen[key] = newest
        return means
