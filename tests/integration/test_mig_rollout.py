"""playbooks/mig_layout.yml against the real kube-apiserver: a MIG layout rolled out node by node.

The hosts are this machine over a local connection, each with its own copy of a simulator
scenario (its GPUs; the simulator keeps MIG instances there as a driver keeps them in the GPU),
chosen by a per-host Python wrapper that sets NVMLSIM_CONFIG. A thread plays the device plugin:
once a cordoned node is no longer labelled scv.gpu/mig-layout=applying, it offers the MIG
devices the host's GPUs now have, as the plugin does when it starts again.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading

import pytest

from harness.ansible import recap
from harness.control_plane import read_object
from harness.paths import ROOT, SIMULATOR_DIR, scenario_path

ANNOTATION = "scv.gpu/cordoned-by"
LAYOUT = [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]


def put_node(plane, name):
    plane.kubectl("delete", "node", name, "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"team": "ml"}}}))


def offered_by(scenario):
    """What the device plugin offers (strategy mixed) for the GPUs a scenario file has now."""
    resources = {}
    for gpu in json.loads(scenario.read_text())["devices"]:
        for entry in gpu.get("migDevices") or []:
            if "computeInstanceId" in entry:
                name = "nvidia.com/mig-" + entry["name"].rpartition(" MIG ")[2].replace("+", ".")
                resources[name] = resources.get(name, 0) + 1
    return {name: str(count) for name, count in resources.items()}


class DevicePlugin(threading.Thread):
    def __init__(self, plane, hosts):
        super().__init__(daemon=True)
        self.plane, self.hosts, self.offered = plane, dict(hosts), {}
        self.stopping = threading.Event()

    def run(self):
        while self.hosts and not self.stopping.is_set():
            for name, scenario in list(self.hosts.items()):
                current = read_object(self.plane, "node", name)
                paused = (current["metadata"].get("labels") or {}).get("scv.gpu/mig-layout") == "applying"
                resources = offered_by(scenario)
                if current["spec"].get("unschedulable") and not paused and resources:
                    self.plane.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p",
                                       json.dumps({"status": {"capacity": resources, "allocatable": resources}}))
                    self.offered[name] = resources
                    del self.hosts[name]
            self.stopping.wait(0.2)


def host(tmp_path, ansible, name, scenario):
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "gpus.json"
    shutil.copy(scenario_path(scenario), path)
    python = folder / "python"
    python.write_text("#!/bin/sh\nexport NVMLSIM_CONFIG=%s LD_LIBRARY_PATH=%s\nexec %s \"$@\"\n"
                      % (path, SIMULATOR_DIR, ansible.python))
    python.chmod(0o755)
    return name, {"ansible_python_interpreter": str(python), "mig_layout_sysfs": str(folder / "no-sys")}, path


def rollout(ansible, plane, tmp_path, hosts, *extra):
    inventory = {"gpu_nodes": {"hosts": {name: variables for name, variables, _path in hosts},
                               "vars": {"ansible_connection": "local", "ansible_become": False}},
                 "all": {"hosts": {"localhost": {"ansible_connection": "local",
                                                 "ansible_python_interpreter": str(ansible.python)}}}}
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps(inventory))
    # no kubelet runs pods here: validation is off but where a test turns it on (test_validate runs its pods)
    settings = {"scv_gpu_kubeconfig": str(plane.admin_kubeconfig), "mig_layout_entries": LAYOUT,
                "mig_layout_drain_timeout": 30, "mig_layout_validate": False}
    command = [str(ansible.venv / "bin" / "ansible-playbook"), "-i", str(path),
               str(ROOT / "playbooks" / "mig_layout.yml"), "-e", json.dumps(settings)] + list(extra)
    return subprocess.run(command, env=ansible.env(), capture_output=True, text=True, check=False)


def venv_tag(ansible):
    """A part of a Node name that tells one ansible-core line's nodes from another's."""
    return ansible.venv.name.strip(".").replace("_", "-").replace(".", "-")


def rollout_with_plugin(ansible, plane, tmp_path, hosts, plugin_hosts, *extra):
    """``rollout`` while DevicePlugin plays the device plugin of ``plugin_hosts``; (its result, stdout and stderr)."""
    plugin = DevicePlugin(plane, plugin_hosts)
    plugin.start()
    try:
        done = rollout(ansible, plane, tmp_path, hosts, *extra)
    finally:
        plugin.stopping.set()
        plugin.join()
    return done, done.stdout + done.stderr


def test_a_rollout_stops_at_the_first_failure_and_keeps_that_node_cordoned(ansible, control_plane, tmp_path):
    plane = control_plane
    tag = venv_tag(ansible)
    a, b, c = ("mig-%s-%s" % (letter, tag) for letter in "abc")
    for name in (a, b, c):
        put_node(plane, name)
    hosts = [host(tmp_path, ansible, a, "h100_mig_empty"), host(tmp_path, ansible, b, "h100_mig_mixed"),
             host(tmp_path, ansible, c, "h100_mig_empty")]
    # b's device plugin never comes back
    done, output = rollout_with_plugin(ansible, plane, tmp_path, hosts, {a: hosts[0][2]},
                                       "-e", "mig_layout_allocatable_timeout=4")
    assert done.returncode != 0, output

    # a: laid out, labelled for its MIG devices, offered them, uncordoned
    assert offered_by(hosts[0][2]) == {"nvidia.com/mig-1g.10gb": "14"}
    assert not read_object(plane, "node", a)["spec"].get("unschedulable"), output
    labels = read_object(plane, "node", a)["metadata"]["labels"]
    assert labels["nvidia.com/mig-1g.10gb.count"] == "14" and labels["nvidia.com/mig.strategy"] == "mixed"
    assert "scv.gpu/mig-layout" not in labels and labels["team"] == "ml"
    assert ANNOTATION not in (read_object(plane, "node", a)["metadata"].get("annotations") or {})
    # b: laid out, but never offered its devices: it keeps our cordon and says why
    assert offered_by(hosts[1][2]) == {"nvidia.com/mig-1g.10gb": "14"}
    assert read_object(plane, "node", b)["spec"].get("unschedulable") is True
    assert read_object(plane, "node", b)["metadata"]["annotations"][ANNOTATION] == "scv.gpu.mig_layout"
    assert "should offer {'nvidia.com/mig-1g.10gb': '14'} after its new MIG layout" in output
    assert "The node stays cordoned." in output
    # c: the rollout stopped before it; its GPUs are as they were
    assert not read_object(plane, "node", c)["spec"].get("unschedulable")
    assert offered_by(hosts[2][2]) == {}
    assert "NO MORE HOSTS LEFT" in output
    assert recap(done.stdout, b)["failed"] == 1 and recap(done.stdout, a)["failed"] == 0


def test_a_node_that_fails_its_validation_stays_cordoned_and_the_rollout_stops(ansible, control_plane, tmp_path):
    """Validation on: the node is laid out and offers its MIG devices, but the workload pod never runs (no kubelet
    here), so the node keeps our cordon, says which checks failed, and the next node is not touched."""
    plane = control_plane
    tag = venv_tag(ansible)
    a, b = ("mig-validate-%s-%s" % (letter, tag) for letter in "ab")
    for name in (a, b):
        put_node(plane, name)
    hosts = [host(tmp_path, ansible, a, "h100_mig_empty"), host(tmp_path, ansible, b, "h100_mig_empty")]
    # the namespace and its default ServiceAccount, which a cluster's controller manager would make
    plane.kubectl("create", "namespace", "mig-validate-" + tag, check=False)
    plane.kubectl("create", "serviceaccount", "default", "-n", "mig-validate-" + tag, check=False)
    done, output = rollout_with_plugin(ansible, plane, tmp_path, hosts, {a: hosts[0][2], b: hosts[1][2]}, "-e",
                                       json.dumps({"mig_layout_validate": True, "mig_layout_validation": {
                                           "timeout": 3, "namespace": "mig-validate-" + tag}}))
    assert done.returncode != 0, output
    assert offered_by(hosts[0][2]) == {"nvidia.com/mig-1g.10gb": "14"}
    assert read_object(plane, "node", a)["spec"].get("unschedulable") is True
    assert read_object(plane, "node", a)["metadata"]["annotations"][ANNOTATION] == "scv.gpu.mig_layout"
    assert "Node %s failed its validation after its new MIG layout: workload: pod " % a in output, output
    assert "The node stays cordoned." in output
    assert not plane.kubectl("get", "pods", "-n", "mig-validate-" + tag, "-o", "name").stdout.strip()
    # b: the rollout stopped before it
    assert not read_object(plane, "node", b)["spec"].get("unschedulable")
    assert offered_by(hosts[1][2]) == {}
    assert recap(done.stdout, a)["failed"] == 1


def test_a_node_with_its_layout_is_left_alone_and_a_busy_one_is_refused_uncordoned(
        ansible, control_plane, tmp_path):
    plane = control_plane
    tag = venv_tag(ansible)
    done_name, busy_name = "mig-done-%s" % tag, "mig-busy-%s" % tag
    for name in (done_name, busy_name):
        put_node(plane, name)
    hosts = [host(tmp_path, ansible, done_name, "h100_mig_all_1g"), host(tmp_path, ansible, busy_name, "h100_mig_mixed")]
    document = json.loads(hosts[1][2].read_text())
    document["devices"][0]["migDevices"][0]["processes"] = [{"pid": 5150, "usedGpuMemory": 1 << 30}]
    hosts[1][2].write_text(json.dumps(document))
    result = rollout(ansible, plane, tmp_path, hosts)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert recap(result.stdout, done_name) == dict(recap(result.stdout, done_name), changed=0, failed=0)
    assert "processes use GPU 0 (NVIDIA H100 80GB HBM3): PIDs 5150" in output
    for name in (done_name, busy_name):
        assert not read_object(plane, "node", name)["spec"].get("unschedulable"), output


@pytest.mark.parametrize("case", ["single-several-profiles", "single-check-mode", "lost-card"])
def test_a_node_nvidias_device_plugin_would_refuse_is_refused_before_the_cordon(ansible, control_plane, tmp_path, case):
    """NVIDIA's plugin will not start under strategy single with MIG devices of several profiles
    (tests/fixtures/device-plugin/h100_mig_mixed-single.txt), nor with a GPU it cannot read
    (lost_card-*.txt): the role says so before it cordons the node or changes a GPU."""
    plane = control_plane
    tag = venv_tag(ansible)
    name = "mig-refused-%s-%s" % (case.split("-")[0], tag)
    put_node(plane, name)
    hosts = [host(tmp_path, ansible, name, "h100_mig_empty")]
    if case == "lost-card":
        document = json.loads(hosts[0][2].read_text())
        document["devices"][1]["errors"] = {"*": "GPU_IS_LOST"}
        hosts[0][2].write_text(json.dumps(document))
    before = hosts[0][2].read_bytes()
    layout = [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 1, "1g.10gb": 4}}]
    extra = ["-e", json.dumps({"mig_layout_entries": layout, "mig_layout_mig_strategy": "single"})]
    if case == "single-check-mode":
        extra.append("--check")
    result = rollout(ansible, plane, tmp_path, hosts, *extra)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    if case == "lost-card":
        assert "GPU 1: getting its handle failed" in output, output
    else:
        assert ("NVIDIA's device plugin will not start on this node under MIG strategy single: its MIG devices are of "
                "2 profiles (1g.10gb, 3g.40gb)") in output, output
        assert "node %s was not cordoned" % name in output
    assert hosts[0][2].read_bytes() == before
    node = read_object(plane, "node", name)
    assert not node["spec"].get("unschedulable") and ANNOTATION not in (node["metadata"].get("annotations") or {})
