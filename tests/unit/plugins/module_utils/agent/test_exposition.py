"""The agent's Prometheus text is, byte for byte, what prometheus_client's generate_latest writes for the same
series: the exposition writes each label set's text once per scrape instead of once per series."""

from __future__ import annotations

import math

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent.metrics import exposition, sample_text
from harness.agent_samples import CARDS, reference


@pytest.mark.parametrize("pods, shares, served", [
    (None, {}, None),                                            # no pod attribution
    ({0: [("", "", "")], 1: [("a", "ml", "c"), ("b", "ml", "c")], 2: [("x", "ns", "main")]},   # GPU 1 shared
     {1: {"holders": {("a", "ml", "c"): "0", ("b", "ml", "c"): "1,2"}, "split": {"memory": True, "utilization": False},
          "pods": {("a", "ml"): {"uid": "u-a", "memory": 100}, ("b", "ml"): {"uid": "u-b", "memory": 200}}}},
     None),
    (None, {}, frozenset(["DCGM_FI_DEV_FB_USED"])),              # a counters file naming one series, no driver label
    ({0: [("", "", "")], 1: [("", "", "")], 2: [("x", "ns", "main")]}, {}, None),   # GPU 1 has MIG on
], ids=["no-pods", "shared", "one-series", "mig"])
def test_the_exposition_is_what_prometheus_client_writes(pods, shares, served, request):
    mig = request.node.callspec.id == "mig"
    instances = {1: [{"id": 1, "profile": "3g.40gb", "usedMemory": 5}, {"id": 2, "profile": "1g.10gb"}]} if mig else {}

    def snapshot():
        return {"node": "node-1", "facts": {"cardList": CARDS, "driver_version": "580.159.04"},
                "last_xids": {1: 79}, "counters": {"scv_agent_ticks": 12, "scv_agent_nvml_seconds": 0.25},
                "served": served, "pods": pods, "shares": shares, "contested": True, "instances": instances,
                "instance_pods": {(1, 2): [("y", "ns", "c")]}, "instance_replicas": {}}

    text = exposition(snapshot)
    assert text == reference(snapshot)
    assert b'modelName="a \\"quoted\\"\\\\odd\\nname"' in text or served is not None


@pytest.mark.parametrize("value, text", [
    (0, "0.0"), (42, "42.0"), (0.25, "0.25"), (1e-05, "1e-05"), (-3.5, "-3.5"), (999999.5, "999999.5"),
    (1234567.0, "1.234567e+06"), (1e6, "1e+06"), (-1234567.0, "-1.234567e+06"),
    (61234567890.0, "6.123456789e+10"), (1e15, "1e+15"), (1e16, "1e+16"), (2 ** 63, "9.223372036854776e+18"),
    (float("nan"), "NaN"), (float("inf"), "+Inf"), (float("-inf"), "-Inf"), (True, "1.0"),
])
def test_a_sample_value_is_written_as_prometheus_client_and_go_write_it(value, text):
    """Below 10**6 in size, Python's shortest repr; from there an exponent, as Go's strconv 'g' writes it: the
    text prometheus_client writes but for large negative numbers, which it writes out in digits. Either way the
    text reads back as the same number."""
    assert sample_text(value) == text
    assert float(text) == float(value) or math.isnan(float(value))
    if math.isnan(float(value)) or float(value) > -1e6:
        from prometheus_client.utils import floatToGoString
        assert floatToGoString(value) == text
