"""The dra_driver role's check: every problem of a node, each naming it; a device-plugin node only its label."""

from __future__ import annotations

import base64

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.scv.gpu.plugins.filter.dra_driver_problems import KEYS, FilterModule
from ansible_collections.scv.gpu.plugins.filter.dra_driver_problems import scv_gpu_dra_driver_problems as problems

GOOD = {"node_name": "gpu-7", "stack": "dra", "check_label": True, "prerequisites": True,
        "node": {"metadata": {"labels": {}}, "status": {"nodeInfo": {"kubeletVersion": "v1.37.1"}}},
        "gpu_facts": {"nvml_available": True, "driver_version": "580.95.05"}, "min_driver_version": "565",
        "min_kubelet_version": "1.34.2", "api_found": True, "compute_domain_api_found": True,
        "runtime": "containerd", "containerd_path": "/etc/containerd/config.toml", "containerd_config": "version = 3\n",
        "containerd_imports": [], "containerd_error": None, "crio_reads": [],
        "cdi_refresh": {"rc": 0, "stdout": "unchanged"}, "cdi_spec": "/etc/cdi/nvidia.yaml"}


def test_a_ready_node_has_no_problem():
    assert problems(GOOD) == []


def test_every_problem_is_listed_with_the_node():
    old_kubelet = {"metadata": {"labels": {}}, "status": {"nodeInfo": {"kubeletVersion": "v1.33.0"}}}
    bad = dict(GOOD, gpu_facts={"nvml_available": True, "driver_version": "550.54.15"}, api_found=False, node=old_kubelet,
               compute_domain_api_found=False, containerd_config=None, cdi_refresh={"missing": True})
    found = problems(bad)
    assert all(line.startswith("node gpu-7: ") for line in found), found
    # in the order a site fixes them: the host, the cluster, the runtime, the spec
    starts = ["the NVIDIA driver is 550.54.15", "its kubelet is v1.33.0", "/etc/containerd/config.toml cannot", "the API server does not serve",
              "dra_driver_compute_domains is true", "scv-gpu-cdi-refresh is not installed"]
    assert len(found) == len(starts) and all(line.split(": ", 1)[1].startswith(start)
                                             for line, start in zip(found, starts)), found


def test_a_key_missing_or_misspelt_is_an_error_naming_it_not_a_check_switched_off():
    given = {key: value for key, value in GOOD.items() if key not in ("prerequisites", "compute_domain_api_found")}
    with pytest.raises(AnsibleFilterError, match=r"^dra_driver_problems: missing compute_domain_api_found, "
                                                 r"prerequisites \(the role and the filter must name the same 18 keys\)$"):
        problems(given)
    with pytest.raises(AnsibleFilterError, match=r": unknown api_fund \("):
        problems(dict(GOOD, api_fund=False))
    with pytest.raises(AnsibleFilterError, match=r": missing api_found; unknown api_fund \("):
        problems(dict({key: value for key, value in GOOD.items() if key != "api_found"}, api_fund=False))
    with pytest.raises(AnsibleFilterError, match="reads a dict, not NoneType"):
        problems(None)


def test_crio_needs_no_containerd_config_and_prerequisites_can_be_skipped():
    assert problems(dict(GOOD, runtime="crio", containerd_config=None)) == []
    assert problems(dict(GOOD, prerequisites=False, api_found=False)) == []


def test_a_device_plugin_node_is_checked_for_its_label_only():
    labelled_dra = {"metadata": {"labels": {"scv.gpu/gpu-stack": "dra"}}, "status": {}}
    assert problems(dict(GOOD, stack="device-plugin", api_found=False)) == []
    (found,) = problems(dict(GOOD, stack="device-plugin", node=labelled_dra))
    assert found.startswith("node gpu-7: it runs the dra stack and gpu_stack asks for device-plugin")
    assert problems(dict(GOOD, stack="device-plugin", node=labelled_dra, check_label=False)) == []


def test_the_filters_by_name():
    filters = FilterModule().filters()
    assert filters["dra_driver_problems"] is problems
    assert filters["dra_node_stack"]({"metadata": {"labels": {"scv.gpu/gpu-stack": "dra"}}}) == "dra"
    assert filters["dra_node_stack"]({"metadata": {}}) == "device-plugin"


def test_containerd_is_judged_with_its_imports_and_what_could_not_be_read_is_said():
    off = {"path": "/etc/containerd/conf.d/99-x.toml", "imported_by": "/etc/containerd/config.toml",
           "content": 'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n  enable_cdi = false\n'}
    (found,) = problems(dict(GOOD, containerd_imports=[off]))
    assert found.startswith("node gpu-7: /etc/containerd/conf.d/99-x.toml (imported by /etc/containerd/config.toml) "
                            "turns CDI off"), found
    unreadable = "/etc/containerd/config.toml imports /x.toml, which cannot be read (denied)"
    assert problems(dict(GOOD, containerd_error=unreadable)) == ["node gpu-7: CDI cannot be checked: " + unreadable]
    missing = "/etc/containerd/config.toml cannot be read (it does not exist)"
    assert problems(dict(GOOD, containerd_config=None, containerd_error=missing)) == [
        "node gpu-7: %s; CDI in containerd cannot be checked (set dra_driver_containerd_config, or "
        "dra_driver_runtime: crio on CRI-O nodes)" % missing]
    (found,) = problems(dict(GOOD, containerd_config=None, containerd_error="MODULE FAILURE"))
    assert found.startswith("node gpu-7: /etc/containerd/config.toml cannot be read (MODULE FAILURE); "), found


def _read(path, text=None, error=None):
    """One result of the role's ansible.builtin.slurp loop over CRI-O's files."""
    if error:
        return {"item": path, "failed": True, "msg": error}
    return {"item": path, "content": base64.b64encode(text.encode()).decode(), "failed": False}


MAIN, DROPINS = "/etc/crio/crio.conf", "/etc/crio/crio.conf.d"
NARROW = '[crio.runtime]\ncdi_spec_dirs = ["/etc/cdi"]\n'
WIDE = '[crio.runtime]\ncdi_spec_dirs = ["/etc/cdi", "/var/run/cdi", "/opt/cdi"]\n'


def test_crio_is_judged_on_its_main_file_and_drop_ins_the_last_that_sets_cdi_spec_dirs_deciding():
    def judged(*reads):
        found = problems(dict(GOOD, runtime="crio", containerd_config=None, crio_reads=list(reads)))
        return [line[len("node gpu-7: "):] for line in found]

    assert judged() == []                                            # no file: CRI-O's defaults read /var/run/cdi
    assert judged(_read(MAIN, '[crio.runtime]\ndefault_runtime = "crun"\n'),
                  _read(DROPINS + "/99-nvidia.toml", '[crio.runtime.runtimes.nvidia]\nruntime_path = "/x"\n')) == []
    assert judged(_read(MAIN, NARROW)) == [
        "%s sets cdi_spec_dirs ([crio.runtime]) to ['/etc/cdi'], without /var/run/cdi where the DRA driver writes its "
        "CDI specifications, and no later drop-in sets it; add /var/run/cdi there, then restart crio" % MAIN]
    # a later drop-in decides, either way; one about other keys does not
    assert judged(_read(MAIN, NARROW), _read(DROPINS + "/50-cdi.conf", WIDE)) == []
    (found,) = judged(_read(MAIN, WIDE), _read(DROPINS + "/50-cdi.conf", NARROW),
                      _read(DROPINS + "/99-nvidia.toml", '[crio.runtime]\ndefault_runtime = "nvidia"\n'))
    assert found.startswith(DROPINS + "/50-cdi.conf sets cdi_spec_dirs ([crio.runtime]) to ['/etc/cdi']"), found
    # what cannot be read, or is not TOML, stops the check and is named
    (found,) = judged(_read(MAIN, WIDE), _read(DROPINS + "/10-x.conf", error="Permission denied"))
    assert found == ("CDI in CRI-O cannot be checked: %s/10-x.conf cannot be read (Permission denied); CRI-O would "
                     "not start with it either" % DROPINS)
    (found,) = judged(_read(DROPINS + "/10-x.conf", "[crio.runtime\n"))
    assert found.startswith("CDI in CRI-O cannot be checked: %s/10-x.conf is not valid TOML (" % DROPINS), found
    (found,) = judged({"item": MAIN, "content": base64.b64encode(b"\xff\xfe").decode()})
    assert found.startswith("CDI in CRI-O cannot be checked: %s cannot be read (not UTF-8 text" % MAIN), found
    (found,) = judged(_read(MAIN, '[crio.runtime]\ncdi_spec_dirs = "/var/run/cdi"\n'))
    assert "sets cdi_spec_dirs ([crio.runtime]) to /var/run/cdi, without /var/run/cdi" in found, found
    # /var/run is a link to /run: either spelling names the DRA driver's folder
    assert judged(_read(MAIN, '[crio.runtime]\ncdi_spec_dirs = ["/etc/cdi", "/run/cdi/"]\n')) == []


def test_the_role_hands_the_filter_exactly_its_keys():
    """The other side of the contract: the dict the dra_driver role builds in its prerequisites task."""
    import pathlib
    import re

    import yaml
    tasks = yaml.safe_load((pathlib.Path(__file__).resolve().parents[4] / "roles" / "dra_driver" / "tasks"
                            / "prerequisites.yml").read_text())
    (check,) = [task for task in tasks if "_problems" in (task.get("vars") or {})]
    expression = check["vars"]["_problems"]
    assert expression.rstrip().endswith("| scv.gpu.dra_driver_problems }}")
    body = expression[expression.index("{{") + 2:]
    depth, top = 0, []
    for index, char in enumerate(body):
        depth += {"{": 1, "}": -1}.get(char, 0)
        found = re.match(r"'(\w+)':", body[index:]) if depth == 1 and char == "'" else None
        if found and re.search(r"[{,]\s*$", body[:index]):
            top.append(found.group(1))
    assert sorted(top) == sorted(KEYS)


def test_importing_the_filter_leaves_a_module_run_in_the_same_process_a_module():
    """test_dra_cdi_containerd2 imports this filter beside modules run in-process: ansible.errors, imported at
    load time, would make the process a controller, whose module warnings go to the display, not the result."""
    import subprocess
    import sys

    probe = ("from ansible.module_utils import _internal\n"
             "import ansible_collections.scv.gpu.plugins.filter.dra_driver_problems\n"
             "print(_internal.is_controller)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": ":".join(sys.path)})
    assert done.stdout.strip() == "False"
