"""One name rule at the edge: a Node or Scv name that is not a DNS subdomain is refused before any request is built
from it, by the modules, the roles' filter and the agent, with a message that names the value."""

from __future__ import annotations

import json
import subprocess

import pytest

from harness.control_plane import read_object

BAD_NAMES = ["node-a/status", "..", ".", "Node-A", "a" * 254, "node_a", ""]


@pytest.fixture(scope="module")
def node_a(control_plane):
    control_plane.kubectl("delete", "node", "node-a", "--ignore-not-found")
    control_plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}))
    yield control_plane
    control_plane.kubectl("delete", "node", "node-a", "--ignore-not-found")


MODULES = [
    ("scv.gpu.node_cordon", {"state": "cordoned"}),
    ("scv.gpu.node_labels", {"gpu_facts": {"cardList": [], "cardNumber": 0}}),
]


def test_a_module_refuses_a_bad_node_name_and_changes_nothing(ansible, node_a, tmp_path):
    """Each module with each bad name, as the tasks of one play: every call fails, naming the value."""
    before = read_object(node_a, "node", "node-a")
    calls = [(module, dict(args, name=name, kubeconfig=str(node_a.admin_kubeconfig)))
             for module, args in MODULES for name in BAD_NAMES]
    wrong = []
    for (module, args), (ok, result) in zip(calls, ansible.modules(calls, tmp_path, simulator=False)):
        name = args["name"]
        expected = ("a node name is needed, got ''" if name == "" else
                    "%r is not a Kubernetes node name: lower-case letters, digits" % name)
        msg = result.get("msg", "")
        if ok or not (msg.startswith("name: " + expected) and "nothing was sent to the API server" in msg):
            wrong.append((module, name, result))
    assert not wrong, wrong
    after = read_object(node_a, "node", "node-a")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert not after["spec"].get("unschedulable")


@pytest.mark.parametrize("name", ["Node-A", "a" * 300, "node-a/status", ".."])
def test_the_agent_refuses_a_bad_node_name_at_start(agent_command, name):
    done = subprocess.run(agent_command + ["--node-name", name], capture_output=True, text=True, check=False,
                          timeout=30)
    assert done.returncode == 2
    assert "node-name from the flag --node-name: %r cannot be used: %r is not a Kubernetes node name" % (name, name) \
        in done.stderr
    assert "Traceback" not in done.stderr


def test_the_agent_refuses_a_bad_node_name_from_the_environment(agent_command, monkeypatch):
    monkeypatch.setenv("NODE_NAME", "GPU_Node_7")
    done = subprocess.run(agent_command, capture_output=True, text=True, check=False, timeout=30)
    assert done.returncode == 2
    assert "node-name from the default: 'GPU_Node_7' cannot be used" in done.stderr


def refused_at_first(ansible, tmp_path, role, variables):
    """The output (whitespace folded) of ``role`` run in check mode with ``variables``, which its first task after
    the argument spec must refuse, changing nothing."""
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False,
                                     "roles": [{"role": "scv.gpu.%s" % role, "vars": variables}]}]))
    done = ansible.playbook(str(playbook), None, "--check")
    assert done.returncode != 0
    output = " ".join(done.stdout.split())
    assert "Nothing was changed." in output, output
    recap = done.stdout.split("PLAY RECAP")[1]
    assert "changed=0" in recap and "failed=1" in recap and "ok=1" in recap   # the argument spec, then this
    return output


@pytest.mark.every_ansible_line
@pytest.mark.parametrize("role, variable", [("scv_agent", "scv_agent_node_name"),
                                            ("mig_layout", "mig_layout_node_name"),
                                            ("device_plugin", "device_plugin_node_name")])
def test_a_role_refuses_a_bad_node_name_as_its_first_task(ansible, tmp_path, role, variable):
    output = refused_at_first(ansible, tmp_path, role, {variable: "gpu-7/status"})
    assert "%s: 'gpu-7/status' is not a Kubernetes node name" % variable in output


@pytest.mark.parametrize("variable, value, expected", [
    ("scv_agent_default_interval", -5, "expected a number from 100 to 3600000 (milliseconds)"),
    ("scv_agent_counters_interval", 0, "expected a number from 1 to 3600 (seconds)"),
    ("scv_agent_request_timeout", 0, "expected a number from 0.1 to 300 (seconds)"),
    ("scv_agent_api_qps", 0, "expected a number from 0.1 to 1000 (requests a second)"),
])
def test_the_agent_role_refuses_an_out_of_range_setting_before_installing(ansible, tmp_path, variable, value,
                                                                          expected):
    output = refused_at_first(ansible, tmp_path, "scv_agent", {variable: value, "scv_agent_node_name": "node-a"})
    assert "%s: %s is out of range; %s. Nothing was changed." % (variable, value, expected) in output


@pytest.mark.every_ansible_line
@pytest.mark.parametrize("role, variables, expected", [
    ("apt_source", {"apt_source_cache_valid_time": -5, "apt_source_name": "site",
                    "apt_source_uris": ["http://deb.example.com/debian"], "apt_source_suites": ["bookworm"]},
     "apt_source_cache_valid_time: -5 is out of range; expected a number from 0 to 31536000 (seconds)"),
    ("device_plugin", {"device_plugin_wait_timeout": 0},
     "device_plugin_wait_timeout: 0 is out of range; expected a number from 1 to 86400 (seconds)"),
    ("device_plugin", {"device_plugin_volcano_device_memory_scaling": 0.0},
     "device_plugin_volcano_device_memory_scaling: 0.0 is out of range; expected a number from 0.01 to 100 "
     "(times the memory)"),
    ("device_plugin", {"device_plugin_volcano_device_split_count": 0},
     "device_plugin_volcano_device_split_count: 0 is out of range; expected a number from 1 to 1024 (tasks per GPU)"),
    ("mig_layout", {"mig_layout_drain_timeout": -1},
     "mig_layout_drain_timeout: -1 is out of range; expected a number from 1 to 86400 (seconds)"),
    ("nvidia_driver", {"nvidia_driver_reboot_timeout": 0},
     "nvidia_driver_reboot_timeout: 0 is out of range; expected a number from 1 to 86400 (seconds)"),
    ("nvidia_driver", {"nvidia_driver_drain_timeout": 100000, "nvidia_driver_allocatable_timeout": -3},
     "nvidia_driver_drain_timeout: 100000 is out of range; expected a number from 1 to 86400 (seconds); "
     "nvidia_driver_allocatable_timeout: -3 is out of range"),
])
def test_every_role_refuses_an_out_of_range_number_before_any_change(ansible, tmp_path, role, variables, expected):
    output = refused_at_first(ansible, tmp_path, role, variables)
    assert expected in output, output


@pytest.mark.parametrize("role, variables, expected", [
    ("scv_agent", {"scv_agent_node_name": "", "scv_agent_xid_actions": {"79": "drain"}, "scv_agent_watchdog_sec": -1},
     ["scv_agent_node_name: a node name is needed, got ''", "scv_agent_xid_actions must map XID numbers",
      "scv_agent_watchdog_sec: -1 is out of range"]),
    ("mig_layout", {"mig_layout_node_name": "", "mig_layout_drain_timeout": -1},
     ["mig_layout_drain_timeout: -1 is out of range", "mig_layout_node_name: a node name is needed, got ''"]),
    ("device_plugin", {"device_plugin_node_name": "", "device_plugin_runtime_class": "Not_A_Name",
                       "device_plugin_wait_timeout": 0},
     ["device_plugin_wait_timeout: 0 is out of range", "device_plugin_runtime_class: 'Not_A_Name' is not",
      "device_plugin_node_name: a node name is needed, got ''"]),
])
def test_a_role_names_every_bad_variable_at_once_before_any_change(ansible, tmp_path, role, variables, expected):
    """A run with several bad variables says all of them, in one task, not one per run."""
    output = refused_at_first(ansible, tmp_path, role, variables)
    assert all(part in output for part in expected), output


@pytest.mark.parametrize("variables, expected", [
    ({"scv_publish_update_interval": 0}, "scv_publish_update_interval: expected whole milliseconds of 1 or more, got 0"),
    ({"scv_publish_node_name": ""}, "scv_publish_node_name of host localhost: a node name is needed, got ''"),
    ({"scv_publish_node_name": "", "scv_publish_update_interval": 0},
     "scv_publish_node_name of host localhost: a node name is needed, got ''; set scv_publish_node_name (or "
     "k8s_node_name in site.yml) to the node's name; scv_publish_update_interval: expected whole milliseconds of 1 "
     "or more, got 0. Nothing was changed."),
])
def test_scv_publish_refuses_before_the_definition_is_installed(ansible, control_plane, tmp_path, variables, expected):
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "roles": [
        {"role": "scv.gpu.scv_publish", "vars": dict(variables, scv_publish_kubeconfig=str(
            control_plane.admin_kubeconfig))}]}]))
    control_plane.kubectl("delete", "crd", "scvs.core.run-linux.com", "--ignore-not-found")
    done = ansible.playbook(str(playbook), None)
    assert done.returncode != 0
    assert expected in " ".join(done.stdout.split())
    assert "changed=0" in done.stdout.split("PLAY RECAP")[1]
    assert control_plane.kubectl("get", "crd", "scvs.core.run-linux.com", check=False).returncode != 0
