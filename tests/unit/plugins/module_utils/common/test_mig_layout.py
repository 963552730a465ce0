"""MIG layouts: entries checked, GPUs matched, instances placed (pure functions)."""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.common.mig_layout import (
    LayoutError,
    assign,
    from_config,
    normalise,
    place,
)

# An H100 80GB's GPU instance profiles as its driver lists them (NVIDIA's MIG user guide).
H100 = {
    "1g.10gb": {"size": 1, "starts": [0, 1, 2, 3, 4, 5, 6], "instances": 7, "slices": 1},
    "1g.20gb": {"size": 2, "starts": [0, 2, 4, 6], "instances": 4, "slices": 1},
    "2g.20gb": {"size": 2, "starts": [0, 2, 4], "instances": 3, "slices": 2},
    "3g.40gb": {"size": 4, "starts": [0, 4], "instances": 2, "slices": 3},
    "4g.40gb": {"size": 4, "starts": [0], "instances": 1, "slices": 4},
    "7g.80gb": {"size": 8, "starts": [0], "instances": 1, "slices": 7},
}


def occupied(plan):
    slices = []
    for name, start in plan:
        slices.extend(range(start, start + H100[name]["size"]))
    return slices


@pytest.mark.parametrize("wanted", [
    {"1g.10gb": 7}, {"7g.80gb": 1}, {"3g.40gb": 2}, {"4g.40gb": 1, "3g.40gb": 1},
    {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}, {"2g.20gb": 3, "1g.10gb": 1}, {"1g.20gb": 3, "1g.10gb": 1},
    {"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, {"2g.20gb": 3, "1g.20gb": 1},
])
def test_layouts_that_fit_are_placed_without_overlap(wanted):
    plan = place(wanted, H100)
    assert plan is not None
    assert sorted(name for name, _start in plan) == sorted(n for n, c in wanted.items() for _copy in range(c))
    assert len(occupied(plan)) == len(set(occupied(plan)))
    assert all(start in H100[name]["starts"] for name, start in plan)


@pytest.mark.parametrize("wanted", [
    {"1g.10gb": 8}, {"4g.40gb": 2}, {"3g.40gb": 2, "1g.10gb": 2}, {"7g.80gb": 1, "1g.10gb": 1},
    {"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}, {"1g.20gb": 4, "1g.10gb": 1},
])
def test_layouts_that_do_not_fit_are_none(wanted):
    assert place(wanted, H100) is None


def test_an_unknown_profile_names_those_there_are():
    with pytest.raises(LayoutError, match=r"1g\.5gb: not a MIG profile of this GPU; it has 1g\.10gb, 1g\.20gb, "
                                          r"2g\.20gb, 3g\.40gb, 4g\.40gb, 7g\.80gb"):
        place({"1g.5gb": 1}, H100)


def test_entries_accept_either_spelling_and_drop_zero_counts():
    entries = normalise([{"devices": [0, 1], "mig_enabled": True, "mig_devices": {"1g.10gb": 7, "2g.20gb": 0}},
                         {"devices": "all", "device-filter": "0x233010DE", "mig-enabled": False}])
    assert entries[0] == {"devices": [0, 1], "device-filter": None, "mig-enabled": True,
                          "mig-devices": {"1g.10gb": 7}}
    assert entries[1]["device-filter"] == [0x233010DE]


@pytest.mark.parametrize("entries, says", [
    ([], "layout: a non-empty list of entries is needed"),
    ([{"devices": "some", "mig-enabled": True}], "layout[0].devices: 'some' is neither 'all' nor a list"),
    ([{"devices": [True], "mig-enabled": True}], "layout[0].devices"),
    ([{"mig-enabled": False, "mig-devices": {"1g.10gb": 1}}], "layout[0]: mig-devices are given but mig-enabled is false"),
    ([{"mig-enabled": True, "mig-devices": {"big": 1}}], "'big' is not a MIG GPU instance profile"),
    ([{"mig-enabled": True, "device-filter": ["H100"]}], "layout[0].device-filter: 'H100' is not a PCI device ID"),
    ([{"mig-enabled": True}, "all"], "layout[1]: an entry must be a mapping"),
    ([{"mig-enabled": True, "device-filter": {"0x233010DE": True}}],
     "layout[0].device-filter: {'0x233010DE': True} is an object, not a PCI device ID; give a string such as"),
    ([{"mig-enabled": True, "device-filter": [["0x233010DE"]]}],
     "layout[0].device-filter: ['0x233010DE'] is an array, not a PCI device ID"),
    ([{"mig-enabled": True, "device-filter": [None]}], "layout[0].device-filter: None is a null, not a PCI"),
    ([{"mig-enabled": True, "device-filter": True}], "layout[0].device-filter: True is a boolean, not a PCI"),
    ([{"mig-enabled": True, "device-filter": []}], "layout[0].device-filter: an empty list matches no GPU"),
    ([{"mig-enabled": True, "mig_enabled": False}],
     "layout[0]: mig-enabled is given twice (as mig-enabled and mig_enabled); give it once"),
    ([{"mig-enabled": True, "mig_devices": {}, "mig-devices": {"1g.10gb": 7}}], "mig-devices is given twice"),
])
def test_bad_entries_are_named(entries, says):
    with pytest.raises(LayoutError, match=None) as caught:
        normalise(entries)
    assert says in str(caught.value)


GPUS = [{"index": 0, "deviceId": 0x233010DE}, {"index": 1, "deviceId": 0x20B010DE}]


def test_gpus_are_assigned_by_index_and_device_filter():
    entries = normalise([{"devices": "all", "device-filter": ["0x233010DE"], "mig-enabled": True},
                         {"devices": [1], "mig-enabled": False}])
    chosen, idle = assign(entries, GPUS)
    assert chosen[0]["mig-enabled"] is True and chosen[1]["mig-enabled"] is False and idle == []


def test_an_entry_that_names_no_gpu_is_reported_and_a_layout_that_names_none_is_refused():
    entries = normalise([{"device-filter": "0x20B210DE", "mig-enabled": True},
                         {"devices": "all", "device-filter": ["0x233010DE"], "mig-enabled": False}])
    chosen, idle = assign(entries, GPUS)
    assert sorted(chosen) == [0] and idle == [0]
    with pytest.raises(LayoutError) as caught:
        assign(entries[:1], GPUS)
    assert str(caught.value) == (
        "The layout names no GPU of this host, so nothing would be laid out: its device-filter names 0x20B210DE; "
        "this host's GPUs are 0 (0x233010DE), 1 (0x20B010DE). Add their IDs, or name another layout.")
    with pytest.raises(LayoutError, match="the host has no GPUs"):
        assign(normalise([{"mig-enabled": False}]), [])


def test_a_config_names_its_layouts():
    config = {"version": "v1", "mig-configs": {"all-disabled": [{"devices": "all", "mig-enabled": False}]}}
    assert from_config(config, "all-disabled", "config.yaml")[0]["mig-enabled"] is False
    with pytest.raises(LayoutError, match="config.yaml has no layout 'x'; it has all-disabled"):
        from_config(config, "x", "config.yaml")
    with pytest.raises(LayoutError, match="version 'v2' is not supported"):
        from_config(dict(config, version="v2"), "all-disabled", "config.yaml")
    with pytest.raises(LayoutError, match="config.yaml: mig-configs.bad\\[0\\].mig-enabled"):
        from_config({"mig-configs": {"bad": [{"devices": "all"}]}}, "bad", "config.yaml")
