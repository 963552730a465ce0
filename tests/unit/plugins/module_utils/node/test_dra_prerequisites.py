"""A node's GPU stack and what NVIDIA's DRA driver needs of it (module_utils/node/dra.py)."""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.node import dra

PATH = "/etc/containerd/config.toml"


@pytest.mark.parametrize("version, minimum, expected", [
    ("565.57.01", "565", True), ("564.99", "565", False), ("570.158.01", "570.158.01", True),
    ("570.158.0", "570.158.01", False), ("580.95.05", "570.158.01", True), ("v1.34.2", "1.34.2", True),
    ("v1.34.1", "1.34.2", False), ("v1.35.0-gke.1200", "1.34.2", True), ("v1.4.10", "1.34.2", False),
    ("", "565", False), ("unknown", "565", False), (None, "1.34", False),
    # missing parts count as zeros, on either side
    ("570.158", "570.158.0", True), ("565.0.0", "565", True), ("565", "565.0.1", False),
])
def test_versions_compare_by_number_not_by_text(version, minimum, expected):
    assert dra.at_least(version, minimum) is expected


def node(labels=None, gpus=None, kubelet="v1.37.1"):
    status = {"nodeInfo": {"kubeletVersion": kubelet}}
    if gpus is not None:
        status["allocatable"] = {"nvidia.com/gpu": str(gpus)}
    return {"metadata": {"name": "gpu-7", "labels": labels or {}}, "status": status}


def test_a_node_without_the_label_runs_the_device_plugin():
    assert dra.node_stack(node()) == "device-plugin"
    assert dra.node_stack(node({dra.STACK_LABEL: "dra"})) == "dra"


@pytest.mark.parametrize("current, wanted, refused", [
    (node(), "device-plugin", False),                                      # labelled what it runs
    (node(gpus=0), "dra", False),                                          # a fresh node: nothing runs on it
    (node(), "dra", False),
    (node(gpus=4), "dra", True),                                           # the device plugin offers GPUs there
    (node({dra.STACK_LABEL: "device-plugin"}), "dra", True),
    (node({dra.STACK_LABEL: "dra"}), "device-plugin", True),
    (node({dra.STACK_LABEL: "dra"}, gpus=4), "dra", False),
    (None, "dra", False),                                                   # no Node: the kubelet check says so
])
def test_the_role_writes_the_label_only_where_no_stack_would_change(current, wanted, refused):
    problem = dra.label_problem(current, wanted)
    assert (problem is not None) is refused
    if refused:
        assert problem.endswith("run playbooks/gpu_stack.yml for it")


@pytest.mark.parametrize("text, problem", [
    ('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n', None),
    ('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "p"\n',
     "does not enable CDI (io.containerd.grpc.v1.cri.enable_cdi)"),
    ('version = 3\n', None),                                                # containerd 2.x: on by default
    ('version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n  enable_cdi = false\n',
     "does not enable CDI (io.containerd.cri.v1.runtime.enable_cdi)"),
    ('version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n  cdi_spec_dirs = ["/etc/cdi"]\n',
     "sets cdi_spec_dirs to ['/etc/cdi'], without /var/run/cdi"),
    ('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n  cdi_spec_dirs = ["/var/run/cdi"]\n',
     None),
    # /var/run is a link to /run
    ('version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n  cdi_spec_dirs = ["/etc/cdi", "/run/cdi"]\n', None),
    ('version = "2"\n', 'CDI cannot be checked: %s has version = "2", a string' % PATH),
    ('version = [\n', "CDI cannot be checked: %s is not valid TOML" % PATH),
])
def test_containerd_must_enable_cdi_and_read_the_drivers_spec_dir(text, problem):
    found = dra.containerd_cdi_problem(text, PATH)
    assert found is None if problem is None else problem in found, found


@pytest.mark.parametrize("refresh, problem", [
    ({"rc": 0, "stdout": "unchanged"}, None),
    ({"rc": 0, "stdout": "would generate"}, "is missing or stale"),
    ({"missing": True}, "scv-gpu-cdi-refresh is not installed"),
    (None, "scv-gpu-cdi-refresh is not installed"),
    ({"rc": 3, "stdout": "the NVIDIA driver does not answer (nvidia-smi: x)"}, "cannot be checked: the NVIDIA driver"),
    ({"rc": 1, "stdout": "", "stderr": "nvidia-ctk --version failed"}, "cannot be checked: nvidia-ctk --version failed"),
    ({"rc": 0, "stdout": ""}, "cannot be checked: exit 0"),
])
def test_the_cdi_spec_must_be_fresh(refresh, problem):
    found = dra.cdi_spec_problem(refresh, "/etc/cdi/nvidia.yaml")
    assert found is None if problem is None else problem in found, found


def test_the_driver_and_kubelet_versions():
    assert dra.driver_problem({"nvml_available": True, "driver_version": "580.95.05"}, "565") is None
    assert "is 550.54.15 and NVIDIA's DRA driver needs 565" in dra.driver_problem(
        {"nvml_available": True, "driver_version": "550.54.15"}, "565")
    assert "does not answer through NVML (NVML_ERROR_DRIVER_NOT_LOADED)" in dra.driver_problem(
        {"nvml_available": False, "nvml_error": "NVML_ERROR_DRIVER_NOT_LOADED"}, "565")
    # a version from an earlier reading does not count when NVML does not answer now, nor NVML without a version
    assert "does not answer through NVML (gone)" in dra.driver_problem(
        {"nvml_available": False, "driver_version": "580.95.05", "nvml_error": "gone"}, "565")
    assert "does not answer through NVML (no driver version)" in dra.driver_problem({"nvml_available": True}, "565")
    assert dra.kubelet_problem(node(kubelet="v1.34.2"), "1.34.2") is None
    assert "its kubelet is v1.33.9" in dra.kubelet_problem(node(kubelet="v1.33.9"), "1.34.2")
    assert "no such Node" in dra.kubelet_problem(None, "1.34.2")
    assert "reports no kubelet version" in dra.kubelet_problem({"metadata": {}, "status": {}}, "1.34.2")
