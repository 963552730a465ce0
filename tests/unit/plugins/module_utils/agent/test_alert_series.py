"""The series alert rules read beside the DCGM ones: clock event reasons, the recovery action, the Fabric Manager
status, lost cards, critical XIDs held under the XID policy, and when the agent last published its Scv."""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent.metrics import families, fabric_manager_status
from ansible_collections.scv.gpu.plugins.module_utils.agent.xid import XidPolicy
from ansible_collections.scv.gpu.plugins.module_utils.nvml.xid_events import XidLog


def series(snapshot):
    return {name: (kind, names, rows) for name, kind, _text, names, rows in families(snapshot)}


def snapshot(cards, **extra):
    found = {"node": "node-1", "facts": {"cardList": cards}, "last_xids": {}, "counters": {}}
    found.update(extra)
    return found


COMPLETED = {"state": "completed", "status": "Success", "cliqueId": 0}


@pytest.mark.parametrize("fabric, status", [
    (None, 0),                                               # a PCIe card, or before Hopper: not supported
    ({"state": "not started"}, 1),
    ({"state": "in progress"}, 2),
    (COMPLETED, 3),
    (dict(COMPLETED, status="Insufficient Resources"), 4),   # completed with an error status: a failure
])
def test_fabric_manager_status_takes_dcgms_values(fabric, status):
    card = {"id": 0} if fabric is None else {"id": 0, "fabric": fabric}
    assert fabric_manager_status(card) == status
    kind, _names, rows = series(snapshot([card]))["DCGM_FI_DEV_FABRIC_MANAGER_STATUS"]
    assert kind == "gauge" and [value for _labels, value in rows] == [status]


def test_clock_event_reasons_and_recovery_action_are_served_as_read():
    cards = [{"id": 0, "uuid": "GPU-0", "clockEventReasons": 0x40, "recoveryAction": 2}, {"id": 1, "uuid": "GPU-1"}]
    found = series(snapshot(cards))
    assert [(labels[0], value) for labels, value in found["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"][2]] == [("0", 0x40)]
    assert [(labels[0], value) for labels, value in found["DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"][2]] == [("0", 2)]


def test_lost_cards_and_critical_xids_are_per_card():
    cards = [{"id": 0, "uuid": "GPU-0"}, {"id": 1, "uuid": "GPU-1"}]
    found = series(snapshot(cards, lost=frozenset([1]), critical_xids={0: 48}))
    assert found["scv_gpu_lost"][2] == [(["node-1", "0", "GPU-0"], 0), (["node-1", "1", "GPU-1"], 1)]
    assert found["scv_gpu_critical_xid"][2] == [(["node-1", "0", "GPU-0"], 48), (["node-1", "1", "GPU-1"], 0)]
    assert found["scv_gpu_lost"][1] == ("node", "gpu", "uuid")


def test_the_published_time_is_served_once_known():
    assert "scv_agent_scv_last_published_timestamp_seconds" not in series(snapshot([]))
    kind, names, rows = series(snapshot([], published_at=1764150000.5))["scv_agent_scv_last_published_timestamp_seconds"]
    assert (kind, names, rows) == ("gauge", (), [((), 1764150000.5)])


def test_critical_takes_the_last_xid_that_calls_for_something_within_the_hold():
    now = [1000.0]
    log = XidLog(lambda: now[0])
    policy = XidPolicy(hold_s=600)
    assert policy.critical(log, 0, now[0]) == 0
    log.add(0, 48)
    log.add(0, 79)          # the last one counts
    log.add(0, 13)          # the application's own fault: it calls for nothing
    assert policy.critical(log, 0, now[0]) == 79
    assert policy.critical(log, 1, now[0]) == 0
    assert XidPolicy({79: "none"}, hold_s=600).critical(log, 0, now[0]) == 48   # a site's own choice
    assert XidPolicy({48: "none", 79: "none"}, hold_s=600).critical(log, 0, now[0]) == 0
    now[0] += 601
    assert policy.critical(log, 0, now[0]) == 0   # past the hold
