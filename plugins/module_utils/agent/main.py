# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""scv-gpu-agent: keeps this node's Scv, and its GPUHealthy condition, current between playbook runs.

The entry point of the zipapp that the scv.gpu.scv_agent role installs (private to the collection).
SIGTERM and SIGINT end it cleanly; SIGHUP (``systemctl reload``) reads its configuration again.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading

from ansible_collections.scv.gpu.plugins.module_utils.agent import config as configuration
from ansible_collections.scv.gpu.plugins.module_utils.agent.loop import Agent
from ansible_collections.scv.gpu.plugins.module_utils.agent.pod_metadata import PodMetadata
from ansible_collections.scv.gpu.plugins.module_utils.agent.pod_attribution import NoPods, PodAttribution
from ansible_collections.scv.gpu.plugins.module_utils.agent.shares import PodShares
from ansible_collections.scv.gpu.plugins.module_utils.agent.sdnotify import Notifier
from ansible_collections.scv.gpu.plugins.module_utils.agent.server import serve
from ansible_collections.scv.gpu.plugins.module_utils.agent import web_config
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.kube.rest_client import RestClient
from ansible_collections.scv.gpu.plugins.module_utils.kube.api_resource import FIELD_MANAGER, NODE
from ansible_collections.scv.gpu.plugins.module_utils.nvml.session import Session
from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import SCV

LOG = logging.getLogger("scv-gpu-agent")


def build(config, notify):
    """The Agent the configuration describes, every part made here and handed to it, and configured; ApiError
    when a kubeconfig cannot be used."""
    limits = {"timeout": config["request-timeout"], "qps": config["api-qps"], "burst": config["api-burst"]}
    client = RestClient.from_file(config["kubeconfig"], resource=SCV, **limits,
                                  status_manager=("%s-agent@%s" % (FIELD_MANAGER, socket.gethostname()))[:128])
    taint_client = RestClient.from_file(config["taint-kubeconfig"], resource=NODE, **limits) \
        if config["taint-kubeconfig"] else None
    # with metrics served, the costly counters are read at most once per scrape (on demand)
    session = Session(on_demand=bool(config["metrics-address"]))
    stopping = threading.Event()
    pods, pod_metadata, shares = _pod_parts(config, client, stopping)
    agent = Agent(client, config["node-name"], session, metrics=bool(config["metrics-address"]),
                  node_condition=config["node-condition"], taint_client=taint_client, notify=notify,
                  pods=pods, pod_metadata=pod_metadata, shares=shares, stopping=stopping)
    agent.configure(config)   # the reloadable settings: the interval, timeouts, XID policy, counters, ...
    return agent


def _pod_parts(config, client, stopping):
    """(pod attribution, pod metadata, shares) as the configuration asks for them: from the kubelet's
    pod-resources socket, or none (NoPods, None, None)."""
    wants_metadata = config["kubernetes-enable-pod-uid"] or config["kubernetes-enable-pod-labels"]
    if not config["pod-resources-socket"]:
        if wants_metadata:
            LOG.warning("kubernetes-enable-pod-uid and kubernetes-enable-pod-labels label the series of the GPUs "
                        "pods hold: without pod-resources-socket no pod is known to hold one, and they do nothing")
        return NoPods(), None, None
    pods = PodAttribution(config["pod-resources-socket"], config["pod-resources-interval"], stopping,
                          id_type=config["kubernetes-gpu-id-type"])
    pod_metadata = PodMetadata(client, config["node-name"], pods, stopping,
                               uid=config["kubernetes-enable-pod-uid"], labels=config["kubernetes-enable-pod-labels"],
                               patterns=config["kubernetes-pod-label-allowlist-regex"],
                               logs_dir=config["pod-logs-dir"]) if wants_metadata else None
    return pods, pod_metadata, PodShares(pods, config["pod-logs-dir"])


class Reloader:
    """SIGHUP: the environment and the file read again, in the agent's own thread."""

    def __init__(self, agent, flags, config):
        self.agent, self.flags, self.config = agent, flags, config
        self.server = None   # the metrics endpoint, whose web configuration file SIGHUP reads again

    def __call__(self, *_args):
        self.agent.request_reload(self.reload)

    def reload(self):
        reload_web_config(self.server)   # its own file: read again even when the configuration cannot be
        try:
            new = configuration.load(self.flags)
        except configuration.ConfigError as error:
            LOG.error("SIGHUP: keeping the configuration in use: %s", error)
            return
        changed = self.config.changed(new)
        later = [name for name in changed if not configuration.reloadable(name)]
        for name in later:   # kept as they are until the next start
            new.values[name], new.sources[name] = self.config.values[name], self.config.sources[name]
        configuration.apply_log_level(new["log-level"])
        self.agent.configure(new)
        # A reload is also how an operator (or the mig_layout role) says the GPUs changed under the agent,
        # or that its credentials did: the kubeconfig and the files it names are read again now.
        self.agent.session.refresh_static()
        for client in (self.agent.client, self.agent.taint.client if self.agent.taint else None):
            if client is not None:
                differ = client.reload(force=True)
                LOG.info("SIGHUP: the kubeconfig %s read again (%s)", client.path or "in use",
                         "the credentials changed" if differ else "the same credentials")
        self.config = new
        self.agent.counters.bump("reloads")
        LOG.info("SIGHUP: configuration read again (changed: %s); the GPUs' static readings are read again at the "
                 "next tick", ", ".join(changed) or "nothing")
        if later:
            LOG.warning("SIGHUP: %s take effect at the next start (systemctl restart scv-gpu-agent)",
                        ", ".join(later))


def reload_web_config(server):
    """SIGHUP: the endpoint's web configuration file read again; a file that cannot be used changes nothing."""
    if server is None or server.web is None:
        return
    try:
        server.web = web_config.replacement(server.web, server.web.path)
    except web_config.WebConfigError as error:
        LOG.error("SIGHUP: keeping the web configuration in use (%s): %s", server.web.describe(), error)
        return
    LOG.info("SIGHUP: %s read again: %s; new connections use it", server.web.path, server.web.describe())


def load_web_config(config):
    """The WebConfig that web-config-file names (None: none named); WebConfigError when it cannot be used."""
    if not config["web-config-file"]:
        return None
    web = web_config.load(config["web-config-file"])
    if not config["metrics-address"]:
        LOG.warning("web-config-file is set but metrics-address is empty: there is no endpoint to protect")
    LOG.info("metrics endpoint: %s (%s)", web.describe(), web.path)
    return web


def main(argv=None):
    parser = configuration.parser(__doc__.split("\n\n", 1)[0])
    flags = vars(parser.parse_args(argv))
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(message)s")
    try:
        config = configuration.load(flags)
    except configuration.ConfigError as error:
        parser.error(str(error))
    configuration.apply_log_level(config["log-level"])
    LOG.info("effective configuration: %s", config.describe())
    try:
        web = load_web_config(config)
    except web_config.WebConfigError as error:
        LOG.error("%s; the agent does not start until the file can be used (fix it, or leave web-config-file "
                  "empty to serve plain HTTP)", error)
        return 2
    notify = Notifier()
    try:
        agent = build(config, notify)
    except ApiError as error:
        LOG.error("%s", error)
        return 2
    signal.signal(signal.SIGTERM, agent.stop)
    signal.signal(signal.SIGINT, agent.stop)
    reloader = Reloader(agent, flags, config)
    signal.signal(signal.SIGHUP, reloader)
    if config["metrics-address"]:
        host, _sep, port = config["metrics-address"].rpartition(":")
        try:
            reloader.server = serve(agent, host, int(port), web)
        except OSError as error:
            LOG.error("cannot serve metrics on %s: %s", config["metrics-address"], error.strerror)
            return 2
    agent.run(watchdog_s=notify.watchdog_s)
    return 0
