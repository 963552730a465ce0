"""The Prometheus Operator's ScrapeConfig examples (docs/examples/scrapeconfig-scv-agents*.yml): a real
kube-apiserver, serving the operator's own CRD (tools/prometheus-operator/crds), takes each with strict field
validation, and each means what the plain Prometheus job beside it means (the job the discovery test runs)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from harness.common import wait_until
from harness.discovery import EXAMPLES
from harness.paths import ROOT

# (ScrapeConfig example, the Prometheus example of the same meaning)
PAIRS = (("scrapeconfig-scv-agents.yml", "prometheus-scv-agents.yml"),
         ("scrapeconfig-scv-agents-tls.yml", "prometheus-scv-agents-tls.yml"))


@pytest.fixture(scope="module")
def operator_crds(control_plane):
    """The control plane, serving the ScrapeConfig CRD of the Prometheus Operator, with a namespace monitoring."""
    done = subprocess.run([str(ROOT / "tools" / "prometheus-operator" / "crds")], capture_output=True, text=True,
                          check=False, timeout=600)
    assert done.returncode == 0, "tools/prometheus-operator/crds failed:\n%s" % done.stderr
    crd = "%s/monitoring.coreos.com_scrapeconfigs.yaml" % done.stdout.strip()
    # server-side: the CRD is larger than client-side apply's last-applied annotation may be
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", crd)
    # kubectl wait fails at once while the new CRD has no conditions yet
    wait_until(lambda: control_plane.kubectl("wait", "--for=condition=Established", "--timeout=10s",
                                             "crd/scrapeconfigs.monitoring.coreos.com", check=False).returncode == 0,
               60, "the ScrapeConfig CRD established", step=0.5)
    control_plane.kubectl("apply", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}}))
    return control_plane


def server_dry_run(plane, document):
    return plane.kubectl("create", "--dry-run=server", "--validate=strict", "-f", "-", check=False,
                         input_text=json.dumps(document))


@pytest.mark.parametrize("example", [pair[0] for pair in PAIRS])
def test_the_api_server_takes_each_scrape_config_example_under_the_operators_schema(operator_crds, example):
    document = yaml.safe_load((EXAMPLES / example).read_text())
    done = server_dry_run(operator_crds, document)
    assert done.returncode == 0, done.stderr
    # the schema bites: a misspelt field and a role the operator does not know are refused
    document["spec"]["relabelings"][0]["sourceLabel"] = document["spec"]["relabelings"][0].pop("sourceLabels")
    assert "unknown field" in server_dry_run(operator_crds, document).stderr
    document = yaml.safe_load((EXAMPLES / example).read_text())
    document["spec"]["kubernetesSDConfigs"][0]["role"] = "node"
    assert "Unsupported value" in server_dry_run(operator_crds, document).stderr


def snake(name):
    return re.sub(r"([A-Z])", lambda match: "_" + match.group(1).lower(), name)


@pytest.mark.parametrize("operator_example,plain_example", PAIRS)
def test_each_scrape_config_example_means_the_prometheus_job_beside_it(operator_example, plain_example):
    spec = yaml.safe_load((EXAMPLES / operator_example).read_text())["spec"]
    [job] = yaml.safe_load((EXAMPLES / plain_example).read_text())["scrape_configs"]
    assert spec["jobName"] == job["job_name"]
    assert [config["role"].lower() for config in spec["kubernetesSDConfigs"]] == [
        config["role"] for config in job["kubernetes_sd_configs"]]
    assert [{snake(key): value for key, value in rule.items()} for rule in spec["relabelings"]] == job["relabel_configs"]
    assert spec.get("scheme", "HTTP").lower() == job.get("scheme", "http")
    # the same credentials, from a Secret instead of files
    tls, files = spec.get("tlsConfig", {}), job.get("tls_config", {})
    assert ("ca" in tls, "cert" in tls, "keySecret" in tls) == ("ca_file" in files, "cert_file" in files,
                                                                "key_file" in files)
    assert sorted(spec.get("basicAuth", {})) == sorted(key.replace("_file", "") for key in job.get("basic_auth", {}))
