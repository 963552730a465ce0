# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The agent's Prometheus metrics, with dcgm-exporter's names and labels (private to the collection).

Dashboards built for NVIDIA's dcgm-exporter query ``DCGM_FI_DEV_*`` series with the labels
``gpu``, ``UUID``, ``device``, ``modelName`` and ``hostname``. The agent serves the same series
from NVML, so those dashboards work on nodes without DCGM. Beside them it serves its own
``scv_gpu_*`` gauges and ``scv_agent_*`` counters. The text exposition format (0.0.4) is written here,
with the standard library only.
"""

from __future__ import annotations

import math

from ansible_collections.scv.gpu.plugins.module_utils.agent.counters import COUNTERS
from ansible_collections.scv.gpu.plugins.module_utils.nvml.series import SERIES

# (metric, card field, help): gauges as dcgm-exporter names them, from gpu_facts's card fields (nvml.series).
DCGM_CARD_GAUGES = tuple((row.name, row.fact, row.help) for row in SERIES)

SCV_CARD_GAUGES = (
    ("scv_gpu_memory_total_mib", "totalMemory", "Total GPU memory in MiB."),
    ("scv_gpu_memory_free_mib", "freeMemory", "Free GPU memory in MiB."),
    ("scv_gpu_utilization_percent", "gpuUtilization", "GPU utilization in percent."),
    ("scv_gpu_power_draw_watts", "powerDraw", "Power draw in watts."),
    ("scv_gpu_temperature_celsius", "temperature", "GPU temperature in degrees Celsius."),
)

# dcgm-exporter writes "hostname" since d5e5f51 (May 2026); "Hostname" made duplicate series when
# joined with other exporters.
DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname")
# The labels of the agent's own per-card series.
SCV_LABELS = ("node", "gpu", "uuid")


def served_fields(served):
    """The card fact keys behind the DCGM series ``served`` (None: every series, so None: every key)."""
    if served is None:
        return None
    return {path[0] for metric, path, _text in DCGM_CARD_GAUGES if metric in served}


# From the fact's unit to DCGM's: {fact key: (multiply by, divide by)}.
_SCALE = {row.fact[0]: row.scale for row in SERIES if row.scale is not None}


# DCGM's dcgmFabricManagerStatus_t from the card's fabric fact (see nvml.fabric): a GPU without one has no fabric.
FABRIC_MANAGER_STATUS = {"not started": 1, "in progress": 2, "completed": 3}
FABRIC_FAILURE = 4


def fabric_manager_status(card):
    fabric = card.get("fabric")
    if not fabric:
        return 0
    status = FABRIC_MANAGER_STATUS.get(fabric.get("state"), 0)
    return FABRIC_FAILURE if status == 3 and fabric.get("status", "Success") != "Success" else status


def _field(card, path):
    if path[0] == "fabric":
        return fabric_manager_status(card)
    if path[0] in _SCALE:
        value, (times, over) = card.get(path[0]), _SCALE[path[0]]
        return value * times / over if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    value = card
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    if isinstance(value, bool):
        return int(value)
    return value if isinstance(value, (int, float)) else None


# dcgm-exporter's "label" counter: the driver version as a label of every DCGM series.
DRIVER_VERSION = "DCGM_FI_DRIVER_VERSION"
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
SERVED = tuple(metric for metric, _path, _text in DCGM_CARD_GAUGES) + (XID_ERRORS, DRIVER_VERSION)


def dcgm_labels(card, hostname, driver=None):
    index = str(card.get("id", ""))
    labels = [index, card.get("uuid", ""), card.get("pciBusId", ""), "nvidia%s" % index, card.get("model", ""),
              hostname]
    return labels + [driver] if driver is not None else labels


def read_counters_file(path):
    """The DCGM series a counters file in dcgm-exporter's CSV format names (``name, type, help`` per
    line, ``#`` comments), as (served, named but not served); ValueError names the line at fault."""
    named = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = [part.strip() for part in line.split(",", 2)]
            if len(parts) < 3 or not parts[0].startswith("DCGM_") or parts[1] not in ("gauge", "counter", "label"):
                raise ValueError("%s line %d: %r is not 'DCGM_FI_..., gauge|counter|label, help text'"
                                 % (path, number, line))
            named.append(parts[0])
    return frozenset(name for name in named if name in SERVED), sorted(set(named) - set(SERVED))


# Help texts of the counters that are not the agent's own Counters (see ``agent.counters``).
_OTHER_COUNTERS = {
    "scv_agent_api_requests": "API requests made.",
    "scv_agent_api_failures": "API requests the API server did not answer, or answered 429 or 5xx.",
    "scv_agent_api_throttled": "API requests that waited for the agent's own rate limit (api-qps, api-burst).",
    "scv_agent_api_throttled_seconds": "Seconds API requests waited for the agent's own rate limit.",
    "scv_agent_credential_reloads": "Times changed credentials were read from disk.",
    "scv_agent_nvml_inits": "Times NVML was initialised (once, then after errors that call for it).",
    "scv_agent_nvml_static_reads": "Times every card's static readings were read.",
    "scv_agent_nvml_seconds": "Seconds spent reading NVML.",
    "scv_agent_nvml_scrape_reads": "Times a scrape read the GPUs' telemetry (and the costly counters when due).",
    "scv_agent_nvml_counter_reads": "Times the costly counters (energy, PCIe replays, NVLink, vGPU licence, GPM) were "
                                    "read: at most once per counters interval, and once per scrape.",
    "scv_agent_pod_resources_reads": "Times the kubelet's pod-resources API was asked which pods hold GPUs.",
    "scv_agent_pod_resources_failures": "Times the kubelet's pod-resources API could not be read.",
    "scv_agent_shared_gpu_reads": "Times a shared GPU's processes were read, at scrapes, to split its memory and "
                                  "utilization per pod.",
    "scv_agent_pod_metadata_reads": "Times the pods bound to this node were read from the API server, for the "
                                    "pod_uid and pod labels of GPU series.",
    "scv_agent_pod_metadata_failures": "Times the pods bound to this node could not be read from the API server.",
}

# With pod attribution on, as dcgm-exporter labels a GPU's series with what holds it (with
# --kubernetes-virtual-gpus: "vgpu" is the replica number of a GPU shared by time-slicing or MPS).
POD_LABELS = ("pod", "namespace", "container", "vgpu")
NOBODY = [("", "", "")]   # Prometheus reads an empty label as no label: a GPU no pod holds
# The series a shared GPU splits per pod (agent.shares), with the pod's figure each shows; they carry "pod_uid" too.
PER_POD = {"DCGM_FI_DEV_FB_USED": "memory", "DCGM_FI_DEV_GPU_UTIL": "utilization"}
UID_LABEL = "pod_uid"


def card_rows(rows, value, figure, share, extra=()):
    """(label values, value) of one card's series: ``rows`` (a set of label values per holder) with the card's
    ``value``, or, for a series split per pod (``figure``, a key of agent.shares' figures) of a shared card whose
    figure NVML could split, the whole GPU without pod labels, then each holder whose pod's figure is known, with
    it. ``extra`` names the pod's own labels that end each row (see agent.pod_metadata); a series split per pod
    ends with pod_uid, theirs or its own."""
    if figure is None:
        return [(row, value) for row in rows]
    if UID_LABEL not in extra:
        rows = [row + [""] for row in rows]
    width = len(POD_LABELS) + len(extra) + (UID_LABEL not in extra)
    if share is None or not share["split"][figure]:
        return [(row, value) for row in rows]
    whole = rows[0][:-width] + [""] * width
    found = [(whole, value)]
    for row in rows:
        pod = share["pods"].get((row[-width], row[1 - width]))
        if pod is not None and figure in pod:
            found.append((row[:-1] + [pod["uid"]], pod[figure]))
    return found


# A GPU with MIG on and GPU instances has no series of its own, as in dcgm-exporter's default monitoring: each GPU
# instance has them, labelled with its profile and ID (and the GPU's labels). They show the instance's own memory and
# engine activity, and the GPU's other readings repeated, as DCGM reads those from the GPU (its utilization and
# codecs none: NVML has none with MIG on). GPM gives no PCIe traffic per instance, and DCGM serves an XID on an
# instance only when the driver names that instance alone: the agent keeps XIDs per GPU, so neither is served.
INSTANCE_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")
INSTANCE_OWN = frozenset(("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
                          "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                          "DCGM_FI_PROF_DRAM_ACTIVE"))
INSTANCE_LEFT_OUT = frozenset(("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES", XID_ERRORS))


def _units(snapshot, cards, driver, mig):
    """[(card, GPU instance readings or None, [label values per holder])]: what has series of its own, each GPU or
    GPU instance, with a set of label values for each container holding it (one, with no pods or nobody). ``mig``:
    the series carry the GPU instance labels (empty on a whole GPU's)."""
    node, pods = snapshot["node"], snapshot.get("pods")
    shares, instances = snapshot.get("shares") or {}, snapshot.get("instances") or {}
    mig = [""] * len(INSTANCE_LABELS) if mig else []
    # the pod's UID and own labels (agent.pod_metadata): (names, {(pod, namespace): values}), after the pod labels
    extra, extras = snapshot.get("pod_extra") or ((), {})
    blank = [""] * len(extra)
    claim_names, claims = snapshot.get("dra") or ((), {})   # the DRA claim labels (agent.dra_claims), after vgpu
    unclaimed = [""] * len(claim_names)
    units = []
    for card in cards:
        base, key = dcgm_labels(card, node, driver), card.get("id")
        if instances.get(key):
            holders = snapshot.get("instance_pods") or {}
            replicas = snapshot.get("instance_replicas") or {}
            parts = [(instance, base + [instance.get("profile") or "", str(instance["id"])], (key, instance["id"]))
                     for instance in instances[key]]
        else:
            holders, replicas = pods or {}, {key: shares.get(key, {}).get("holders", {})}
            parts = [(None, base + mig, key)]
        for instance, labels, part in parts:
            vgpu, claim = replicas.get(part, {}), claims.get(part, {})
            units.append((card, instance, [labels] if pods is None else [
                labels + list(holder) + [vgpu.get(holder, "")] + claim.get(holder, unclaimed) + extras.get(holder[:2], blank)
                for holder in holders.get(part, NOBODY)]))
    return units


def _value(metric, path, card, instance, last):
    if path is None:
        return last.get(card.get("id"), 0)
    if instance is None or metric not in INSTANCE_OWN:
        return _field(card, path)
    return _field(instance, path)


def families(snapshot):
    """Each series family of a snapshot (node, facts, last XIDs, counters, pods, shares, GPU instances and their
    pods): (name, "gauge" or "counter", help text, label names, [(label values, value), ...])."""
    node = snapshot["node"]
    cards = (snapshot["facts"] or {}).get("cardList") or []
    served = SERVED if snapshot.get("served") is None else snapshot["served"]   # a file may name none
    driver = (snapshot["facts"] or {}).get("driver_version") if DRIVER_VERSION in served else None
    labels = DCGM_LABELS + ((DRIVER_VERSION,) if driver is not None else ())
    mig = any((snapshot.get("instances") or {}).values())
    if mig:
        labels += INSTANCE_LABELS
    pods, shares = snapshot.get("pods"), snapshot.get("shares") or {}
    # the names of the labels _units puts after the pod labels: the DRA claim's, then the pod's own
    extra = (snapshot.get("dra") or ((), {}))[0] + (snapshot.get("pod_extra") or ((), {}))[0]
    if pods is not None:
        labels += POD_LABELS + extra
    units, last = _units(snapshot, cards, driver, mig), snapshot["last_xids"]
    for metric, path, text in DCGM_CARD_GAUGES + ((XID_ERRORS, None, "Value of the last XID error encountered."),):
        if metric not in served:
            continue
        figure = PER_POD.get(metric) if pods is not None else None
        rows = []
        for card, instance, unit_rows in units:
            if instance is not None and metric in INSTANCE_LEFT_OUT:
                continue
            value = _value(metric, path, card, instance, last)
            if value is not None:
                share = shares.get(card.get("id")) if instance is None else None
                rows += card_rows(unit_rows, value, figure, share, extra)
        yield metric, "gauge", text, labels + ((UID_LABEL,) if figure and UID_LABEL not in extra else ()), rows

    for metric, field, text in SCV_CARD_GAUGES:
        yield metric, "gauge", text, SCV_LABELS, [
            ([node, str(card["id"]), card.get("uuid", "")], card[field]) for card in cards if card.get(field) is not None]
    yield "scv_gpu_healthy", "gauge", "1 when the card is Healthy.", SCV_LABELS, [
        ([node, str(card["id"]), card.get("uuid", "")], int(card.get("health") == "Healthy")) for card in cards]
    yield from alert_families(snapshot, cards)
    yield ("scv_agent_scv_contested", "gauge", "1 while another writer keeps changing this node's Scv status and the "
           "agent holds its own writes.", (), [((), int(bool(snapshot.get("contested"))))])
    helps = dict(_OTHER_COUNTERS, **{"scv_agent_%s" % name: text for name, text in COUNTERS})
    for name, value in snapshot["counters"].items():
        yield name, "counter", helps[name], (), [((), value)]


def alert_families(snapshot, cards):
    """The per-card and agent series that alert rules need beside the DCGM ones: lost cards, critical XIDs
    held under the XID policy, and when the agent last published its Scv."""
    node, lost, held = snapshot["node"], snapshot.get("lost") or (), snapshot.get("critical_xids") or {}
    yield "scv_gpu_lost", "gauge", ("1 while the card answers GPU_IS_LOST or RESET_REQUIRED (fallen off the bus, "
                                    "XID 79): reset the GPU or reboot the node."), SCV_LABELS, [
        ([node, str(card["id"]), card.get("uuid", "")], int(card["id"] in lost)) for card in cards]
    yield "scv_gpu_critical_xid", "gauge", ("The last XID held against the card under the agent's XID policy that "
                                            "calls for a reset or a reboot (0: none)."), SCV_LABELS, [
        ([node, str(card["id"]), card.get("uuid", "")], held.get(card["id"], 0)) for card in cards]
    yield ("scv_agent_api_consecutive_failures", "gauge", "API requests that failed (no answer, 429 or 5xx) since "
           "the API server last answered.", (), [((), snapshot.get("api_failures_in_a_row") or 0)])
    if snapshot.get("published_at") is not None:
        yield ("scv_agent_scv_last_published_timestamp_seconds", "gauge", "Unix time the agent last wrote its "
               "node's Scv status or found it current.", (), [((), snapshot["published_at"])])


def sample_text(value):
    """A sample value as Prometheus's text format writes it: ``NaN``, ``+Inf``, ``-Inf``, else the shortest text
    that reads back as the same float. As Go's client (dcgm-exporter's) does, a number of 10**6 or more in size
    is written with an exponent (``1.234567e+06``) where Python would write its digits out; below that, Python's
    own shortest text (``42.0``, ``0.25``, ``1e-05``)."""
    number = float(value)
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    text = repr(number)
    sign, digits = ("-", text[1:]) if text.startswith("-") else ("", text)
    whole, _point, fraction = digits.partition(".")
    if "e" in digits or len(whole) <= 6:
        return text
    significant = (whole + fraction).rstrip("0")
    mantissa = significant[0] + ("." + significant[1:] if len(significant) > 1 else "")
    return "%s%se+%02d" % (sign, mantissa, len(whole) - 1)


def _escaped(value):
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def exposition(snapshot):
    """The Prometheus text (format 0.0.4) of what ``snapshot()`` (a function) returns: byte for byte what
    prometheus_client's ``generate_latest`` writes for the same :func:`families` (a unit test holds it to that;
    :func:`sample_text` differs only on negative numbers of 10**6 or more in size). The label text of each set
    of label values is made once per scrape, not once per series: with pod attribution a shared GPU's every
    series is served once per pod, and most of a scrape went into writing the same labels again."""
    lines, label_texts = [], {}
    for name, kind, text, names, rows in families(snapshot()):
        shown = name + "_total" if kind == "counter" else name
        lines.append("# HELP %s %s\n# TYPE %s %s\n"
                     % (shown, text.replace("\\", r"\\").replace("\n", r"\n"), shown, kind))
        order = sorted(range(len(names)), key=names.__getitem__)
        for values, value in rows:
            key = (names, tuple(values))
            label_text = label_texts.get(key)
            if label_text is None:
                label_text = label_texts[key] = "{%s}" % ",".join(
                    '%s="%s"' % (names[position], _escaped(values[position])) for position in order) if names else ""
            lines.append("%s%s %s\n" % (shown, label_text, sample_text(value)))
    return "".join(lines).encode("utf-8")
