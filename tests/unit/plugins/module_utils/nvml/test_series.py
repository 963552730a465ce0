"""The series table (nvml.series): its rows are well formed, and what each cadence names is what the readers read."""

from __future__ import annotations

import pynvml
import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent import metrics
from ansible_collections.scv.gpu.plugins.module_utils.nvml import extras, series
from ansible_collections.scv.gpu.plugins.module_utils.nvml.collect import collect


def test_every_row_is_well_formed_and_named_once():
    names = [row.name for row in series.SERIES]
    assert len(names) == len(set(names))
    for row in series.SERIES:
        assert row.name.startswith(("DCGM_FI_DEV_", "DCGM_FI_PROF_")), row
        assert row.cadence in series.CADENCES, row
        assert isinstance(row.fact, tuple) and row.fact, row
        assert row.source.startswith((series.FIELD_PREFIX, "nvml")), row
        assert row.scale is None or (len(row.scale) == 2 and 0 not in row.scale), row


def test_every_field_a_row_names_is_pynvmls_and_read_as_its_id():
    fields = [row for row in series.SERIES if row.source.startswith(series.FIELD_PREFIX)]
    assert len(fields) >= 6
    for row in fields:
        assert isinstance(getattr(pynvml, row.source), int), row.source
    assert extras.COUNTER_FIELDS == {"energyConsumption": 83, "pcieReplayCount": 94, "nvlinkBandwidthTotal": 66,
                                     "powerCapThrottling": 74}
    assert extras.TELEMETRY_FIELDS == {"memoryTemperature": 82}


@pytest.mark.parametrize("subset, cadence", [("telemetry", "scrape"), ("counters", "counters")])
def test_a_subset_adds_to_a_card_what_its_cadences_rows_name(nvml_simulator, subset, cadence):
    """The scrape rows are what the telemetry subset reads, the counters rows what the counters subset reads (of
    those the h100_sxm_x8 GPUs have: GPM takes two samples, ECC is a health input read without the subset too)."""
    nvml_simulator.use("h100_sxm_x8")
    bare, read = collect([])["cardList"][0], collect([subset])["cardList"][0]
    added = set(read) - set(bare)
    keys = set(series.fact_keys(cadence)) - {"eccErrors"}
    assert keys & added == keys - {"vgpuLicenseStatus", "tensorUtilization", "graphicsActivity", "dramActivity",
                                   "pcieTxMiBPerSecond", "pcieRxMiBPerSecond"}
    assert added - keys <= {"virtualizationMode"}


def test_a_rows_scale_turns_the_facts_unit_into_dcgms():
    card = {"powerCapThrottling": 2500000, "graphicsActivity": 35, "pcieTxMiBPerSecond": 2, "energyConsumption": 7}
    found = {name: metrics._field(card, path) for name, path, _text in metrics.DCGM_CARD_GAUGES  # pylint: disable=protected-access
             if path[0] in card}
    assert found == {"DCGM_FI_DEV_POWER_VIOLATION": 2500, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.35,
                     "DCGM_FI_PROF_PCIE_TX_BYTES": 2097152, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 7}
