"""The agent's Events: deduplicated into counts and spam-limited per node, as Kubernetes' event recorder does.

The client here keeps Events in a dict; ``tests/integration/test_agent_fleet_writes.py`` runs the same against
a real kube-apiserver.
"""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent.counters import Counters
from ansible_collections.scv.gpu.plugins.module_utils.agent.node_events import EVENT_BURST, EVENT_REFILL_S, EventRecorder
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError

NODE = {"metadata": {"name": "gpu-1", "uid": "uid-1"}}
UNHEALTHY = ("False", "GPUUnhealthy", "1 of 8 GPUs unhealthy. GPU 3: lost")
HEALTHY = ("True", "GPUsHealthy", "all 8 GPUs are healthy")


class Events:
    """Events by (namespace, name), and every call made."""

    def __init__(self):
        self.stored, self.calls = {}, []

    def create_event(self, event):
        self.calls.append("create")
        key = (event["metadata"]["namespace"], event["metadata"]["name"])
        assert key not in self.stored
        self.stored[key] = dict(event)
        return self.stored[key]

    def patch_event(self, namespace, name, patch):
        self.calls.append("patch")
        if (namespace, name) not in self.stored:
            raise ApiError("cannot patch Event %s: HTTP 404" % name, status=404)
        self.stored[(namespace, name)].update(patch)
        return self.stored[(namespace, name)]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def recorder():
    events, counters, clock = Events(), Counters(), Clock()
    return EventRecorder(events, "gpu-1", counters, "scv-gpu-agent", clock=clock), events, counters, clock


def test_a_flapping_card_leaves_two_events_with_counts(recorder):
    record, events, counters, _clock = recorder
    for flap in range(10):
        record.record(NODE, *UNHEALTHY, now="t%d" % flap)
        record.record(NODE, *HEALTHY, now="t%d" % flap)
    assert events.calls == ["create", "create"] + ["patch"] * 18
    assert sorted((event["reason"], event["count"]) for event in events.stored.values()) == [
        ("GPUUnhealthy", 10), ("GPUsHealthy", 10)]
    unhealthy = next(event for event in events.stored.values() if event["reason"] == "GPUUnhealthy")
    assert (unhealthy["firstTimestamp"], unhealthy["lastTimestamp"], unhealthy["type"]) == ("t0", "t9", "Warning")
    assert counters["events"] == 20 and counters["events_dropped"] == 0


def test_another_message_or_another_node_object_is_another_event(recorder):
    record, events, _counters, _clock = recorder
    record.record(NODE, *UNHEALTHY, now="t")
    record.record(NODE, "False", "GPUUnhealthy", "2 of 8 GPUs unhealthy", now="t")
    record.record({"metadata": {"name": "gpu-1", "uid": "uid-2"}}, *UNHEALTHY, now="t")   # the Node re-created
    assert events.calls == ["create"] * 3


def test_an_event_gone_is_created_again(recorder):
    record, events, _counters, _clock = recorder
    record.record(NODE, *UNHEALTHY, now="t1")
    events.stored.clear()                       # the API server's event TTL ran out
    record.record(NODE, *UNHEALTHY, now="t2")
    record.record(NODE, *UNHEALTHY, now="t3")
    assert events.calls == ["create", "patch", "create", "patch"]
    assert [event["count"] for event in events.stored.values()] == [2]


def test_other_errors_of_a_count_update_are_raised(recorder):
    record, events, _counters, _clock = recorder
    record.record(NODE, *UNHEALTHY, now="t1")

    def refused(*_args):
        raise ApiError("cannot patch Event: HTTP 403", status=403)

    events.patch_event = refused
    with pytest.raises(ApiError, match="403"):
        record.record(NODE, *UNHEALTHY, now="t2")


def test_the_spam_limit_drops_what_is_over_and_lets_one_through_per_refill(recorder):
    record, events, counters, clock = recorder
    for flap in range(100):
        record.record(NODE, *(UNHEALTHY if flap % 2 else HEALTHY), now="t%d" % flap)
    assert len(events.calls) == EVENT_BURST
    assert counters["events"] == EVENT_BURST and counters["events_dropped"] == 100 - EVENT_BURST
    clock.now += EVENT_REFILL_S
    record.record(NODE, *UNHEALTHY, now="later")
    record.record(NODE, *UNHEALTHY, now="later")
    assert len(events.calls) == EVENT_BURST + 1 and counters["events_dropped"] == 100 - EVENT_BURST + 1
