"""systemd's notifications over a real datagram socket, and the agent's counters under concurrent threads."""

from __future__ import annotations

import socket
import threading

from ansible_collections.scv.gpu.plugins.module_utils.agent.counters import Counters
from ansible_collections.scv.gpu.plugins.module_utils.agent.sdnotify import Notifier
from ansible_collections.scv.gpu.plugins.module_utils.nvml.events import XidLog


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


def hammer(function, threads=8, times=5000):
    workers = [threading.Thread(target=lambda: [function() for _call in range(times)]) for _worker in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return threads * times


def test_counters_lose_no_bump_between_threads():
    counters = Counters()
    total = hammer(lambda: counters.bump("errors"))
    assert counters["errors"] == total and counters.values()["errors"] == total


def test_the_xid_log_keeps_every_record_while_another_thread_trims_it():
    now = [0.0]
    log = XidLog(lambda: now[0])
    stop = threading.Event()

    def trim():
        while not stop.is_set():
            log.kept(0, newer_than=-1.0)   # drops nothing: every record is newer; trims under the lock
    trimmer = threading.Thread(target=trim)
    trimmer.start()
    try:
        total = hammer(lambda: log.add(0, 48), threads=4, times=2000)
    finally:
        stop.set()
        trimmer.join()
    assert len(log.kept(0)) == total and log.last() == {0: 48}
