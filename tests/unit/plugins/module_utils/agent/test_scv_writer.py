"""Another writer of the node's Scv status: counted, named, and not fought."""

from __future__ import annotations

import logging

from ansible_collections.scv.gpu.plugins.module_utils.agent import scv_writer
from ansible_collections.scv.gpu.plugins.module_utils.agent.counters import Counters
from ansible_collections.scv.gpu.plugins.module_utils.agent.scv_writer import HOLD_S, Contest, last_status_writer


def scv(version, free, manager="scv.gpu-agent@other-host", time="2026-11-25T19:00:00Z"):
    return {"metadata": {"resourceVersion": str(version), "uid": "u-1", "managedFields": [
        {"manager": "scv.gpu", "operation": "Update", "time": "2026-11-25T18:00:00Z"},
        {"manager": manager, "operation": "Update", "subresource": "status", "time": time}]},
        "status": {"freeMemorySum": free}}


def test_three_foreign_writes_in_the_window_hold_the_agents_writes_then_it_writes_again():
    clock = [0.0]
    counters = Counters()
    contest = Contest(counters, clock=lambda: clock[0])
    assert contest.may_write(scv(1, 100)) == (True, False)      # nothing written yet: nothing foreign
    contest.wrote(scv(2, 100))
    assert contest.may_write(scv(2, 100)) == (True, False)      # its own write, as watched
    outcomes = []
    for version in (3, 5, 7):                                   # the other agent's write after each of ours
        clock[0] += 2
        outcomes.append(contest.may_write(scv(version, 50)))
        contest.wrote(scv(version + 1, 100))
    assert outcomes == [(True, False), (True, False), (False, True)]
    assert contest.contested() and counters["scv_foreign_writes"] == 3 and contest.writer == "scv.gpu-agent@other-host"
    assert contest.may_write(scv(9, 50)) == (False, False)     # held, and told once
    clock[0] += HOLD_S
    assert contest.may_write(scv(9, 50)) == (True, False) and not contest.contested()


def test_a_playbooks_write_now_and_then_is_no_contest():
    clock = [0.0]
    contest = Contest(Counters(), clock=lambda: clock[0])
    contest.wrote(scv(2, 100))
    for version in (3, 6, 9, 12):
        clock[0] += scv_writer.WINDOW_S / 2 + 1                 # once in a while: the window never holds three
        assert contest.may_write(scv(version, 50, manager="scv.gpu")) == (True, False)
        contest.wrote(scv(version + 1, 100))
    assert not contest.contested()


def test_a_spec_change_or_an_equal_status_is_not_a_foreign_write():
    counters = Counters()
    contest = Contest(counters, clock=lambda: 0.0)
    contest.wrote(scv(2, 100))
    for version in (3, 4, 5, 6):
        assert contest.may_write(scv(version, 100)) == (True, False)   # a new version, the same status
    assert counters["scv_foreign_writes"] == 0


def test_the_last_status_writer_is_the_newest_status_entry_of_managed_fields():
    assert last_status_writer(scv(1, 1, manager="scv.gpu-agent@b", time="2026-11-25T19:00:01Z")) == "scv.gpu-agent@b"
    assert last_status_writer({"metadata": {}}) is None


class Client:
    def __init__(self):
        self.events, self.writes = [], []

    def create_event(self, event):
        self.events.append(event)
        return event

    def replace_status(self, body, check_mode=False):
        body = dict(body, metadata=dict(body["metadata"], resourceVersion=str(int(body["metadata"]["resourceVersion"])
                                                                              + 1)))
        self.writes.append(body)
        return body


class State:
    def __init__(self, scv_object):
        self.scv = scv_object

    def get(self):
        return self.scv, False

    def set(self, scv_object):
        self.scv = scv_object


def test_the_writer_says_so_once_with_an_event_on_the_scv_and_stops_writing(caplog, monkeypatch):
    facts = {"cardList": [{"id": 0, "model": "TITAN Xp", "totalMemory": 12194, "freeMemory": 11950,
                           "health": "Healthy"}], "nvml_available": True}
    client, state = Client(), State(scv(1, 0))
    writer = scv_writer.ScvWriter(client, "gpu-1", state, Counters())
    clock = [0.0]
    monkeypatch.setattr(writer.contest, "_clock", lambda: clock[0])
    with caplog.at_level(logging.INFO, logger="scv-gpu-agent"):
        for _tick in range(6):
            writer.publish(facts, 1000)
            state.set(scv(int(state.scv["metadata"]["resourceVersion"]) + 1, 7))   # the other agent writes back
            clock[0] += 1
    assert len(client.writes) == 3 and len(client.events) == 1
    event = client.events[0]
    assert (event["type"], event["reason"], event["involvedObject"]["kind"]) == ("Warning", "ScvContested", "Scv")
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(
        "another writer (scv.gpu-agent@other-host) changed the status of Scv gpu-1 3 times in 300 s")
