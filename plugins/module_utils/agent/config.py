# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The agent's configuration: command-line flags, environment variables and an optional file (private).

Each setting is looked for, first to last: its flag (``--default-interval``), its environment
variable (``SCV_GPU_AGENT_DEFAULT_INTERVAL``), the configuration file named by ``--config`` or
``SCV_GPU_AGENT_CONFIG`` (YAML or JSON, keys spelled as the flags without dashes in front:
``default-interval: 2000``), then its default. SIGHUP reads the environment of the process and
the file again; settings marked reloadable take effect at once, the others at the next start.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import re
import socket

from ansible_collections.scv.gpu.plugins.module_utils.agent import metrics
from ansible_collections.scv.gpu.plugins.module_utils.agent.xid import parse_actions
from ansible_collections.scv.gpu.plugins.module_utils.common.names import node_name_problem
from ansible_collections.scv.gpu.plugins.module_utils.common.value_kinds import json_kind
from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import DEFAULT_UPDATE_INTERVAL_MS

ENV_PREFIX = "SCV_GPU_AGENT_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class ConfigError(Exception):
    """A setting that cannot be used; the message names it, where it came from, and what is allowed."""


def _boolean(text):
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _bounded(kind, minimum, maximum):
    def convert(text):
        if isinstance(text, bool):
            raise ValueError("expected a number")
        value = kind(text)
        if not minimum <= value <= maximum:
            raise ValueError("expected a number from %s to %s" % (minimum, maximum))
        return value
    # read by tools/scv_agent_role.py, which writes the scv_agent role's limits from these
    convert.kind, convert.minimum, convert.maximum = kind, minimum, maximum
    return convert


def _path(value):
    """A file's path ('' for none): text, never a mapping, list or number read as a file name."""
    if not isinstance(value, str):
        raise ValueError("expected a file path (or '' for none), got %s" % json_kind(value))
    if "\0" in value:
        raise ValueError("a file path cannot hold a NUL character")
    return value


def _log_level(text):
    if not isinstance(text, str):
        raise ValueError("expected one of %s, got %s" % (", ".join(LOG_LEVELS), json_kind(text)))
    level = text.upper()
    if level not in LOG_LEVELS:
        raise ValueError("expected one of %s" % ", ".join(LOG_LEVELS))
    return level


def _address(text):
    """``host:port`` (an empty host means 127.0.0.1); '' turns the endpoint off."""
    if not isinstance(text, str):
        raise ValueError("expected host:port (for example 127.0.0.1:9400), got %s" % json_kind(text))
    if not text:
        return ""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected host:port (for example 127.0.0.1:9400), or '' for none")
    return "%s:%s" % (host.strip("[]") or "127.0.0.1", port)


def _xid_actions(value):
    """{xid: action} from a list of ``XID=ACTION`` (flags, environment: comma-separated) or a mapping."""
    if isinstance(value, dict):
        value = ["%s=%s" % item for item in value.items()]
    elif isinstance(value, str):
        value = [item for item in value.replace(",", " ").split() if item]
    return parse_actions(value)


def _node_name(text):
    """A Node's name as the API server checks it, so that no request is built from a name it refuses."""
    if not isinstance(text, str):
        raise ValueError("expected a Kubernetes node name, got %s" % json_kind(text))
    problem = node_name_problem(text)
    if problem:
        raise ValueError(problem)
    return str(text)


def _node_name_default(environ):
    return environ.get("NODE_NAME") or socket.gethostname().lower()


def _no_xid_actions(_environ):
    return {}


# dcgm-exporter's values of kubernetes-gpu-id-type: how the device IDs of the pod-resources answer name GPUs.
GPU_ID_TYPES = ("uid", "device-name")


def _no_patterns(_environ):
    return []


def _gpu_id_type(text):
    if text not in GPU_ID_TYPES:
        raise ValueError("expected %s" % " or ".join(GPU_ID_TYPES))
    return text


def _patterns(value):
    """Regular expressions as a list (flags and environment: comma-separated, as dcgm-exporter reads them; a file
    may give a list, whose items may hold commas), each checked to compile."""
    if isinstance(value, str):
        value = [item for item in value.split(",") if item]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError("expected regular expressions (a list, or text separated by commas), got %s"
                         % json_kind(value))
    for item in value:
        try:
            re.compile(item)
        except re.error as error:
            raise ValueError("%r is not a regular expression: %s" % (item, error)) from None
    return list(value)


# (name, convert, default, reloadable, help); the default may be a function of the environment.
OPTIONS = (
    ("kubeconfig", _path, "/etc/kubernetes/kubelet.conf", False,
     "kubeconfig to authenticate with (default: the kubelet's, so the node writes as itself)"),
    ("node-name", _node_name, _node_name_default, False, "the Kubernetes node name (default: $NODE_NAME, else the host name)"),
    ("default-interval", _bounded(int, 100, 3600000), DEFAULT_UPDATE_INTERVAL_MS, True,
     "spec.updateInterval (ms) for an Scv the agent creates, and the interval while the Scv has none"),
    ("watch-timeout", _bounded(int, 1, 3600), 300, True, "seconds per watch request"),
    ("request-timeout", _bounded(float, 0.1, 300), 10.0, False,
     "seconds to wait for the API server's answer before a request fails"),
    ("api-qps", _bounded(float, 0.1, 1000), 5.0, False,
     "API requests a second the agent may make once its burst is spent (watches included), as client-go's limit"),
    ("api-burst", _bounded(int, 1, 1000), 10, False, "API requests the agent may make at once before api-qps applies"),
    ("counters-interval", _bounded(float, 1, 3600), 60.0, True,
     "least seconds between reads of the costly counters (energy, PCIe replays, NVLink, vGPU licence) and of GPM "
     "(engine activity), which are read at a scrape of /metrics; 30 is dcgm-exporter's cadence, at twice their cost"),
    ("counters-file", _path, "", True,   # read by load, once, into Config.counters
     "a counters file in dcgm-exporter's CSV format (name, type, help) naming the DCGM series to serve; "
     "'' serves every one the agent has"),
    ("static-refresh", _bounded(float, 0, 86400), 600.0, True,
     "seconds between reads of each card's static readings (identity, maximum clocks, power limit, PCIe, ECC and "
     "MIG mode); NVML errors that call for it read them at once"),
    ("node-condition", _boolean, True, False,
     "set the GPUHealthy condition on the node's Node and emit Events (--no-node-condition: do not)"),
    ("xid-actions", _xid_actions, _no_xid_actions, True,
     "what an XID calls for: none (the card stays Healthy), reset or reboot (the card is Unhealthy); overrides the "
     "built-in table (flag: --xid-action XID=ACTION, repeated)"),
    ("xid-hold", _bounded(float, 0, 86400), 600.0, True,
     "seconds an XID that calls for a reset or reboot keeps its card Unhealthy (0: until NVML is initialised again)"),
    ("taint-kubeconfig", _path, "", False,
     "kubeconfig of an identity allowed to taint Nodes (a node's own is not): with it, the agent puts "
     "scv.gpu/gpu-unhealthy:NoSchedule on its Node while GPUHealthy is False (off when empty)"),
    ("metrics-address", _address, "", False,
     "host:port for Prometheus metrics (/metrics) and the health check (/healthz); off when empty"),
    ("web-config-file", _path, "", False,
     "a web configuration file in the Prometheus exporter-toolkit's format (tls_server_config, basic_auth_users, "
     "http_server_config), as dcgm-exporter's --web-config-file: TLS, client certificates and passwords for the "
     "metrics address; SIGHUP reads the file again ('' serves plain HTTP to anyone)"),
    ("pod-resources-socket", _path, "", False,
     "the kubelet's pod-resources socket (usually /var/lib/kubelet/pod-resources/kubelet.sock): with it, GPU series "
     "carry the pod, namespace and container that hold the GPU, as dcgm-exporter's do (off when empty)"),
    ("pod-resources-interval", _bounded(float, 1, 3600), 10.0, True,
     "seconds between questions to the kubelet's pod-resources API (each bounded to 2 s)"),
    ("pod-logs-dir", _path, "/var/log/pods", False,
     "the kubelet's pod logs directory (its podLogsDir), whose <namespace>_<pod>_<uid> entries name the pods that "
     "processes on a shared GPU belong to, for each pod's own memory and utilization series"),
    ("pod-utilization", _boolean, False, True,
     "split a shared GPU's utilization per pod too, from NVML's process samples (about 2 ms per shared GPU and "
     "scrape on an H200); off: each holder's series shows the whole GPU's, as the other series"),
    ("kubernetes-enable-pod-uid", _boolean, False, False,
     "with pod-resources-socket: a pod_uid label on the series of a GPU a pod holds, read with the kubeconfig's "
     "credentials from the API server (as dcgm-exporter's option of this name)"),
    ("kubernetes-enable-pod-labels", _boolean, False, False,
     "with pod-resources-socket: the Kubernetes labels of the pod that holds a GPU on its series, names made "
     "Prometheus label names (as dcgm-exporter's option of this name)"),
    ("kubernetes-pod-label-allowlist-regex", _patterns, _no_patterns, False,
     "regular expressions (comma-separated; the flag may be repeated): only the pod labels whose key one of them "
     "finds are served; none: every pod label (as dcgm-exporter's option of this name)"),
    ("kubernetes-gpu-id-type", _gpu_id_type, "uid", False,
     "how the kubelet's pod-resources answer names GPUs: uid (GPU-... UUIDs, as NVIDIA's device plugin) or "
     "device-name (nvidia0, as GKE's device plugin); MIG devices are found either way (dcgm-exporter's option)"),
    ("log-level", _log_level, "INFO", True, "DEBUG, INFO, WARNING or ERROR"),
)
# Boolean flags that stand alone (--kubernetes-enable-pod-uid) or take a value, as dcgm-exporter's do.
SWITCHES = ("kubernetes-enable-pod-uid", "kubernetes-enable-pod-labels")
NAMES = tuple(option[0] for option in OPTIONS)


def env_name(name):
    return ENV_PREFIX + name.upper().replace("-", "_")


def parser(description):
    """The command line: every option, with no defaults filled in (so that what was given is known)."""
    parsed = argparse.ArgumentParser(prog="scv-gpu-agent", description=description,
                                     argument_default=argparse.SUPPRESS,
                                     epilog="Every option can also come from %s<NAME> or the configuration file; "
                                            "flags win, then the environment, then the file." % ENV_PREFIX)
    parsed.add_argument("--config", help="a YAML or JSON file of settings, keys named as these options "
                                         "(default: $%s)" % env_name("config"))
    for name, _convert, default, reloadable, text in OPTIONS:
        text = "%s%s" % (text, "" if reloadable else " [read at start only]")
        if name == "node-condition":
            parsed.add_argument("--no-node-condition", dest="node-condition", action="store_false", help=text)
        elif name == "xid-actions":
            parsed.add_argument("--xid-action", dest="xid-actions", action="append", metavar="XID=ACTION", help=text)
        elif name in SWITCHES:
            parsed.add_argument("--" + name, dest=name, nargs="?", const="true", help=text + " (default: false)")
        elif name == "kubernetes-pod-label-allowlist-regex":
            parsed.add_argument("--" + name, dest=name, action="append", metavar="REGEX", help=text)
        else:
            shown = "" if callable(default) else " (default: %s)" % (default if default != "" else "none")
            parsed.add_argument("--" + name, dest=name, help=text + shown)
    return parsed


def read_file(path):
    """The settings of a configuration file, as {name: value}; ConfigError when it cannot be used."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise ConfigError("cannot read the configuration file %s: %s" % (path, error.strerror)) from error
    except UnicodeDecodeError as error:
        raise ConfigError("the configuration file %s is not UTF-8 text (byte %d: %s); write it as UTF-8"
                          % (path, error.start, error.reason)) from error
    try:
        import yaml
    except ImportError:
        yaml = None
    try:
        document = yaml.safe_load(text) if yaml is not None else json.loads(text)
    except ValueError as error:
        raise ConfigError("%s is not JSON (PyYAML is not installed to read YAML): %s" % (path, error)) from error
    except Exception as error:  # pylint: disable=broad-exception-caught
        if yaml is None or not isinstance(error, yaml.YAMLError):
            raise
        raise ConfigError("%s is not YAML: %s" % (path, error)) from error
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError("%s: expected a mapping of settings, got %s" % (path, type(document).__name__))
    settings = {}
    for key, value in document.items():
        name = str(key).replace("_", "-")
        if name not in NAMES:
            raise ConfigError("%s: unknown setting %r; known: %s" % (path, key, ", ".join(NAMES)))
        settings[name] = value
    return settings


def unknown_variables(environ):
    """Refusals for each ``SCV_GPU_AGENT_*`` variable that names no setting (a misspelling would be ignored)."""
    known = {env_name(name): name for name in ("config",) + NAMES}
    problems = []
    for variable in sorted(name for name in environ if name.startswith(ENV_PREFIX) and name not in known):
        close = difflib.get_close_matches(variable, known, n=1)
        problems.append("the environment variable %s names no setting%s; known: %s" % (
            variable, " (did you mean %s?)" % close[0] if close else "", ", ".join(sorted(known))))
    return problems


class Config:
    """The effective settings (``values``), where each came from (``sources``), and what the counters file
    names (``counters``: the served DCGM series and those it names that the agent lacks; None: no file)."""

    def __init__(self, values, sources, counters=None):
        self.values = values
        self.sources = sources
        self.counters = counters

    def __getitem__(self, name):
        return self.values[name]

    def describe(self):
        """One line: every setting, its value and its source, for the log."""
        return ", ".join("%s=%s (%s)" % (name, json.dumps(self.values[name], sort_keys=True), self.sources[name])
                         for name in NAMES)

    def changed(self, other):
        """The names whose value differs in ``other``."""
        return [name for name in NAMES if self.values[name] != other.values[name]]


def load(flags, environ=None):
    """The effective Config from parsed ``flags`` (a dict of what was given), the environment and the file."""
    environ = os.environ if environ is None else environ
    path = flags.get("config") or environ.get(env_name("config")) or None
    from_file = read_file(path) if path else {}
    values, sources, problems = {}, {}, unknown_variables(environ)
    for name, convert, default, _reloadable, _text in OPTIONS:
        if name in flags:
            raw, source = flags[name], "flag --%s" % ("xid-action" if name == "xid-actions" else name)
            if name == "kubernetes-pod-label-allowlist-regex":   # repeated, each comma-separated
                raw = ",".join(raw)
        elif env_name(name) in environ:
            raw, source = environ[env_name(name)], "environment %s" % env_name(name)
        elif name in from_file:
            raw, source = from_file[name], "file %s" % path
        elif callable(default):   # worked out from the environment: checked as if given
            raw, source = default(environ), "default"
        else:
            values[name], sources[name] = default, "default"
            continue
        try:
            values[name] = convert(raw)
        except (TypeError, ValueError) as error:
            problems.append("%s from the %s: %r cannot be used: %s" % (name, source, raw, error))
        sources[name] = source
    counters = None
    if not problems and values["counters-file"]:
        counters = _read_counters(values["counters-file"], sources["counters-file"], problems)
    if problems:
        raise ConfigError("; ".join(problems))
    return Config(values, sources, counters)


def _read_counters(path, source, problems):
    """(served, unknown) of the counters file at ``path``; a problem appended when it cannot be used."""
    try:
        return metrics.read_counters_file(path)
    except OSError as error:
        problem = "cannot read %s: %s" % (path, error.strerror)
    except UnicodeDecodeError as error:
        problem = "%s is not UTF-8 text (byte %d: %s)" % (path, error.start, error.reason)
    except ValueError as error:
        problem = str(error)
    problems.append("counters-file from the %s: %r cannot be used: %s" % (source, path, problem))
    return None


def reloadable(name):
    return next(option[3] for option in OPTIONS if option[0] == name)


def apply_log_level(level):
    logging.getLogger().setLevel(level)
