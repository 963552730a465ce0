"""A fleet of Scv agents against one control plane, and every request the API server saw from them.

Each agent runs as the scv_agent role installs it (``harness.agent.install_agent``), with its own
node name, Node, node identity (``system:node:<name>``), simulated GPUs and scenario file. The
control plane writes an audit log of every request made by group ``system:nodes``, so what each
node asked, and when, is read from the API server's side (``AuditLog``).

Used by ``benchmarks/fleet.py`` and ``tests/integration/test_agent_fleet_writes.py``.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import pathlib
import shutil
import subprocess
import time
import urllib.request

from harness.common import wait_until
from harness.control_plane import CertificateAuthority, ControlPlane, install_scv_crd
from harness.paths import ROOT, SIMULATOR_DIR, scenario_path

# Metadata of every request by a node identity (``everyone``: by anyone but the API server itself).
NODES_ONLY = [{"level": "Metadata", "userGroups": ["system:nodes"]}, {"level": "None"}]
EVERYONE = [{"level": "None", "users": ["system:apiserver"]}, {"level": "Metadata"}]
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
# ``node``: the node of a system:node:<node> identity (else the user name); ``name``: the object's.
Request = collections.namedtuple("Request", "at node verb what name code user")


def audited_plane(directory, everyone=False):
    """A started ControlPlane whose kube-apiserver audits the nodes' requests (or everyone's) into
    ``directory``/audit.log."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    policy = directory / "audit-policy.json"
    policy.write_text(json.dumps({"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                                  "omitStages": ["RequestReceived"], "rules": EVERYONE if everyone else NODES_ONLY}))
    log = directory / "audit.log"
    plane = ControlPlane(directory / "plane", apiserver_args=[
        "--audit-policy-file", str(policy), "--audit-log-path", str(log), "--audit-log-format", "json",
        "--audit-log-maxbackup", "0", "--audit-log-maxsize", "0"]).start()
    plane.audit_log = AuditLog(log)
    return plane


def _timestamp(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class AuditLog:
    """The requests kube-apiserver audited: one ``Request`` per request (a watch counts once, when it began)."""

    def __init__(self, path):
        self.path = pathlib.Path(path)

    def requests(self, since=None, until=None, users=None):
        """Requests received from ``since`` to ``until`` (wall-clock seconds, ``time.time()``), in order;
        only those of ``users`` (user names) when given."""
        seen, found = set(), []
        if not self.path.exists():
            return found
        with open(self.path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue        # a line being written
                if record.get("auditID") in seen:
                    continue        # a watch's second stage (ResponseComplete after ResponseStarted)
                seen.add(record.get("auditID"))
                at = _timestamp(record["requestReceivedTimestamp"])
                if (since is not None and at < since) or (until is not None and at >= until):
                    continue
                user = record.get("user", {}).get("username", "")
                if users is not None and user not in users:
                    continue
                ref = record.get("objectRef") or {}
                what = ref.get("resource", "(no resource)") + ("/" + ref["subresource"] if ref.get("subresource") else "")
                found.append(Request(at, user.rsplit(":", 1)[-1], record.get("verb"), what, ref.get("name"),
                                     (record.get("responseStatus") or {}).get("code"), user))
        return sorted(found)


def per_node(requests, nodes):
    """{node: [requests]} with every node of ``nodes`` present."""
    table = {node: [] for node in nodes}
    for request in requests:
        if request.node in table:
            table[request.node].append(request)
    return table


def by_kind(requests):
    """{"verb resource[/subresource]": count}."""
    return dict(collections.Counter("%s %s" % (request.verb, request.what) for request in requests))


def writes(requests):
    return [request for request in requests if request.verb in WRITE_VERBS]


def lost_first_card(scenario, lost):
    """Makes the scenario's first GPU answer GPU_IS_LOST to every call (``lost``), or answer again."""
    data = json.loads(scenario.read_text())
    device = data["devices"][0]
    if lost:
        device["errors"] = {"*": "GPU_IS_LOST"}
    else:
        device.pop("errors", None)
    staged = scenario.with_suffix(".new")
    staged.write_text(json.dumps(data))
    staged.rename(scenario)   # the simulator never reads half a file


def render_access(plane):
    """The scv_publish role's RBAC and admission policy, as the role renders them for node identities."""
    import jinja2

    template = ROOT / "roles" / "scv_publish" / "templates" / "access.yml.j2"
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined)
    environment.filters["to_json"] = json.dumps
    text = environment.from_string(template.read_text()).render(scv_publish_grant_nodes=True,
                                                                scv_publish_agent_subjects=[])
    plane.kubectl("apply", "-f", "-", input_text=text)


class Fleet:
    """``size`` agents named ``<prefix>-<n>`` on ``plane``, each with 8 simulated H100s (``scenario``).

    ``command`` runs one agent (``harness.agent.install_agent``); ``model`` is the simulator's cost
    model (``none`` keeps a large fleet's own CPU down; the API traffic does not depend on it).
    """

    def __init__(self, plane, work, command, size, prefix="fleet", model="none", scenario="h100_sxm_x8",
                 options=()):
        self.plane, self.work, self.command = plane, pathlib.Path(work), list(command)
        self.nodes = ["%s-%d" % (prefix, index) for index in range(size)]
        self.model, self.scenario, self.options = model, scenario, list(options)
        self.processes = {}

    def scenario_of(self, node):
        return self.work / ("%s.json" % node)

    def prepare(self):
        """Registers every Node (as its kubelet would) and writes its identity and scenario."""
        self.work.mkdir(parents=True, exist_ok=True)
        items = [{"apiVersion": "v1", "kind": "Node",
                  "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}} for node in self.nodes]
        listed = {"apiVersion": "v1", "kind": "List", "items": items}
        self.plane.kubectl("create", "-f", "-", input_text=json.dumps(listed))
        for node in self.nodes:
            self.plane.node_kubeconfig(node)
            shutil.copy(scenario_path(self.scenario), self.scenario_of(node))

    def start(self):
        for node in self.nodes:
            env = dict(os.environ, LD_LIBRARY_PATH=str(SIMULATOR_DIR), NVMLSIM_CONFIG=str(self.scenario_of(node)),
                       NVMLSIM_LATENCY=self.model)
            log = open(self.work / ("%s.log" % node), "ab")  # pylint: disable=consider-using-with
            self.processes[node] = subprocess.Popen(
                self.command + ["--kubeconfig", str(self.plane.node_kubeconfig(node)), "--node-name", node,
                                "--log-level", "INFO"] + self.options,
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            log.close()

    def stop(self):
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = {}

    def exited(self):
        """Nodes whose agent ended, with the tail of its log."""
        return {node: (self.work / ("%s.log" % node)).read_text()[-2000:]
                for node, process in self.processes.items() if process.poll() is not None}

    def conditions(self):
        """{node: GPUHealthy status} as the Nodes have it (None: not set)."""
        listed = json.loads(self.plane.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        found = {}
        for item in listed:
            for condition in item.get("status", {}).get("conditions") or []:
                if condition.get("type") == "GPUHealthy":
                    found[item["metadata"]["name"]] = condition.get("status")
        return {node: found.get(node) for node in self.nodes}

    def published(self):
        listed = json.loads(self.plane.kubectl("get", "scvs", "-o", "json").stdout)["items"]
        return {item["metadata"]["name"] for item in listed if item.get("status")} & set(self.nodes)

    def wait(self, predicate, timeout, what, poll=0.5):
        """Seconds until ``predicate()`` holds; AssertionError after ``timeout``, or as soon as an agent ends."""
        return wait_until(predicate, timeout, what, step=poll,
                          gone=lambda: "agents ended: %s" % self.exited() if self.exited() else None)

    def wait_published(self, timeout=300):
        return self.wait(lambda: len(self.published()) == len(self.nodes) and
                         set(self.conditions().values()) == {"True"}, timeout, "every Scv and condition published")

    def lose_first_cards(self, lost):
        """Every node's first card lost at once (``lost``), or back; when it happened (``time.time()``)."""
        at = time.time()
        for node in self.nodes:
            lost_first_card(self.scenario_of(node), lost)
        return at

    def wait_condition(self, status, timeout=120):
        return self.wait(lambda: set(self.conditions().values()) == {status}, timeout,
                         "GPUHealthy %s on every node" % status)

    def rotate_certificates(self):
        """Every node's client certificate and key issued again, in place (as a kubelet's rotation does)."""
        authority = CertificateAuthority.load(self.plane.directory / "pki")
        at = time.time()
        for node in self.nodes:
            authority.issue("node-%s" % node, "system:node:%s" % node, "system:nodes")
        return at


def start_fleet(plane, work, command, size, **options):
    """A prepared, started Fleet whose every Scv and condition is published; the CRD and access applied."""
    install_scv_crd(plane)
    render_access(plane)
    fleet = Fleet(plane, work, command, size, **options)
    fleet.prepare()
    fleet.start()
    try:
        fleet.wait_published(timeout=max(120, size * 3))
    except BaseException:
        fleet.stop()
        raise
    return fleet


def process_sample(pid):
    """(RSS MiB, CPU seconds) of a process."""
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/%d/status" % pid, encoding="utf-8") as handle:
        rss_kib = next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))
    with open("/proc/%d/stat" % pid, encoding="utf-8") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return rss_kib / 1024.0, (int(fields[11]) + int(fields[12])) / tick


def etcd_bytes(plane):
    """etcd's database size in use, in bytes."""
    with urllib.request.urlopen(plane.state["etcd_metrics"], timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("etcd_mvcc_db_total_size_in_use_in_bytes "):
                return float(line.split()[1])
    raise RuntimeError("etcd reported no etcd_mvcc_db_total_size_in_use_in_bytes")
