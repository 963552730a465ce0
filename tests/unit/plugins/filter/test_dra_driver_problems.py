"""The dra_driver role's check: every problem of a node, each naming it; a device-plugin node only its label."""

from __future__ import annotations

from ansible_collections.scv.gpu.plugins.filter.dra_driver_problems import scv_gpu_dra_driver_problems as problems

GOOD = {"node_name": "gpu-7", "stack": "dra", "check_label": True, "prerequisites": True,
        "node": {"metadata": {"labels": {}}, "status": {"nodeInfo": {"kubeletVersion": "v1.37.1"}}},
        "gpu_facts": {"nvml_available": True, "driver_version": "580.95.05"}, "min_driver_version": "565",
        "min_kubelet_version": "1.34.2", "api_found": True, "compute_domain_api_found": True,
        "runtime": "containerd", "containerd_path": "/etc/containerd/config.toml", "containerd_config": "version = 3\n",
        "cdi_refresh": {"rc": 0, "stdout": "unchanged"}, "cdi_spec": "/etc/cdi/nvidia.yaml"}


def test_a_ready_node_has_no_problem():
    assert problems(GOOD) == []


def test_every_problem_is_listed_with_the_node():
    bad = dict(GOOD, gpu_facts={"nvml_available": True, "driver_version": "550.54.15"}, api_found=False,
               compute_domain_api_found=False, containerd_config=None, cdi_refresh={"missing": True})
    found = problems(bad)
    assert len(found) == 5 and all(line.startswith("node gpu-7: ") for line in found), found
    assert any("/etc/containerd/config.toml cannot be read" in line for line in found)


def test_crio_needs_no_containerd_config_and_prerequisites_can_be_skipped():
    assert problems(dict(GOOD, runtime="crio", containerd_config=None)) == []
    assert problems(dict(GOOD, prerequisites=False, api_found=False)) == []


def test_a_device_plugin_node_is_checked_for_its_label_only():
    labelled_dra = {"metadata": {"labels": {"scv.gpu/gpu-stack": "dra"}}, "status": {}}
    assert problems(dict(GOOD, stack="device-plugin", api_found=False)) == []
    (found,) = problems(dict(GOOD, stack="device-plugin", node=labelled_dra))
    assert found.startswith("node gpu-7: it runs the dra stack and gpu_stack asks for device-plugin")
    assert problems(dict(GOOD, stack="device-plugin", node=labelled_dra, check_label=False)) == []
