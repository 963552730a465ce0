"""The GPUHealthy Node condition worked out from gpu_facts's facts."""

from __future__ import annotations

import copy

from ansible_collections.scv.gpu.plugins.module_utils.agent.condition import (
    MESSAGE_LIMIT,
    condition_patch,
    current_condition,
    gpu_condition,
    transition_event,
)

from harness import scenario_expectations as expected


def test_every_card_healthy_is_true():
    assert gpu_condition(expected.H100_SXM_X8) == ("True", "GPUsHealthy", "all 8 GPUs are healthy")


def test_no_gpu_with_working_nvml_is_true_and_says_so():
    assert gpu_condition(expected.NO_GPUS) == ("True", "GPUsHealthy", "NVML works and reports no GPU")


def test_a_lost_card_is_named_with_its_reason():
    status, reason, message = gpu_condition(expected.LOST_CARD)
    assert (status, reason) == ("False", "GPUUnhealthy")
    assert message == "1 of 4 GPUs unhealthy. GPU 2: %s" % expected.LOST    # a lost card tells no UUID
    facts = copy.deepcopy(expected.LOST_CARD)
    facts["cardList"][2]["uuid"] = "GPU-x"
    assert gpu_condition(facts)[2] == "1 of 4 GPUs unhealthy. GPU 2 (GPU-x): %s" % expected.LOST


def test_an_unreadable_nvml_is_false_with_the_reason():
    status, reason, message = gpu_condition(expected.DRIVER_NOT_LOADED)
    assert (status, reason) == ("False", "NVMLUnavailable")
    assert expected.DRIVER_NOT_LOADED["nvml_error"] in message


def test_a_long_message_is_cut():
    facts = copy.deepcopy(expected.H100_SXM_X8)
    for card in facts["cardList"]:
        card["health"], card["healthReasons"] = "Unhealthy", ["x" * 300]
    status, _reason, message = gpu_condition(facts)
    assert status == "False" and len(message) == MESSAGE_LIMIT and message.endswith("...")


def test_patch_event_and_lookup():
    patch = condition_patch("False", "GPUUnhealthy", "m", "2026-11-22T10:00:00Z", "2026-11-22T09:00:00Z")
    condition = patch["status"]["conditions"][0]
    assert condition["type"] == "GPUHealthy" and condition["lastTransitionTime"] == "2026-11-22T09:00:00Z"
    node = {"metadata": {"name": "n1", "uid": "u1"}, "status": {"conditions": [{"type": "Ready"}, condition]}}
    assert current_condition(node) is condition
    assert current_condition({"status": {}}) is None
    event = transition_event(node, "False", "GPUUnhealthy", "m", "2026-11-22T10:00:00Z", "scv-gpu-agent")
    assert (event["type"], event["reason"], event["involvedObject"]["name"]) == ("Warning", "GPUUnhealthy", "n1")
    assert event["metadata"]["namespace"] == "default"
    assert transition_event(node, "True", "GPUsHealthy", "m", "t", "c")["type"] == "Normal"
