"""Sample readings and reference renderers shared by the agent's unit tests (no test module imports another).

``reference`` renders a snapshot's series with prometheus_client, the oracle the agent's exposition is held to;
``CARDS`` are three cards as NVML reads them; ``WHOLE``, ``MIG`` and ``INSTANCES`` a GPU whole and one with MIG on;
``pb`` builds one length-delimited protobuf field, what the kubelet's pod-resources answer is made of;
``QuietClient`` is a client for an Agent that never reaches an API server.
"""

from __future__ import annotations

import types

from ansible_collections.scv.gpu.plugins.module_utils.agent.metrics import families
from ansible_collections.scv.gpu.plugins.module_utils.kube.rest import ApiContact


class QuietClient:
    """What an Agent reads of its client, for an agent whose tests (or benchmarks) make no API request: the
    server's address, the request and reload counts, the throttle and the contact (``contact`` given, or a new
    one that has heard nothing)."""

    server = "https://127.0.0.1:1"

    def __init__(self, contact=None):
        self.requests = self.reloads = 0
        self.contact = contact or ApiContact()
        self.limiter = types.SimpleNamespace(throttled=0, waited_s=0.0)


class SnapshotCollector:
    """prometheus_client's view of the same series families: the reference the exposition is held to."""

    def __init__(self, snapshot):
        self.snapshot = snapshot

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for name, kind, text, names, rows in families(self.snapshot()):
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, text, labels=names)
            for values, value in rows:
                family.add_metric(list(values), value)
            yield family


def reference(snapshot):
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    return generate_latest(registry)


def card(index, **extra):
    found = {"id": index, "uuid": "GPU-%d" % index, "pciBusId": "00000000:%02X:00.0" % index,
             "model": "NVIDIA H100 80GB HBM3", "health": "Healthy", "usedMemory": 1024 * index,
             "freeMemory": 80000, "temperature": 40 + index, "gpuUtilization": 10 * index, "powerUsage": 101.5}
    found.update(extra)
    return found


CARDS = [card(0), card(1, model='a "quoted"\\odd\nname', health="Unhealthy"), card(2, temperature=None)]

WHOLE = {"id": 0, "uuid": "GPU-0", "pciBusId": "00000000:18:00.0", "model": "NVIDIA H100 80GB HBM3",
         "temperature": 41, "usedMemory": 100, "freeMemory": 80000, "gpuUtilization": 7, "pcieTxMiBPerSecond": 2.0,
         "health": "Healthy"}
# MIG on: no utilization (NVML has none), GPM's PCIe traffic as it would be were the GPU sampled whole
MIG = {"id": 1, "uuid": "GPU-1", "pciBusId": "00000000:2A:00.0", "model": "NVIDIA H100 80GB HBM3",
       "temperature": 50, "usedMemory": 26, "freeMemory": 50000, "pcieTxMiBPerSecond": 3.0, "health": "Healthy"}
INSTANCES = {1: [{"id": 1, "profile": "3g.40gb", "usedMemory": 13, "freeMemory": 40435, "tensorUtilization": 35.0},
                 {"id": 5, "profile": "1g.10gb", "usedMemory": 13, "freeMemory": 9971}]}


def pb(number, payload):
    """One length-delimited protobuf field (what the kubelet's answer is made of)."""
    payload = payload.encode() if isinstance(payload, str) else payload
    length, encoded = len(payload), b""
    while True:
        encoded += bytes([(length & 0x7F) | (0x80 if length > 0x7F else 0)])
        length >>= 7
        if not length:
            break
    return bytes([number << 3 | 2]) + encoded + payload
