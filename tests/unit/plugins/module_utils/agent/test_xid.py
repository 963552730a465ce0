"""The XID table: what an XID calls for, and the site's own choices."""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent.xid import (
    APPLICATION_XIDS,
    XID_TABLE,
    action_for,
    parse_actions,
    reason_for,
)


@pytest.mark.parametrize("xid, action", [(48, "reset"), (63, "reset"), (64, "reset"), (74, "reset"), (79, "reboot"),
                                         (92, "reset"), (94, "reset"), (95, "reset"), (13, "none"), (9999, "reset")])
def test_the_table(xid, action):
    assert action_for(xid) == action


def test_the_default_is_nvidias_device_plugin_policy():
    """Every critical XID makes the card unhealthy but NVIDIA's application errors (health.go); 79 wants a reboot."""
    actions = {xid: action_for(xid) for xid in range(1, 1000)}
    assert {xid for xid, action in actions.items() if action == "none"} == {13, 31, 43, 45, 68, 109}
    assert {xid for xid, action in actions.items() if action == "reboot"} == {79}
    assert set(actions.values()) == {"none", "reset", "reboot"}
    assert APPLICATION_XIDS == (13, 31, 43, 45, 68, 109)
    assert {xid: action for xid, (_meaning, action) in XID_TABLE.items()} == {
        13: "none", 31: "none", 43: "none", 45: "none", 48: "reset", 61: "reset", 62: "reset", 63: "reset",
        64: "reset", 68: "none", 74: "reset", 79: "reboot", 92: "reset", 94: "reset", 95: "reset", 109: "none",
        119: "reset", 120: "reset"}


def test_reasons_say_what_happened_and_what_to_do():
    assert reason_for(79, "2026-11-22T10:00:00Z") == (
        "XID 79 at 2026-11-22T10:00:00Z: GPU has fallen off the bus; reboot the node")
    assert reason_for(48, "t") == "XID 48 at t: double-bit ECC error; reset the GPU or reboot the node"
    assert reason_for(109, "t") is None
    assert reason_for(5555, "t") == ("XID 5555 at t: a critical XID error not among the application's own; "
                                     "reset the GPU or reboot the node")
    assert reason_for(5555, "t", {5555: "none"}) is None


def test_site_choices_override_the_table():
    actions = parse_actions(["79=none", " 31 = reset "])
    assert actions == {79: "none", 31: "reset"}
    assert reason_for(79, "t", actions) is None
    assert action_for(31, actions) == "reset"


@pytest.mark.parametrize("item", ["79", "x=reset", "79=drain", "=none"])
def test_bad_choices_are_refused_by_name(item):
    with pytest.raises(ValueError, match="bad XID action"):
        parse_actions([item])


def test_every_entry_is_well_formed():
    assert all(action in ("none", "reset", "reboot") and text for text, action in XID_TABLE.values())
