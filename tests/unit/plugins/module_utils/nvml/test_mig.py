"""A MIG layout applied to GPUs (nvml.mig's survey, plan and apply), on stand-in GPUs that record each call."""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.common.mig_layout import LayoutError, normalise
from ansible_collections.scv.gpu.plugins.module_utils.nvml.mig import (
    RESET_REQUIRED,
    SUCCESS,
    MigError,
    lay_out,
    plan_for,
    survey,
)

H100_ID = 0x233010DE
H100 = {
    "1g.10gb": {"id": 19, "size": 1, "starts": [0, 1, 2, 3, 4, 5, 6], "instances": 7, "slices": 1},
    "3g.40gb": {"id": 9, "size": 4, "starts": [0, 4], "instances": 2, "slices": 3},
    "7g.80gb": {"id": 0, "size": 8, "starts": [0], "instances": 1, "slices": 7},
}


class StandInGpu:
    """What lay_out asks of a MigGpu, with the driver's answers given and every change recorded."""

    def __init__(self, index, mode=(False, False), instances=(), pids=(), mode_status=SUCCESS, mig=True,
                 device_id=H100_ID, table=None, fail_create=False):
        self.index, self.name, self.uuid, self.device_id = index, "NVIDIA H100 80GB HBM3", "GPU-%d" % index, device_id
        self.table, self.fail_create = dict(H100) if table is None else table, fail_create
        self._mode = mode if mig else None
        self._instances = [{"id": n, "profile": profile, "start": start, "compute_instances": []}
                           for n, (profile, start) in enumerate(instances)]
        self.pids, self.mode_status, self.calls = list(pids), mode_status, []

    def mode(self):
        return self._mode

    def profiles(self):
        return dict(self.table) if self._mode and self._mode[0] else {}

    def instances(self, table):
        return list(self._instances)

    def processes(self):
        return self.pids

    def set_mode(self, enabled):
        self.calls.append(("set_mode", enabled))
        if self.mode_status == SUCCESS:
            self._mode = (enabled, enabled)
        else:
            self._mode = (self._mode[0], enabled)
        return self.mode_status

    def destroy(self, instances):
        self.calls.append(("destroy", sorted(instance["profile"] for instance in instances)))
        self._instances = []

    def create(self, table, plan):
        self.calls.append(("create", sorted(plan)))
        if self.fail_create:
            raise MigError("GPU %d: creating a 1g.10gb GPU instance at slice 0 failed: Insufficient Resources"
                           % self.index)
        self._instances = [{"id": n, "profile": profile, "start": start, "compute_instances": []}
                           for n, (profile, start) in enumerate(plan)]


def entries(*raw):
    return normalise(list(raw))


SEVEN = {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}


def test_a_gpu_that_matches_is_not_touched():
    gpu = StandInGpu(0, mode=(True, True), instances=[("1g.10gb", start) for start in range(7)])
    [report] = lay_out(entries(SEVEN), [gpu])
    assert report["changed"] is False and report["pending"] is False and gpu.calls == []
    assert report["before"] == report["after"] == {"mig-enabled": True, "mig-devices": {"1g.10gb": 7}}


def test_a_gpu_that_differs_loses_its_instances_and_gets_the_layout():
    gpu = StandInGpu(0, mode=(True, True), instances=[("3g.40gb", 0), ("3g.40gb", 4)])
    [report] = lay_out(entries(SEVEN), [gpu])
    assert report["changed"] is True and report["pending"] is False
    assert report["before"] == {"mig-enabled": True, "mig-devices": {"3g.40gb": 2}}
    assert gpu.calls == [("destroy", ["3g.40gb", "3g.40gb"]), ("create", [("1g.10gb", n) for n in range(7)])]


def test_mig_mode_is_turned_on_then_the_instances_are_planned_from_the_new_profiles():
    gpu = StandInGpu(0, mode=(False, False))
    [report] = lay_out(entries(SEVEN), [gpu])
    assert report["before"] == {"mig-enabled": False, "mig-devices": {}} and report["changed"] is True
    assert gpu.calls == [("set_mode", True), ("create", [("1g.10gb", n) for n in range(7)])]


def test_a_mode_change_waiting_for_a_reset_is_pending_and_creates_nothing():
    gpu = StandInGpu(0, mode=(False, False), mode_status=RESET_REQUIRED)
    [report] = lay_out(entries(SEVEN), [gpu])
    assert report["pending"] is True and gpu.calls == [("set_mode", True)]


def test_a_pending_mode_change_counts_as_a_change_even_when_the_state_matches():
    gpu = StandInGpu(0, mode=(False, True))
    [report] = lay_out(entries({"devices": "all", "mig-enabled": False}), [gpu])
    assert report["changed"] is True and gpu.calls == [("set_mode", False)]


def test_check_mode_reports_the_change_and_changes_nothing():
    gpu = StandInGpu(0, mode=(True, True), instances=[("7g.80gb", 0)])
    [report] = lay_out(entries(SEVEN), [gpu], check_mode=True)
    assert report["changed"] is True and report["pending"] is False and gpu.calls == []


def test_busy_gpus_are_named_and_no_gpu_changes():
    idle, busy = StandInGpu(0), StandInGpu(1, pids=[4242, 4343])
    with pytest.raises(MigError) as caught:
        lay_out(entries(SEVEN), [idle, busy])
    assert "GPU 1 (NVIDIA H100 80GB HBM3): PIDs 4242, 4343" in str(caught.value)
    assert "nothing was changed" in str(caught.value)
    assert idle.calls == [] and busy.calls == []


def test_a_busy_gpu_that_would_not_change_is_no_obstacle():
    gpu = StandInGpu(0, mode=(True, True), instances=[("1g.10gb", start) for start in range(7)], pids=[1])
    assert lay_out(entries(SEVEN), [gpu])[0]["changed"] is False


def test_only_the_gpus_an_entry_names_are_reported():
    gpus = [StandInGpu(0), StandInGpu(1)]
    report = lay_out(entries({"devices": [1], "mig-enabled": False}), gpus)
    assert [gpu["index"] for gpu in report] == [1]


def test_a_gpu_without_mig_is_refused_when_mig_is_asked_for():
    with pytest.raises(LayoutError, match=r"GPU 0 \(NVIDIA H100 80GB HBM3\) cannot do MIG"):
        survey(StandInGpu(0, mig=False), entries(SEVEN)[0])


def test_a_plan_that_does_not_fit_or_names_an_unknown_profile_names_the_gpu():
    gpu = StandInGpu(0)
    with pytest.raises(LayoutError, match=r"GPU 0 \(NVIDIA H100 80GB HBM3\): 2 x 7g.80gb do not fit on one GPU"):
        plan_for(gpu, {"7g.80gb": 2}, H100)
    with pytest.raises(LayoutError, match=r"^GPU 0 \(NVIDIA H100 80GB HBM3\): .*2g\.20gb"):
        plan_for(gpu, {"2g.20gb": 1}, H100)


@pytest.mark.parametrize("wanted, says", [
    ({"4g.40gb": 2}, r"GPU 0 \(NVIDIA H100 80GB HBM3\): 2 x 4g.40gb do not fit on one GPU"),
    ({"1g.5gb": 7}, r"1g\.5gb: not a MIG profile of this GPU; it has 1g\.10gb, 1g\.10gb\+me, 1g\.20gb, 2g\.20gb"),
])
def test_a_layout_that_cannot_finish_on_a_gpu_with_mig_off_changes_nothing(wanted, says):
    gpus = [StandInGpu(0), StandInGpu(1)]
    for check_mode in (True, False):
        with pytest.raises(LayoutError, match=says):
            lay_out(entries({"devices": "all", "mig-enabled": True, "mig-devices": wanted}), gpus, check_mode)
    assert [gpu.calls for gpu in gpus] == [[], []]
    assert [gpu.mode() for gpu in gpus] == [(False, False)] * 2


def test_a_card_whose_profiles_are_unknown_needs_mig_mode_on_first():
    gpu = StandInGpu(0, device_id=0x26B510DE)
    with pytest.raises(LayoutError) as caught:
        lay_out(entries(SEVEN), [gpu])
    assert "PCI device 0x26B510DE) are not in the collection's table" in str(caught.value)
    assert "Turn MIG mode on first (an entry with mig-enabled: true and no mig-devices)" in str(caught.value)
    assert gpu.calls == []
    [report] = lay_out(entries({"devices": "all", "mig-enabled": True}), [gpu])     # the first step it names
    assert report["changed"] and gpu.calls == [("set_mode", True)]
    [report] = lay_out(entries(SEVEN), [gpu])                                         # then the driver's table
    assert gpu.calls[-1] == ("create", [("1g.10gb", n) for n in range(7)])


def test_a_failure_part_way_names_the_gpus_changed_and_how_to_restore_them():
    done, failing, untouched = (StandInGpu(0, mode=(True, True), instances=[("7g.80gb", 0)]),
                                StandInGpu(1, mode=(True, True), instances=[("3g.40gb", 0)], fail_create=True),
                                StandInGpu(2))
    layout = entries(SEVEN)
    with pytest.raises(MigError) as caught:
        lay_out(layout, [done, failing, untouched])
    error = caught.value
    assert str(error) == (
        "The MIG layout stopped part-way: GPU 1: creating a 1g.10gb GPU instance at slice 0 failed: Insufficient "
        "Resources. GPUs changed: GPU 0 from MIG on with 1 x 7g.80gb to MIG on with 7 x 1g.10gb; GPU 1 from MIG on "
        "with 1 x 3g.40gb to MIG on with no instances. Left as they were: none. To put the changed GPUs back, run "
        "scv.gpu.mig_layout with layout: [{\"devices\": [0], \"mig-enabled\": true, \"mig-devices\": "
        "{\"7g.80gb\": 1}}, {\"devices\": [1], \"mig-enabled\": true, \"mig-devices\": {\"3g.40gb\": 1}}]")
    assert untouched.calls == []
    assert [gpu["index"] for gpu in error.report] == [0, 1] and "Insufficient Resources" in error.report[1]["failed"]
    assert error.restore == [{"devices": [0], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}},
                             {"devices": [1], "mig-enabled": True, "mig-devices": {"3g.40gb": 1}}]


def test_a_driver_whose_profiles_differ_from_the_table_stops_with_the_mode_change_named():
    gpu = StandInGpu(0, table={"7g.80gb": H100["7g.80gb"]})
    with pytest.raises(MigError) as caught:
        lay_out(entries(SEVEN), [gpu])
    assert "differ from the collection's table" in str(caught.value)
    assert "GPU 0 from MIG off to MIG on with no instances" in str(caught.value)
    assert caught.value.restore == [{"devices": [0], "mig-enabled": False, "mig-devices": {}}]


def test_an_entry_that_names_no_gpu_is_warned_of():
    said = []
    lay_out(entries({"devices": [0], "mig-enabled": False}, {"device-filter": "0x20B010DE", "mig-enabled": True}),
            [StandInGpu(0)], warn=said.append)
    assert said == ["layout[1] names no GPU of this host (its devices or device-filter match none); it was skipped"]
