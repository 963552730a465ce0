"""The watch's reconnect pauses: doubling, capped, spread over the upper half so a fleet does not reconnect in step."""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent.watch import MAX_BACKOFF_S, reconnect_pause


@pytest.mark.parametrize("failures, low, high", [(1, 1, 2), (2, 2, 4), (3, 4, 8), (4, 8, 16), (5, 15, 30),
                                                 (40, 15, 30)])
def test_the_pause_doubles_up_to_the_cap_within_its_upper_half(failures, low, high):
    assert reconnect_pause(failures, rand=lambda: 0.0) == low
    assert reconnect_pause(failures, rand=lambda: 1.0) == high
    assert high <= MAX_BACKOFF_S


def test_pauses_of_a_fleet_are_spread():
    pauses = sorted(reconnect_pause(5) for _agent in range(1000))
    assert pauses[0] >= 15 and pauses[-1] <= 30
    assert pauses[-1] - pauses[0] > 10          # a thousand agents that failed together come back over > 10 s
