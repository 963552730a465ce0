"""A real Prometheus (built from its Go module by tools/prometheus/build) scraping targets every second.

``build()`` gives the binary; ``Prometheus`` runs it on a free port with one job per scrape config and
asks its HTTP API (queries, targets).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import urllib.parse
import urllib.request

from harness.common import free_port, wait_until
from harness.paths import ROOT
from harness.tls_certs import bcrypt_hash


def build():
    """The prometheus binary, built once into the cache (tools/prometheus/build)."""
    done = subprocess.run([str(ROOT / "tools" / "prometheus" / "build")], capture_output=True, text=True, check=False,
                          timeout=1800)
    assert done.returncode == 0, "tools/prometheus/build failed:\n%s" % done.stderr[-3000:]
    return pathlib.Path(done.stdout.strip()) / "prometheus"


class Prometheus:
    """Scrapes ``target`` as the job gpu-metrics, or runs the ``jobs`` given (Prometheus scrape configs)."""

    def __init__(self, binary, work, target=None, jobs=None, rule_files=()):
        self.port = free_port()
        config = work / "prometheus.yml"
        jobs = jobs or [{"job_name": "gpu-metrics", "static_configs": [{"targets": [target]}]}]
        config.write_text(json.dumps({   # YAML is a superset of JSON
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": jobs,
            "rule_files": [str(path) for path in rule_files],
        }))
        self.log = work / "prometheus.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [str(binary), "--config.file", str(config), "--storage.tsdb.path", str(work / "tsdb"),
                 "--web.listen-address", "127.0.0.1:%d" % self.port], stdout=log, stderr=subprocess.STDOUT)

    def api(self, path, **params):
        url = "http://127.0.0.1:%d/api/v1/%s?%s" % (self.port, path, urllib.parse.urlencode(params, doseq=True))
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.loads(response.read())
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expression):
        return self.api("query", query=expression)["result"]

    def alerts(self):
        """[(alert name, state, labels)] of the alerts the rules raised."""
        return [(alert["labels"]["alertname"], alert["state"], alert["labels"]) for alert in self.api("alerts")["alerts"]]

    def targets(self):
        """{job: (health, lastError)} of the active targets."""
        return {target["labels"]["job"]: (target["health"], target["lastError"])
                for target in self.api("targets", state="active")["activeTargets"]}

    def wait_for(self, predicate, timeout):
        wait_until(predicate, timeout, "prometheus's answer", step=0.2, ignore=(OSError, ValueError, KeyError, IndexError),
                   gone=lambda: None if self.process.poll() is None else "prometheus exited",
                   log=lambda: "prometheus log:\n" + self.log.read_text()[-3000:])

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)


REQUIRE_CERT = "RequireAndVerifyClientCert"


def write_web_config(path, pki, password, auth_type=REQUIRE_CERT):
    """An agent web configuration file at ``path`` (mode 0600): TLS with ``pki``'s server pair, client certificates
    of its CA as ``auth_type`` asks, and the user prometheus with ``password``."""
    path.write_text("tls_server_config:\n  cert_file: %s\n  key_file: %s\n  client_ca_file: %s\n"
                    "  client_auth_type: %s\nbasic_auth_users:\n  prometheus: '%s'\n"
                    % (pki.server[0].name, pki.server[1].name, pki.ca.name, auth_type, bcrypt_hash(password)))
    path.chmod(0o600)


def scrape_job(name, agent, pki, scheme="https", password="first", certificate=True):
    """A Prometheus scrape config for ``agent`` behind write_web_config: over ``scheme``, with ``password``, and
    with the client certificate of ``pki`` if ``certificate``."""
    tls = {"ca_file": str(pki.ca)}
    if certificate:
        tls.update(cert_file=str(pki.client[0]), key_file=str(pki.client[1]))
    config = {"job_name": name, "scheme": scheme, "static_configs": [{"targets": ["127.0.0.1:%d" % agent.port]}],
              "basic_auth": {"username": "prometheus", "password": password}}
    if scheme == "https":
        config["tls_config"] = tls
    return config
