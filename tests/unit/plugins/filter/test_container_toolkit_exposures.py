"""The container_toolkit role's refusal of a toolkit release with a known container escape."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.scv.gpu.plugins.filter.container_toolkit_exposures import (
    scv_gpu_container_toolkit_exposures as exposures)
from ansible_collections.scv.gpu.plugins.module_utils.host.toolkit_advisories import ADVISORIES, FIXED_RELEASE


def cves(version):
    return [item["cve"] for item in exposures(version)]


def test_the_oldest_release_with_every_fix_is_the_last_fix():
    assert FIXED_RELEASE == "1.19.1"


@pytest.mark.parametrize("version", ["", None, "1.19.1", "1.19.1-1", "1.20.2-1", "1:1.20.2-1", "1.19.2~rc.1-1",
                                     "2.0.0", "1.19.1-1.el9"])
def test_a_release_with_every_fix_predates_none(version):
    assert exposures(version) == []


@pytest.mark.parametrize("version, expected", [
    ("1.19.0-1", ["CVE-2026-24260"]),
    ("1.19.1~rc.1-1", ["CVE-2026-24260"]),         # a pre-release of the fix predates it
    ("1.18.2-1", ["CVE-2026-24260"]),
    ("1.17.8-1", ["CVE-2026-24260"]),
    ("1.17.7-1", ["CVE-2025-23266", "CVE-2025-23267", "CVE-2026-24260"]),
    ("1.17.3", ["CVE-2025-23359", "CVE-2025-23266", "CVE-2025-23267", "CVE-2026-24260"]),
    ("1.16.1-1", [advisory[0] for advisory in ADVISORIES]),
    ("1.9.10-1", [advisory[0] for advisory in ADVISORIES]),    # compared as numbers, not as text
])
def test_an_older_release_names_each_cve_it_predates_in_the_order_of_their_fixes(version, expected):
    found = exposures(version)
    assert [item["cve"] for item in found] == expected
    assert found[-1]["fixed"] == FIXED_RELEASE
    assert all(item["url"].startswith("https://nvidia.custhelp.com/app/answers/detail/a_id/") for item in found)


@pytest.mark.parametrize("version", ["latest", "1.20", "v1.20.2", "1.20.2\n", "1.20.2-", "1.20.x-1"])
def test_what_is_no_release_is_an_error_naming_the_variable(version):
    with pytest.raises(AnsibleFilterError, match="container_toolkit_version: .* is not a toolkit version"):
        exposures(version)
