"""The collection's one retry pause (doubling, capped, upper-half jitter) and its client-side rate limit."""

from __future__ import annotations

import threading
import time

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.common.backoff import TokenBucket, pause


@pytest.mark.parametrize("failures, ceiling", [(1, 0.5), (2, 1.0), (3, 2.0), (6, 16.0), (7, 20.0), (500, 20.0)])
def test_the_pause_doubles_to_its_cap_and_stays_in_the_upper_half(failures, ceiling):
    assert pause(failures, 0.5, 20.0, rand=lambda: 0.0) == ceiling / 2
    assert pause(failures, 0.5, 20.0, rand=lambda: 1.0) == ceiling


def test_no_failure_yet_pauses_as_the_first():
    assert pause(0, 1.0, 30.0, rand=lambda: 1.0) == pause(1, 1.0, 30.0, rand=lambda: 1.0) == 1.0


class FakeTime:
    """A clock that moves only when someone sleeps on it."""

    def __init__(self):
        self.now = 100.0
        self.slept = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def test_a_burst_passes_at_once_then_one_call_per_token():
    time_ = FakeTime()
    bucket = TokenBucket(qps=2, burst=5, clock=time_.clock, sleep=time_.sleep)
    assert [bucket.take() for _call in range(5)] == [0.0] * 5
    assert [bucket.take() for _call in range(4)] == [0.5] * 4
    assert time_.now == pytest.approx(102.0)
    assert bucket.throttled == 4 and bucket.waited_s == pytest.approx(2.0)


def test_the_bucket_fills_again_while_idle_but_never_past_the_burst():
    time_ = FakeTime()
    bucket = TokenBucket(qps=1, burst=3, clock=time_.clock, sleep=time_.sleep)
    for _call in range(3):
        bucket.take()
    time_.now += 3600            # an hour idle refills 3 tokens, not 3600
    assert [bucket.take() for _call in range(4)] == [0.0, 0.0, 0.0, 1.0]


def test_a_thousand_calls_take_as_long_as_the_rate_says():
    time_ = FakeTime()
    bucket = TokenBucket(qps=5, burst=10, clock=time_.clock, sleep=time_.sleep)
    for _call in range(1000):
        bucket.take()
    assert time_.now - 100.0 == pytest.approx((1000 - 10) / 5)


def test_threads_share_the_bucket_without_losing_a_token():
    # Real time: 40 calls from 4 threads, a burst of 10 and then 200 a second, cannot end before 30 / 200 s.
    bucket = TokenBucket(qps=200, burst=10)
    threads = [threading.Thread(target=lambda: [bucket.take() for _call in range(10)]) for _thread in range(4)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.monotonic() - start >= 30 / 200 - 0.005
    assert 20 <= bucket.throttled <= 30   # time passing meanwhile refills a few


@pytest.mark.parametrize("qps, burst", [(0, 5), (-1, 5), (1, 0)])
def test_a_limit_that_would_block_forever_is_refused(qps, burst):
    with pytest.raises(ValueError, match="qps > 0 and burst >= 1"):
        TokenBucket(qps, burst)


def test_try_take_never_waits_and_refills_with_time():
    time_ = FakeTime()
    bucket = TokenBucket(qps=1 / 300, burst=2, clock=time_.clock, sleep=time_.sleep)
    assert [bucket.try_take() for _call in range(3)] == [True, True, False]
    time_.now += 299
    assert not bucket.try_take()
    time_.now += 2
    assert bucket.try_take() and not bucket.try_take()
    assert time_.slept == [] and bucket.throttled == 0
