"""The gpu_alerts role against a real API server: a PrometheusRule where the Prometheus Operator's CRD (the one
its release publishes) is installed, the rules file for a plain Prometheus where it is not; check mode, diff and
idempotence. The CRD's own schema, enforced by the API server, accepts the rules and refuses a broken object."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from harness.alert_recording import render_rules
from harness.ansible import recap
from harness.common import wait_until
from harness.paths import ROOT

CRD = "prometheusrules.monitoring.coreos.com"


def operator_crd():
    done = subprocess.run([str(ROOT / "tools" / "prometheus-operator" / "crds")], capture_output=True, text=True,
                          check=False, timeout=600)
    assert done.returncode == 0, done.stderr
    return "%s/monitoring.coreos.com_prometheusrules.yaml" % done.stdout.strip()


def serves_prometheus_rules(plane):
    done = plane.kubectl("api-resources", "--api-group=monitoring.coreos.com", "-o", "name", check=False)
    return done.returncode == 0 and CRD in done.stdout.split()


def run_role(ansible, plane, tmp_path, *extra, **variables):
    playbook = tmp_path / "alerts.yml"
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "roles": [
        {"role": "scv.gpu.gpu_alerts", "vars": dict(gpu_alerts_kubeconfig=str(plane.admin_kubeconfig), **variables)}]}]))
    done = ansible.playbook(str(playbook), None, *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    return recap(done.stdout), done.stdout


@pytest.fixture
def without_operator(control_plane):
    control_plane.kubectl("delete", "crd", CRD, "--ignore-not-found", "--wait=true")
    wait_until(lambda: not serves_prometheus_rules(control_plane), 30, "the API server to stop serving %s" % CRD)
    return control_plane


@pytest.fixture
def with_operator(control_plane):
    control_plane.kubectl("apply", "--server-side", "-f", operator_crd())
    control_plane.kubectl("wait", "--for=condition=Established", "crd/%s" % CRD, "--timeout=60s")
    wait_until(lambda: serves_prometheus_rules(control_plane), 30, "the API server to serve %s" % CRD)
    if control_plane.kubectl("get", "namespace", "monitoring", check=False).returncode != 0:
        control_plane.kubectl("create", "namespace", "monitoring")
    control_plane.kubectl("delete", "prometheusrule", "-n", "monitoring", "scv-gpu-alerts", "--ignore-not-found")
    return control_plane


def test_without_the_operator_the_role_writes_the_rules_file(ansible, without_operator, tmp_path):
    path = tmp_path / "rules" / "scv-gpu-alerts.yml"
    path.parent.mkdir()
    counts, _out = run_role(ansible, without_operator, tmp_path, "--check", gpu_alerts_rules_file=str(path))
    assert counts["changed"] == 1 and not path.exists()            # check mode writes nothing
    counts, _out = run_role(ansible, without_operator, tmp_path, gpu_alerts_rules_file=str(path))
    assert counts["changed"] == 1 and "alert: GpuLost" in path.read_text()
    (tmp_path / "direct").mkdir()
    assert path.read_text() == render_rules(ansible, tmp_path / "direct").read_text()   # auto chose the file
    counts, _out = run_role(ansible, without_operator, tmp_path, "--check", "--diff", gpu_alerts_rules_file=str(path))
    assert counts["changed"] == 0
    counts, _out = run_role(ansible, without_operator, tmp_path, gpu_alerts_rules_file=str(path))
    assert counts["changed"] == 0


@pytest.mark.every_ansible_line
def test_with_the_operator_the_role_applies_a_prometheus_rule(ansible, with_operator, tmp_path):
    plane = with_operator
    path = tmp_path / "not-written.yml"
    counts, _out = run_role(ansible, plane, tmp_path, "--check", gpu_alerts_rules_file=str(path),
                            gpu_alerts_labels={"release": "kube-prometheus-stack"})
    assert counts["changed"] == 1
    assert plane.kubectl("get", "prometheusrule", "-n", "monitoring", "scv-gpu-alerts", check=False).returncode != 0
    counts, _out = run_role(ansible, plane, tmp_path, gpu_alerts_rules_file=str(path),
                            gpu_alerts_labels={"release": "kube-prometheus-stack"})
    assert counts["changed"] == 1 and not path.exists()
    applied = json.loads(plane.kubectl("get", "prometheusrule", "-n", "monitoring", "scv-gpu-alerts", "-o",
                                       "json").stdout)
    assert applied["metadata"]["labels"] == {"release": "kube-prometheus-stack",
                                             "app.kubernetes.io/managed-by": "scv.gpu"}
    (tmp_path / "file").mkdir()
    rendered = yaml.safe_load(render_rules(ansible, tmp_path / "file").read_text())
    assert applied["spec"] == rendered        # the object holds the rules file's groups, templates untouched
    assert "{{ $labels.gpu }}" in applied["spec"]["groups"][0]["rules"][0]["annotations"]["summary"]
    counts, _out = run_role(ansible, plane, tmp_path, "--check", "--diff", gpu_alerts_rules_file=str(path),
                            gpu_alerts_labels={"release": "kube-prometheus-stack"})
    assert counts["changed"] == 0
    counts, _out = run_role(ansible, plane, tmp_path, gpu_alerts_rules_file=str(path),
                            gpu_alerts_labels={"release": "kube-prometheus-stack"})
    assert counts["changed"] == 0
    # a tuned duration reaches the object
    counts, _out = run_role(ansible, plane, tmp_path, gpu_alerts_throttling_for="15m",
                            gpu_alerts_labels={"release": "kube-prometheus-stack"})
    assert counts["changed"] == 1
    rules = json.loads(plane.kubectl("get", "prometheusrule", "-n", "monitoring", "scv-gpu-alerts", "-o",
                                     "json").stdout)["spec"]["groups"][0]["rules"]
    assert {rule["alert"]: rule.get("for") for rule in rules}["GpuThermalThrottling"] == "15m"


def test_the_operators_schema_refuses_a_broken_prometheus_rule(with_operator):
    broken = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
              "metadata": {"name": "broken-gpu-alerts", "namespace": "monitoring"},
              "spec": {"groups": [{"name": "scv-gpu", "rules": [
                  {"alert": "GpuLost", "expr": "scv_gpu_lost > 0", "for": "5 minutes"}]}]}}
    done = with_operator.kubectl("create", "-f", "-", input_text=json.dumps(broken), check=False)
    assert done.returncode != 0
    assert "spec.groups[0].rules[0].for" in done.stderr and "should match" in done.stderr, done.stderr
    no_name = json.loads(json.dumps(broken))
    del no_name["spec"]["groups"][0]["name"]
    no_name["spec"]["groups"][0]["rules"][0]["for"] = "5m"
    done = with_operator.kubectl("create", "-f", "-", input_text=json.dumps(no_name), check=False)
    assert done.returncode != 0 and "spec.groups[0].name: Required value" in done.stderr, done.stderr
