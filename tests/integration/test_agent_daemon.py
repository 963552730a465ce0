"""The agent as operators run a daemon: settings from a file and the environment, /healthz, SIGHUP, systemd's
notifications and watchdog. A real agent process (the zipapp as the role installs it) against the real API server."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from harness.agent import AgentProcess
from harness.paths import SIMULATOR_DIR, scenario_path


def test_settings_come_from_flags_then_environment_then_file_and_are_logged(access, agent_command, node, tmp_path,
                                                                            monkeypatch):
    settings = tmp_path / "agent.yml"
    settings.write_text("default-interval: 700\nwatch-timeout: 30\nxid-actions: {79: none}\n")
    monkeypatch.setenv("SCV_GPU_AGENT_WATCH_TIMEOUT", "45")
    monkeypatch.setenv("SCV_GPU_AGENT_XID_HOLD", "12")
    agent = AgentProcess(agent_command, access, node, tmp_path, extra=("--config", str(settings)))
    try:
        agent.wait_for(lambda: agent.scv()["spec"]["updateInterval"] == 700, 20)   # the file's interval
        log = agent.log.read_text()
        line = next(line for line in log.splitlines() if "effective configuration:" in line)
        assert "default-interval=700 (file %s)" % settings in line
        assert "watch-timeout=60 (flag --watch-timeout)" in line          # the fixture's flag beats both
        assert "xid-hold=12.0 (environment SCV_GPU_AGENT_XID_HOLD)" in line
        assert 'xid-actions={"79": "none"} (file' in line and "log-level=\"INFO\" (default)" in line
    finally:
        agent.stop()


def test_healthz_answers_beside_metrics(access, agent_command, node, tmp_path):
    agent = AgentProcess(agent_command, access, node, tmp_path)
    try:
        agent.wait_for(lambda: agent.healthz()[1]["detail"].startswith("last tick "), 20)
        status, body = agent.healthz()
        assert status == 200 and body["status"] == "ok"
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen("http://127.0.0.1:%d/nothing" % agent.port, timeout=5)
        assert missing.value.code == 404
    finally:
        agent.stop()


def test_sighup_reads_the_file_again_applies_what_it_can_and_says_what_waits(access, agent_command, node, tmp_path):
    settings = tmp_path / "agent.yml"
    settings.write_text("log-level: INFO\n")
    agent = AgentProcess(agent_command, access, node, tmp_path, extra=("--config", str(settings)))
    try:
        agent.wait_for(lambda: agent.metrics()["scv_agent_ticks_total"] >= 1, 20)
        settings.write_text("log-level: DEBUG\nxid-hold: 5\nnode-condition: false\n")
        agent.process.send_signal(signal.SIGHUP)
        agent.wait_for(lambda: agent.metrics()["scv_agent_reloads_total"] == 1, 5)
        log = agent.log.read_text()
        assert "SIGHUP: configuration read again (changed: node-condition, xid-hold, log-level)" in log
        assert "SIGHUP: node-condition take effect at the next start" in log
        settings.write_text("log-level: nonsense\n")
        agent.process.send_signal(signal.SIGHUP)
        agent.wait_for(lambda: "SIGHUP: keeping the configuration in use: log-level from the file" in
                       agent.log.read_text(), 5)
        assert agent.process.poll() is None and agent.metrics()["scv_agent_reloads_total"] == 1
        settings.write_bytes(b"log-level: D\xc9BUG\n")                   # Latin-1, not UTF-8
        agent.process.send_signal(signal.SIGHUP)
        agent.wait_for(lambda: "SIGHUP: keeping the configuration in use: the configuration file %s is not UTF-8 "
                       "text" % settings in agent.log.read_text(), 5)
        assert agent.process.poll() is None and agent.metrics()["scv_agent_ticks_total"] >= 1
        assert "Traceback" not in agent.log.read_text()
    finally:
        agent.stop()


def test_systemd_hears_ready_watchdog_and_stopping(access, agent_command, node, tmp_path):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(path)
        systemd.settimeout(20)
        env = dict(os.environ, LD_LIBRARY_PATH=str(SIMULATOR_DIR), NVMLSIM_CONFIG=str(scenario_path("titan_xp")),
                   NOTIFY_SOCKET=path, WATCHDOG_USEC="1000000")
        env.pop("PYTHONPATH", None)
        process = subprocess.Popen(agent_command + ["--kubeconfig", str(access.node_kubeconfig(node)),
                                                    "--node-name", node], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            messages = [systemd.recv(4096).decode()]
            assert messages[0].startswith("READY=1\nSTATUS=publishing Scv %s" % node) or \
                messages[0] == "WATCHDOG=1", messages
            started = time.monotonic()
            while time.monotonic() - started < 2.5:
                messages.append(systemd.recv(4096).decode())
            assert any(message.startswith("READY=1") for message in messages)
            # WatchdogSec=1: the agent must speak at least every half second while it idles
            assert messages.count("WATCHDOG=1") >= 4, messages
        finally:
            process.terminate()
        assert process.wait(timeout=15) == 0
        tail = []
        try:
            while True:
                tail.append(systemd.recv(4096).decode())
        except OSError:
            pass
        assert "STOPPING=1" in tail


def test_a_bad_flag_is_refused_before_anything_starts(agent_command):
    done = subprocess.run(agent_command + ["--log-level", "verbose", "--metrics-address", "0.0.0.0"],
                          capture_output=True, text=True, check=False, timeout=30)
    assert done.returncode == 2
    assert "log-level from the flag --log-level: 'verbose' cannot be used: expected one of DEBUG" in done.stderr
    assert "metrics-address from the flag --metrics-address: '0.0.0.0' cannot be used: expected host:port" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unreadable_file_or_a_misspelt_variable_is_refused_at_start(agent_command, tmp_path):
    settings = tmp_path / "agent.yml"
    settings.write_bytes(b"log-level: D\xc9BUG\n")
    environ = dict(os.environ, SCV_GPU_AGENT_WATCH_TIMOUT="30")
    done = subprocess.run(agent_command + ["--config", str(settings)], env=environ,
                          capture_output=True, text=True, check=False, timeout=30)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "the configuration file %s is not UTF-8 text (byte 12: invalid continuation byte)" % settings in done.stderr
    settings.write_text("log-level: DEBUG\n")
    done = subprocess.run(agent_command + ["--config", str(settings)], env=environ,
                          capture_output=True, text=True, check=False, timeout=30)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert ("the environment variable SCV_GPU_AGENT_WATCH_TIMOUT names no setting (did you mean "
            "SCV_GPU_AGENT_WATCH_TIMEOUT?)") in done.stderr


def test_sighup_reads_the_kubeconfig_again_and_says_so(access, agent_command, node, tmp_path):
    agent = AgentProcess(agent_command, access, node, tmp_path)
    try:
        agent.wait_for(lambda: agent.metrics()["scv_agent_ticks_total"] >= 1, 20)
        agent.process.send_signal(signal.SIGHUP)
        agent.wait_for(lambda: "SIGHUP: the kubeconfig %s read again (the same credentials)"
                       % access.node_kubeconfig(node) in agent.log.read_text(), 5)
        assert agent.metrics()["scv_agent_credential_reloads_total"] == 0   # nothing differed
    finally:
        agent.stop()


def test_a_kubeconfig_replaced_with_garbage_keeps_the_credentials_in_use(access, agent_command, node, tmp_path):
    """SIGHUP after the kubeconfig became garbage: the agent says why it cannot use it, keeps the
    credentials it has, goes on publishing, and takes the file again once it is fixed."""
    kubeconfig = tmp_path / "kubeconfig"
    shutil.copy(access.node_kubeconfig(node), kubeconfig)
    agent = AgentProcess(agent_command, access, node, tmp_path, kubeconfig=kubeconfig)
    good = kubeconfig.read_text()
    try:
        agent.wait_for(lambda: agent.metrics()["scv_agent_ticks_total"] >= 1, 20)
        kubeconfig.write_text("{{{ not yaml: [")
        agent.process.send_signal(signal.SIGHUP)
        agent.wait_for(lambda: "SIGHUP" in agent.log.read_text() and str(kubeconfig) in agent.log.read_text()
                       and "not YAML" in agent.log.read_text(), 5)
        ticks = agent.metrics()["scv_agent_ticks_total"]
        agent.set_free_memory(2 ** 30)
        agent.wait_for(lambda: agent.scv()["status"]["freeMemorySum"] == 1024, 5)   # still publishing
        assert agent.metrics()["scv_agent_ticks_total"] > ticks and agent.process.poll() is None
        kubeconfig.write_text(good)
        agent.process.send_signal(signal.SIGHUP)
        agent.wait_for(lambda: "SIGHUP: the kubeconfig %s read again (the same credentials)" % kubeconfig
                       in agent.log.read_text(), 5)
    finally:
        agent.stop()


def _threads(pid):
    return len(os.listdir("/proc/%d/task" % pid))


def test_idle_connections_hold_no_thread_and_never_keep_a_scrape_waiting(access, agent_command, node, tmp_path):
    agent = AgentProcess(agent_command, access, node, tmp_path)
    sockets = []
    try:
        # every thread of a settled agent (its loop, XID waiter, watch and HTTP server) is running
        agent.wait_for(lambda: agent.metrics()["scv_agent_ticks_total"] >= 3, 20)
        time.sleep(1)
        before = _threads(agent.process.pid)
        for _connection in range(100):                  # half-open: connected, never a request
            sockets.append(socket.create_connection(("127.0.0.1", agent.port), timeout=5))
        time.sleep(1)
        assert _threads(agent.process.pid) == before    # they wait without a thread each
        started = time.monotonic()
        assert agent.metrics()["scv_agent_ticks_total"] >= 3 and agent.healthz()[0] == 200
        assert time.monotonic() - started < 3           # a scrape is served at once beside them
        for held in sockets:
            held.close()
        sockets = []
        assert agent.process.poll() is None
    finally:
        for held in sockets:
            held.close()
        agent.stop()


@pytest.mark.parametrize("form", ["[::1]:%d", ":%d"], ids=["ipv6", "port-only"])
def test_the_metrics_address_takes_ipv6_and_port_only_forms(access, agent_command, node, tmp_path, form):
    from harness.common import free_port

    port = free_port()
    agent = AgentProcess(agent_command, access, node, tmp_path, extra=("--metrics-address", form % port))
    url = "http://%s:%d/healthz" % ("[::1]" if form.startswith("[") else "127.0.0.1", port)

    def answers():
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200

    try:
        agent.wait_for(answers, 20)
    finally:
        agent.stop()


def test_a_metrics_port_in_use_ends_the_agent_at_once_naming_it_and_publishing_nothing(
        access, agent_command, node, tmp_path):
    access.kubectl("delete", "scv", node, "--ignore-not-found")
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        agent = AgentProcess(agent_command, access, node, tmp_path, extra=("--metrics-address", "127.0.0.1:%d" % port))
        assert agent.process.wait(timeout=30) == 2
    finally:
        taken.close()
    log = agent.log.read_text()
    assert "cannot serve metrics on 127.0.0.1:%d: Address already in use" % port in log, log
    assert "Traceback" not in log
    assert agent.scv() is None                   # it stopped before its first tick: nothing published


def test_sigterm_ends_a_publishing_agent_within_5_s(access, agent_command, node, tmp_path):
    agent = AgentProcess(agent_command, access, node, tmp_path, scenario="h100_sxm_x8")
    try:
        agent.wait_for(lambda: agent.scv() is not None, 20)
        started = time.monotonic()
        agent.process.send_signal(signal.SIGTERM)
        assert agent.process.wait(timeout=15) == 0
        assert time.monotonic() - started < 5.0
        assert "stopped" in agent.log.read_text()
    finally:
        agent.stop()


def test_a_storm_of_sighups_never_hangs_the_agent(access, agent_command, node, tmp_path):
    """Signal handlers run in the main thread between two of its bytecodes: one that took a lock the main
    thread held (a threading.Event's, in the loop's wait or clear) hung the agent for good, after which
    SIGTERM could not stop it. 400 SIGHUPs at random moments of the loop, then SIGTERM."""
    import random

    agent = AgentProcess(agent_command, access, node, tmp_path, scenario="h100_sxm_x8")
    agent.wait_for(lambda: agent.scv() is not None, 20)
    for _signal in range(400):
        agent.process.send_signal(signal.SIGHUP)
        time.sleep(random.uniform(0.0, 0.01))
    agent.wait_for(lambda: agent.log.read_text().count("SIGHUP: configuration read again") >= 1, 10)
    started = time.monotonic()
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(timeout=15) == 0
    assert time.monotonic() - started < 5.0
    assert "Traceback" not in agent.log.read_text()
