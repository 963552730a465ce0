"""dcgm-exporter's Kubernetes options: their settings, which pod labels are served under which names, GPUs named
by device name, and the series families with a pod's UID and labels (the API reads: tests/integration)."""

from __future__ import annotations

import json
import threading

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent import config
from ansible_collections.scv.gpu.plugins.module_utils.agent.metrics import exposition, families
from ansible_collections.scv.gpu.plugins.module_utils.agent.pod_metadata import (
    TAKEN,
    PodMetadata,
    allowed_labels,
    compile_patterns,
    label_name,
)
from ansible_collections.scv.gpu.plugins.module_utils.agent.pod_attribution import PodAttribution, device_replicas
from ansible_collections.scv.gpu.plugins.module_utils.kube.podresources import decode_list_response

from harness.paths import ROOT
from harness.agent_samples import CARDS, INSTANCES, MIG, WHOLE, pb, reference


def load(argv=(), environ=None, path=None):
    flags = vars(config.parser("test").parse_args(list(argv) + (["--config", str(path)] if path else [])))
    return config.load(flags, environ or {"NODE_NAME": "gpu-1"})


def test_the_options_are_off_by_default_and_read_as_dcgm_exporter_spells_them(tmp_path):
    settings = load()
    assert settings["kubernetes-enable-pod-uid"] is False and settings["kubernetes-enable-pod-labels"] is False
    assert settings["kubernetes-pod-label-allowlist-regex"] == [] and settings["kubernetes-gpu-id-type"] == "uid"
    settings = load(["--kubernetes-enable-pod-uid", "--kubernetes-enable-pod-labels=false",
                     "--kubernetes-pod-label-allowlist-regex", "^app$,^tier$",
                     "--kubernetes-pod-label-allowlist-regex", "^team/", "--kubernetes-gpu-id-type", "device-name"])
    assert settings["kubernetes-enable-pod-uid"] is True and settings["kubernetes-enable-pod-labels"] is False
    assert settings["kubernetes-pod-label-allowlist-regex"] == ["^app$", "^tier$", "^team/"]
    assert settings["kubernetes-gpu-id-type"] == "device-name"
    environ = {"NODE_NAME": "gpu-1", "SCV_GPU_AGENT_KUBERNETES_ENABLE_POD_LABELS": "true",
               "SCV_GPU_AGENT_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX": "^app$,^x"}
    settings = load(environ=environ)
    assert settings["kubernetes-enable-pod-labels"] is True
    assert settings["kubernetes-pod-label-allowlist-regex"] == ["^app$", "^x"]
    path = tmp_path / "agent.yml"
    path.write_text("kubernetes-pod-label-allowlist-regex: ['^a{1,3}$', '^b']\n")   # a list's items keep commas
    assert load(path=path)["kubernetes-pod-label-allowlist-regex"] == ["^a{1,3}$", "^b"]


@pytest.mark.parametrize("argv, message", [
    (["--kubernetes-pod-label-allowlist-regex", "^app$,(tier"],
     "kubernetes-pod-label-allowlist-regex from the flag --kubernetes-pod-label-allowlist-regex: '^app$,(tier' cannot "
     "be used: '(tier' is not a regular expression: missing ), unterminated subpattern at position 0"),
    (["--kubernetes-gpu-id-type", "index"],
     "kubernetes-gpu-id-type from the flag --kubernetes-gpu-id-type: 'index' cannot be used: expected uid or "
     "device-name"),
    (["--kubernetes-enable-pod-uid=maybe"], "kubernetes-enable-pod-uid from the flag --kubernetes-enable-pod-uid: "
                                            "'maybe' cannot be used: expected true or false"),
])
def test_a_bad_value_is_refused_naming_where_it_came_from(argv, message):
    with pytest.raises(config.ConfigError) as refused:
        load(argv)
    assert str(refused.value) == message


def test_a_file_giving_a_mapping_for_the_allowlist_is_refused(tmp_path):
    path = tmp_path / "agent.yml"
    path.write_text("kubernetes-pod-label-allowlist-regex: {app: true}\n")
    with pytest.raises(config.ConfigError, match=r"expected regular expressions \(a list, or text separated by commas\), got object"):
        load(path=path)


def test_label_names_are_prometheus_names():
    assert label_name("app.kubernetes.io/name") == "app_kubernetes_io_name"
    assert label_name("team-a") == "team_a" and label_name("Tier_2") == "Tier_2"
    assert label_name("9lives") == "_9lives"


def test_names_and_the_allowlist_are_dcgm_exporters_own():
    """tests/fixtures/dcgm-exporter/pod-labels.json: what dcgm-exporter's SanitizeLabelName and its allowlist
    matching (Go's regexp) gave (tools/dcgm-exporter/make-pod-label-fixture, at the commit it names)."""
    fixture = json.loads((ROOT / "tests" / "fixtures" / "dcgm-exporter" / "pod-labels.json").read_text())
    assert fixture["commit"].startswith("d5e5f51")
    # the same names, but where a key begins with a digit: dcgm-exporter serves a name Prometheus refuses
    assert {key: label_name(key) for key in fixture["names"]} == dict(fixture["names"], **{"9lives": "_9lives"})
    for patterns, admitted in zip(fixture["allowlists"], fixture["admitted"]):
        found = [key for key in sorted(fixture["names"]) if allowed_labels({key: "v"}, compile_patterns(patterns))]
        assert found == sorted(admitted), patterns
    assert {"gpu", "pod_uid"} <= TAKEN      # keys the fixture has whose names the agent leaves off, as the series


def test_the_allowlist_searches_each_key_and_any_pattern_admits_it():
    labels = {"app": "web", "app.kubernetes.io/name": "shop", "tier": "gold", "myapp": "x", "team": "ml"}
    assert allowed_labels(labels, compile_patterns(["app"])) == {
        "app": "web", "app_kubernetes_io_name": "shop", "myapp": "x"}            # found anywhere in the key
    assert allowed_labels(labels, compile_patterns(["^app$", "^tier$"])) == {"app": "web", "tier": "gold"}
    assert allowed_labels(labels, ()) == {"app": "web", "app_kubernetes_io_name": "shop", "tier": "gold",
                                          "myapp": "x", "team": "ml"}           # no allowlist: every label
    assert allowed_labels({"app": 3}, ()) == {"app": "3"}


def test_a_label_the_series_have_or_a_second_key_of_the_same_name_is_left_off():
    labels = {"gpu": "7", "pod": "spoof", "pod_uid": "u", "UUID": "x", "hostname": "h", "vgpu": "1",
              "GPU_I_ID": "1", "DCGM_FI_DRIVER_VERSION": "1", "a-b": "dash", "a.b": "dot", "a_b": "underscore"}
    assert allowed_labels(labels, ()) == {"a_b": "dash"}    # a-b sorts first


def _held(pod, *ids, container="c"):
    return {"namespace": "ns", "pod": pod, "container": container, "resource": "nvidia.com/gpu", "device_ids": list(ids)}


GPUS = [{"id": 0, "uuid": "GPU-0"}, {"id": 1, "uuid": "GPU-1"}, {"id": 2, "uuid": "GPU-2"}, {"id": 3, "uuid": "GPU-3"}]


@pytest.mark.parametrize("id_type, expected", [      # a MIG device's holders are its GPU instance's, not the GPU's
    ("uid", {0: ["by-uuid"], 1: ["by-index", "replica"]}),
    ("device-name", {0: ["by-name"], 1: ["gke-shared"]}),
])
def test_gpus_are_found_by_the_ids_their_type_names_and_mig_devices_either_way(id_type, expected):
    answer = [_held("by-uuid", "GPU-0"), _held("by-index", "1"), _held("replica", "GPU-1::4"),
              _held("by-name", "nvidia0"), _held("gke-shared", "nvidia1/vgpu2"), _held("mig", "MIG-a"),
              _held("gke-mig", "nvidia3/gi2/vgpu0"), _held("stranger", "nvidia9", "GPU-9", "9")]
    pods = PodAttribution("/none", 10, threading.Event(), lister=lambda *_args: answer, id_type=id_type)
    pods.learn(GPUS, lambda: {"MIG-a": ("GPU-2", 1)})
    pods.refresh()
    assert pods.refreshed.is_set()
    assert {card: [holder[0] for holder in held] for card, held in pods.by_card(GPUS).items()} == expected
    # a MIG device's pod is named on its GPU instance's series: by its UUID, or nvidia<index>/gi<GPU instance ID>
    assert pods.by_instance(GPUS) == {(2, 1): [("mig", "ns", "c")], (3, 2): [("gke-mig", "ns", "c")]}
    assert pods.replicas_by_instance(GPUS) == {(3, 2): {("gke-mig", "ns", "c"): "0"}}


def test_gkes_vgpu_suffix_is_a_replica_and_the_kubelets_answer_keeps_device_names_of_this_node():
    assert device_replicas([_held("a", "nvidia1/vgpu2", "nvidia1/vgpu0"), _held("b", "nvidia0/gi1/vgpu3")]) == {
        "nvidia1": {("a", "ns", "c"): {"2", "0"}}, "nvidia0/gi1": {("b", "ns", "c"): {"3"}}}

    device = pb(1, "nvidia.com/gpu") + b"".join(pb(2, d) for d in ("nvidia0/vgpu1", "nvidia7/gi1", "nvidia0::2"))
    answer = pb(1, pb(1, "p") + pb(2, "ns") + pb(3, pb(1, "c") + pb(2, device)))
    assert decode_list_response(answer, keep=frozenset({b"nvidia0"}))[0]["device_ids"] == [
        "nvidia0/vgpu1", "nvidia0::2"]


class _Pods:
    holders, claims = {}, {}


def test_the_extra_labels_are_the_held_pods_and_none_while_the_pods_cannot_be_read():
    reader = PodMetadata(None, "gpu-1", _Pods(), threading.Event(), uid=True, labels=True)
    by_card = {0: [("a", "ml", "c")], 1: [("b", "ml", "c"), ("gone", "ml", "c")], 2: [("", "", "")]}
    assert reader.extra(by_card) == ((), {})
    reader._pods = {("a", "ml"): ("u-a", {"app": "x"}), ("b", "ml"): ("u-b", {"tier": "1"}),
                    ("idle", "ml"): ("u-i", {"zone": "z"})}
    assert reader.extra(by_card) == (("app", "tier", "pod_uid"), {("a", "ml"): ["x", "", "u-a"],
                                                                  ("b", "ml"): ["", "1", "u-b"]})
    reader.uid = False
    assert reader.extra({0: [("a", "ml", "c")]}) == (("app",), {("a", "ml"): ["x"]})


def snapshot(pods, shares, extra):
    return {"node": "node-1", "facts": {"cardList": CARDS, "driver_version": "580.159.04"}, "last_xids": {},
            "counters": {}, "served": None, "pods": pods, "shares": shares, "contested": False, "pod_extra": extra}


PODS = {0: [("", "", "")], 1: [("a", "ml", "c"), ("b", "ml", "c")], 2: [("x", "ns", "main")]}
SHARES = {1: {"holders": {("a", "ml", "c"): "0", ("b", "ml", "c"): "1"}, "split": {"memory": True, "utilization": False},
              "pods": {("a", "ml"): {"uid": "log-a", "memory": 100}, ("b", "ml"): {"uid": "log-b", "memory": 200}}}}


def _rows(extra, metric):
    found = {name: (names, rows) for name, _kind, _text, names, rows in families(snapshot(PODS, SHARES, extra))}
    names, rows = found[metric]
    base = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname", "DCGM_FI_DRIVER_VERSION")
    return [{name: value for name, value in zip(names, values) if value and name not in base}
            for values, _value in rows]


@pytest.mark.parametrize("extra", [
    (("app", "pod_uid"), {("a", "ml"): ["web", "api-a"], ("x", "ns"): ["", "api-x"]}),
    (("app",), {("a", "ml"): ["web"]}),
    (), None,
], ids=["uid-and-labels", "labels", "none", "off"])
def test_held_series_carry_the_pods_uid_and_labels_and_the_whole_gpu_none(extra):
    assert exposition(lambda: snapshot(PODS, SHARES, extra)) == reference(lambda: snapshot(PODS, SHARES, extra))
    names, values = extra or ((), {})
    uid = "pod_uid" in names
    temperature = _rows(extra, "DCGM_FI_DEV_XID_ERRORS")   # every card has one
    app = {"app": "web"} if "app" in names else {}
    assert temperature[1] == dict({"pod": "a", "namespace": "ml", "container": "c", "vgpu": "0"}, **app,
                                  **({"pod_uid": "api-a"} if uid else {}))
    assert temperature[0] == {} and temperature[3] == dict({"pod": "x", "namespace": "ns", "container": "main"},
                                                           **({"pod_uid": "api-x"} if uid else {}))
    # GPU 1's memory split per pod: the whole GPU with no pod label, each pod with the UID its processes showed
    memory = _rows(extra, "DCGM_FI_DEV_FB_USED")
    assert memory[1] == {} and memory[2] == dict({"pod": "a", "namespace": "ml", "container": "c", "vgpu": "0",
                                                  "pod_uid": "log-a"}, **app)
    assert memory[3]["pod_uid"] == "log-b" and memory[4] == temperature[3]


def test_a_pod_holding_a_gpu_instance_has_its_uid_and_labels_on_that_instances_series():

    snapshot = {"node": "n", "facts": {"cardList": [WHOLE, MIG], "driver_version": "580"}, "last_xids": {},
                "counters": {}, "served": None, "pods": {0: [("whole", "ns", "c")]}, "shares": {},
                "instances": INSTANCES, "instance_pods": {(1, 5): [("small", "ns", "c")]}, "instance_replicas": {},
                "pod_extra": (("app", "pod_uid"), {("small", "ns"): ["infer", "u-s"], ("whole", "ns"): ["", "u-w"]})}
    found = {name: (names, rows) for name, _kind, _text, names, rows in families(snapshot)}
    names, rows = found["DCGM_FI_DEV_FB_USED"]
    named = {(labels["gpu"], labels["GPU_I_ID"]): (labels["pod"], labels["app"], labels["pod_uid"])
             for labels in (dict(zip(names, values)) for values, _value in rows)}
    assert named == {("0", ""): ("whole", "", "u-w"), ("1", "1"): ("", "", ""), ("1", "5"): ("small", "infer", "u-s")}
    assert exposition(lambda: snapshot) == reference(lambda: snapshot)
