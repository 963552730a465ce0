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

from harness.paths import ROOT


def plugin_ignored_xids():
    """The XIDs NVIDIA's device plugin keeps a device healthy for (tests/fixtures/device-plugin-health)."""
    text = (ROOT / "tests" / "fixtures" / "device-plugin-health" / "ignored-xids.txt").read_text()
    return {int(line) for line in text.splitlines() if line and not line.startswith("#")}


def test_the_default_marks_a_card_as_nvidias_device_plugin_does():
    """Every XID but the application's own makes the card unhealthy, as the device plugin's health check does;
    of those, a card fallen off the bus (79) wants the node rebooted, every other one a GPU reset."""
    actions = {xid: action_for(xid) for xid in range(1, 1000)}
    assert {xid for xid, action in actions.items() if action == "none"} == plugin_ignored_xids()
    assert {xid for xid, action in actions.items() if action == "reboot"} == {79}
    assert set(actions.values()) == {"none", "reset", "reboot"}
    assert action_for(99999) == "reset"                     # an XID newer than the table


def test_the_xids_the_table_calls_the_applications_are_those_it_leaves_healthy():
    assert set(APPLICATION_XIDS) == {xid for xid, (_meaning, action) in XID_TABLE.items() if action == "none"}


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
