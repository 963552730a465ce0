"""What a tick reads and what a scrape reads: telemetry only when Prometheus asks, fresh, and kept between."""

from __future__ import annotations

import threading

from ansible_collections.scv.gpu.plugins.module_utils.agent.readings import TELEMETRY_KEYS, Readings
from ansible_collections.scv.gpu.plugins.module_utils.agent.xid import XidPolicy
from ansible_collections.scv.gpu.plugins.module_utils.nvml.session import Session


def test_ticks_read_no_telemetry_scrapes_read_it_fresh_and_ticks_keep_the_last(nvml_simulator):
    nvml_simulator.use("h100_sxm_x8")
    session = Session()
    session.slow.on_demand = True
    readings = Readings(session, XidPolicy(), metrics=True)
    try:
        readings.tick()
        nvml_simulator.reset_calls()
        card = readings.tick()["cardList"][0]
        assert nvml_simulator.calls_of("nvmlDeviceGetTemperature") == 0
        assert nvml_simulator.calls_of("nvmlDeviceGetUtilizationRates") == 0
        assert "temperature" not in card and card["freeMemory"] > 0       # nothing scraped yet: none kept
        readings.scrape()
        assert nvml_simulator.calls_of("nvmlDeviceGetTemperature") == 8 and readings.scrape_reads == 1
        scraped = readings.facts()["cardList"][0]
        assert {"temperature", "gpuUtilization", "powerDraw"} <= set(scraped)
        card = readings.tick()["cardList"][0]
        assert nvml_simulator.calls_of("nvmlDeviceGetTemperature") == 8     # the tick asked nothing more
        assert {key: card[key] for key in TELEMETRY_KEYS if key in card} == \
            {key: scraped[key] for key in TELEMETRY_KEYS if key in scraped}
        assert session.static_reads == 1      # a scrape's read and a tick's share the cards' static readings
    finally:
        readings.close()


def test_without_metrics_a_tick_reads_only_what_the_scv_needs(nvml_simulator):
    nvml_simulator.use("h100_sxm_x8")
    readings = Readings(Session(), XidPolicy(), metrics=False)
    try:
        readings.tick()
        nvml_simulator.reset_calls()
        readings.tick()
        assert nvml_simulator.calls_of("nvmlDeviceGetTemperature") == 0
        assert nvml_simulator.calls_of("nvmlDeviceGetTotalEnergyConsumption") == 0
        assert nvml_simulator.calls_of("nvmlDeviceGetMemoryInfo_v2") == 8
    finally:
        readings.close()


def test_scrapes_and_ticks_from_two_threads_never_read_nvml_at_once(nvml_simulator):
    nvml_simulator.use("h100_sxm_x8")
    session = Session()
    readings = Readings(session, XidPolicy(), metrics=True)
    inside, overlaps = [0], []
    real_read = session.read

    def read(subsets):
        inside[0] += 1
        overlaps.append(inside[0])
        try:
            return real_read(subsets)
        finally:
            inside[0] -= 1

    session.read = read

    def scrapes():
        for _scrape in range(20):
            readings.scrape()

    def ticks():
        for _tick in range(20):
            readings.tick()

    threads = [threading.Thread(target=scrapes), threading.Thread(target=scrapes), threading.Thread(target=ticks)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(overlaps) == 60 and max(overlaps) == 1 and readings.scrape_reads == 40
    finally:
        readings.close()
