"""The sharing filters: what the device_plugin role's tasks call, with unset variables as Ansible passes them."""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.filter.sharing_problems import FilterModule

FILTERS = FilterModule().filters()
CONFIGS = {"ts-4": {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}},
           "mps-2": {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}}


def test_the_filters_take_unset_values_as_empty():
    assert FILTERS["sharing_problems"]({}, "none", None, None) == []
    assert FILTERS["sharing_problems"](None) == []
    assert FILTERS["sharing_configs"](None) == {}
    assert FILTERS["sharing_default"](None, None) == ""
    assert FILTERS["sharing_mps"](None, None) is False
    assert FILTERS["sharing_host_problems"](None, None, {}, "n") == []


def test_the_filters_pass_their_arguments_on():
    assert FILTERS["sharing_problems"](CONFIGS, "none", "ts-4", "ts-8")[0].startswith("device_plugin_config: 'ts-8'")
    assert FILTERS["sharing_problems"](CONFIGS, "none", "ts-4", "", "gke")[0].endswith("device_plugin_configs empty")
    assert FILTERS["sharing_configs"](CONFIGS, "single")["ts-4"]["flags"] == {"migStrategy": "single"}
    assert FILTERS["sharing_default"]({"ts-4": {}}, "") == "ts-4"
    assert FILTERS["sharing_mps"](CONFIGS, ["ts-4", "mps-2"]) is True
    assert FILTERS["sharing_mps"](CONFIGS, ["ts-4"]) is False
    fact = {"cardList": [{"computeCapability": "8.0", "migEnabled": True}]}
    assert FILTERS["sharing_host_problems"](CONFIGS, "mps-2", fact, "gpu-1")[0].startswith("node gpu-1: config 'mps-2'")
