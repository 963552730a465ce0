"""/healthz's answer: healthy while ticks keep coming, failing once none came for a while."""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.agent.loop import Agent
from ansible_collections.scv.gpu.plugins.module_utils.nvml.session import Session


class NoClient:
    server = "https://127.0.0.1:1"
    requests = 0


def test_starting_then_ticking_then_stalled():
    agent = Agent(NoClient(), "gpu-1", Session(), node_condition=False)
    assert agent.healthz(now=100.0) == (True, "starting")
    agent.last_tick_at = 100.0
    healthy, detail = agent.healthz(now=130.0)
    assert healthy and detail == "last tick 30.0 s ago; 0 API failures in a row"
    agent.failures = 4     # the API server is away: the agent is alive, backing off
    assert agent.healthz(now=150.0)[0]
    healthy, detail = agent.healthz(now=161.0)
    assert not healthy and detail == "no tick for 61 s (more than 60 s)"


def test_a_long_interval_stretches_the_grace():
    agent = Agent(NoClient(), "gpu-1", Session(), default_interval_ms=40000, node_condition=False)
    agent.last_tick_at = 0.0
    assert agent.healthz(now=119.0)[0] and not agent.healthz(now=121.0)[0]
