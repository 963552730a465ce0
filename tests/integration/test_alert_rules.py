"""The gpu_alerts role's rules, checked by promtool and tested on what a real agent served.

For each fault a real agent (on 8 simulated H100s) is scraped before and after the fault is put into
the simulator; the scrapes become promtool's input series, and ``promtool test rules`` must see each
alert fire in its own scenario with its labels and annotations, and every other alert stay silent,
as all of them do on the healthy node.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from harness.agent import AgentProcess, change_scenario, node_for
from harness.alert_recording import JOB, Recording, expand, promtool_test, render_rules
from harness.common import free_port
from harness.prometheus import Prometheus

DCGM_BY = ("instance", "hostname", "gpu", "UUID")
SCV_BY = ("instance", "node", "gpu", "uuid")
AGENT_BY = ("instance", "job")
# alert: (the series its labels come from, the labels it keeps, severity)
ALERTS = {
    "GpuLost": ("scv_gpu_lost", SCV_BY, "critical"),
    "GpuCriticalXid": ("scv_gpu_critical_xid", SCV_BY, "critical"),
    "GpuUncorrectableEccErrors": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", DCGM_BY, "critical"),
    "GpuRowRemapPending": ("DCGM_FI_DEV_ROW_REMAP_PENDING", DCGM_BY, "warning"),
    "GpuRowRemapFailed": ("DCGM_FI_DEV_ROW_REMAP_FAILURE", DCGM_BY, "critical"),
    "GpuRecoveryActionRequested": ("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", DCGM_BY, "critical"),
    "GpuThermalThrottling": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", DCGM_BY, "warning"),
    "GpuPowerThrottling": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", DCGM_BY, "warning"),
    "GpuFabricNotReady": ("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", DCGM_BY, "critical"),
    "GpuFabricFailed": ("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", DCGM_BY, "critical"),
    "ScvAgentNotPublishing": ("scv_agent_scv_last_published_timestamp_seconds", AGENT_BY, "warning"),
    "ScvAgentApiFailing": ("scv_agent_api_consecutive_failures", AGENT_BY, "warning"),
    "ScvAgentDown": ("up", AGENT_BY, "warning"),
}


def _xid(device, xid):
    device["xids"] = [{"xid": xid, "afterMs": 0}]


def _ecc(scenario):
    scenario["devices"][2]["ecc"]["uncorrectedVolatile"] = 2
    _xid(scenario["devices"][2], 94)      # the driver reports an uncorrectable ECC error with an XID


def _row_remap(scenario):
    scenario["devices"][1]["remappedRows"]["pending"] = 1
    _xid(scenario["devices"][1], 63)
    scenario["devices"][6]["remappedRows"]["failed"] = 1
    _xid(scenario["devices"][6], 64)


def _recovery(scenario):
    scenario["devices"][4]["recoveryAction"] = 2
    _xid(scenario["devices"][4], 119)


def _throttling(scenario):
    scenario["devices"][4]["clocksEventReasons"] = 0x40    # hardware thermal slowdown
    scenario["devices"][7]["clocksEventReasons"] = 0x80    # hardware power brake


def _fabric(scenario):
    scenario["devices"][0]["fabric"]["state"] = 1                # not started
    scenario["devices"][2]["fabric"]["status"] = "UNKNOWN"       # completed with an error


# name: (change to the scenario, or an action on the agent; [(alert, GPU or None, value)]; scrapes after the fault).
# The value is the one {{ $value }} shows in the alert's annotations.
SCENARIOS = {
    "healthy": (None, [], 12),
    "lost_card": (lambda s: s["devices"][3].update(errors={"*": "GPU_IS_LOST"}), [("GpuLost", 3, 1)], 4),
    "xid_79": (lambda s: _xid(s["devices"][5], 79), [("GpuCriticalXid", 5, 79)], 4),
    "ecc": (_ecc, [("GpuUncorrectableEccErrors", 2, 2), ("GpuCriticalXid", 2, 94)], 4),
    "row_remap": (_row_remap, [("GpuRowRemapPending", 1, 1), ("GpuRowRemapFailed", 6, 1),
                               ("GpuCriticalXid", 1, 63), ("GpuCriticalXid", 6, 64)], 4),
    "recovery_action": (_recovery, [("GpuRecoveryActionRequested", 4, 2), ("GpuCriticalXid", 4, 119)], 4),
    "throttling": (_throttling, [("GpuThermalThrottling", 4, 2), ("GpuPowerThrottling", 7, 1)], 8),
    "fabric": (_fabric, [("GpuFabricNotReady", 0, 1), ("GpuFabricFailed", 2, 4)], 12),
    "api_failing": ("api", [("ScvAgentNotPublishing", None, 0), ("ScvAgentApiFailing", None, "recorded")], 14),
    "agent_stopped": ("stop", [("ScvAgentDown", None, 0)], 7),
}
# What the agent serves once the fault is in, before the recording goes on.
SEEN = {
    "lost_card": ("scv_gpu_lost", "3", 1), "xid_79": ("scv_gpu_critical_xid", "5", 79),
    "ecc": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "2", 2), "row_remap": ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "6", 1),
    "recovery_action": ("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", "4", 2),
    "throttling": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "7", 0x80),
    "fabric": ("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "0", 1),
}


@pytest.fixture(scope="module")
def promtool(prometheus_bin):
    return prometheus_bin.parent / "promtool"


@pytest.fixture(scope="module")
def rules(ansible, tmp_path_factory):
    return render_rules(ansible, tmp_path_factory.mktemp("rules"))


def check_rules(promtool, path):
    return subprocess.run([str(promtool), "check", "rules", str(path)], capture_output=True, text=True, check=False)


def test_promtool_accepts_the_rules_with_defaults_and_tuned_values(ansible, promtool, rules, tmp_path):
    done = check_rules(promtool, rules)
    assert done.returncode == 0 and "SUCCESS: 13 rules found" in done.stdout, done.stdout + done.stderr
    tuned = render_rules(ansible, tmp_path, gpu_alerts_throttling_for="90s", gpu_alerts_fabric_not_ready_for="1h",
                         gpu_alerts_selector='job="gpu", cluster="a"', gpu_alerts_agent_up_selector="",
                         gpu_alerts_not_publishing_after="30m", gpu_alerts_runbook_url="https://wiki.example/gpu")
    done = check_rules(promtool, tuned)
    assert done.returncode == 0 and "SUCCESS: 12 rules found" in done.stdout, done.stdout + done.stderr
    text = tuned.read_text()
    exprs = [rule["expr"] for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]
    assert "for: 90s" in text and "for: 1h" in text
    assert any('{job="gpu", cluster="a"}[30m]' in expr for expr in exprs), exprs
    assert "https://wiki.example/gpu#gpulost" in text and "ScvAgentDown" not in text


def minimal_rules(path, duration):
    """A rules file of one alert whose ``for`` is ``duration``, written as YAML serialises it."""
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"alert": "A", "expr": "up == 0", "for": duration}]}]}))
    return path


@pytest.mark.parametrize("duration", ["5 min", "5m1h", "1m1m", "300000y", "5m\n", "1.5h", ""])
def test_a_duration_promtool_refuses_is_refused_before_anything_is_written(ansible, promtool, tmp_path, duration):
    checked = check_rules(promtool, minimal_rules(tmp_path / "promtool.yml", duration))
    assert checked.returncode != 0, checked.stdout        # Prometheus itself refuses it
    playbook = tmp_path / "bad.yml"
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "roles": [
        {"role": "scv.gpu.gpu_alerts", "vars": {"gpu_alerts_target": "file", "gpu_alerts_throttling_for": duration,
                                                "gpu_alerts_rules_file": str(tmp_path / "r.yml")}}]}]))
    done = ansible.playbook(str(playbook), None)
    assert done.returncode != 0 and not (tmp_path / "r.yml").exists()
    assert "gpu_alerts_throttling_for: %r is " % duration in done.stdout and "nothing was changed" in done.stdout, \
        done.stdout


def run_file_role(ansible, tmp_path, **variables):
    playbook = tmp_path / "role.yml"
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "roles": [
        {"role": "scv.gpu.gpu_alerts", "vars": dict(gpu_alerts_target="file", **variables)}]}]))
    return ansible.playbook(str(playbook), None)


def test_a_rules_path_that_is_a_directory_is_refused_and_nothing_is_written_in_it(ansible, tmp_path):
    folder = tmp_path / "rules"
    folder.mkdir()
    done = run_file_role(ansible, tmp_path, gpu_alerts_rules_file=str(folder) + "/")
    assert done.returncode != 0 and list(folder.iterdir()) == [], done.stdout
    assert "gpu_alerts_rules_file %s/ is a directory on localhost: name the rules file itself, such as " \
           "%s/scv-gpu-alerts.yml" % (folder, folder) in done.stdout, done.stdout


@pytest.mark.parametrize("promtool_path", ["missing", "not-executable"])
def test_a_promtool_that_cannot_run_is_named_and_nothing_is_written(ansible, tmp_path, promtool_path):
    path = tmp_path / promtool_path
    if promtool_path == "not-executable":
        path.write_text("#!/bin/sh\nexit 0\n")
    done = run_file_role(ansible, tmp_path, gpu_alerts_rules_file=str(tmp_path / "r.yml"), gpu_alerts_promtool=str(path))
    assert done.returncode != 0 and not (tmp_path / "r.yml").exists(), done.stdout
    assert "gpu_alerts_promtool %s is not a program on localhost (missing, or not executable)" % path in done.stdout


@pytest.mark.parametrize("duration", ["0", "90s", "1h30m", "1y2w3d4h5m6s7ms", "292y"])
def test_a_duration_promtool_takes_is_taken(ansible, promtool, tmp_path, duration):
    assert check_rules(promtool, minimal_rules(tmp_path / "promtool.yml", duration)).returncode == 0
    rendered = render_rules(ansible, tmp_path, gpu_alerts_throttling_for=duration)
    assert check_rules(promtool, rendered).returncode == 0


@pytest.mark.parametrize("selector", ['job="a#b"', 'job="a: b"', 'job=~"a|b",\ncluster="c"', "job='x'"])
def test_selectors_promql_takes_render_rules_promtool_takes(ansible, promtool, tmp_path, selector):
    """Selectors holding what YAML reads specially (a comment's #, a mapping's ': ', a newline, quotes): the
    rules file serialises each expression, so promtool reads the selector as written."""
    rendered = render_rules(ansible, tmp_path, gpu_alerts_selector=selector)
    done = check_rules(promtool, rendered)
    assert done.returncode == 0 and "SUCCESS: 13 rules found" in done.stdout, done.stdout + done.stderr
    exprs = [rule["expr"] for group in yaml.safe_load(rendered.read_text())["groups"] for rule in group["rules"]]
    assert exprs[0] == "max by (instance, node, gpu, uuid) (scv_gpu_lost{%s}) > 0" % selector


def record(name, access, agent_command, tmp_path, request):
    fault, _expected, after = SCENARIOS[name]
    node = node_for(request)
    kubeconfig = tmp_path / "node.kubeconfig"
    kubeconfig.write_text(access.node_kubeconfig(node).read_text())
    agent = AgentProcess(agent_command, access, node, tmp_path, scenario="h100_sxm_x8", kubeconfig=kubeconfig,
                         watch_timeout=2, extra=("--default-interval", "100", "--counters-interval", "1"))
    recording = Recording(agent)
    try:
        agent.wait_for(lambda: "scv_agent_scv_last_published_timestamp_seconds" in agent.metrics_text(), 30)
        recording.scrape(4)
        if fault == "stop":
            agent.stop()
        elif fault == "api":
            config = json.loads(kubeconfig.read_text())
            config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:%d" % free_port()   # nobody listens
            kubeconfig.write_text(json.dumps(config))
            agent.wait_for(lambda: agent.metrics()["scv_agent_api_failures_total"] > 0, 30)
        elif fault is not None:
            change_scenario(agent, fault)
            if name in SEEN:
                metric, gpu, value = SEEN[name]
                agent.wait_for(lambda: [v for k, v in agent.metrics().items()
                                        if k.startswith(metric + "{") and 'gpu="%s"' % gpu in k] == [value], 30)
        recording.scrape(after)
    finally:
        agent.stop()
        access.kubectl("delete", "scv", node, "--ignore-not-found")
    return recording


def expected_alerts(recording, rules_file, expected):
    """promtool's alert_rule_test: every alert at the last scrape, with what ``expected`` says fires."""
    rules = {rule["alert"]: rule for group in yaml.safe_load(rules_file.read_text())["groups"] for rule in group["rules"]}
    assert set(rules) == set(ALERTS)
    tests = []
    for alert, (source, kept, severity) in ALERTS.items():
        firing = []
        for name, gpu, value in expected:
            if name != alert:
                continue
            if source == "up":
                labels = {"instance": recording.instance, "job": JOB}
            else:
                labels, served = recording.last(source, **({} if gpu is None else {"gpu": str(gpu)}))
                value = served if value == "recorded" else value   # what the agent counted, known only now
            labels = dict({key: labels[key] for key in kept}, severity=severity)
            firing.append({"exp_labels": labels, "exp_annotations": {
                key: expand(text, labels, value) for key, text in rules[alert]["annotations"].items()}})
        tests.append({"eval_time": recording.eval_time, "alertname": alert, "exp_alerts": firing})
    return tests


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_each_alert_fires_on_what_the_agent_served_and_only_there(
        scenario, access, agent_command, promtool, rules, tmp_path, request):
    recording = record(scenario, access, agent_command, tmp_path, request)
    test_file = tmp_path / "test.yml"
    test_file.write_text(yaml.safe_dump({
        "rule_files": [str(rules)], "evaluation_interval": "1m",
        "tests": [{"name": scenario, "interval": "1m", "input_series": recording.input_series(),
                   "alert_rule_test": expected_alerts(recording, rules, SCENARIOS[scenario][1])}]}))
    passed, output = promtool_test(promtool, test_file)
    assert passed, output[-6000:]


def test_the_recorded_input_is_the_agents_own(access, agent_command, tmp_path, request):
    """The input series are the agent's exposition as Prometheus's parser reads it, with the scrape's labels."""
    recording = record("healthy", access, agent_command, tmp_path, request)
    series = {entry["series"]: entry["values"].split() for entry in recording.input_series()}
    assert len(recording.steps) == 4 + 12 and all(step for step in recording.steps)
    temperature = [key for key in series if key.startswith("DCGM_FI_DEV_GPU_TEMP{")]
    assert len(temperature) == 8 and all('job="%s"' % JOB in key and 'hostname="' in key for key in temperature)
    assert series['up{instance="%s",job="%s"}' % (recording.instance, JOB)] == ["1"] * 16
    published = [float(value) for value in next(values for key, values in series.items()
                                                if key.startswith("scv_agent_scv_last_published"))]
    assert published == sorted(published) and len(set(published)) == len(published)   # a tick between scrapes


def test_a_real_prometheus_loads_the_rules_and_fires_on_a_live_agent(
        access, agent_command, prometheus_bin, rules, tmp_path, request):
    """The same rules file in a real Prometheus scraping the agent: GpuLost fires for the lost GPU, and only it."""
    node = node_for(request)
    agent = AgentProcess(agent_command, access, node, tmp_path, scenario="h100_sxm_x8",
                         extra=("--default-interval", "200"))
    prometheus = Prometheus(prometheus_bin, tmp_path, jobs=[{"job_name": JOB, "static_configs": [
        {"targets": ["127.0.0.1:%d" % agent.port]}]}], rule_files=[rules])
    try:
        prometheus.wait_for(lambda: prometheus.query('count(scv_gpu_lost{job="%s"})' % JOB)[0]["value"][1] == "8", 60)
        assert prometheus.api("rules")["groups"][0]["name"] == "scv-gpu"
        assert prometheus.alerts() == []
        change_scenario(agent, lambda scenario: scenario["devices"][3].update(errors={"*": "GPU_IS_LOST"}))
        prometheus.wait_for(lambda: [name for name, state, _labels in prometheus.alerts() if state == "firing"]
                            == ["GpuLost"], 60)
        (_name, _state, labels), = prometheus.alerts()
        assert (labels["node"], labels["gpu"], labels["severity"]) == (node, "3", "critical")
    finally:
        prometheus.stop()
        agent.stop()
        access.kubectl("delete", "scv", node, "--ignore-not-found")
