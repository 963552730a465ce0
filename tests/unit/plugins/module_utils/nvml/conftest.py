"""Fixtures of the NVML reader's unit tests: a scenario a test may change, and a session on a clock of its own."""

from __future__ import annotations

import json

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.nvml.session import Session

from harness.common import Clock, replace_json
from harness.paths import scenario_path


@pytest.fixture
def scenario_file(tmp_path, nvml_simulator):
    """A copy of a shipped scenario that a test may change (``replace_json``); returns (path, data)."""
    def make(name):
        path = tmp_path / ("%s.json" % name)
        data = json.loads(scenario_path(name).read_text())
        replace_json(path, data)
        nvml_simulator.use(path)
        return path, data
    return make


@pytest.fixture
def session():
    """A Session whose clock the test moves (``session.clock_control.now``)."""
    clock = Clock()
    started = Session(clock=clock)
    started.clock_control = clock
    yield started
    started.close()
