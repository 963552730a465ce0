"""The agent's NVML session, through the real pynvml.

A Session keeps NVML initialised and reads each card's static readings once; these tests count
the simulator's calls to show what a read asks, and change the scenario file under a running
session to show when it starts again.
"""

from __future__ import annotations

import json

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent.metrics import served_fields
from ansible_collections.scv.gpu.plugins.module_utils.agent.xid import XidPolicy
from ansible_collections.scv.gpu.plugins.module_utils.nvml.api import (
    GPM_ANY_TENSOR_UTIL,
    GPM_DRAM_BW_UTIL,
    GPM_GRAPHICS_UTIL,
    pynvml,
)
from ansible_collections.scv.gpu.plugins.module_utils.nvml.collect import collect
from ansible_collections.scv.gpu.plugins.module_utils.nvml.session import SYSTEM_CHECK_S
from ansible_collections.scv.gpu.plugins.module_utils.common.gpu_info import GATHER_SUBSETS

from harness import scenario_expectations as expected
from harness.common import replace_json as write
from harness.paths import scenario_path

ALL = list(GATHER_SUBSETS)

# What a session asks only when it reads the static readings (once, then every 10 minutes).
STATIC_CALLS = ("nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetEccMode",
                "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetName",
                "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetPciInfo_v3", "nvmlInitWithFlags")


@pytest.mark.parametrize("scenario", sorted(expected.BY_SCENARIO))
def test_a_session_reads_what_collect_reads_first_and_later(nvml_simulator, session, scenario):
    nvml_simulator.use(scenario)
    for _read in range(3):
        assert session.read(ALL) == expected.BY_SCENARIO[scenario]


def test_static_readings_are_read_once_per_session(nvml_simulator, session):
    nvml_simulator.use("h100_sxm_x8")
    session.read(["telemetry"])
    nvml_simulator.reset_calls()
    for _read in range(5):
        session.read(["telemetry"])
    for function in STATIC_CALLS:
        assert nvml_simulator.calls_of(function) == 0, function
    assert nvml_simulator.calls_of("nvmlDeviceGetMemoryInfo_v2") == 5 * 8
    assert nvml_simulator.calls_of("nvmlDeviceGetTemperature") == 5 * 8
    # The H100s do not support retired pages: asked once, not at every read.
    assert nvml_simulator.calls_of("nvmlDeviceGetRetiredPagesPendingStatus") == 0
    assert (session.inits, session.static_reads) == (1, 1)


def test_a_read_costs_under_a_millisecond_of_nvml_per_gpu_on_the_real_cost_model(nvml_simulator, session):
    nvml_simulator.use("h100_sxm_x8")
    nvml_simulator.latency("real")
    nvml_simulator.reset_calls()
    session.read(["telemetry"])
    first = nvml_simulator.spent_ms()
    nvml_simulator.reset_calls()
    session.read(["telemetry"])
    per_gpu = nvml_simulator.spent_ms() / 8
    assert first > 8 * 10.72       # init and every GPU's attach
    assert per_gpu < 1.0, per_gpu


def test_static_readings_are_read_again_after_the_refresh_period(scenario_file, session):
    path, data = scenario_file("titan_xp")
    assert session.read([])["cardList"][0]["clock"] == 5705
    data["devices"][0]["maxClocks"]["memory"] = 5000
    data["devices"][0]["memory"]["free"] = 2 ** 30
    write(path, data)
    card = session.read([])["cardList"][0]
    assert (card["freeMemory"], card["clock"]) == (1024, 5705)   # memory at once, clocks later
    session.clock_control.now += 600
    assert session.read([])["cardList"][0]["clock"] == 5000
    assert (session.inits, session.static_reads) == (1, 2)


def test_mig_mode_turned_on_shows_at_the_next_read_after_a_refresh(scenario_file, session):
    """What mig_layout does under a running agent: the agent's reload calls refresh_static."""
    path, data = scenario_file("h100_mig_empty")
    data["devices"][0]["migMode"] = {"current": 0, "pending": 0}
    write(path, data)
    assert session.read(["mig"])["cardList"][0]["migEnabled"] is False
    data["devices"][0]["migMode"] = {"current": 1, "pending": 1}
    data["devices"][0]["migDevices"] = json.loads(scenario_path("h100_mig_all_1g").read_text())["devices"][0]["migDevices"]
    write(path, data)
    assert session.read(["mig"])["cardList"][0]["migEnabled"] is False      # static: not asked again yet
    session.refresh_static()
    card = session.read(["mig"])["cardList"][0]
    assert card["migEnabled"] is True and [device["profile"] for device in card["migDevices"]] == ["1g.10gb"] * 7
    assert (session.inits, session.static_reads) == (1, 2)


def test_a_changed_driver_version_starts_a_new_session(scenario_file, session):
    path, data = scenario_file("titan_xp")
    assert session.read([])["driver_version"] == "535.183.01"
    data["driverVersion"] = "550.54.15"
    data["devices"][0]["maxClocks"]["memory"] = 5000
    write(path, data)
    # the loaded library meets the new kernel module: the driver answers LIB_RM_VERSION_MISMATCH at once
    facts = session.read([])
    assert facts["driver_version"] == "550.54.15"
    assert facts["cardList"][0]["clock"] == 5000      # static readings read afresh
    assert session.inits == 2
    assert "version mismatch" in session.last_reinit_reason


def test_a_changed_gpu_count_starts_a_new_session(scenario_file, session):
    path, data = scenario_file("h100_sxm_x8")
    assert session.read([])["cardNumber"] == 8
    del data["devices"][7]
    write(path, data)
    session.read([])                  # GPU 7 answers no more (a removed GPU says it is lost)
    session.clock_control.now += SYSTEM_CHECK_S
    assert session.read([])["cardNumber"] == 7
    assert session.inits == 2
    assert session.last_reinit_reason == "the GPU count changed from 8 to 7"


@pytest.mark.parametrize("error", ["UNINITIALIZED", "LIB_RM_VERSION_MISMATCH", "DRIVER_NOT_LOADED"])
def test_a_session_ending_answer_starts_a_new_session_within_the_same_read(scenario_file, session, error):
    path, data = scenario_file("titan_xp")
    session.read([])
    data["devices"][0]["errors"] = {"nvmlDeviceGetMemoryInfo": {"error": error, "times": 1}}
    write(path, data)
    facts = session.read([])
    assert facts["cardList"][0]["health"] == "Healthy", facts
    assert facts["cardList"][0]["freeMemory"] == 11950
    assert session.inits == 2
    assert session.read([])["cardList"][0]["health"] == "Healthy"
    assert session.inits == 2


def test_a_session_ending_answer_that_stays_is_reported_not_retried_forever(scenario_file, session):
    path, data = scenario_file("titan_xp")
    session.read([])
    data["devices"][0]["errors"] = {"nvmlDeviceGetMemoryInfo": "LIB_RM_VERSION_MISMATCH"}
    write(path, data)
    facts = session.read([])
    assert facts["nvml_available"] is False
    assert "RM has detected an NVML/RM version mismatch" in facts["nvml_error"]
    assert facts["cardList"] == [] and facts["cardNumber"] == 0
    assert session.inits == 2      # one new session per read, not a loop


def test_a_lost_gpu_starts_a_new_session_then_backs_off(scenario_file, session):
    path, data = scenario_file("lost_card")
    facts = session.read([])
    assert facts["cardList"][2]["healthReasons"] == [expected.LOST]
    assert session.inits == 1
    session.read([])                               # the next read starts anew
    assert session.inits == 2
    session.read([])                               # still lost: wait 1 s before the next
    assert session.inits == 2
    session.clock_control.now += 1
    session.read([])
    assert session.inits == 3
    session.clock_control.now += 1
    session.read([])                               # then 2 s
    assert session.inits == 3
    del data["devices"][2]["errors"]               # the card was reset
    write(path, data)
    session.clock_control.now += 1
    facts = session.read([])
    assert session.inits == 4
    assert facts["cardList"][2]["health"] == "Healthy"
    session.clock_control.now += 5
    session.read([])
    assert session.inits == 4                      # healthy again: no more new sessions


def test_a_card_lost_under_a_session_keeps_its_identity_in_the_next(scenario_file, session):
    """One fault, one change: the new session cannot read the lost card's UUID, and still names it."""
    path, data = scenario_file("h100_sxm_x8")
    healthy = session.read([])["cardList"][0]
    data["devices"][0]["errors"] = {"*": "GPU_IS_LOST"}
    write(path, data)
    first = session.read([])["cardList"][0]
    second = session.read([])["cardList"][0]        # a new session: the card answers nothing
    assert session.inits == 2
    assert first == second and first["health"] == "Unhealthy"
    for key in ("uuid", "pciBusId", "model", "clock", "power"):
        assert second[key] == healthy[key]
    assert "freeMemory" not in second               # only what it told before, nothing read now
    del data["devices"][0]["errors"]
    write(path, data)
    session.clock_control.now += 1
    assert session.read([])["cardList"][0]["health"] == "Healthy"


def test_a_lost_card_is_not_named_after_the_gpu_count_changed(scenario_file, session):
    path, data = scenario_file("h100_sxm_x8")
    session.read([])
    data["devices"][0]["errors"] = {"*": "GPU_IS_LOST"}
    write(path, data)
    assert session.read([])["cardList"][0]["uuid"]
    data["devices"].pop()                           # a GPU gone as well: the indexes may mean other cards
    write(path, data)
    card = session.read([])["cardList"][0]
    assert session.inits == 2 and "uuid" not in card and card["health"] == "Unhealthy"


def test_a_static_query_that_failed_is_asked_again(scenario_file, session):
    path, data = scenario_file("titan_xp")
    data["devices"][0]["errors"] = {"nvmlDeviceGetMaxClockInfo": {"error": "UNKNOWN", "times": 1}}
    write(path, data)
    card = session.read([])["cardList"][0]
    assert card["health"] == "Unhealthy" and "maximum memory clock" in card["healthReasons"][0]
    card = session.read([])["cardList"][0]
    assert (card["health"], card["clock"]) == ("Healthy", 5705)


def test_gather_subset_min_asks_nothing_it_does_not_return(nvml_simulator):
    nvml_simulator.use("a100_mig")
    nvml_simulator.reset_calls()
    facts = collect([])
    for function in ("nvmlDeviceGetTemperature", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage",
                     "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex",
                     "nvmlDeviceGetComputeRunningProcesses_v3"):
        assert nvml_simulator.calls_of(function) == 0, function
    card = facts["cardList"][0]
    assert not {"temperature", "migEnabled", "migDevices", "processCount"} & set(card)


def test_a_session_reports_every_health_reason_at_every_read(nvml_simulator, session):
    nvml_simulator.use("health_reasons")
    once = collect(ALL)
    for _read in range(3):
        facts = session.read(ALL)
        assert [card["healthReasons"] for card in facts["cardList"]] == expected.HEALTH_REASONS
        assert facts == once


def test_a_waiter_that_found_nvml_closed_waits_on_events_as_soon_as_a_session_starts(scenario_file, session):
    """The agent's waiter starts before the first read: it must not sleep out its whole wait (an XID in
    that time would reach the agent only after it), but wait on NVML's events once NVML is initialised."""
    import threading
    import time

    path, data = scenario_file("h100_sxm_x8")
    events = []

    def wait():   # as the agent's waiter does: wait after wait, 5 s each
        deadline = time.monotonic() + 10
        while not events and time.monotonic() < deadline:
            event = session.wait_event(5000)
            if event is not None:
                events.append((time.monotonic(), event))

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)
    session.read([])
    data["devices"][4]["xids"] = [{"xid": 48, "afterMs": 0}]
    write(path, data)
    written = time.monotonic()
    waiter.join(timeout=15)
    assert events and events[0][1] == (4, 48)
    assert events[0][0] - written < 1.0


def test_an_xid_event_wakes_the_waiter_and_is_logged_for_its_card(scenario_file, session):
    path, data = scenario_file("h100_sxm_x8")
    session.read([])
    assert session.wait_event(200) is None                 # nothing happened: the wait times out
    data["devices"][4]["xids"] = [{"xid": 48, "afterMs": 0}, {"xid": 31, "afterMs": 0}]
    write(path, data)
    assert session.wait_event(2000) == (4, 48)
    assert session.wait_event(2000) == (4, 31)
    assert [(record.xid, record.at[:2]) for record in session.xids.kept(4)] == [(48, "20"), (31, "20")]
    assert session.xids.last() == {4: 31}
    card = session.read([])["cardList"][4]
    assert card["health"] == "Healthy"                     # the session logs XIDs; policy is the agent's
    # the agent's policy: 48 calls for a reset, 31 (the application's page fault) for nothing; hold 600 s
    policy = XidPolicy()
    facts = policy.apply(session.read([]), session.xids, session.clock())
    card = facts["cardList"][4]
    assert card["health"] == "Unhealthy"
    assert len(card["healthReasons"]) == 1 and card["healthReasons"][0].startswith("XID 48 at ")
    session.clock_control.now += 600
    assert policy.apply(session.read([]), session.xids, session.clock())["cardList"][4]["health"] == "Healthy"
    assert session.xids.kept(4) == []                      # dropped for good once past the hold
    assert session.xids.last() == {4: 31}                  # DCGM's XID_ERRORS: the last XID stays
    session.close()
    assert session.xids.kept(4) == [] and session.xids.last() == {4: 31}   # a new session keeps it too


def test_an_xid_from_a_card_that_no_longer_answers_is_still_placed(scenario_file, session):
    path, data = scenario_file("h100_sxm_x8")
    session.read([])
    assert session.wait_event(100) is None                 # the event set is registered now
    data["devices"][3]["xids"] = [{"xid": 79, "afterMs": 0}]
    data["devices"][3]["errors"] = {"*": "GPU_IS_LOST"}
    write(path, data)
    assert session.wait_event(2000) == (3, 79)
    policy = XidPolicy()
    card = policy.apply(session.read([]), session.xids, session.clock())["cardList"][3]
    assert card["healthReasons"][0] == expected.LOST and card["healthReasons"][1].startswith("XID 79 at ")
    # The next read starts a new session (the card is lost): the card is told exactly as before, XID included,
    # so one fault is one change of the Scv and of the Node condition.
    again = policy.apply(session.read([]), session.xids, session.clock())["cardList"][3]
    assert session.inits == 2 and again == card
    # Reset: the card answers again, and its XID goes with the fault.
    del data["devices"][3]["errors"]
    write(path, data)
    session.clock_control.now += 1
    back = policy.apply(session.read([]), session.xids, session.clock())["cardList"][3]
    assert session.inits == 3 and back["health"] == "Healthy" and session.xids.kept(3) == []
    assert session.xids.last() == {3: 79}


def test_tensor_activity_comes_from_gpm_between_two_reads(scenario_file, session):
    path, data = scenario_file("h100_sxm_x8")
    data["devices"][0]["gpm"] = {"anyTensorUtil": 37}
    del data["devices"][1]["gpm"]
    write(path, data)
    first = session.read(["telemetry", "counters"])["cardList"]
    assert "tensorUtilization" not in first[0]              # GPM compares two samples
    assert "tensorUtilization" not in session.read(["telemetry", "counters"])["cardList"][0]   # not due yet
    session.clock_control.now += session.slow.interval_s
    cards = session.read(["telemetry", "counters"])["cardList"]
    assert cards[0]["tensorUtilization"] == 37
    assert "tensorUtilization" not in cards[1]              # no GPM on that card
    data["devices"][0]["gpm"] = {"anyTensorUtil": 80}
    write(path, data)
    assert session.read(["telemetry", "counters"])["cardList"][0]["tensorUtilization"] == 37   # kept between
    assert "tensorUtilization" not in session.read(["telemetry"])["cardList"][0]   # the counters subset only


def test_a_tick_asks_only_what_health_and_telemetry_need(nvml_simulator, session):
    """Between the counters' reads a tick asks no ECC count, remapped rows or persistence mode while the
    health readings are clear and no XID came, yet the card still shows all four counts as last read."""
    nvml_simulator.use("h100_sxm_x8")
    first = session.read(["telemetry", "counters"])["cardList"][0]["eccErrors"]
    nvml_simulator.reset_calls()
    card = session.read(["telemetry", "counters"])["cardList"][0]
    assert nvml_simulator.calls_of("nvmlDeviceGetTotalEccErrors") == 0
    assert nvml_simulator.calls_of("nvmlDeviceGetRemappedRows") == 0
    assert nvml_simulator.calls_of("nvmlDeviceGetMemoryInfo_v2") == 8
    assert nvml_simulator.calls_of("nvmlDeviceGetCurrentClocksEventReasons") == 8
    assert nvml_simulator.calls_of("nvmlDeviceGetPersistenceMode") == 0
    assert nvml_simulator.calls_of("nvmlDeviceGetCount_v2") == 0
    assert nvml_simulator.calls_of("nvmlGpmSampleGet") == 0
    every_count = {"uncorrectedVolatile", "uncorrectedAggregate", "correctedVolatile", "correctedAggregate"}
    assert card["eccErrors"] == first and set(first) == every_count
    assert card["persistenceMode"] is True


def test_on_demand_the_costly_counters_are_read_at_most_once_per_scrape(nvml_simulator, session):
    """With the agent's metrics on, after the first read the energy and GPM wait for a scrape as well as the
    interval: one scrape a minute at a 30 s interval reads them once a minute, and none reads them never."""
    nvml_simulator.use("h100_sxm_x8")
    session.slow.on_demand = True
    session.read(["telemetry", "counters"])
    assert session.slow.reads == 1                          # the first read takes them unasked
    for _minute in range(3):                                # nobody scrapes
        session.clock_control.now += 60
        session.read(["telemetry", "counters"])
    assert session.slow.reads == 1
    nvml_simulator.reset_calls()
    session.slow.ask()                                      # a scrape
    session.read(["telemetry", "counters"])
    assert session.slow.reads == 2 and nvml_simulator.calls_of("nvmlDeviceGetTotalEccErrors") == 32   # all four
    session.slow.ask()                                      # a second scrape within the interval waits for it
    session.read(["telemetry", "counters"])
    assert session.slow.reads == 2
    session.clock_control.now += session.slow.interval_s
    session.read(["telemetry", "counters"])
    assert session.slow.reads == 3
    session.slow.on_demand = False                          # the plain cadence: every interval, asked or not
    session.clock_control.now += session.slow.interval_s
    session.read(["telemetry", "counters"])
    assert session.slow.reads == 4


def test_gpm_metrics_cost_the_cold_figure_once_per_session_then_the_warm_one(tmp_path, nvml_simulator):
    """The H100: 5.79 ms for a process's first (cold) request of seven metrics, 6.1 us per metric warm."""
    data = json.loads(scenario_path("titan_xp").read_text())
    data["devices"][0]["gpm"] = {"anyTensorUtil": 42, "graphicsUtil": 50, "dramBwUtil": 7}
    write(tmp_path / "gpm.json", data)
    nvml_simulator.use(tmp_path / "gpm.json")
    nvml_simulator.latency("real")
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        samples = [pynvml.nvmlGpmSampleAlloc() for _twice in (1, 2)]
        for sample in samples:
            pynvml.nvmlGpmSampleGet(handle, sample)
        costs = []
        for _request in range(3):
            request = pynvml.c_nvmlGpmMetricsGet_t()
            request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = 5
            request.sample1, request.sample2 = samples
            for position, metric in enumerate((GPM_ANY_TENSOR_UTIL, GPM_GRAPHICS_UTIL, GPM_DRAM_BW_UTIL, 20, 21)):
                request.metrics[position].metricId = metric
            nvml_simulator.reset_calls()
            pynvml.nvmlGpmMetricsGet(request)
            costs.append(nvml_simulator.spent_ms())
        assert request.metrics[0].value == 42 and request.metrics[1].nvmlReturn == 0
        for sample in samples:
            pynvml.nvmlGpmSampleFree(sample)
    finally:
        pynvml.nvmlShutdown()
    assert costs[0] == pytest.approx(5.7881)
    assert costs[1:] == [pytest.approx(5 * 0.0061)] * 2


def test_the_recovery_action_is_asked_again_after_an_xid_not_at_every_read(scenario_file, session, nvml_simulator):
    """The driver sets a GPU recovery action only with an XID: while it reads 0 and no XID comes it is not
    asked (0.04 ms a card on an H100), except every SYSTEM_CHECK_S; once it is not 0 it is asked at every read."""
    path, data = scenario_file("h100_sxm_x8")
    session.read([])
    nvml_simulator.reset_calls()
    assert session.read([])["cardList"][2]["recoveryAction"] == 0
    assert nvml_simulator.calls_of("nvmlDeviceGetFieldValues") == 0

    data["devices"][2]["recoveryAction"] = 1      # NVML_GPU_RECOVERY_ACTION_GPU_RESET
    data["devices"][2]["xids"] = [{"xid": 154, "afterMs": 0}]
    write(path, data)
    assert session.read([])["cardList"][2]["recoveryAction"] == 0    # the XID has not been seen yet
    assert session.wait_event(1000) == (2, 154)
    nvml_simulator.reset_calls()
    card = session.read([])["cardList"][2]
    assert nvml_simulator.calls_of("nvmlDeviceGetFieldValues") == 8    # every card once, after an XID
    assert card["recoveryAction"] == 1 and card["health"] == "Unhealthy"
    assert any("reset" in reason.lower() for reason in card["healthReasons"]), card["healthReasons"]
    nvml_simulator.reset_calls()
    session.read([])
    assert nvml_simulator.calls_of("nvmlDeviceGetFieldValues") == 1    # the card that is not 0, at every read

    data["devices"][2]["recoveryAction"] = 0      # the GPU was reset
    write(path, data)
    nvml_simulator.reset_calls()
    assert session.read([])["cardList"][2]["health"] == "Healthy"
    assert nvml_simulator.calls_of("nvmlDeviceGetFieldValues") == 1    # only the card that was not 0
    nvml_simulator.reset_calls()
    session.read([])
    assert nvml_simulator.calls_of("nvmlDeviceGetFieldValues") == 0

    data["devices"][4]["recoveryAction"] = 2      # with no XID: seen at the next periodic check
    write(path, data)
    assert session.read([])["cardList"][4]["recoveryAction"] == 0
    session.clock_control.now += SYSTEM_CHECK_S
    assert session.read([])["cardList"][4]["recoveryAction"] == 2


def test_ecc_errors_and_row_remapping_are_seen_after_their_xid_and_asked_at_every_read_while_not_clear(
        scenario_file, session, nvml_simulator):
    """An uncorrectable ECC error comes with XID 48, 94 or 95, a row remapping with XID 63 or 64: while a
    card's count and rows read clear they are reused, asked again after any XID and every SYSTEM_CHECK_S;
    a card whose readings are not clear is asked at every read until they are."""
    path, data = scenario_file("h100_sxm_x8")
    session.read([])
    data["devices"][3]["ecc"]["uncorrectedVolatile"] = 2
    data["devices"][3]["remappedRows"].update(uncorrectable=1, pending=1)
    write(path, data)
    card = session.read([])["cardList"][3]
    assert card["health"] == "Healthy" and card["eccErrors"]["uncorrectedVolatile"] == 0   # no XID yet

    data["devices"][3]["xids"] = [{"xid": 94, "afterMs": 0}]
    write(path, data)
    assert session.wait_event(1000) == (3, 94)
    nvml_simulator.reset_calls()
    card = session.read([])["cardList"][3]
    assert nvml_simulator.calls_of("nvmlDeviceGetRemappedRows") == 8     # every card once, after an XID
    assert card["health"] == "Unhealthy" and card["eccErrors"]["uncorrectedVolatile"] == 2
    assert card["remappedRows"] == {"correctable": 0, "uncorrectable": 1, "pending": True, "failed": False}
    assert card["healthReasons"] == ["2 uncorrectable ECC errors since the driver loaded",
                                     "row remapping is pending: reset the GPU"]
    for _read in range(2):
        nvml_simulator.reset_calls()
        assert session.read([])["cardList"][3]["health"] == "Unhealthy"
        assert nvml_simulator.calls_of("nvmlDeviceGetRemappedRows") == 1   # the card that is not clear
        assert nvml_simulator.calls_of("nvmlDeviceGetTotalEccErrors") == 1

    data["devices"][3]["ecc"]["uncorrectedVolatile"] = 0    # the GPU was reset: volatile counts start at 0
    data["devices"][3]["remappedRows"]["pending"] = 0
    write(path, data)
    assert session.read([])["cardList"][3]["health"] == "Healthy"
    nvml_simulator.reset_calls()
    card = session.read([])["cardList"][3]
    assert nvml_simulator.calls_of("nvmlDeviceGetRemappedRows") == 0
    assert card["remappedRows"] == {"correctable": 0, "uncorrectable": 1, "pending": False, "failed": False}
    assert card["eccErrors"] == {"uncorrectedVolatile": 0}

    data["devices"][5]["remappedRows"]["failed"] = 1       # with no XID: seen at the next periodic check
    write(path, data)
    assert session.read([])["cardList"][5]["health"] == "Healthy"
    session.clock_control.now += SYSTEM_CHECK_S
    card = session.read([])["cardList"][5]
    assert card["healthReasons"] == ["row remapping failed: the GPU needs service"]


def test_a_card_with_any_health_reason_has_its_xid_driven_readings_asked_at_every_read(
        scenario_file, session, nvml_simulator):
    """A reason of another kind (here a thermal slowdown) does not make the reused readings wrong, but a
    card that is Unhealthy for any reason is read in full: nothing about it is taken on trust."""
    path, data = scenario_file("h100_sxm_x8")
    data["devices"][1]["clocksEventReasons"] = 0x20    # software thermal slowdown
    write(path, data)
    session.read([])
    nvml_simulator.reset_calls()
    card = session.read([])["cardList"][1]
    assert card["health"] == "Unhealthy"
    assert nvml_simulator.calls_of("nvmlDeviceGetRemappedRows") == 1
    assert nvml_simulator.calls_of("nvmlDeviceGetFieldValues") == 1


def test_counters_no_series_serves_are_not_read(scenario_file, session, nvml_simulator):
    """A counters file without the energy and profiling series: the energy field (4.3 ms a GPU on an H100)
    and GPM are not asked; the PCIe replay counter, still served, is."""
    path, data = scenario_file("h100_sxm_x8")
    for device in data["devices"]:
        device.update(fields={"83": 123456, "94": 0}, gpm={"anyTensorUtil": 42})
    write(path, data)
    session.slow.wanted = served_fields({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"})
    nvml_simulator.reset_calls()
    card = session.read(["counters"])["cardList"][0]
    assert "energyConsumption" not in card and "pcieReplayCount" in card
    assert nvml_simulator.calls_of("nvmlGpmSampleGet") == 0
    session.slow.wanted = None                   # every series served: everything is read
    session.clock_control.now += 60
    nvml_simulator.reset_calls()
    card = session.read(["counters"])["cardList"][0]
    assert card["energyConsumption"] == 123456
    assert nvml_simulator.calls_of("nvmlGpmSampleGet") == 8
