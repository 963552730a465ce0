"""The loop's wake-up: an Event's behaviour over a pipe, so that signal handlers may set it."""

from __future__ import annotations

import os
import signal
import threading
import time

from ansible_collections.scv.gpu.plugins.module_utils.agent.wakeup import Wakeup


def test_it_behaves_as_an_event():
    wakeup = Wakeup()
    assert not wakeup.is_set() and wakeup.wait(0.01) is False
    wakeup.set()
    wakeup.set()
    assert wakeup.is_set() and wakeup.wait(5) is True and wakeup.is_set()   # waiting does not clear it
    wakeup.clear()
    assert not wakeup.is_set()
    wakeup.close()


def test_another_thread_wakes_a_wait():
    wakeup = Wakeup()
    threading.Timer(0.05, wakeup.set).start()
    started = time.monotonic()
    assert wakeup.wait(10) is True and time.monotonic() - started < 5


def test_a_full_pipe_still_reads_as_set():
    wakeup = Wakeup()
    for _call in range(100000):     # far more than a pipe holds
        wakeup.set()
    assert wakeup.is_set()
    wakeup.clear()
    assert not wakeup.is_set()


def test_a_signal_handler_wakes_the_main_thread_waiting_on_it():
    wakeup = Wakeup()
    previous = signal.signal(signal.SIGUSR1, lambda *_args: wakeup.set())
    try:
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        assert wakeup.wait(10) is True
    finally:
        signal.signal(signal.SIGUSR1, previous)
