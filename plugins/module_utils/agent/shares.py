# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Each pod's own part of a GPU that several pods share, for its memory and utilization series (private).

Under GPU sharing (NVIDIA's device plugin handing out replicas ``<uuid>::<n>`` for time-slicing or
MPS) most of a GPU's readings have no owner: every pod holding it is shown the GPU's whole value
(``agent.pod_attribution``). Memory and utilization can be told per process, so, as dcgm-exporter does with
``--kubernetes-virtual-gpus``, ``DCGM_FI_DEV_FB_USED`` and ``DCGM_FI_DEV_GPU_UTIL`` of a shared GPU
get one series for the whole GPU (no pod labels) and one per holding container with its pod's own
figure, labelled ``pod_uid`` and ``vgpu`` as well.

A process is tied to its pod by its cgroup (``/proc/<pid>/cgroup`` names the pod UID) and the UID to
the pod's name by the kubelet's pod logs directory (``kube.pod_processes``); the pod-resources
answer then says which of the GPU's holders it is. A pod's figure is the sum over its processes:

- memory (MiB, as the GPU's series): exact, from NVML's running processes;
- utilization (percent of the SMs): the mean of each process's samples since the last scrape. NVML
  keeps samples only of processes it saw busy, sparsely under time-slicing, and none at all for MPS
  clients (it names the MPS server): a pod whose processes have no sample gets no utilization series
  (unknown, not idle). A GPU whose own utilization reads 0 is idle, so each of its pods reads 0, and
  the costly sample query (about 2 ms on an H200) is not made. NVML has no samples with MIG: there
  the series stays as the other series are, the whole value on each holder's series. That query is
  made only with ``utilization`` (the agent's ``pod-utilization``, off by default for its cost): without
  it too the utilization series stays whole on each holder's series.

A pod holding the GPU with no process on it reads 0. Processes are read only for shared GPUs (held
by more than one container, or through replicas) and only at a scrape: a node that shares no GPU,
or that nobody scrapes, makes no per-process call.
"""

from __future__ import annotations

import logging

from ansible_collections.scv.gpu.plugins.module_utils.kube.pod_processes import (
    DEFAULT_POD_LOGS_DIR,
    PodNames,
    pod_uid_of_pid,
)
from ansible_collections.scv.gpu.plugins.module_utils.nvml.processes import ProcessUse

LOG = logging.getLogger("scv-gpu-agent")
MIB = 1 << 20


def pod_figures(use, pods, idle):
    """{(pod, namespace): {"memory": MiB, "utilization": percent}} from one GPU's ``use``
    (``nvml.processes.ProcessUse.read``) and ``pods`` ({(pod, namespace): [its PIDs on the GPU]}, every
    holder of the GPU, None where its processes cannot be told). A figure NVML cannot give is left out."""
    memory, samples = use["memory"], use["utilization"]
    figures = {}
    for pod, pids in pods.items():
        found = figures[pod] = {}
        if pids is None:
            continue
        if memory is not None:
            found["memory"] = sum(memory.get(pid, 0) for pid in pids) // MIB
        if idle or not pids:
            found["utilization"] = 0
        elif samples is not None:
            sampled = [samples[pid]["smUtil"] for pid in pids if pid in samples]
            if sampled:
                found["utilization"] = round(sum(sampled))
    return figures


class PodShares:
    """Reads, at a scrape, what each pod holding a shared GPU uses of it (``last``: {card id: see ``read``})."""

    def __init__(self, pods, logs_dir=DEFAULT_POD_LOGS_DIR, proc="/proc"):
        self.pods = pods                  # the agent.pod_attribution.PodAttribution that says who holds each GPU
        self.names = PodNames(logs_dir)
        self.proc = proc
        self.use = ProcessUse()
        self.utilization = True           # split the utilization too (the agent's pod-utilization)
        self.reads = 0                    # shared GPUs read
        self.last = {}
        self._unnamed = None              # the pod UIDs last warned about

    def configure(self, utilization):
        """Whether the utilization is split per pod too (the agent's pod-utilization), not only the memory."""
        self.utilization = utilization

    def shared(self, cards):
        """{card id: {(pod, namespace, container): vgpu}} of the shared cards: held by more than one container, or
        through replicas; vgpu is "" for a container that holds the GPU whole."""
        holders, replicas = self.pods.by_card(cards), self.pods.replicas_by_card(cards)
        return {card: {holder: replicas.get(card, {}).get(holder, "") for holder in held}
                for card, held in holders.items() if len(held) > 1 or card in replicas}

    def read(self, session, cards):
        """Reads the shared cards' processes through ``session`` (an open nvml.session.Session, its reader's lock
        held) and keeps, per card id, {"holders": {holder: vgpu}, "pods": {(pod, namespace): {"uid": UID,
        "memory": MiB, "utilization": percent}}, "split": {figure: whether NVML could split it per process}}."""
        shared = self.shared(cards)
        found, unnamed, migs = {}, set(), self.pods.mig_gpus() if shared else set()
        for position, card in enumerate(cards):
            holders = shared.get(card.get("id"))
            handle, uuid = session.handle(position) if holders else (None, None)
            if handle is None:
                continue
            mig = uuid in migs
            idle = self.utilization and card.get("gpuUtilization") == 0 and not mig
            use = self.use.read(uuid, handle, mig=mig, utilization=self.utilization and not idle, session=session.inits)
            self.reads += 1
            found[card.get("id")] = self._card(use, holders, idle, unnamed)
        self.last = found
        self._warn(unnamed)

    def _card(self, use, holders, idle, unnamed_here):
        pods = {(pod, namespace) for pod, namespace, _container in holders}
        unnamed = set()
        pids = set(use["memory"] or ()) | set(use["utilization"] or ())
        uids = {pid: pod_uid_of_pid(pid, self.proc) for pid in sorted(pids)}
        names = self.names.names()
        if any(uid is not None and uid not in names for uid in uids.values()):
            names = self.names.names(again=True)   # a pod newer than the last listing
        by_pod = {pod: [] for pod in pods}
        for pid, uid in uids.items():
            name = names.get(uid)
            if name is not None and (name[1], name[0]) in by_pod:
                by_pod[(name[1], name[0])].append(pid)
            elif uid is not None and name is None:
                unnamed.add(uid)
        if unnamed:
            # a process of a pod that cannot be named may be any holder's: only pods with processes are known
            by_pod = {pod: (pids or None) for pod, pids in by_pod.items()}
        unnamed_here.update(unnamed)
        figures = pod_figures(use, by_pod, idle)
        uid_of = {(pod, namespace): uid for uid, (namespace, pod) in names.items()}
        for pod, figure in figures.items():
            figure["uid"] = uid_of.get(pod, "")
        # a figure NVML cannot split here (utilization on MIG, say) stays whole on every holder's series
        split = {"memory": use["memory"] is not None, "utilization": idle or use["utilization"] is not None}
        return {"holders": holders, "pods": figures, "split": split}

    def _warn(self, unnamed):
        if unnamed and unnamed != self._unnamed:
            LOG.warning("processes on shared GPUs belong to pods %s, which %s does not name: their pods' memory and "
                        "utilization are left off (is pod-logs-dir the kubelet's podLogsDir?)",
                        ", ".join(sorted(unnamed)), self.names.directory)
        self._unnamed = unnamed
