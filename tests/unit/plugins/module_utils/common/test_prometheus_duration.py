from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.common.prometheus_duration import duration_problem


@pytest.mark.parametrize("text", ["0", "1ms", "30s", "5m", "1h30m", "1y2w3d4h5m6s7ms", "292y", "0s", "10m0s"])
def test_what_prometheus_takes(text):
    assert duration_problem(text) is None


@pytest.mark.parametrize("text, said", [
    ("5m1h", "units in the order y, w, d, h, m, s, ms, each at most once"),
    ("1m1m", "each at most once"),
    ("5m\n", "is not a Prometheus duration"),          # Go's regexp $ ends at the text's end; Python's does not
    ("5 m", "is not a Prometheus duration"),
    ("1.5h", "is not a Prometheus duration"),
    ("-5m", "is not a Prometheus duration"),
    ("", "is not a Prometheus duration"),
    ("5", "is not a Prometheus duration"),
    ("300000y", "is out of Prometheus's duration range"),
    ("106752d", "is out of Prometheus's duration range"),   # 2**63 ns is 106751.99 days
])
def test_what_prometheus_refuses(text, said):
    assert said in duration_problem(text)


def test_the_range_ends_where_a_signed_64_bit_count_of_nanoseconds_does():
    assert duration_problem("106751d23h47m16s854ms") is None
    assert "out of" in duration_problem("106751d23h47m16s855ms")


def test_not_text():
    assert "is not a Prometheus duration" in duration_problem(5)


@pytest.mark.parametrize("inside, outside", [("292y", "293y"), ("15250w", "15251w"),
                                             ("292y171d23h47m16s854ms", "292y171d23h47m16s855ms")])
def test_the_range_in_years_and_weeks_as_prometheus_counts_them(inside, outside):
    """A year is 365 days and a week 7, as model.ParseDuration counts them; the range ends between these."""
    assert duration_problem(inside) is None
    assert "out of" in duration_problem(outside)
