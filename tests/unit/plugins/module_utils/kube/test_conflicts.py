"""The one conflict policy: start over after a jittered, doubling pause; a clear error when it never settles."""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import (
    CONFLICT_ATTEMPTS,
    CONFLICT_PAUSE_S,
    ApiError,
    retry_on_conflict,
)


def conflicting(times, result="written"):
    calls = []

    def cycle():
        calls.append(1)
        if len(calls) <= times:
            raise ApiError("cannot patch Node n: conflict (409): the object has been modified", conflict=True)
        return result

    return cycle, calls


def test_the_pauses_double_with_jitter_and_the_last_attempt_wins():
    pauses = []
    cycle, calls = conflicting(CONFLICT_ATTEMPTS - 1)
    assert retry_on_conflict(cycle, sleep=pauses.append) == "written"
    assert len(calls) == CONFLICT_ATTEMPTS and len(pauses) == CONFLICT_ATTEMPTS - 1
    for attempt, pause in enumerate(pauses):
        assert CONFLICT_PAUSE_S * 2 ** attempt <= pause <= 2 * CONFLICT_PAUSE_S * 2 ** attempt


def test_a_conflict_every_time_says_so():
    pauses = []
    cycle, calls = conflicting(100)
    with pytest.raises(ApiError) as error:
        retry_on_conflict(cycle, sleep=pauses.append)
    assert len(calls) == CONFLICT_ATTEMPTS and len(pauses) == CONFLICT_ATTEMPTS - 1   # no pause after the last
    assert error.value.conflict
    assert str(error.value).startswith("cannot patch Node n: conflict (409): the object has been modified. It changed "
                                       "between our read and our write 5 times in a row")


def test_other_errors_are_not_retried():
    calls = []

    def cycle():
        calls.append(1)
        raise ApiError("forbidden (403)", status=403)

    with pytest.raises(ApiError, match="forbidden"):
        retry_on_conflict(cycle, sleep=lambda _s: pytest.fail("no pause for a 403"))
    assert len(calls) == 1
