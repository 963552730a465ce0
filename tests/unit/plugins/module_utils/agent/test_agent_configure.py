"""Agent.configure: the reloadable settings of a configuration reach each part of a running agent (at start and
at SIGHUP), through the part's own configure."""

from __future__ import annotations

import threading

from ansible_collections.scv.gpu.plugins.module_utils.agent import config
from ansible_collections.scv.gpu.plugins.module_utils.agent.loop import Agent
from ansible_collections.scv.gpu.plugins.module_utils.agent.pod_attribution import NoPods, PodAttribution
from ansible_collections.scv.gpu.plugins.module_utils.agent.shares import PodShares
from ansible_collections.scv.gpu.plugins.module_utils.nvml.session import Session

from harness.agent_samples import QuietClient


def load(*argv):
    return config.load(vars(config.parser("test").parse_args(["--node-name", "gpu-1"] + list(argv))), {})


def test_every_reloadable_setting_reaches_its_part(tmp_path, caplog):
    counters = tmp_path / "counters.csv"
    counters.write_text("DCGM_FI_DEV_GPU_TEMP, gauge, temperature\nDCGM_FI_NOT_A_SERIES, gauge, x\n")
    settings = load("--default-interval", "2500", "--watch-timeout", "45", "--static-refresh", "120",
                    "--counters-interval", "90", "--xid-action", "79=none", "--xid-hold", "30",
                    "--pod-resources-interval", "7", "--pod-utilization", "true", "--counters-file", str(counters))
    stopping = threading.Event()
    pods = PodAttribution("/nonexistent.sock", 1.0, stopping)
    agent = Agent(QuietClient(), "gpu-1", Session(), node_condition=False, pods=pods,
                  shares=PodShares(pods, str(tmp_path)), stopping=stopping)
    agent.configure(settings)
    assert agent.default_interval_ms == 2500 and agent.watch.timeout == 45
    assert agent.session.static_refresh_s == 120 and agent.session.slow.interval_s == 90
    # the counters file chose one series: only what it needs is read
    assert agent.dcgm_series == {"DCGM_FI_DEV_GPU_TEMP"} and agent.session.slow.wanted == {"temperature"}
    assert (agent.xid_policy.actions, agent.xid_policy.hold_s) == ({79: "none"}, 30)
    assert agent.pods.interval_s == 7 and agent.readings.shares.utilization is True
    assert agent.readings.pods is pods and agent.stopping is stopping   # one attribution, one stopping event
    assert "names series this agent does not serve (left out): DCGM_FI_NOT_A_SERIES" in caplog.text


def test_without_the_pod_resources_socket_the_agent_names_no_pod():
    agent = Agent(QuietClient(), "gpu-1", Session(), node_condition=False)
    agent.configure(load())
    assert isinstance(agent.pods, NoPods) and agent.readings.pods is agent.pods and agent.readings.shares is None
    assert agent.dcgm_series is None and agent.session.slow.wanted is None


def test_a_counters_file_naming_no_series_the_agent_serves_says_so_and_serves_none(tmp_path, caplog):
    counters = tmp_path / "counters.csv"
    counters.write_text("DCGM_FI_NOT_A_SERIES, gauge, x\n")
    agent = Agent(QuietClient(), "gpu-1", Session(), node_condition=False)
    agent.configure(load("--counters-file", str(counters)))
    assert agent.dcgm_series == frozenset() and "names no series this agent serves" in caplog.text
