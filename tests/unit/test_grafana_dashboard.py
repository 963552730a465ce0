"""The fleet dashboard (docs/examples/grafana-scv-gpu-fleet.json) follows the rules of Grafana's dashboard linter.

github.com/grafana/dashboard-linter cannot be built here (its Go module pulls in AGPL Grafana and Loki modules), so
these are our own checks, one test per linter rule that applies to a Prometheus dashboard, written from the rules'
descriptions. PromQL is read with a small tokeniser of our own, not a full parser: it finds every series selector,
its label matchers, its range and the function that holds it, which is all the rules look at. Each test also breaks
a copy of the dashboard the way the rule forbids and asserts that its check reports it. docs/monitoring.md says
which rules the dashboard follows and why.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "examples" / "grafana-scv-gpu-fleet.json"

# Panel types the linter's panel rules look at (rows and text panels carry no query and no unit).
QUERY_PANELS = {"stat", "singlestat", "graph", "table", "timeseries", "gauge"}
DATASOURCE_UIDS = {"$datasource", "${datasource}"}
# Grafana unit ids (packages/grafana-data/src/valueFormats/categories.ts) this dashboard may use; add one here
# when a panel needs another id of that list.
UNITS = {"none", "short", "percent", "percentunit", "string", "locale", "sci", "bool", "bool_yes_no", "bool_on_off",
         "ns", "µs", "ms", "s", "m", "h", "d", "dtdurations", "dtdurationms", "dateTimeAsIso", "dateTimeFromNow",
         "hertz", "ops", "reqps", "rps", "wps", "iops", "cps", "bytes", "decbytes", "bits", "Bps", "bps", "celsius",
         "watt", "joule"}
# Series the collection's agent serves, and the one Prometheus writes for each target.
SERIES = re.compile(r"^(DCGM_FI_[A-Z0-9_]+|scv_gpu_[a-z0-9_]+|scv_agent_[a-z0-9_]+|up)$")

# What the tokeniser knows of PromQL.
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
                "quantile", "limitk", "limit_ratio"}
FUNCTIONS = AGGREGATIONS | {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
    "count_over_time", "day_of_month", "day_of_week", "days_in_month", "delta", "deriv", "exp", "floor",
    "histogram_quantile", "holt_winters", "hour", "idelta", "increase", "irate", "label_join", "label_replace",
    "last_over_time", "ln", "log2", "log10", "max_over_time", "min_over_time", "minute", "month",
    "predict_linear", "present_over_time", "quantile_over_time", "rate", "resets", "round", "scalar", "sgn",
    "sort", "sort_desc", "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "time", "timestamp",
    "vector", "year"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}
OPERATORS = {"+", "-", "*", "/", "%", "^", "==", "!=", ">", "<", ">=", "<=", ",", "(", ")"}
RATES = {"rate", "irate", "increase"}
STRING = r'"(?:[^"\\]|\\.)*"'
TOKEN = re.compile(r"""\s*(?:
    (?P<string>%s|'(?:[^'\\]|\\.)*')
   |(?P<braces>\{(?:[^{}"]|%s)*\})
   |(?P<range>\[[^\[\]]*\])
   |(?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[a-z]*)
   |(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
   |(?P<op>=~|!~|!=|==|>=|<=|\S))""" % (STRING, STRING), re.X)
MATCHER = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(%s)\s*(?:,|$)" % STRING)
DURATION = r"(?:\d+(?:ms|[smhdwy]))+|\$__rate_interval|\$__interval|\$__range|\$__auto"
RANGE = re.compile(r"^\[(?:%s)(?::(?:%s)?)?\]$" % (DURATION, DURATION))


@dataclasses.dataclass
class Selector:
    """One series selector of a query: ``metric{label op "value", ...}[range]`` inside ``function(...)``."""

    metric: str
    matchers: list[tuple[str, str, str]]
    function: str
    range: str | None


def tokens(expr: str) -> list[tuple[str, str]]:
    """(kind, text) of each token of a PromQL expression."""
    found, position = [], 0
    while expr[position:].strip():
        match = TOKEN.match(expr, position)
        found.append((match.lastgroup, match.group(match.lastgroup)))
        position = match.end()
    return found


def matchers(braces: str, problems: list[str]) -> list[tuple[str, str, str]]:
    """(label, operator, value) of each matcher between ``{`` and ``}``; a part that is no matcher is a problem."""
    inside, found, position = braces[1:-1], [], 0
    while inside[position:].strip():
        match = MATCHER.match(inside, position)
        if match is None:
            problems.append("not a label matcher: %r" % inside[position:])
            break
        found.append((match.group(1), match.group(2), match.group(3)[1:-1]))
        position = match.end()
    return found


def parse_promql(expr: str) -> tuple[list[Selector], list[str]]:
    """The selectors of a query, and what makes it no valid PromQL (empty when it reads as PromQL)."""
    found, problems, stack, calling = [], [], [], ""
    items = tokens(expr)
    if not items:
        problems.append("empty query")
    index = 0
    while index < len(items):
        kind, text = items[index]
        after = items[index + 1] if index + 1 < len(items) else ("", "")
        if kind == "name" and text in GROUPING:
            index = skip_label_list(items, index + 1, problems)
            continue
        if kind == "name" and after[1] == "(":
            if text not in FUNCTIONS:
                problems.append("unknown function %s" % text)
            calling = text
        elif kind == "name" and text in AGGREGATIONS and after[1] in ("by", "without"):
            calling = text
        elif kind == "name" and after[1] in ("by", "without"):
            problems.append("%s %s, but %s is no aggregation" % (text, after[1], text))
        elif kind == "name" and text.lower() in KEYWORDS:
            pass
        elif kind in ("name", "braces"):
            metric, braces = (text, "{}") if kind == "name" else ("", text)
            if kind == "name" and after[0] == "braces":
                braces = after[1]
                index += 1
            index += 1
            ranged = items[index][1] if index < len(items) and items[index][0] == "range" else None
            if ranged is None:
                index -= 1
            elif not RANGE.match(ranged):
                problems.append("not a range: %s" % ranged)
            found.append(Selector(metric, matchers(braces, problems), stack[-1] if stack else "", ranged))
        elif kind == "op" and text == "(":
            stack.append(calling)
            calling = ""
        elif kind == "op" and text == ")" and stack:
            stack.pop()
        elif kind == "range" and not (RANGE.match(text) and index and items[index - 1][1] == ")"):
            problems.append("a range after no selector: %s" % text)   # a subquery's range follows a ")"
        elif kind == "op" and (text not in OPERATORS or text in ("(", ")")):
            problems.append("unexpected %s" % text)
        index += 1
    if stack:
        problems.append("unclosed parenthesis")
    return found, problems


def skip_label_list(items: list[tuple[str, str]], index: int, problems: list[str]) -> int:
    """The index after the ``(label, ...)`` list of a by/without/on/ignoring/group_* clause that starts at index."""
    if index >= len(items) or items[index][1] != "(":
        problems.append("a grouping clause without its label list")
        return index
    end = index + 1
    while end < len(items) and items[end][1] != ")":
        if items[end][0] != "name" and items[end][1] != ",":
            problems.append("not a label: %s" % items[end][1])
        end += 1
    if end >= len(items):
        problems.append("an unclosed label list")
    return end + 1


# The dashboard, walked as the linter walks it.

def panels(dashboard: dict) -> list[dict]:
    """Every panel, the panels of rows included."""
    return [inner for panel in dashboard["panels"] for inner in [panel] + panel.get("panels", [])]


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expression) of every Prometheus target."""
    return [(panel["title"], target["expr"]) for panel in panels(dashboard) for target in panel.get("targets", [])]


def variable(dashboard: dict, name: str) -> dict | None:
    return next((item for item in dashboard["templating"]["list"] if item["name"] == name), None)


def query_text(template: dict) -> str:
    query = template.get("query", "")
    return query.get("query", "") if isinstance(query, dict) else query


def unit(panel: dict) -> str:
    """The unit a panel shows: an override's unit, else the default's."""
    config = panel.get("fieldConfig", {})
    overridden = [prop["value"] for override in config.get("overrides", [])
                  for prop in override.get("properties", []) if prop.get("id") == "unit"]
    return overridden[-1] if overridden else config.get("defaults", {}).get("unit", "")


def has_mappings(panel: dict) -> bool:
    config = panel.get("fieldConfig", {})
    return bool(config.get("defaults", {}).get("mappings")) or any(
        prop.get("id") == "mappings" and prop.get("value") for override in config.get("overrides", [])
        for prop in override.get("properties", []))


# The checks: each returns what breaks its rule, empty when the dashboard follows it.

def template_problems(dashboard: dict, name: str) -> list[str]:
    """template-job-rule and template-instance-rule: a Prometheus query variable of that name, labelled as the
    name in title case, on the templated data source, multi-valued, whose "All" is the regular expression .+"""
    template = variable(dashboard, name)
    if template is None:
        return ["no %s variable" % name]
    wanted = {"type": "query", "label": name.title(), "multi": True, "includeAll": True, "allValue": ".+"}
    problems = ["%s: %s is %r, not %r" % (name, key, template.get(key), value) for key, value in wanted.items()
                if template.get(key) != value]
    if uid(template.get("datasource")) not in DATASOURCE_UIDS:
        problems.append("%s does not use the $datasource variable" % name)
    return problems


def selector_problems(dashboard: dict, label: str) -> list[str]:
    """target-job-rule and target-instance-rule: every selector of every query matches the label with
    ``label=~"$label"``: a regular expression, so that several values and "All" (.+) work."""
    return ["%s: %s%s" % (title, selector.metric, selector.matchers)
            for title, expr in queries(dashboard) for selector in parse_promql(expr)[0]
            if (label, "=~", "$" + label) not in selector.matchers]


def check(rule: str, dashboard: dict) -> list[str]:
    """What breaks ``rule`` in the dashboard."""
    return CHECKS[rule](dashboard)


def broken(dashboard: dict, edit) -> dict:
    """A copy of the dashboard that ``edit`` changed."""
    mutant = copy.deepcopy(dashboard)
    edit(mutant)
    return mutant


def requery(old: str, new: str):
    """An edit that replaces ``old`` by ``new`` in every panel query and every variable's query."""
    def edit(dashboard):
        for panel in panels(dashboard):
            for target in panel.get("targets", []):
                target["expr"] = target["expr"].replace(old, new)
        for template in dashboard["templating"]["list"]:
            if isinstance(template.get("query"), dict):
                template["query"]["query"] = template["query"]["query"].replace(old, new)
    return edit


def both(*edits):
    """An edit made of several."""
    def edit(dashboard):
        for each in edits:
            each(dashboard)
    return edit


def uid(source) -> str | None:
    """The uid of a panel's, target's or variable's data source (old dashboards name it by a plain string)."""
    return source if isinstance(source, str) or source is None else source.get("uid")


def first(dashboard: dict, panel_type: str) -> dict:
    return next(panel for panel in panels(dashboard) if panel["type"] == panel_type)


def label_query_is_valid(text: str) -> bool:
    """A Grafana Prometheus variable query: label_names(), label_values([selector,] label), metrics(regex) or
    query_result(PromQL), its PromQL valid."""
    match = re.match(r"^(label_names|label_values|metrics|query_result)\((.*)\)$", text.strip(), re.S)
    if match is None:
        return False
    function, argument = match.groups()
    if function == "label_values":
        selector, _comma, label = argument.rpartition(",")
        return bool(re.match(r"^\s*[A-Za-z_][A-Za-z0-9_]*\s*$", label)) and (
            not selector or (not parse_promql(selector)[1] and len(parse_promql(selector)[0]) == 1))
    if function == "query_result":
        return not parse_promql(argument)[1]
    return True


CHECKS = {
    "template-datasource-rule": lambda dashboard: [
        "%s (%s): %s" % (item["name"], item.get("label"), item.get("query"))
        for item in dashboard["templating"]["list"] if item["type"] == "datasource"
        and (item["name"], item.get("label"), item.get("query")) != ("datasource", "Data source", "prometheus")
    ] + ([] if [item["type"] for item in dashboard["templating"]["list"]].count("datasource") == 1
         else ["not exactly one data source variable"]),
    "template-job-rule": lambda dashboard: template_problems(dashboard, "job"),
    "template-instance-rule": lambda dashboard: template_problems(dashboard, "instance"),
    "template-label-promql-rule": lambda dashboard: [
        "%s: %s" % (item["name"], query_text(item)) for item in dashboard["templating"]["list"]
        if item["type"] == "query" and not label_query_is_valid(query_text(item))],
    "template-on-time-change-reload-rule": lambda dashboard: [
        item["name"] for item in dashboard["templating"]["list"]
        if item["type"] == "query" and item.get("refresh") != 2],
    "uneditable-dashboard": lambda dashboard: [] if dashboard.get("editable") is False else ["editable"],
    "panel-datasource-rule": lambda dashboard: [
        "%s: %s" % (panel["title"], source) for panel in panels(dashboard) if panel["type"] in QUERY_PANELS
        for source in [panel.get("datasource")] + [target.get("datasource") for target in panel.get("targets", [])]
        if uid(source) not in DATASOURCE_UIDS],
    "panel-title-description-rule": lambda dashboard: [
        panel.get("title", "") for panel in panels(dashboard) if panel["type"] in QUERY_PANELS
        and not (panel.get("title", "").strip() and panel.get("description", "").strip())],
    "panel-units-rule": lambda dashboard: [
        "%s: %r" % (panel["title"], unit(panel)) for panel in panels(dashboard) if panel["type"] in QUERY_PANELS
        and unit(panel) not in UNITS and not has_mappings(panel)
        and not (panel["type"] == "stat" and panel.get("options", {}).get("reduceOptions", {}).get("fields"))],
    "panel-no-targets-rule": lambda dashboard: [
        panel["title"] for panel in panels(dashboard) if panel["type"] in QUERY_PANELS and not panel.get("targets")],
    "target-promql-rule": lambda dashboard: [
        "%s: %s" % (title, problems) for title, expr in queries(dashboard)
        for problems in [parse_promql(expr)[1]] if problems],
    "target-rate-interval-rule": lambda dashboard: [
        "%s: %s%s in %s()" % (title, selector.metric, selector.range, selector.function or "no function")
        for title, expr in queries(dashboard) for selector in parse_promql(expr)[0] if selector.range
        and (not selector.function or (selector.function in RATES and selector.range != "[$__rate_interval]"))],
    "target-job-rule": lambda dashboard: selector_problems(dashboard, "job"),
    "target-instance-rule": lambda dashboard: selector_problems(dashboard, "instance"),
    "target-counter-agg-rule": lambda dashboard: [
        "%s: %s" % (title, selector.metric) for title, expr in queries(dashboard)
        for selector in parse_promql(expr)[0] if selector.metric.endswith("_total")
        and not (selector.function in RATES and selector.range)],
}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def assert_rule(rule: str, dashboard: dict, *edits) -> None:
    """The dashboard follows ``rule``, and each edit breaks it in a way the check reports."""
    assert check(rule, dashboard) == []
    for edit in edits:
        assert check(rule, broken(dashboard, edit)), "%s missed a broken dashboard" % rule


def test_template_datasource_rule(dashboard):
    """template-datasource-rule: one data source variable, named datasource, labelled "Data source", for
    Prometheus."""
    assert_rule("template-datasource-rule", dashboard,
                lambda mutant: variable(mutant, "datasource").update(name="ds"),
                lambda mutant: variable(mutant, "datasource").update(label="Prometheus"),
                lambda mutant: mutant["templating"]["list"].append(dict(variable(mutant, "datasource"))))


def test_template_job_rule(dashboard):
    """template-job-rule: the job variable is a multi-valued Prometheus query on $datasource, "All" is .+"""
    assert_rule("template-job-rule", dashboard,
                lambda mutant: variable(mutant, "job").update(multi=False, includeAll=False, allValue=None),
                lambda mutant: variable(mutant, "job").update(allValue=".*"),
                lambda mutant: variable(mutant, "job").update(datasource={"type": "prometheus", "uid": "prom"}),
                lambda mutant: variable(mutant, "job").update(name="jobs"))


def test_template_instance_rule(dashboard):
    """template-instance-rule: the instance variable is labelled Instance, multi-valued, "All" is .+"""
    assert_rule("template-instance-rule", dashboard,
                lambda mutant: variable(mutant, "instance").update(label="Node"),
                lambda mutant: variable(mutant, "instance").update(allValue=".*"),
                lambda mutant: variable(mutant, "instance").update(type="custom"))


def test_template_label_promql_rule(dashboard):
    """template-label-promql-rule: each query variable is a Grafana Prometheus query with valid PromQL."""
    assert_rule("template-label-promql-rule", dashboard,
                requery("label_values(up{", "label_values(up{,"),
                requery("label_values(", "label_value("),
                requery(", instance)", ", instance, job)"))


def test_template_on_time_change_reload_rule(dashboard):
    """template-on-time-change-reload-rule: query variables refresh when the time range changes (refresh 2)."""
    assert_rule("template-on-time-change-reload-rule", dashboard,
                lambda mutant: variable(mutant, "instance").update(refresh=1))


def test_uneditable_dashboard_rule(dashboard):
    """uneditable-dashboard (docs/rules/template-uneditable-rule.md): the dashboard is code, not edited in the UI."""
    assert_rule("uneditable-dashboard", dashboard,
                lambda mutant: mutant.update(editable=True),
                lambda mutant: mutant.pop("editable"))


def test_panel_datasource_rule(dashboard):
    """panel-datasource-rule: each panel (and each of its targets) uses the templated data source."""
    assert_rule("panel-datasource-rule", dashboard,
                lambda mutant: first(mutant, "table").update(datasource={"type": "prometheus", "uid": "prom"}),
                lambda mutant: first(mutant, "timeseries").pop("datasource"),
                lambda mutant: first(mutant, "stat")["targets"][0].update(datasource="Prometheus"))


def test_panel_title_description_rule(dashboard):
    """panel-title-description-rule: each panel has a title and a description."""
    assert_rule("panel-title-description-rule", dashboard,
                lambda mutant: first(mutant, "stat").pop("description"),
                lambda mutant: first(mutant, "table").update(title=""))


def test_panel_units_rule(dashboard):
    """panel-units-rule: each panel has a unit Grafana knows (value mappings or a non-numeric stat excepted)."""
    assert_rule("panel-units-rule", dashboard,
                lambda mutant: first(mutant, "stat")["fieldConfig"]["defaults"].pop("unit"),
                lambda mutant: first(mutant, "timeseries").pop("fieldConfig"),
                lambda mutant: first(mutant, "table")["fieldConfig"]["defaults"].update(unit="gpus"))


def test_panel_no_targets_rule(dashboard):
    """panel-no-targets-rule: each panel has at least one target."""
    assert_rule("panel-no-targets-rule", dashboard,
                lambda mutant: first(mutant, "timeseries").pop("targets"),
                lambda mutant: first(mutant, "stat").update(targets=[]))


def test_target_promql_rule(dashboard):
    """target-promql-rule: each target is valid PromQL (as far as our tokeniser reads it)."""
    assert_rule("target-promql-rule", dashboard,
                requery("or vector(0)", "or vector(0"),
                requery("sum by (instance)", "summ by (instance)"),
                requery('job=~"$job"', 'job~="$job"'),
                requery("[$__rate_interval]", "[5 minutes]"),
                lambda mutant: first(mutant, "stat")["targets"][0].update(expr=""))


def test_target_rate_interval_rule(dashboard):
    """target-rate-interval-rule: rate(), irate() and increase() read their counters over [$__rate_interval] (the
    rule's page names all three; a range outside any function is reported too)."""
    assert_rule("target-rate-interval-rule", dashboard,
                requery("[$__rate_interval]", "[5m]"),
                both(requery("(rate(", "(irate("), requery("[$__rate_interval]", "[1m]")),
                both(requery("(rate(", "(increase("), requery("[$__rate_interval]", "[1h]")))


def test_target_job_rule(dashboard):
    """target-job-rule: every selector of every query has job=~"$job"."""
    assert_rule("target-job-rule", dashboard,
                requery('job=~"$job"', 'job="$job"'),
                requery('job=~"$job", ', ""),
                requery('{job=~"$job", instance=~"$instance"} == 0', " == 0"))


def test_target_instance_rule(dashboard):
    """target-instance-rule: every selector of every query has instance=~"$instance"."""
    assert_rule("target-instance-rule", dashboard,
                requery('instance=~"$instance"', 'instance="$instance"'),
                requery(', instance=~"$instance"', ""))


def test_target_counter_agg_rule(dashboard):
    """target-counter-agg-rule: a counter (a series ending in _total) is read only through rate, irate or
    increase over a range."""
    assert_rule("target-counter-agg-rule", dashboard,
                requery("(rate(scv_agent_errors_total", "((scv_agent_errors_total"),
                requery("rate(scv_agent_writes_total", "max_over_time(scv_agent_writes_total"))


def test_the_queries_read_only_series_the_agent_serves(dashboard):
    """Not a linter rule: every selector names a DCGM_FI_*, scv_gpu_* or scv_agent_* series of the agent, or up."""
    names = [selector.metric for title, expr in queries(dashboard) for selector in parse_promql(expr)[0]]
    assert names and all(SERIES.match(name) for name in names), names
    assert not all(SERIES.match(selector.metric) for selector in parse_promql('DCGM_EXP_XID{job=~"$job"}')[0])


def test_the_tokeniser_finds_selectors_ranges_and_their_function():
    """The PromQL reading the checks rest on."""
    found, problems = parse_promql('sum by (instance) (rate(a_total{job=~"$job", x!~"y,}"}[$__rate_interval])) '
                                   'or on (instance) count_values("xid", b) > bool 0')
    assert problems == []
    assert [(item.metric, item.function, item.range) for item in found] == [
        ("a_total", "rate", "[$__rate_interval]"), ("b", "count_values", None)]
    assert found[0].matchers == [("job", "=~", "$job"), ("x", "!~", "y,}")]
    assert parse_promql("up{job=~}")[1] and parse_promql("rate(up[5m)")[1] and parse_promql("up)")[1]
