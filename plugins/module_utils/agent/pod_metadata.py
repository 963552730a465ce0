# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The UID and the Kubernetes labels of the pods that hold this node's GPUs, for the ``pod_uid`` label and the pod's
own labels on their series (``kubernetes-enable-pod-uid``, ``kubernetes-enable-pod-labels``) (private).

The pods are read from the API server with the agent's credentials (the kubelet's kubeconfig by default): one
list of the pods bound to this node (``fieldSelector=spec.nodeName=<node>``, which the Node authorizer lets a node
make), asking for their metadata alone. A thread of its own reads them again when the pods that hold GPUs
change: another pod holds one (from the kubelet's pod-resources answer), or a pod of the same name has another
UID (an entry of the kubelet's pod logs directory, ``<namespace>_<pod>_<uid>``); and every ``refresh_s``
seconds, for labels changed on a running pod. No read is made while no pod holds a GPU, and a scrape never
makes one: it serves what was read last. While the pods cannot be read, the series keep ``pod``,
``namespace`` and ``container`` and carry neither ``pod_uid`` nor pod labels (what was read before may name
a pod that has ended); the reason is logged when it first appears and when it clears.

A pod label is served when its key is found by one of the allowlist's regular expressions anywhere in it
(a search, not a whole match: anchor with ``^`` and ``$``), or by any key when the list is empty. Its name
is the key with each character other than a letter, a digit or ``_`` made ``_`` (a leading digit gets a
``_`` in front). A name the series already have (``gpu``, ``pod``, ``pod_uid``, ...) is left off, as is a
second key that comes to the same name (the key first in sorted order is served).
"""

from __future__ import annotations

import logging
import re
import threading
import time

from ansible_collections.scv.gpu.plugins.module_utils.agent import dra_claims as dra
from ansible_collections.scv.gpu.plugins.module_utils.agent.metrics import (
    DCGM_LABELS,
    DRIVER_VERSION,
    INSTANCE_LABELS,
    POD_LABELS,
    UID_LABEL,
)
from ansible_collections.scv.gpu.plugins.module_utils.common.backoff import pause
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.kube.pod_processes import DEFAULT_POD_LOGS_DIR, PodNames

LOG = logging.getLogger("scv-gpu-agent")
REFRESH_S = 300.0
RETRY_S = 5.0          # the first retry after a failed read; doubled up to refresh_s
PODS = "/api/v1/pods"
# The list as PartialObjectMetadataList: each pod's metadata without its spec and status (plain JSON as a fallback).
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
# The labels DCGM series carry already (GPU_I_*: those of a MIG GPU instance; dra_*: of a DRA claim): a pod label of
# the same name is left off.
TAKEN = frozenset(DCGM_LABELS + (DRIVER_VERSION,) + POD_LABELS + (UID_LABEL,) + INSTANCE_LABELS + dra.LABELS
                  + dra.MIG_LABELS)
_NOT_IN_NAMES = re.compile(r"[^a-zA-Z0-9_]")


def label_name(key):
    """The Prometheus label name of a pod label's key: ``app.kubernetes.io/name`` is ``app_kubernetes_io_name``."""
    name = _NOT_IN_NAMES.sub("_", key)
    return "_" + name if name[:1].isdigit() else name


def compile_patterns(patterns):
    """The allowlist's regular expressions, compiled (the configuration checked that each compiles)."""
    return tuple(re.compile(pattern) for pattern in patterns)


def allowed_labels(labels, patterns):
    """{label name: value} of a pod's ``labels`` ({key: value}) that the compiled ``patterns`` admit (see above)."""
    found = {}
    for key in sorted(labels):
        if patterns and not any(pattern.search(key) for pattern in patterns):
            continue
        name = label_name(key)
        if name not in TAKEN and name not in found:
            found[name] = str(labels[key])
    return found


def node_pods(client, node, patterns=None):
    """{(pod, namespace): (uid, {label name: value})} of the pods bound to ``node``, read with ``client`` (a
    ``kube.rest.RestTransport``) in one request; ``patterns`` None: no labels. ApiError when they cannot be read."""
    answer = client.request("GET", "list", "the pods of Node %s" % node,
                            client.url(PODS, fieldSelector="spec.nodeName=%s" % node), accept=METADATA_ONLY)
    found = {}
    for item in answer.get("items") or ():
        metadata = item.get("metadata") or {}
        labels = {} if patterns is None else allowed_labels(metadata.get("labels") or {}, patterns)
        found[(metadata.get("name") or "", metadata.get("namespace") or "")] = (metadata.get("uid") or "", labels)
    return found


class PodMetadata(threading.Thread):
    """Keeps the UID and allowed labels of the pods holding GPUs (``pods``, an ``agent.pod_attribution.PodAttribution``)."""

    def __init__(self, client, node, pods, stopping, uid=True, labels=False, patterns=(),
                 logs_dir=DEFAULT_POD_LOGS_DIR, refresh_s=REFRESH_S, clock=time.monotonic):
        super().__init__(name="pod-metadata", daemon=True)
        self.client, self.node, self.pods, self.stopping = client, node, pods, stopping
        self.uid, self.labels = uid, labels
        self.patterns = compile_patterns(patterns) if labels else None
        self.names = PodNames(logs_dir)
        self.refresh_s, self.clock = refresh_s, clock
        self.reads, self.failures = 0, 0
        self.problem = None
        self._pods = None        # {(pod, namespace): (uid, labels)} of the last read; None: none, or it failed
        self._key = None         # the pods holding GPUs, and their UIDs in the pod logs directory, when last read
        self._due = 0.0          # the clock time of the next read, whatever changes
        self._failed = 0         # reads failed in a row
        self._lock = threading.Lock()

    def run(self):
        while not self.stopping.is_set():
            if self.pods.refreshed.wait(1.0):
                self.pods.refreshed.clear()
            self.step()

    def step(self):
        """Reads the pods when those holding GPUs changed or a read is due; never while none holds one, and
        after a failure not before its retry is due."""
        held = frozenset(holder[:2] for table in (self.pods.holders, self.pods.claims)   # claims: through DRA
                         for found in list(table.values()) for holder in found)
        if not held:
            return
        uids = frozenset((uid, namespace, pod) for uid, (namespace, pod) in self.names.names().items()
                         if (pod, namespace) in held)
        key, now = (held, uids), self.clock()
        if now < self._due and (key == self._key or self._failed):
            return
        self._key = key
        self.read(now)

    def read(self, now):
        try:
            found = node_pods(self.client, self.node, self.patterns)
        except Exception as error:  # pylint: disable=broad-exception-caught
            self.failures += 1
            self._failed += 1
            self._due = now + pause(self._failed, RETRY_S, self.refresh_s)
            with self._lock:
                self._pods = None
            self._failed_with(error)
            return
        self.reads += 1
        self._failed, self._due = 0, now + self.refresh_s
        with self._lock:
            self._pods = found
        if self.problem is not None:
            LOG.info("pod UID and labels back on GPU series: the pods of Node %s are read again", self.node)
        self.problem = None

    def _failed_with(self, error):
        problem = str(error) if isinstance(error, ApiError) else (
            "the pods of Node %s could not be read (%s: %s)" % (self.node, type(error).__name__, error))
        if getattr(error, "status", None) == 403:
            problem += (" (the Node authorizer lets a node list the pods bound to it with its own credentials: is "
                        "the kubeconfig the kubelet's, of Node %s?)" % self.node)
        if problem != self.problem:
            LOG.warning("pod UID and labels left off GPU series: %s", problem,
                        exc_info=not isinstance(error, ApiError))
        self.problem = problem

    def extra(self, *held_by):
        """(label names, {(pod, namespace): [their values]}) for the pods ``held_by`` names (each {card or GPU
        instance: [(pod, namespace, container)]}): the allowed labels any of them has, in name order, then
        ``pod_uid`` when asked for. A pod without a label has '' (no label, to Prometheus). No names while the
        pods cannot be read."""
        with self._lock:
            known = self._pods
        if known is None:
            return (), {}
        held = {holder[:2] for table in held_by for holders in (table or {}).values() for holder in holders}
        chosen = {key: known[key] for key in held if key in known}
        names = tuple(sorted({name for _uid, labels in chosen.values() for name in labels}))
        values = {key: [labels.get(name, "") for name in names] + ([uid] if self.uid else [])
                  for key, (uid, labels) in chosen.items()}
        return names + ((UID_LABEL,) if self.uid else ()), values

    def counters(self):
        return {"scv_agent_pod_metadata_reads": self.reads, "scv_agent_pod_metadata_failures": self.failures}
