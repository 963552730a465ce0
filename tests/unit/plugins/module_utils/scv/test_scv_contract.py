"""The Scv consumer contract, checked with a port of Yoda-Scheduler's own filter and score.

For every simulator scenario (lost, unreadable, partly healthy and healthy nodes alike) the Scv
status we publish goes through Yoda's Filter and, where the node passes, its PreScore and Score,
for a range of pods. Yoda must never crash (it divides by totalMemorySum), and a node it admits
must have the cards the pod asked for: usable ones.

Left out on purpose: a pod labelled ``scv/number: "0"``. Yoda admits it to a node with no cards
and then divides by a totalMemorySum of 0. That happens on any node without a GPU, with SCV's
own objects too. No honest status can avoid it, because the sum of no memory is 0.
"""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.nvml.collect import collect
from ansible_collections.scv.gpu.plugins.module_utils.common.gpu_info import GATHER_SUBSETS
from ansible_collections.scv.gpu.plugins.module_utils.scv.status import desired_status

from harness import yoda_scheduler as yoda
from harness.paths import SCENARIOS

SCENARIO_NAMES = sorted(path.stem for path in SCENARIOS.glob("*.json"))


def _usable(card):
    return card["health"] == "Healthy" and card.get("totalMemory")


def _pods(facts):
    pods = [{}, {"scv/memory": "1024"}, {"scv/memory": "1024", "scv/number": "2"}, {"scv/memory": "999999"}]
    pods += [{"scv/number": str(number)} for number in range(1, 10)]
    pods += [{"scv/clock": str(card["clock"])} for card in facts["cardList"] if card.get("clock")][:1]
    return pods


@pytest.fixture(scope="module")
def published(request):
    """{scenario: (facts, the Scv we publish)} for every scenario, read through the simulator."""
    import os
    from harness.paths import scenario_path

    result = {}
    saved = os.environ.get("NVMLSIM_CONFIG")
    try:
        for name in SCENARIO_NAMES:
            os.environ["NVMLSIM_CONFIG"] = str(scenario_path(name))
            facts = collect(list(GATHER_SUBSETS))
            result[name] = (facts, {"metadata": {"name": name}, "status": desired_status(facts)})
    finally:
        if saved is None:
            os.environ.pop("NVMLSIM_CONFIG", None)
        else:
            os.environ["NVMLSIM_CONFIG"] = saved
    return result


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_yoda_never_crashes_and_admits_only_what_the_node_can_run(nvml_simulator, published, scenario):
    facts, scv = published[scenario]
    cluster = [other for _facts, other in published.values()]
    usable = [card for card in facts["cardList"] if _usable(card)]
    for labels in _pods(facts):
        if not yoda.filter_node(labels, scv):
            continue
        wanted = yoda._uint(labels.get("scv/number", "1"))
        assert wanted <= len(usable), "Yoda admits a %d-card pod to %s, which has %d usable cards" % (
            wanted, scenario, len(usable))
        if "scv/memory" in labels:
            memory = yoda._uint(labels["scv/memory"])
            assert sum(1 for card in usable if card.get("freeMemory", 0) >= memory) >= wanted
        try:
            yoda.score_node(labels, scv, cluster, pods_on_node=[{"scv/memory": "512"}])
        except ZeroDivisionError:
            pytest.fail("Yoda's Score panics (integer divide by zero) on the Scv of %s for a pod labelled %s: %s"
                        % (scenario, labels, scv["status"]))


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_unusable_cards_are_published_apart_with_their_reasons(nvml_simulator, published, scenario):
    facts, scv = published[scenario]
    status = scv["status"]
    listed = status.get("cardList", [])
    apart = status.get("unhealthyCardList", [])
    assert sorted(card["id"] for card in listed + apart) == sorted(card["id"] for card in facts["cardList"])
    assert all(card["health"] == "Healthy" and card["totalMemory"] > 0 for card in listed)
    assert status.get("cardNumber", 0) == len(listed) == status.get("healthyCardNumber", 0)
    assert status.get("unhealthyCardNumber", 0) == len(apart)
    assert status.get("totalMemorySum", 0) == sum(card["totalMemory"] for card in listed)
    for card in apart:
        assert card.get("healthReasons") or not card.get("totalMemory"), card


def test_the_port_reproduces_yodas_crash_on_a_lost_card():
    """What SCV-style publishing of every card did: a lost card in cardList, counted, with no memory."""
    scv = {"status": {"cardNumber": 1, "cardList": [{"id": 0, "health": "Unhealthy"}]}}
    assert yoda.filter_node({}, scv)
    with pytest.raises(ZeroDivisionError):
        yoda.score_node({}, scv, [scv])
