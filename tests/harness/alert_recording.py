"""An agent's /metrics recorded over time, turned into promtool's unit test input (``promtool test rules``).

Each scrape of the recording stands for one step of promtool's time (``STEP``, one minute), so that the
alerts' ``for:`` durations pass in a few seconds of a real agent: an alert that needs 5 minutes needs 6
scrapes that show its condition. A scrape that fails (the agent stopped) is a step with ``up`` 0 and no
series, as Prometheus stores it; a series that leaves the scrape gets a staleness marker.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
import urllib.error

from prometheus_client.parser import text_string_to_metric_families

STEP_MINUTES = 1
JOB = "scv-gpu-agents"   # the job name of docs/examples/prometheus-scv-agents.yml
_TEMPLATE = re.compile(r"\{\{ *(\$labels\.([A-Za-z_][A-Za-z0-9_]*)|\$value) *\}\}")


def _series_key(name, labels):
    return name + "{%s}" % ",".join('%s=%s' % (key, json.dumps(value)) for key, value in sorted(labels.items()))


class Recording:
    """The scrapes of one agent; ``instance`` is the target's address, as Prometheus labels it."""

    def __init__(self, agent):
        self.agent = agent
        self.instance = "127.0.0.1:%d" % agent.port
        self.steps = []   # per scrape: {series key: value}, or None when the scrape failed
        self.labels = {}  # series key: its labels

    def scrape(self, count=1, pause_s=0.3):
        for _scrape in range(count):
            try:
                text = self.agent.metrics_text()
            except (OSError, urllib.error.URLError):
                self.steps.append(None)
            else:
                self.steps.append(self._parse(text))
            time.sleep(pause_s)

    def _parse(self, text):
        found = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                labels = dict(sample.labels, instance=self.instance, job=JOB)
                key = _series_key(sample.name, labels)
                self.labels[key] = dict(labels, __name__=sample.name)
                found[key] = sample.value
        return found

    def last(self, name, **match):
        """The labels and value of the series ``name`` matching ``match`` in the last successful scrape."""
        step = next(step for step in reversed(self.steps) if step is not None)
        for key, value in step.items():
            labels = self.labels[key]
            if labels["__name__"] == name and all(labels.get(k) == v for k, v in match.items()):
                return labels, value
        raise KeyError("%s %s is not in the last scrape" % (name, match))

    @property
    def eval_time(self):
        """promtool's time of the last scrape."""
        return "%dm" % ((len(self.steps) - 1) * STEP_MINUTES)

    def input_series(self):
        """promtool's input_series: every series scraped, ``_`` where a scrape lacked it, ``stale`` where it left."""
        keys = sorted({key for step in self.steps if step for key in step})
        series = []
        for key in keys:
            values, present = [], False
            for step in self.steps:
                if step is not None and key in step:
                    values.append(_number(step[key]))
                    present = True
                else:
                    values.append("stale" if present else "_")
                    present = False
            series.append({"series": key, "values": " ".join(values)})
        up = _series_key("up", {"instance": self.instance, "job": JOB})
        series.append({"series": up, "values": " ".join("0" if step is None else "1" for step in self.steps)})
        return series


def _number(value):
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def go_value(value):
    """``{{ $value }}`` as Prometheus's templates print a float64 (Go's %v: 79, not 79.0)."""
    return ("%d" % value) if float(value).is_integer() else repr(float(value))


def expand(template, labels, value):
    """A rule's annotation with ``{{ $labels.x }}`` and ``{{ $value }}`` filled in; anything else fails."""
    text = _TEMPLATE.sub(lambda m: go_value(value) if m.group(1) == "$value" else labels.get(m.group(2), ""),
                         template)
    assert "{{" not in text, "the test expands only $labels.x and $value: %s" % template
    return text


def promtool_test(promtool, test_file):
    """(passed, output) of ``promtool test rules``."""
    done = subprocess.run([str(promtool), "test", "rules", str(test_file)], capture_output=True, text=True,
                          check=False, timeout=300)
    return done.returncode == 0, done.stdout + done.stderr


def render_rules(ansible, directory, **variables):
    """The rules file the gpu_alerts role writes (gpu_alerts_target file), with ``variables`` over the defaults."""
    path = directory / "scv-gpu-alerts.yml"
    playbook = directory / "render.yml"
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "roles": [
        {"role": "scv.gpu.gpu_alerts", "vars": dict(gpu_alerts_target="file", gpu_alerts_rules_file=str(path),
                                                    **variables)}]}]))
    done = ansible.playbook(str(playbook), None)
    assert done.returncode == 0, done.stdout + done.stderr
    return path
