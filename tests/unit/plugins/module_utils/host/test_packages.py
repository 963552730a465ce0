"""Check mode's question to dpkg: which of the wanted packages are not installed (as asked)."""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.module_utils.host.packages import missing_packages

LINES = ["nvidia-driver=535.216.01-1 installed", "hello=2.10-3 config-files", "firmware-misc-nonfree=20230625-2 installed"]


def test_names_and_pinned_versions_are_compared_with_what_dpkg_has_installed():
    assert missing_packages(["nvidia-driver", "firmware-misc-nonfree"], LINES) == []
    assert missing_packages(["nvidia-driver=535.216.01-1"], LINES) == []
    assert missing_packages(["nvidia-driver=535.247.01-1"], LINES) == ["nvidia-driver=535.247.01-1"]


def test_removed_unknown_and_garbled_packages_are_missing():
    assert missing_packages(["hello"], LINES) == ["hello"]                 # only its config files are left
    assert missing_packages(["python3-venv"], LINES) == ["python3-venv"]   # dpkg printed nothing for it
    assert missing_packages(["hello"], ["", "garbage", "hello installed"]) == ["hello"]
