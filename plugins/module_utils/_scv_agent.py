# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Scv agent: keeps one node's Scv current between playbook runs (private to the collection).

Every ``spec.updateInterval`` milliseconds it reads NVML through an ``_nvml.Session`` (the code
behind gpu_facts, with NVML kept initialised and each card's static readings read once) and
writes the status subresource only when SCV's compared data changed.
The last object written is kept in memory, so an unchanged tick costs no API request. A
watch on the node's own Scv (one request per ``watch_timeout``) brings spec changes and
deletions; a deleted Scv is created again at the next tick. API errors back off and retry;
GPU errors become Unhealthy cards; SIGTERM ends it cleanly.

The scv.gpu.scv_agent role installs it with ``scv-gpu-agent`` as the entry point.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import signal
import socket
import threading
import time

from ansible_collections.scv.gpu.plugins.module_utils._kube import RestScvClient, ScvApiError
from ansible_collections.scv.gpu.plugins.module_utils._node_condition import (
    condition_patch,
    current_condition,
    gpu_condition,
    transition_event,
)
from ansible_collections.scv.gpu.plugins.module_utils._nvml import Session
from ansible_collections.scv.gpu.plugins.module_utils._scv_publisher import publish
from ansible_collections.scv.gpu.plugins.module_utils._scv_status import desired_status, needs_update, now_rfc3339
from ansible_collections.scv.gpu.plugins.module_utils._xid import parse_actions

LOG = logging.getLogger("scv-gpu-agent")
DEFAULT_INTERVAL_MS = 1000
MIN_INTERVAL_MS = 100
MAX_BACKOFF_S = 30.0
CONDITION_HEARTBEAT_S = 300.0
TAINT_KEY = "scv.gpu/gpu-unhealthy"
COMPONENT = "scv-gpu-agent"


class Agent:
    """One node's publishing loop. ``client`` is a RestScvClient (or anything with its methods)."""

    def __init__(self, client, node, default_interval_ms=DEFAULT_INTERVAL_MS, watch_timeout=300, metrics=False,
                 session=None, node_condition=True, taint_client=None):
        self.client = client
        self.node = node
        self.default_interval_ms = default_interval_ms
        self.watch_timeout = watch_timeout
        self.metrics = metrics
        self.session = session if session is not None else Session()
        self.nvml_seconds = 0.0
        self.node_condition = node_condition
        self.condition = None          # (status, reason, message) as last written or read from the Node
        self.condition_since = None    # its lastTransitionTime
        self.condition_written_at = None
        self.node_missing_since = None   # when the Node was last found missing
        self.taint_client = taint_client  # an identity allowed to taint Nodes (a node's own is not)
        self.tainted = None               # whether our taint is on the Node, None until known
        self.scv = None               # the object as last written or watched
        self.recreate = False         # the watch saw it deleted
        self.facts = None
        self.failures = 0
        self.counters = {"ticks": 0, "writes": 0, "creates": 0, "errors": 0, "condition_writes": 0, "events": 0,
                         "xid_events": 0, "taint_changes": 0}
        self._xid_waiter = None
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self._watcher = None

    # ------------------------------------------------------------------ loop

    def interval_s(self):
        with self.lock:
            spec = (self.scv or {}).get("spec")
        interval = spec.get("updateInterval") if isinstance(spec, dict) else None
        if not isinstance(interval, int) or isinstance(interval, bool):
            interval = self.default_interval_ms
        return max(interval, MIN_INTERVAL_MS) / 1000.0

    def run(self):
        LOG.info("publishing Scv %s to %s", self.node, self.client.server)
        self._xid_waiter = threading.Thread(target=self._wait_for_xids, name="nvml-events", daemon=True)
        self._xid_waiter.start()
        while not self.stopping.is_set():
            self.wake.clear()
            delay = self.tick()
            self.wake.wait(delay)
        if self._xid_waiter is not None:
            self._xid_waiter.join(timeout=2)
        self.session.close()
        LOG.info("stopped")

    def stop(self, *_args):
        self.stopping.set()
        self.wake.set()

    def tick(self):
        """One round; returns the seconds until the next."""
        self.counters["ticks"] += 1
        inits = self.session.inits
        started = time.perf_counter()
        try:
            subsets = ["telemetry"] if self.metrics else []
            facts = self.session.read(subsets)
        except Exception as error:  # pylint: disable=broad-exception-caught
            # _nvml turns GPU errors into Unhealthy cards; anything else must not end the agent.
            LOG.error("reading NVML failed: %s", error)
            self.counters["errors"] += 1
            self.session.close()
            return self.interval_s()
        finally:
            self.nvml_seconds += time.perf_counter() - started
        if self.session.inits > inits > 0:
            LOG.warning("NVML initialised anew: %s", self.session.last_reinit_reason)
        self.facts = facts
        if self.node_condition:
            self._update_condition(facts)
        if self.taint_client is not None:
            self._update_taint(facts)
        try:
            self._publish(facts)
        except ScvApiError as error:
            self.counters["errors"] += 1
            if error.status in (404, 409):
                # Deleted or changed meanwhile (the object is read again): no outage, no backoff.
                LOG.info("%s; reading it again", error)
                return min(self.interval_s(), 0.1)
            self.failures += 1
            backoff = min(MAX_BACKOFF_S, self.interval_s() * 2 ** min(self.failures, 10))
            LOG.warning("%s; trying again in %.1f s", error, backoff)
            return backoff
        if self.failures:
            LOG.info("the API server answers again")
        self.failures = 0
        self._ensure_watch()
        return self.interval_s()

    def _publish(self, facts):
        with self.lock:
            current, recreate = self.scv, self.recreate
        if current is None or recreate:
            result = publish(self.client, self.node, facts, self.default_interval_ms)
            with self.lock:
                self.scv, self.recreate = result["scv"], False
            if result["created"]:
                self.counters["creates"] += 1
                LOG.info("created Scv %s", self.node)
            if result["status_updated"]:
                self.counters["writes"] += 1
            return
        desired = desired_status(facts)
        if not needs_update(current.get("status"), desired):
            return
        body = copy.deepcopy(current)
        body["status"] = dict(desired, updateTime=now_rfc3339())
        body.get("metadata", {}).pop("managedFields", None)
        try:
            written = self.client.replace_status(body)
        except ScvApiError as error:
            if error.status in (404, 409):
                # Deleted or changed meanwhile: read it again at the next tick.
                with self.lock:
                    self.scv = None
            raise
        with self.lock:
            self.scv = written
        self.counters["writes"] += 1
        LOG.info("wrote the status of Scv %s", self.node)

    def _wait_for_xids(self):
        """Blocks on NVML's events; an XID wakes the loop at once, so it reaches the Scv and the Node within a tick."""
        while not self.stopping.is_set():
            try:
                event = self.session.wait_event(1000)
            except Exception as error:  # pylint: disable=broad-exception-caught
                LOG.warning("waiting for NVML events failed: %s", error)
                self.stopping.wait(1)
                continue
            if event is not None:
                index, xid = event
                self.counters["xid_events"] += 1
                LOG.warning("XID %d on GPU %s", xid, index)
                self.wake.set()

    # ------------------------------------------------------- node condition

    def _update_condition(self, facts):
        """Sets GPUHealthy on the node's own Node when it changed (or every CONDITION_HEARTBEAT_S); an Event on
        each change of status or reason. API errors are logged and tried again at the next tick."""
        wanted = gpu_condition(facts)
        now_s = time.monotonic()
        try:
            if self.condition is None:
                if self.node_missing_since is not None and now_s - self.node_missing_since < CONDITION_HEARTBEAT_S:
                    return   # no Node yet: look again later, not at every tick
                node = self.client.get_node(self.node)
                if node is None:
                    if self.node_missing_since is None:
                        LOG.warning("there is no Node %s: the GPUHealthy condition is not set; looking again every "
                                    "%d s", self.node, CONDITION_HEARTBEAT_S)
                    self.node_missing_since = now_s
                    return
                self.node_missing_since = None
                existing = current_condition(node)
                if existing:
                    self.condition = (existing.get("status"), existing.get("reason"), existing.get("message"))
                    self.condition_since = existing.get("lastTransitionTime")
                else:
                    self.condition = (None, None, None)
            heartbeat_due = (self.condition_written_at is None
                             or now_s - self.condition_written_at >= CONDITION_HEARTBEAT_S)
            if wanted == self.condition and not heartbeat_due:
                return
            now = now_rfc3339()
            transition = wanted[:2] != self.condition[:2]
            since = now if wanted[0] != self.condition[0] or not self.condition_since else self.condition_since
            node = self.client.patch_node_status(self.node, condition_patch(*wanted, now=now, transition_time=since))
            self.counters["condition_writes"] += 1
            previous, self.condition, self.condition_since = self.condition, wanted, since
            self.condition_written_at = now_s
            if transition:
                LOG.info("Node %s: GPUHealthy is %s (%s): %s", self.node, *wanted)
                if previous[0] is not None or wanted[0] != "True":
                    self.client.create_event(transition_event(node, *wanted, now=now, component=COMPONENT))
                    self.counters["events"] += 1
        except ScvApiError as error:
            self.counters["errors"] += 1
            LOG.warning("%s", error)

    def _update_taint(self, facts):
        """Puts ``scv.gpu/gpu-unhealthy:NoSchedule`` on the Node while GPUHealthy is False, and takes it off after.

        NodeRestriction forbids a node's own identity to change its taints, so this runs with
        ``taint_client``, another identity. Other taints are kept; a conflicting write is tried
        again at the next tick.
        """
        wanted = gpu_condition(facts)[0] == "False"
        if wanted == self.tainted:
            return
        try:
            node = self.taint_client.get_node(self.node)
            if node is None:
                return
            taints = list((node.get("spec") or {}).get("taints") or [])
            ours = [taint for taint in taints if taint.get("key") == TAINT_KEY]
            others = [taint for taint in taints if taint.get("key") != TAINT_KEY]
            if bool(ours) != wanted:
                if wanted:
                    others.append({"key": TAINT_KEY, "effect": "NoSchedule"})
                self.taint_client.patch_node(self.node, {
                    "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                    "spec": {"taints": others or None}})
                self.counters["taint_changes"] += 1
                LOG.info("Node %s: %s the taint %s:NoSchedule", self.node, "set" if wanted else "removed", TAINT_KEY)
            self.tainted = wanted
        except ScvApiError as error:
            self.counters["errors"] += 1
            LOG.warning("%s", error)

    # ----------------------------------------------------------------- watch

    def _ensure_watch(self):
        if self._watcher is None or not self._watcher.is_alive():
            self._watcher = threading.Thread(target=self._watch_forever, name="scv-watch", daemon=True)
            self._watcher.start()

    def _watch_forever(self):
        failures = 0
        while not self.stopping.is_set():
            with self.lock:
                version = ((self.scv or {}).get("metadata") or {}).get("resourceVersion")
            if version is None:
                return  # the loop starts a new watch once it has an object again
            try:
                for kind, obj in self.client.watch(self.node, version, self.watch_timeout):
                    failures = 0
                    if self._on_event(kind, obj):
                        return
            except ScvApiError as error:
                if error.status == 410:
                    # Our resourceVersion is too old: forget the object, the next tick reads it.
                    with self.lock:
                        self.scv = None
                    return
                failures += 1
                LOG.warning("%s", error)
                self.stopping.wait(min(MAX_BACKOFF_S, 2 ** failures))

    def _on_event(self, kind, obj):
        """Applies one watch event; True when the watch should end."""
        if kind == "DELETED":
            LOG.warning("Scv %s was deleted; creating it again", self.node)
            with self.lock:
                self.recreate = True
                self.scv = None
            self.wake.set()
            return True
        if kind == "BOOKMARK":
            with self.lock:
                if self.scv is not None:
                    self.scv.setdefault("metadata", {})["resourceVersion"] = obj["metadata"]["resourceVersion"]
            return False
        if kind in ("ADDED", "MODIFIED"):
            with self.lock:
                before = _interval_of(self.scv)
                # The event of our own write can arrive after the write's response: keep the newer.
                if not _older(obj, self.scv):
                    self.scv = obj
            if _interval_of(obj) != before:
                LOG.info("spec.updateInterval is now %s ms", _interval_of(obj))
                self.wake.set()
            return False
        if kind == "ERROR":
            raise ScvApiError("watch error: %s" % obj.get("message"), status=obj.get("code"))
        return False

    # --------------------------------------------------------------- metrics

    def counter_values(self):
        """(name without _total, help, value) of the agent's own counters."""
        values = [("scv_agent_%s" % name, text, self.counters[name]) for name, text in (
            ("ticks", "NVML reads."), ("writes", "Status writes."), ("creates", "Scv creations."),
            ("errors", "Failed reads or API calls."),
            ("condition_writes", "Writes of the GPUHealthy Node condition."),
            ("events", "Events emitted on GPUHealthy transitions."),
            ("xid_events", "XID critical errors NVML reported."),
            ("taint_changes", "Times the unhealthy-GPU taint was set or removed."))]
        values += [
            ("scv_agent_api_requests", "API requests made.", self.client.requests),
            ("scv_agent_credential_reloads", "Times changed credentials were read from disk.",
             getattr(self.client, "reloads", 0)),
            ("scv_agent_nvml_inits", "Times NVML was initialised (once, then after errors that call for it).",
             self.session.inits),
            ("scv_agent_nvml_static_reads", "Times every card's static readings were read.",
             self.session.static_reads),
            ("scv_agent_nvml_seconds", "Seconds spent reading NVML.", self.nvml_seconds),
        ]
        return values

    def metrics_text(self):
        """Prometheus text: dcgm-exporter's series, the scv_gpu gauges and the agent's counters."""
        from ansible_collections.scv.gpu.plugins.module_utils._gpu_metrics import exposition

        return exposition(self).decode("utf-8")


def _interval_of(scv):
    """spec.updateInterval of an Scv, None when it has none (or a spec that is not an object)."""
    spec = (scv or {}).get("spec")
    return spec.get("updateInterval") if isinstance(spec, dict) else None


def _older(candidate, current):
    """Whether ``candidate`` is an older version of the object than ``current``.

    resourceVersions are etcd revisions in every API server there is; one that is not a
    number is never judged older.
    """
    try:
        return int(candidate["metadata"]["resourceVersion"]) < int(current["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return False


def serve_metrics(agent, address):
    """Serves /metrics on ``host:port`` in a daemon thread; returns the server."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the http.server API)
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = agent.metrics_text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):
            pass

    host, _sep, port = address.rpartition(":")
    server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def main(argv=None):
    parser = argparse.ArgumentParser(prog="scv-gpu-agent", description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--kubeconfig", default="/etc/kubernetes/kubelet.conf",
                        help="kubeconfig to authenticate with (default: the kubelet's, so the node writes as itself)")
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME") or socket.gethostname().lower(),
                        help="the Kubernetes node name (default: $NODE_NAME, else the host name)")
    parser.add_argument("--default-interval", type=int, default=DEFAULT_INTERVAL_MS,
                        help="spec.updateInterval (ms) for an Scv the agent creates")
    parser.add_argument("--watch-timeout", type=int, default=300, help="seconds per watch request")
    parser.add_argument("--request-timeout", type=float, default=10.0,
                        help="seconds to wait for the API server's answer before a request fails")
    parser.add_argument("--static-refresh", type=float, default=600.0,
                        help="seconds between reads of each card's static readings (identity, maximum clocks, "
                             "power limit, PCIe, ECC and MIG mode); NVML errors that call for it read them at once")
    parser.add_argument("--no-node-condition", dest="node_condition", action="store_false",
                        help="do not set the GPUHealthy condition on the node's Node, nor emit Events")
    parser.add_argument("--xid-action", action="append", default=[], metavar="XID=ACTION",
                        help="what an XID calls for: none (the card stays Healthy), reset or reboot (the card is "
                             "Unhealthy); overrides the built-in table; repeat for several")
    parser.add_argument("--xid-hold", type=float, default=600.0,
                        help="seconds an XID that calls for a reset or reboot keeps its card Unhealthy (0: until NVML "
                             "is initialised again)")
    parser.add_argument("--taint-kubeconfig", default="",
                        help="kubeconfig of an identity allowed to taint Nodes (a node's own is not): with it, the agent "
                             "puts %s:NoSchedule on its Node while GPUHealthy is False (off when empty)" % TAINT_KEY)
    parser.add_argument("--metrics-address", default="", help="host:port for Prometheus metrics (off when empty)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    try:
        xid_actions = parse_actions(args.xid_action)
    except ValueError as error:
        parser.error(str(error))
    try:
        client = RestScvClient.from_file(args.kubeconfig, timeout=args.request_timeout)
    except ScvApiError as error:
        LOG.error("%s", error)
        return 2
    taint_client = None
    if args.taint_kubeconfig:
        try:
            taint_client = RestScvClient.from_file(args.taint_kubeconfig, timeout=args.request_timeout)
        except ScvApiError as error:
            LOG.error("%s", error)
            return 2
    agent = Agent(client, args.node_name, args.default_interval, args.watch_timeout, metrics=bool(args.metrics_address),
                  session=Session(static_refresh_s=args.static_refresh, xid_actions=xid_actions,
                                  xid_hold_s=args.xid_hold),
                  node_condition=args.node_condition, taint_client=taint_client)
    signal.signal(signal.SIGTERM, agent.stop)
    signal.signal(signal.SIGINT, agent.stop)
    if args.metrics_address:
        serve_metrics(agent, args.metrics_address)
    agent.run()
    return 0
