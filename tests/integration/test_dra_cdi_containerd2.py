"""The DRA check's reading of containerd's imports, against containerd 2's own.

Each layout of a main file and its imports is read by scv.gpu.containerd_config_info and judged by
the dra_driver role's filter, then given to a real containerd 2 (tools/containerd/build), whose
`config dump` is the configuration it runs with. The check must pass exactly where containerd 2
runs with CDI on and /var/run/cdi among its spec folders.
"""

from __future__ import annotations


import pytest

from ansible_collections.scv.gpu.plugins.filter.dra_driver_problems import scv_gpu_dra_driver_problems
from ansible_collections.scv.gpu.plugins.modules import containerd_config_info
from harness.containerd import containerd2 as built_containerd2
from harness.containerd import dump
from harness.in_process import run_module

RUNTIME = '[plugins."io.containerd.cri.v1.runtime"]\n'
ON, OFF = RUNTIME + "  enable_cdi = true\n", RUNTIME + "  enable_cdi = false\n"
GLOB = 'imports = ["conf.d/*.toml"]\n'
LAYOUTS = {
    "an import turns it off": {"config.toml": GLOB, "conf.d/50-x.toml": OFF},
    "an import turns it back on": {"config.toml": GLOB + OFF, "conf.d/50-x.toml": ON},
    "the last drop-in by name wins": {"config.toml": GLOB, "conf.d/10-on.toml": ON, "conf.d/90-off.toml": OFF},
    "the first drop-in by name loses": {"config.toml": GLOB, "conf.d/10-off.toml": OFF, "conf.d/90-on.toml": ON},
    "an import of another key keeps the main file's": {
        "config.toml": GLOB + OFF, "conf.d/50-x.toml": RUNTIME + "  device_ownership_from_security_context = true\n"},
    "a nested import's spec folders": {"config.toml": GLOB, "conf.d/50-x.toml": 'imports = ["../vendor/cdi.toml"]\n',
                                       "vendor/cdi.toml": RUNTIME + '  cdi_spec_dirs = ["/opt/cdi"]\n'},
    "an import puts /var/run/cdi back": {
        "config.toml": GLOB + RUNTIME + '  cdi_spec_dirs = ["/etc/cdi"]\n',
        "conf.d/50-x.toml": RUNTIME + '  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]\n'},
    "a relative import from the main file's folder": {"config.toml": 'imports = ["site.toml"]\n' + OFF,
                                                      "site.toml": ON},
}


@pytest.fixture(scope="module")
def containerd2():
    return built_containerd2()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_check_passes_where_containerd2_runs_with_cdi_and_the_drivers_folder(capsys, containerd2, tmp_path, layout):
    for name, text in LAYOUTS[layout].items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("version = 3\n" + text)
    main = tmp_path / "config.toml"
    code, read = run_module(capsys, containerd_config_info, {"path": str(main)})
    assert code == 0, read
    problems = scv_gpu_dra_driver_problems({
        "node_name": "gpu-7", "stack": "dra", "prerequisites": True, "check_label": False, "runtime": "containerd",
        "containerd_path": str(main), "containerd_config": read["content"], "containerd_imports": read["imports"],
        "containerd_error": None, "crio_reads": [], "compute_domain_api_found": True,
        "node": {"status": {"nodeInfo": {"kubeletVersion": "v1.37.1"}}}, "min_kubelet_version": "1.34.2",
        "gpu_facts": {"nvml_available": True, "driver_version": "580.95.05"}, "min_driver_version": "565",
        "api_found": True, "cdi_refresh": {"rc": 0, "stdout": "unchanged"}, "cdi_spec": "/etc/cdi/nvidia.yaml"})
    runs_with = dump(containerd2, main)["plugins"]["io.containerd.cri.v1.runtime"]
    usable = runs_with.get("enable_cdi", True) is True and "/var/run/cdi" in runs_with.get("cdi_spec_dirs", [])
    assert (problems == []) is usable, (problems, runs_with.get("enable_cdi"), runs_with.get("cdi_spec_dirs"))
