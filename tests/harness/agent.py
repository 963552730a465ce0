"""The Scv agent as the scv_agent role installs it, run for real (a subprocess) against a control plane.

``install_agent`` makes the venv and zipapp; ``AgentProcess`` runs one agent for one node on a copy of a
simulator scenario that a test may change under it (``change_scenario``), and reads what it serves and
publishes. The rest reads what the agent wrote on its Node, and what dcgm-exporter serves, for comparison.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import urllib.error
import urllib.request

from harness.common import free_port, wait_until
from harness.control_plane import read_object
from harness.paths import AGENT_ROLE, AGENT_WHEELS, ROOT, SIMULATOR_DIR, scenario_path

# The counters dcgm-exporter serves by default (etc/default-counters.csv of NVIDIA/dcgm-exporter at
# d5e5f51, the lines not commented out): 25 series, and the driver version as a label of each.
DCGM_DEFAULT_COUNTERS = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
)
# The queries of NVIDIA's Grafana dashboard for dcgm-exporter.
DASHBOARD_QUERIES = ROOT / "tests" / "fixtures" / "dcgm-exporter-dashboard-queries.txt"


def agent_python():
    """Debian 12's Python (3.11), the one the agent wheels are downloaded for (make agent-wheels)."""
    for candidate in ("/usr/bin/python3", None):
        if candidate is None:
            done = subprocess.run([str(ROOT / "tools" / "find-python"), "3.11"], capture_output=True, text=True,
                                  check=False)
            candidate = done.stdout.strip()
        if candidate and subprocess.run([candidate, "-c", "import sys, venv, ensurepip; "
                                         "sys.exit(sys.version_info[:2] != (3, 11))"], check=False).returncode == 0:
            return candidate
    raise AssertionError("no Python 3.11 with venv here: the agent's wheels are for Debian 12's Python 3.11")


def install_agent(work, wheels=AGENT_WHEELS):
    """The agent as roles/scv_agent installs it; returns the command that runs it.

    A virtual environment holding only the role's packages (installed from ``wheels``, as an
    air-gapped site would) and the zipapp that the scv.gpu.agent_zipapp lookup builds.
    """
    from ansible_collections.scv.gpu.plugins.plugin_utils._agent_zipapp import write

    packages = [pin for pin in (line.split("#")[0].strip() for line in (AGENT_ROLE / "files" / "requirements.txt").read_text().splitlines()) if pin]
    work = pathlib.Path(work)
    venv = work / "venv"
    if not (venv / "bin" / "python").exists():
        subprocess.run([agent_python(), "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", "--no-index",
                        "--find-links", str(wheels)] + packages, check=True)
    zipapp = work / "scv-gpu-agent.pyz"
    write(str(zipapp))
    return [str(venv / "bin" / "python"), str(zipapp)]


class AgentProcess:
    """One agent for ``node``, on a copy of ``scenario`` in ``directory``, serving metrics on a port of its own."""

    def __init__(self, command, plane, node, directory, scenario="titan_xp", watch_timeout=60, kubeconfig=None,
                 extra=()):
        self.plane, self.node = plane, node
        self.scenario = directory / "scenario.json"
        shutil.copy(scenario_path(scenario), self.scenario)
        self.port = free_port()
        env = dict(os.environ, LD_LIBRARY_PATH=str(SIMULATOR_DIR), NVMLSIM_CONFIG=str(self.scenario))
        env.pop("PYTHONPATH", None)
        self.log = directory / "agent.log"
        command = list(command) + [
            "--kubeconfig", str(kubeconfig or plane.node_kubeconfig(node)), "--node-name", node,
            "--watch-timeout", str(watch_timeout), "--metrics-address", "127.0.0.1:%d" % self.port] + list(extra)
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def metrics_text(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port, timeout=5) as response:
            return response.read().decode()

    def metrics(self):
        """{'name{label="value",...}': value}, labels sorted by name, parsed by Prometheus's own text parser."""
        from prometheus_client.parser import text_string_to_metric_families

        samples = {}
        for family in text_string_to_metric_families(self.metrics_text()):
            for sample in family.samples:
                labels = ",".join('%s="%s"' % item for item in sorted(sample.labels.items()))
                samples[sample.name + ("{%s}" % labels if labels else "")] = sample.value
        return samples

    def healthz(self):
        """(HTTP status, parsed body) of the agent's /healthz."""
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % self.port, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def scv(self):
        """This node's Scv; None while it cannot be read (not there, its CRD gone, the API server away)."""
        try:
            return read_object(self.plane, "scv", self.node, missing_ok=True)
        except RuntimeError:
            return None

    def wait_for(self, predicate, timeout, step=0.05):
        """Seconds until predicate() held; fails after ``timeout``, or at once when the agent exits."""
        return wait_until(predicate, timeout, "agent %s" % self.node, step=step,
                          ignore=(OSError, ValueError, KeyError, TypeError),
                          gone=lambda: (None if self.process.poll() is None
                                        else "the agent exited (%s)" % self.process.returncode),
                          log=lambda: "agent log:\n" + self.log.read_text())

    def wait_for_count(self, counter, above, timeout):
        """Seconds until the agent's ``scv_agent_<counter>_total`` exceeds ``above``, read from its own metrics
        endpoint: a local request of milliseconds, so the time measured is the agent's, not a kubectl start-up's
        (a process start, seconds on a machine running the whole suite beside it)."""
        name = "scv_agent_%s_total" % counter
        return self.wait_for(lambda: self.metrics()[name] > above, timeout, step=0.02)

    def count(self, counter):
        return self.metrics()["scv_agent_%s_total" % counter]

    def tick_of(self, counter, above, timeout):
        """The agent's tick count (``scv_agent_ticks_total``) when its counter first exceeded ``above``: which tick
        did something, read from the same answer of its metrics endpoint. A tick is counted when it starts and
        the next starts a whole interval after it ends, so a poll every 20 ms reads the tick that did it; a
        count, unlike a time, does not grow when a loaded machine slows the agent's work."""
        name, seen = "scv_agent_%s_total" % counter, {}

        def done():
            seen.update(self.metrics())
            return seen[name] > above
        self.wait_for(done, timeout, step=0.02)
        return seen["scv_agent_ticks_total"]

    def set_free_memory(self, free_bytes):
        change_scenario(self, lambda scenario: scenario["devices"][0]["memory"].update(free=free_bytes))

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=15)
        return self.process.returncode


def node_for(request):
    """A node name of the test's own, from its function's name."""
    return "agent-%s" % request.node.name.split("[")[0].replace("_", "-")[5:40].strip("-")


def change_scenario(agent, change):
    """Applies ``change`` to the agent's scenario, replacing the file at once: the simulator never reads half."""
    scenario = json.loads(agent.scenario.read_text())
    change(scenario)
    staged = agent.scenario.with_suffix(".new")
    staged.write_text(json.dumps(scenario))
    staged.rename(agent.scenario)


def gpu_condition_of(plane, node):
    """The Node's GPUHealthy condition, None when it has none."""
    status = read_object(plane, "node", node)["status"]
    return next((c for c in status.get("conditions", []) if c["type"] == "GPUHealthy"), None)


def node_events(plane, node):
    """(type, reason) of the Node's events in the default namespace, oldest first."""
    events = json.loads(plane.kubectl("get", "events", "-n", "default", "-o", "json",
                                      "--field-selector", "involvedObject.name=%s" % node).stdout)["items"]
    return [(event["type"], event["reason"]) for event in sorted(events, key=lambda e: e["metadata"]["creationTimestamp"])]


def every_counter(scenario):
    """H100s as a vGPU guest with NVLink would show them: every default counter has a value."""
    for index, device in enumerate(scenario["devices"]):
        device.update(clocks={"sm": 1980, "memory": 2619}, fields={"82": 40 + index, "83": 2742790 + index, "94": index, "66": 1000 * index},
                      encoderUtilization=index, decoderUtilization=2 * index, virtualizationMode=2,
                      vgpuLicensed=1, gpm={"anyTensorUtil": 42, "graphicsUtil": 60, "dramBwUtil": 25,
                                           "pcieTxMiBPerSecond": 2, "pcieRxMiBPerSecond": 3})


def pods_on_gpus(agent, metric="DCGM_FI_DEV_GPU_UTIL"):
    """{gpu index: sorted [(pod, namespace, container)]} as the agent's /metrics says, '' for no pod."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families(agent.metrics_text()):
        for sample in family.samples:
            if sample.name == metric:
                labels = sample.labels
                found.setdefault(int(labels["gpu"]), []).append(
                    (labels.get("pod", ""), labels.get("namespace", ""), labels.get("container", "")))
    return {gpu: sorted(holders) for gpu, holders in found.items()}
