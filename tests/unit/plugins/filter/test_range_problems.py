"""The roles' range check: one message per bad value, none for good ones."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.scv.gpu.plugins.filter.range_problems import scv_gpu_range_problems as range_problems


def limit(value, **extra):
    return dict({"name": "x_timeout", "value": value, "low": 1, "high": 3600, "unit": "seconds"}, **extra)


@pytest.mark.parametrize("value", [1, 3600, "60", 2.5, " 10 "])
def test_values_within_the_limits_pass(value):
    assert range_problems([limit(value)]) == []


@pytest.mark.parametrize("value, message", [
    (0, "x_timeout: 0 is out of range; expected a number from 1 to 3600 (seconds)"),
    (-5, "x_timeout: -5 is out of range; expected a number from 1 to 3600 (seconds)"),
    ("3601", "x_timeout: 3601 is out of range; expected a number from 1 to 3600 (seconds)"),
    ("soon", "x_timeout: 'soon' is not a number; expected one from 1 to 3600 (seconds)"),
    (True, "x_timeout: True is not a number; expected one from 1 to 3600 (seconds)"),
    (float("nan"), "x_timeout: nan is not a number; expected one from 1 to 3600 (seconds)"),
    ("inf", "x_timeout: 'inf' is not a number; expected one from 1 to 3600 (seconds)"),
    (None, "x_timeout: None is not a number; expected one from 1 to 3600 (seconds)"),
])
def test_values_outside_or_not_numbers_are_named(value, message):
    assert range_problems([limit(value)]) == [message]


def test_whole_numbers_and_several_problems_at_once():
    assert range_problems([limit(2.5, whole=True), limit(10, name="y"), limit(0, name="z")]) == [
        "x_timeout: 2.5 is not a whole number; expected one from 1 to 3600 (seconds)",
        "z: 0 is out of range; expected a number from 1 to 3600 (seconds)"]


@pytest.mark.parametrize("limits", ["x", [{"name": "x"}], [None]])
def test_a_malformed_list_is_a_filter_error(limits):
    with pytest.raises(AnsibleFilterError, match="range_problems"):
        range_problems(limits)
