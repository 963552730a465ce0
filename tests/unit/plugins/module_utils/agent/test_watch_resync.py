"""The Scv watch starting again: from the object as it is now (a watch-list), never by a read per tick.

The API server's side of this (a real restart, a real watch-list) is in
tests/integration/test_agent_fleet_writes.py; here a scripted client shows each path's requests.
"""

from __future__ import annotations

import threading

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent import watch as watch_module
from ansible_collections.scv.gpu.plugins.module_utils.agent.watch import INITIAL_EVENTS_END, ScvState, ScvWatch
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError


def scv(version, interval=1000):
    return {"metadata": {"name": "n", "resourceVersion": str(version)}, "spec": {"updateInterval": interval}}


def initial_end(version):
    return ("BOOKMARK", {"metadata": {"resourceVersion": str(version), "annotations": {INITIAL_EVENTS_END: "true"}}})


class Scripted:
    """Answers each watch (and list) with the next scripted answer: events, or an error to raise."""

    def __init__(self, watches, lists=()):
        self.watches, self.lists, self.calls = list(watches), list(lists), []

    def watch(self, name, version, timeout):
        self.calls.append(("watch", version))
        answer = self.watches.pop(0) if self.watches else StopWatching()
        if isinstance(answer, Exception):
            raise answer
        yield from answer

    def list_named(self, name):
        self.calls.append(("list", None))
        return self.lists.pop(0)


class StopWatching(ApiError):
    def __init__(self):
        super().__init__("the script is over", status=599)


@pytest.fixture
def run(monkeypatch):
    monkeypatch.setattr(watch_module, "reconnect_pause", lambda failures: 0.0)

    def go(client):
        state, wake, stopping = ScvState(), threading.Event(), threading.Event()
        state.set(scv(10))
        original = client.watch

        def watch(name, version, timeout):
            if not client.watches:
                stopping.set()     # the script is over: end the loop after this answer
            return original(name, version, timeout)

        client.watch = watch
        ScvWatch(client, "n", state, wake, stopping)._forever()
        return state, wake

    return go


def test_a_version_too_old_starts_again_from_now_in_one_request(run):
    client = Scripted([ApiError("too old", status=410),
                       [("ADDED", scv(50, interval=2000)), initial_end(51), ("MODIFIED", scv(60, interval=2000))]])
    state, wake = run(client)
    assert client.calls[:2] == [("watch", "10"), ("watch", None)]
    assert state.get()[0]["metadata"]["resourceVersion"] == "60" and state.interval() == 2000
    assert wake.is_set()                                        # the interval changed


def test_an_error_event_410_in_the_stream_does_the_same(run):
    client = Scripted([[("ERROR", {"code": 410, "message": "too old resource version"})],
                       [("ADDED", scv(50)), initial_end(51)]])
    state, _wake = run(client)
    assert client.calls[:2] == [("watch", "10"), ("watch", None)]
    assert state.version() == "51" and state.get()[0]["metadata"]["resourceVersion"] == "50"


def test_after_an_outage_the_watch_starts_from_now(run):
    client = Scripted([unreachable(), [("ADDED", scv(50)), initial_end(51)]])
    run(client)
    assert client.calls[:2] == [("watch", "10"), ("watch", None)]


def test_an_scv_deleted_meanwhile_is_created_again(run):
    client = Scripted([ApiError("too old", status=410), [initial_end(51)]])
    state, wake = run(client)
    assert state.get() == (None, True) and wake.is_set()
    assert client.calls == [("watch", "10"), ("watch", None)]   # and the watch ends until the Scv is back


def test_a_server_without_watch_lists_is_read_once_by_a_list(run):
    client = Scripted([ApiError("too old", status=410), ApiError("sendInitialEvents is forbidden", status=422),
                       [("MODIFIED", scv(70))]], lists=[([scv(60)], "65")])
    state, _wake = run(client)
    assert client.calls[:4] == [("watch", "10"), ("watch", None), ("list", None), ("watch", "65")]
    assert state.version() == "70"


def unreachable():
    """The error the client raises when the server cannot be reached."""
    return ApiError("cannot watch Scv n: the Kubernetes API is unreachable: [Errno 111] Connection refused")


def test_a_bookmark_moves_where_the_watch_resumes_not_the_version_a_write_replaces():
    state = ScvState()
    state.set(scv(10))
    state.bookmark("99")
    assert state.version() == "99"
    assert state.get()[0]["metadata"]["resourceVersion"] == "10"    # a write after it must not meet a conflict
    state.offer(scv(120))
    assert state.version() == "120"
    state.bookmark("130")
    state.set(scv(140))                                             # our write's answer
    assert state.version() == "140"
