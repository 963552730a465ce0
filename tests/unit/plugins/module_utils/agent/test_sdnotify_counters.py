"""systemd's notifications over a real datagram socket, and the agent's counters under concurrent threads."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time

from ansible_collections.scv.gpu.plugins.module_utils.agent.counters import Counters
from ansible_collections.scv.gpu.plugins.module_utils.agent.sdnotify import Notifier
from ansible_collections.scv.gpu.plugins.module_utils.nvml.xid_events import XidLog


def test_notifications_reach_the_socket_systemd_names(tmp_path):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        notify = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2500000"})
        assert notify.watchdog_s == 2.5
        assert notify("READY=1", "STATUS=publishing")
        assert server.recv(4096) == b"READY=1\nSTATUS=publishing"


def test_an_abstract_socket_is_addressed_with_a_nul_byte():
    name = "scv-gpu-test-%d" % threading.get_ident()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name)
        assert Notifier({"NOTIFY_SOCKET": "@" + name})("WATCHDOG=1")
        assert server.recv(4096) == b"WATCHDOG=1"


def test_outside_systemd_nothing_is_sent_and_a_watchdog_meant_for_another_process_is_ignored(tmp_path):
    assert Notifier({})("READY=1") is False
    assert Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})("READY=1") is False   # a socket that went away
    assert Notifier({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}).watchdog_s is None


@contextlib.contextmanager
def frequent_switches():
    """Threads switch every microsecond instead of every 5 ms, so that an unguarded read-modify-write
    is interrupted halfway thousands of times in a short run."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def hammer(function, threads=8, times=5000):
    workers = [threading.Thread(target=lambda: [function() for _call in range(times)]) for _worker in range(threads)]
    with frequent_switches():
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    return threads * times


class YieldingOne(int):
    """1, whose addition runs Python code that lets another thread in. ``value += 1`` on a dict
    item runs no Python code on CPython, so no thread switch can fall between its read and its
    write; adding this amount opens that window, as a free-threaded build does for plain ints.
    Only the counters' lock then keeps two bumps from reading the same value."""

    def __radd__(self, other):
        time.sleep(0)
        return other + 1


def test_counters_lose_no_bump_between_threads():
    counters = Counters()
    total = hammer(lambda: counters.bump("errors", YieldingOne(1)), threads=4, times=500)
    assert counters["errors"] == total and counters.values()["errors"] == total


def test_an_xid_added_while_the_log_is_trimmed_waits_for_the_trim():
    """A trim reads a card's records and writes back those it keeps: an XID appended in between would
    be lost. On CPython with the GIL that gap is too narrow for a stress test to hit (the filter sees
    appends until it ends), so an XID is added from another thread while the trim is filtering, and
    must wait until the trim is done."""
    done_during_the_trim = []

    class ClockTime(float):
        def __gt__(self, other):   # called by the trim's filter, once per record
            if not done_during_the_trim:
                adder.start()
                adder.join(0.2)
                done_during_the_trim.append(not adder.is_alive())
            return float(self) > other

    log = XidLog(lambda: ClockTime(1.0))
    log.add(0, 48)
    adder = threading.Thread(target=log.add, args=(0, 79))
    assert [record.xid for record in log.kept(0, newer_than=0.0)] == [48]
    adder.join()
    assert done_during_the_trim == [False]
    assert [record.xid for record in log.kept(0)] == [48, 79] and log.count() == 2 and log.last() == {0: 79}
