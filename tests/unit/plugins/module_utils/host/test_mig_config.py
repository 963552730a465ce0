"""A MIG layout as the mig_layout module is given it: inline, from a configuration, or from a file."""

from __future__ import annotations

import json

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.common.mig_layout import LayoutError
from ansible_collections.scv.gpu.plugins.module_utils.host.mig_config import layout_entries

CONFIG = {"version": "v1", "mig-configs": {
    "all-disabled": [{"devices": "all", "mig-enabled": False}],
    "all-1g.10gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}],
}}
SEVEN = [{"devices": "all", "device-filter": None, "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]


def test_an_inline_layout_is_checked_and_normalised():
    assert layout_entries(layout=[{"mig_enabled": True, "mig_devices": {"1g.10gb": 7}}]) == SEVEN


def test_a_named_layout_of_a_mapping():
    assert layout_entries(config=CONFIG, config_name="all-1g.10gb") == SEVEN


YAML_CONFIG = ("version: v1\nmig-configs:\n  all-1g.10gb:\n    - devices: all\n      mig-enabled: true\n"
               "      mig-devices: {1g.10gb: 7}\n")


@pytest.mark.parametrize("text", [YAML_CONFIG, json.dumps(CONFIG)], ids=["yaml", "json"])
def test_a_named_layout_of_a_file(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert layout_entries(config_file=str(path), config_name="all-1g.10gb") == SEVEN


def test_an_unknown_name_names_the_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(CONFIG))
    with pytest.raises(LayoutError, match=str(path)):
        layout_entries(config_file=str(path), config_name="all-3g.40gb")


def test_a_missing_or_broken_file_is_named(tmp_path):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(LayoutError, match=r"config_file %s cannot be read: No such file" % missing):
        layout_entries(config_file=str(missing), config_name="any")
    broken = tmp_path / "broken.yaml"
    broken.write_text("mig-configs: [unclosed\n")
    with pytest.raises(LayoutError, match=r"config_file %s is not valid YAML" % broken):
        layout_entries(config_file=str(broken), config_name="any")


@pytest.mark.parametrize("data, says", [
    (b"version: v1\nmig-configs:\n  caf\xe9: []\n", "is not UTF-8 text: byte 0xe9 at offset 30"),
    (b"[" * 5000, "is not a MIG configuration: it is nested too deeply to read"),
    (b"version: v1\nmig-configs:\n  1:\n    - {devices: all, mig-enabled: false}\n  all-off: []\n",
     "mig-configs: the layout name 1 is not text (YAML reads it as int); quote every such name, as in '1':"),
    (b"version: v1\nmig-configs:\n  2026-11-25: []\n", "the layout name 2026-11-25 is not text (YAML reads it as date)"),
    (b"- just\n- a list\n", "a 'mig-configs' mapping of layout names to entries is needed"),
    (b"", "a 'mig-configs' mapping of layout names to entries is needed"),
], ids=["not-utf8", "too-deep", "number-name", "date-name", "a-list", "empty"])
def test_an_unreadable_configuration_is_refused_naming_the_file(tmp_path, data, says):
    path = tmp_path / "config.yaml"
    path.write_bytes(data)
    with pytest.raises(LayoutError) as caught:
        layout_entries(config_file=str(path), config_name="1")
    assert str(path) in str(caught.value) and says in str(caught.value)
