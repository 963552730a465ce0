"""/healthz's answer: healthy while ticks keep coming, failing once none came for a while."""

from __future__ import annotations

import json

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent.loop import Agent
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.kube.rest import ApiContact
from ansible_collections.scv.gpu.plugins.module_utils.kube.rest_client import RestClient
from ansible_collections.scv.gpu.plugins.module_utils.nvml.session import Session
from harness.agent_samples import QuietClient
from harness.common import free_port


def test_starting_then_ticking_then_stalled():
    agent = Agent(QuietClient(), "gpu-1", Session(), node_condition=False)
    assert agent.healthz(now=100.0) == (True, "starting")
    agent.last_tick_at = 100.0
    healthy, detail = agent.healthz(now=130.0)
    assert healthy and detail == "last tick 30.0 s ago; the API server answers"
    agent.failures = 4     # the API server is away: the agent is alive, backing off
    assert agent.healthz(now=150.0)[0]
    healthy, detail = agent.healthz(now=161.0)
    assert not healthy and detail == "no tick for 61 s (more than 60 s)"


def test_a_long_interval_stretches_the_grace():
    agent = Agent(QuietClient(), "gpu-1", Session(), default_interval_ms=40000, node_condition=False)
    agent.last_tick_at = 0.0
    assert agent.healthz(now=119.0)[0] and not agent.healthz(now=121.0)[0]


def test_an_api_server_that_stopped_answering_is_named_though_no_tick_wrote():
    """A tick writes only what changed, so the agent's own failure count stays 0 through an outage; every
    request's outcome, the watch's included, tells /healthz instead."""
    clock = [0.0]
    contact = ApiContact(clock=lambda: clock[0])
    agent = Agent(QuietClient(contact), "gpu-1", Session(), node_condition=False)
    agent.last_tick_at = 0.0
    assert agent.healthz(now=1.0) == (True, "last tick 1.0 s ago; the API server answers")
    clock[0] = 3.0
    contact.failed()                      # the watch's connection broke
    clock[0] = 15.0
    contact.failed()                      # and its next attempt
    assert agent.healthz(now=15.0) == (True, "last tick 15.0 s ago; the API server has not answered for 12 s "
                                             "(2 attempts failed)")
    contact.reached(503)                  # up, but cannot serve: still no answer
    assert "(3 attempts failed)" in agent.healthz(now=15.0)[1]
    contact.reached(404)                  # any real answer ends it
    assert agent.healthz(now=16.0)[1] == "last tick 16.0 s ago; the API server answers"


def test_every_request_and_watch_of_the_client_reports_to_its_contact(tmp_path):
    """A real client against a port nothing listens on: each failed request counts, the watch's too."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:%d" % free_port(),
                                               "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    client = RestClient.from_file(str(kubeconfig), timeout=1.0)
    for attempt in (lambda: client.get("gpu-1"), lambda: next(client.watch("gpu-1", None, 5))):
        with pytest.raises(ApiError):
            attempt()
    assert client.contact.failures == 2 and client.contact.describe().startswith(
        "the API server has not answered for 0 s (2 attempts failed)")
