"""GPU nodes that a real Prometheus finds by itself, through the Kubernetes API, as docs/examples tell it to.

``SdFleet`` makes Node objects, each with an InternalIP of its own on the loopback (127.0.0.2, ...), the GPU
label the examples keep or not, runs one agent per GPU node listening on its node's address, all on one port,
and gives Prometheus an identity that may list and watch Nodes. ``example_job`` turns an example scrape
configuration into the job Prometheus runs here: the same job, at the agents' port, through a kubeconfig.
"""

from __future__ import annotations

import json
import socket

import yaml

from harness.agent import AgentProcess
from harness.common import free_port
from harness.paths import ROOT

EXAMPLES = ROOT / "docs" / "examples"
GPU_LABEL = "nvidia.com/gpu.present"
EXAMPLE_PORT = "${1}:9400"   # the relabelling that sets the agent's port
PROMETHEUS_USER = "scv-test:prometheus-sd"


def shared_port(addresses):
    """A TCP port free on every one of ``addresses``."""
    for _attempt in range(100):
        port = free_port()
        sockets = []
        try:
            for address in addresses:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind((address, port))
            return port
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise AssertionError("no port free on all of %s" % ", ".join(addresses))


def example_job(name, port, kubeconfig, **replace):
    """The one job of docs/examples/``name``, at ``port`` instead of the examples' 9400, finding the Nodes through
    ``kubeconfig``; ``replace`` sets keys of the job (the TLS files of this test)."""
    text = (EXAMPLES / name).read_text()
    assert text.count(EXAMPLE_PORT) == 1, "%s: the agent's port should be written once" % name
    [job] = yaml.safe_load(text.replace(EXAMPLE_PORT, "${1}:%d" % port))["scrape_configs"]
    [sd_config] = job["kubernetes_sd_configs"]
    sd_config["kubeconfig_file"] = str(kubeconfig)
    job.update(replace)
    return job


class SdFleet:
    """Nodes named ``prefix``-<name>: ``gpu`` {name: address} carry the GPU label and run an agent (unless named in
    ``no_agent``), ``plain`` {name: address} do not carry it. Every Node is in zone ``zone``."""

    def __init__(self, plane, prefix, gpu, plain, zone="zone-a"):
        self.plane, self.zone = plane, zone
        self.gpu = {"%s-%s" % (prefix, name): address for name, address in gpu.items()}
        self.plain = {"%s-%s" % (prefix, name): address for name, address in plain.items()}
        self.port = shared_port(sorted(set(self.gpu.values()) | set(self.plain.values())))
        self.agents = {}

    def create_nodes(self):
        for name, address in list(self.gpu.items()) + list(self.plain.items()):
            labels = {"topology.kubernetes.io/zone": self.zone}
            if name in self.gpu:
                labels[GPU_LABEL] = "true"
            self.plane.kubectl("delete", "node", name, "--ignore-not-found")
            self.plane.kubectl("create", "-f", "-", input_text=json.dumps(
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}))
            # the addresses are status, which the kubelet writes: a create would drop them
            self.plane.kubectl("patch", "node", name, "--subresource", "status", "--type", "merge", "-p", json.dumps(
                {"status": {"addresses": [{"type": "InternalIP", "address": address},
                                          {"type": "Hostname", "address": name}]}}))

    def start_agents(self, command, directory, names, scenario="h100_sxm_x8", extra=()):
        for name in names:
            work = directory / name
            work.mkdir(parents=True, exist_ok=True)
            self.plane.kubectl("delete", "scv", name, "--ignore-not-found")
            # the later --metrics-address wins: the node's own address, the fleet's port
            self.agents[name] = AgentProcess(command, self.plane, name, work, scenario=scenario, extra=(
                "--metrics-address", "%s:%d" % (self.gpu[name], self.port)) + tuple(extra))

    def prometheus_kubeconfig(self):
        """A client certificate identity allowed only to get, list and watch Nodes, as Prometheus's discovery
        needs."""
        self.plane.kubectl("apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "scv-test-prometheus-sd"},
             "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "scv-test-prometheus-sd"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": "scv-test-prometheus-sd"},
             "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": PROMETHEUS_USER}]}]}))
        return self.plane.kubeconfig("prometheus-sd", PROMETHEUS_USER)

    def stop(self):
        for name, agent in self.agents.items():
            agent.stop()
            self.plane.kubectl("delete", "scv", name, "--ignore-not-found")
        for name in list(self.gpu) + list(self.plain):
            self.plane.kubectl("delete", "node", name, "--ignore-not-found")


def active_targets(prometheus, job):
    """{instance: (health, scrape URL, labels)} of ``job``'s active targets."""
    return {target["labels"]["instance"]: (target["health"], target["scrapeUrl"], target["labels"])
            for target in prometheus.api("targets", state="active")["activeTargets"]
            if target["scrapePool"] == job}


def dropped_nodes(prometheus):
    """The node names of the targets Prometheus's relabelling dropped."""
    return {target["discoveredLabels"].get("__meta_kubernetes_node_name")
            for target in prometheus.api("targets", state="dropped")["droppedTargets"]}


def dashboard_queries(dashboard):
    """(panel title, expression) of every query of a Grafana dashboard, rows' panels included, in order."""
    queries = []
    for panel in dashboard["panels"]:
        for inner in [panel] + panel.get("panels", []):
            queries += [(inner["title"], target["expr"]) for target in inner.get("targets", [])]
    return queries


def variable_queries(dashboard):
    """{name: (metric selector, label)} of the dashboard's label_values() variables."""
    found = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            text = variable["query"]["query"]
            assert text.startswith("label_values(") and text.endswith(")"), text
            selector, label = text[len("label_values("):-1].rsplit(",", 1)
            found[variable["name"]] = (selector.strip(), label.strip())
    return found
