"""NodeCondition and NodeTaint: what the agent writes on its own Node, and when, against an in-memory Node that
answers as kube-apiserver does (404 for a missing Node, 409 for a taint write over a stale resourceVersion).

The same classes against a real API server and kubelet are in tests/integration/test_agent_*.py; here each rule is
one case that fails fast: the heartbeat, the transition time, one Event per change, the pause while a Node is
missing, the taint beside the others.
"""

from __future__ import annotations

import copy

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent import node_health
from ansible_collections.scv.gpu.plugins.module_utils.agent.counters import Counters
from ansible_collections.scv.gpu.plugins.module_utils.agent.node_health import (
    CONDITION_HEARTBEAT_S,
    NODE_LOOKUP_S,
    TAINT_KEY,
    NodeCondition,
    NodeTaint,
)
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError

HEALTHY = {"nvml_available": True, "cardList": [{"id": 0, "uuid": "GPU-0", "health": "Healthy"}]}
LOST = {"nvml_available": True, "cardList": [{"id": 0, "uuid": "GPU-0", "health": "Unhealthy",
                                              "healthReasons": ["XID 79"]}]}
HOT = {"nvml_available": True, "cardList": [{"id": 0, "uuid": "GPU-0", "health": "Unhealthy",
                                             "healthReasons": ["XID 48"]}]}


class Api:
    """One Node (or none), its Events, and every call made: (verb, what)."""

    def __init__(self, node="gpu-1"):
        self.node = {"metadata": {"name": node, "uid": "u-1", "resourceVersion": "1"},
                     "spec": {"taints": [{"key": "other", "effect": "NoExecute"}]}, "status": {"conditions": []}}
        self.calls, self.events, self.fail = [], [], {}

    def maybe_fail(self, verb):
        if self.fail.get(verb):
            raise self.fail[verb].pop(0)

    def bump(self):
        self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)

    def get_node(self, name):
        self.calls.append(("get_node", name))
        self.maybe_fail("get_node")
        return copy.deepcopy(self.node)

    def patch_node_status(self, name, patch):
        self.calls.append(("patch_node_status", patch))
        self.maybe_fail("patch_node_status")
        if self.node is None:
            raise ApiError("nodes %s not found" % name, status=404)
        self.node["status"]["conditions"] = patch["status"]["conditions"]
        self.bump()
        return copy.deepcopy(self.node)

    def patch_node(self, name, patch):
        self.calls.append(("patch_node", patch))
        self.maybe_fail("patch_node")
        if patch["metadata"]["resourceVersion"] != self.node["metadata"]["resourceVersion"]:
            raise ApiError("the object has been modified", conflict=True, status=409)
        self.node["spec"]["taints"] = patch["spec"]["taints"]
        self.bump()
        return copy.deepcopy(self.node)

    def create_event(self, event):
        self.events.append(event)
        return dict(event, metadata=dict(event["metadata"], namespace="default", name="e-%d" % len(self.events)))

    def patch_event(self, namespace, name, patch):
        self.calls.append(("patch_event", name))

    def verbs(self, verb):
        return [what for called, what in self.calls if called == verb]


@pytest.fixture
def clock(monkeypatch):
    """The monotonic clock node_health reads, moved by the test."""
    now = [1000.0]
    monkeypatch.setattr(node_health.time, "monotonic", lambda: now[0])
    return now


def condition(api):
    (found,) = api.node["status"]["conditions"]
    return found["status"], found["reason"], found["message"], found["lastTransitionTime"]


def test_the_condition_is_written_at_first_then_on_change_or_heartbeat_only(clock):
    api, counters = Api(), Counters()
    health = NodeCondition(api, "gpu-1", counters)
    health.update(HEALTHY)
    assert condition(api)[:3] == ("True", "GPUsHealthy", "all 1 GPUs are healthy")
    health.update(HEALTHY)
    clock[0] += CONDITION_HEARTBEAT_S - 1
    health.update(HEALTHY)
    assert len(api.verbs("patch_node_status")) == 1 and len(api.verbs("get_node")) == 1
    clock[0] += 1
    health.update(HEALTHY)                    # the heartbeat: written again, no Event
    assert len(api.verbs("patch_node_status")) == 2 and counters["condition_writes"] == 2
    assert [event["reason"] for event in api.events] == []


def test_a_change_writes_at_once_with_one_event_and_the_transition_time_moves_with_the_status_only(clock,
                                                                                                   monkeypatch):
    times = iter(["2026-11-29T01:00:0%dZ" % second for second in range(10)])
    monkeypatch.setattr(node_health, "now_rfc3339", lambda: next(times))
    api = Api()
    health = NodeCondition(api, "gpu-1", Counters())
    health.update(HEALTHY)
    health.update(LOST)
    assert condition(api) == ("False", "GPUUnhealthy", "1 of 1 GPUs unhealthy. GPU 0 (GPU-0): XID 79",
                              "2026-11-29T01:00:01Z")
    health.update(HOT)                        # the reason's text changed, the status did not
    assert condition(api)[2].endswith("XID 48") and condition(api)[3] == "2026-11-29T01:00:01Z"
    health.update(HEALTHY)
    assert condition(api)[0] == "True" and condition(api)[3] == "2026-11-29T01:00:03Z"
    # the first write (True, from nothing) is no Event; each change of status or reason after it is one
    assert [(event["type"], event["reason"]) for event in api.events] == [
        ("Warning", "GPUUnhealthy"), ("Normal", "GPUsHealthy")]


def test_the_condition_the_node_already_has_keeps_its_transition_time(clock):
    api = Api()
    api.node["status"]["conditions"] = [{"type": "GPUHealthy", "status": "True", "reason": "GPUsHealthy",
                                         "message": "all 1 GPUs are healthy",
                                         "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    NodeCondition(api, "gpu-1", Counters()).update(HEALTHY)
    assert condition(api)[3] == "2026-01-01T00:00:00Z" and api.events == []


def test_a_missing_node_is_looked_for_again_every_lookup_period_not_every_tick(clock):
    api = Api()
    api.node = None
    health = NodeCondition(api, "gpu-1", Counters())
    health.update(HEALTHY)
    clock[0] += NODE_LOOKUP_S - 1
    health.update(HEALTHY)
    assert len(api.verbs("get_node")) == 1 and api.verbs("patch_node_status") == []
    clock[0] += 1
    api.node = Api().node
    health.update(HEALTHY)
    assert len(api.verbs("get_node")) == 2 and condition(api)[0] == "True"


def test_a_node_deleted_under_the_agent_is_looked_for_again(clock):
    api, counters = Api(), Counters()
    health = NodeCondition(api, "gpu-1", counters)
    health.update(HEALTHY)
    api.node = None
    health.update(LOST)                       # the write meets 404
    assert counters["errors"] == 1 and health.condition is None
    health.update(LOST)
    assert len(api.verbs("patch_node_status")) == 2 and len(api.verbs("get_node")) == 1   # no GET yet
    clock[0] += NODE_LOOKUP_S
    api.node = Api().node
    health.update(LOST)
    assert condition(api)[0] == "False"


def test_another_api_error_is_counted_and_tried_again_at_the_next_tick(clock):
    api, counters = Api(), Counters()
    api.fail["patch_node_status"] = [ApiError("etcdserver: request timed out", status=500)]
    health = NodeCondition(api, "gpu-1", counters)
    health.update(LOST)
    assert counters["errors"] == 1 and api.node["status"]["conditions"] == []
    health.update(LOST)
    assert condition(api)[0] == "False"


def test_the_taint_goes_on_beside_the_others_and_comes_off_with_the_nodes_resource_version(clock):
    api, counters = Api(), Counters()
    taint = NodeTaint(api, "gpu-1", counters)
    taint.update(HEALTHY)
    assert api.verbs("patch_node") == [] and taint.tainted is False
    taint.update(LOST)
    assert api.node["spec"]["taints"] == [{"key": "other", "effect": "NoExecute"},
                                          {"key": TAINT_KEY, "effect": "NoSchedule"}]
    assert api.verbs("patch_node")[-1]["metadata"] == {"resourceVersion": "1"}
    taint.update(HOT)                         # still unhealthy: nothing to do, not even a read
    assert len(api.verbs("get_node")) == 2
    taint.update(HEALTHY)
    assert api.node["spec"]["taints"] == [{"key": "other", "effect": "NoExecute"}]
    assert counters["taint_changes"] == 2


def test_the_last_taint_removed_leaves_none_and_a_conflict_reads_again(clock):
    api = Api()
    api.node["spec"]["taints"] = [{"key": TAINT_KEY, "effect": "NoSchedule"}]
    taint = NodeTaint(api, "gpu-1", Counters())
    real_get = api.get_node

    def stale_once(name):
        node = real_get(name)
        if len(api.verbs("get_node")) == 1:
            api.bump()                       # someone wrote the Node after our read
        return node
    api.get_node = stale_once
    taint.update(HEALTHY)
    assert api.node["spec"]["taints"] is None and taint.tainted is False
    assert [patch["metadata"]["resourceVersion"] for patch in api.verbs("patch_node")] == ["1", "2"]


def test_without_a_node_the_taint_is_tried_again_at_the_next_tick(clock):
    api = Api()
    node, api.node = api.node, None
    api.get_node = lambda name, get=api.get_node: None if api.node is None else get(name)
    taint = NodeTaint(api, "gpu-1", Counters())
    taint.update(LOST)
    assert taint.tainted is None
    api.node = node
    taint.update(LOST)
    assert taint.tainted is True and api.node["spec"]["taints"][-1]["key"] == TAINT_KEY


def test_the_log_says_once_that_the_node_is_missing_and_once_that_it_came(clock, caplog):
    caplog.set_level("INFO", logger="scv-gpu-agent")
    api = Api()
    node, api.node = api.node, None
    health = NodeCondition(api, "gpu-1", Counters())
    for _tick in range(3):
        health.update(HEALTHY)
        clock[0] += NODE_LOOKUP_S
    api.node = node
    health.update(HEALTHY)
    messages = [record.getMessage() for record in caplog.records]
    assert messages[:2] == ["there is no Node gpu-1: the GPUHealthy condition is not set; looking again every 10 s",
                            "Node gpu-1 is there: setting its GPUHealthy condition"]
    caplog.clear()
    NodeCondition(Api(), "gpu-1", Counters()).update(HEALTHY)     # a Node there from the start: no such line
    assert not [record for record in caplog.records if "is there" in record.getMessage()]
