"""playbooks/driver_upgrade.yml against the real kube-apiserver: a rollout that stops on trouble.

The hosts are this machine over a local connection, each with its own prepared sysfs tree (its
PCI bus) and Node object; NVML is the simulator (one TITAN Xp) and nvidia-smi the stand-in that
asks it. The install itself is the host method's work, tested in molecule, so it runs here
with --skip-tags driver and scv_gpu_upgrade_force. What runs for real: serial batches with
max_fail_percentage 0, the marked cordon, the drain, the verification (NVML against the PCI
bus), the wait for allocatable nvidia.com/gpu, and the uncordon of our own cordons only. No kubelet
runs pods, so the validation before the uncordon is off but in the test of a node that fails it.
A thread plays the device plugin: it makes a cordoned node offer its GPU after 2 s, as the
kubelet does once the plugin registers after a reboot.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest

from harness.ansible import recap
from harness.control_plane import read_object
from harness.pci_sysfs import add_function as add_pci_function
from harness.paths import ROOT

RESOURCE = "nvidia.com/gpu"
ANNOTATION = "scv.gpu/cordoned-by"


@pytest.fixture(scope="session")
def standin_bin(tmp_path_factory):
    folder = tmp_path_factory.mktemp("standin-bin")
    source = ROOT / "tests" / "molecule" / "standin" / "nvidia-smi.c"
    subprocess.run(["gcc", "-O2", "-o", str(folder / "nvidia-smi"), str(source), "-ldl"], check=True)
    return folder


def set_allocatable(plane, name, count):
    plane.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(
        {"status": {"capacity": {RESOURCE: str(count)}, "allocatable": {RESOURCE: str(count)}}}))


def put_node(plane, name, cordoned=False):
    plane.kubectl("delete", "node", name, "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {"unschedulable": cordoned}}))
    set_allocatable(plane, name, 0)      # the device plugin has not registered since the last boot


class DevicePlugin(threading.Thread):
    """Offers one GPU on each listed node 2 s after it is first seen cordoned."""

    def __init__(self, plane, names):
        super().__init__(daemon=True)
        self.plane, self.pending, self.offered = plane, set(names), {}
        self.stopping = threading.Event()

    def run(self):
        seen = {}
        while self.pending and not self.stopping.is_set():
            for name in sorted(self.pending):
                if read_object(self.plane, "node", name)["spec"].get("unschedulable"):
                    seen.setdefault(name, time.monotonic())
                    if time.monotonic() - seen[name] >= 2:
                        set_allocatable(self.plane, name, 1)
                        self.offered[name] = time.time()
                        self.pending.discard(name)
            self.stopping.wait(0.2)


def sysfs_with(tmp_path, host, gpus):
    root = tmp_path / host
    (root / "module" / "nvidia").mkdir(parents=True)
    (root / "module" / "nvidia" / "version").write_text("535.183.01\n")
    for address in gpus:
        add_pci_function(root, address, 0x10DE, 0x1B02, 0x030000, "nvidia")
    return root


def rollout(ansible, plane, tmp_path, standin_bin, hosts, *extra):
    inventory = {"gpu_nodes": {"hosts": {name: {"nvidia_driver_sysfs": str(sysfs)} for name, sysfs in hosts},
                               "vars": {"ansible_connection": "local", "ansible_become": False,
                                        "ansible_python_interpreter": str(ansible.python)}}}
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps(inventory))
    # no kubelet runs pods here: validation is off but where a test turns it on (test_validate runs its pods)
    settings = {"scv_gpu_kubeconfig": str(plane.admin_kubeconfig), "scv_gpu_upgrade_force": True,
                "nvidia_driver_persistenced": False, "nvidia_driver_drain_timeout": 30,
                "nvidia_driver_validate": False}
    env = ansible.env("titan_xp")
    env["PATH"] = "%s:%s" % (standin_bin, env["PATH"])
    command = [str(ansible.venv / "bin" / "ansible-playbook"), "-i", str(path),
               str(ROOT / "playbooks" / "driver_upgrade.yml"), "--skip-tags", "driver",
               "-e", json.dumps(settings)] + list(extra)
    return subprocess.run(command, env=env, capture_output=True, text=True, check=False)


@pytest.mark.every_ansible_line
def test_rollout_stops_at_the_first_failure_and_leaves_foreign_cordons(
        ansible, control_plane, tmp_path, standin_bin):
    plane = control_plane
    tag = ansible.venv.name.strip(".").replace("_", "-").replace(".", "-")
    names = ["roll-%s-%s" % (letter, tag) for letter in "abcd"]
    a, b, c, d = names
    put_node(plane, a, cordoned=True)       # cordoned by an operator before the rollout
    for name in (b, c, d):
        put_node(plane, name)
    hosts = [(a, sysfs_with(tmp_path, a, ["0000:01:00.0"])),
             (b, sysfs_with(tmp_path, b, ["0000:01:00.0"])),
             # two GPUs on the bus, and NVML answers for one: this node fails its verification
             (c, sysfs_with(tmp_path, c, ["0000:01:00.0", "0000:02:00.0"])),
             (d, sysfs_with(tmp_path, d, ["0000:01:00.0"]))]
    plugin = DevicePlugin(plane, [a, b, c])
    plugin.start()
    try:
        done = rollout(ansible, plane, tmp_path, standin_bin, hosts)
    finally:
        plugin.stopping.set()
        plugin.join()
    output = done.stdout + done.stderr
    assert done.returncode != 0, output

    # a: cordoned by someone else; drained and verified, and still cordoned, unmarked
    assert read_object(plane, "node", a)["spec"].get("unschedulable") is True, output
    assert ANNOTATION not in (read_object(plane, "node", a)["metadata"].get("annotations") or {})
    assert "stays cordoned; someone else cordoned it" in output
    # b: ours; uncordoned only after the device plugin offered its GPU
    assert not read_object(plane, "node", b)["spec"].get("unschedulable"), output
    assert ANNOTATION not in (read_object(plane, "node", b)["metadata"].get("annotations") or {})
    assert b in plugin.offered
    # c: verification failed; it keeps our cordon, and the message names the card NVML does not see
    assert read_object(plane, "node", c)["spec"].get("unschedulable") is True
    assert read_object(plane, "node", c)["metadata"]["annotations"][ANNOTATION] == "scv.gpu.nvidia_driver"
    assert "The PCI bus has 2 NVIDIA GPU(s) and NVML sees 1" in output and "0000:02:00.0" in output
    # d: the rollout stopped before it
    assert not read_object(plane, "node", d)["spec"].get("unschedulable")
    assert "NO MORE HOSTS LEFT" in output
    assert d not in done.stdout.partition("PLAY RECAP")[2]
    assert recap(done.stdout, c)["failed"] == 1
    assert recap(done.stdout, b)["failed"] == 0 and recap(done.stdout, a)["failed"] == 0


def test_a_node_that_fails_its_validation_stays_cordoned_and_the_rollout_stops(
        ansible, control_plane, tmp_path, standin_bin):
    """Validation on: the node is verified and offers its GPU, but the workload pod never runs (no kubelet here),
    so the node keeps our cordon, says which checks failed, and the next node is not touched."""
    plane = control_plane
    tag = ansible.venv.name.strip(".").replace("_", "-").replace(".", "-")
    a, b = ("roll-validate-%s-%s" % (letter, tag) for letter in "ab")
    namespace = "roll-validate-" + tag
    for name in (a, b):
        put_node(plane, name)
    # the namespace and its default ServiceAccount, which a cluster's controller manager would make
    plane.kubectl("create", "namespace", namespace, check=False)
    plane.kubectl("create", "serviceaccount", "default", "-n", namespace, check=False)
    hosts = [(name, sysfs_with(tmp_path, name, ["0000:01:00.0"])) for name in (a, b)]
    plugin = DevicePlugin(plane, [a, b])
    plugin.start()
    try:
        done = rollout(ansible, plane, tmp_path, standin_bin, hosts, "-e", json.dumps(
            {"nvidia_driver_validate": True, "nvidia_driver_validation": {"timeout": 3, "namespace": namespace}}))
    finally:
        plugin.stopping.set()
        plugin.join()
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    # a: verified and offering its GPU, but not validated: it keeps our cordon and names the failed check
    assert a in plugin.offered
    assert read_object(plane, "node", a)["spec"].get("unschedulable") is True, output
    assert read_object(plane, "node", a)["metadata"]["annotations"][ANNOTATION] == "scv.gpu.nvidia_driver"
    assert "Node %s failed its validation after the driver install: workload: pod " % a in output, output
    assert "The node stays cordoned." in output
    assert not plane.kubectl("get", "pods", "-n", namespace, "-o", "name").stdout.strip()
    # b: the rollout stopped before it
    assert not read_object(plane, "node", b)["spec"].get("unschedulable")
    assert b not in plugin.offered
    assert b not in done.stdout.partition("PLAY RECAP")[2]
    assert recap(done.stdout, a)["failed"] == 1


def test_a_node_that_never_offers_its_gpus_stays_cordoned(ansible, control_plane, tmp_path, standin_bin):
    plane = control_plane
    name = "roll-stuck-%s" % ansible.venv.name.strip(".").replace("_", "-").replace(".", "-")
    put_node(plane, name)
    started = time.monotonic()
    done = rollout(ansible, plane, tmp_path, standin_bin, [(name, sysfs_with(tmp_path, name, ["0000:01:00.0"]))],
                   "-e", "nvidia_driver_allocatable_timeout=4")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "offers 0 nvidia.com/gpu after 4 s, and NVML sees 1 GPU(s). The node stays cordoned." in output
    assert read_object(plane, "node", name)["spec"].get("unschedulable") is True
    assert read_object(plane, "node", name)["metadata"]["annotations"][ANNOTATION] == "scv.gpu.nvidia_driver"
    assert time.monotonic() - started < 120


def test_a_rerun_after_the_fix_lifts_only_our_cordon(ansible, control_plane, tmp_path, standin_bin):
    """The stuck node's GPU comes back; the same playbook finishes the job and uncordons it."""
    plane = control_plane
    name = "roll-rerun-%s" % ansible.venv.name.strip(".").replace("_", "-").replace(".", "-")
    put_node(plane, name)
    hosts = [(name, sysfs_with(tmp_path, name, ["0000:01:00.0"]))]
    first = rollout(ansible, plane, tmp_path, standin_bin, hosts, "-e", "nvidia_driver_allocatable_timeout=2")
    assert first.returncode != 0
    set_allocatable(plane, name, 1)
    second = rollout(ansible, plane, tmp_path, standin_bin, hosts)
    assert second.returncode == 0, second.stdout + second.stderr
    assert not read_object(plane, "node", name)["spec"].get("unschedulable")
    assert ANNOTATION not in (read_object(plane, "node", name)["metadata"].get("annotations") or {})


@pytest.mark.every_ansible_line
def test_node_cordon_check_mode_diff_and_rerun(ansible, control_plane):
    plane = control_plane
    name = "cordon-module-%s" % ansible.venv.name.strip(".").replace("_", "-").replace(".", "-")
    put_node(plane, name)
    args = {"name": name, "state": "cordoned", "owner": "maintenance", "kubeconfig": str(plane.admin_kubeconfig)}
    ok, result = ansible.module(args, name="scv.gpu.node_cordon", check=True, diff=True)
    assert ok and result["changed"] is True and result["outcome"] == "cordoned", result
    diff = ansible.last_output
    assert '-    "unschedulable": false' in diff and '+    "unschedulable": true' in diff, diff
    assert '+    "annotation": "maintenance"' in diff, diff
    assert not read_object(plane, "node", name)["spec"].get("unschedulable")          # check mode wrote nothing
    ok, result = ansible.module(args, name="scv.gpu.node_cordon")
    assert ok and result["changed"] is True and read_object(plane, "node", name)["spec"]["unschedulable"] is True
    ok, result = ansible.module(args, name="scv.gpu.node_cordon")
    assert ok and result["changed"] is False and result["outcome"] == "ours"
    # another owner's uncordon leaves our cordon in place
    ok, result = ansible.module(dict(args, state="uncordoned", owner="someone-else"), name="scv.gpu.node_cordon")
    assert ok and result["changed"] is False and result["outcome"] == "foreign"
    assert read_object(plane, "node", name)["spec"]["unschedulable"] is True
    ok, result = ansible.module(dict(args, state="uncordoned"), name="scv.gpu.node_cordon")
    assert ok and result["changed"] is True and result["outcome"] == "uncordoned"
    assert not read_object(plane, "node", name)["spec"].get("unschedulable")
    ok, result = ansible.module(dict(args, name="no-such-node"), name="scv.gpu.node_cordon")
    assert not ok and "Node no-such-node does not exist" in result["msg"]


def test_node_cordon_leaves_an_operators_later_cordon_by_the_real_kubectl(ansible, control_plane):
    """Ours, then `kubectl uncordon` and `kubectl cordon` (the real kubectl, field manager 'kubectl'):
    the API server's managedFields say whose cordon it is now, and ours is not lifted over it."""
    plane = control_plane
    name = "cordon-kubectl-%s" % ansible.venv.name.strip(".").replace("_", "-").replace(".", "-")
    plane.kubectl("delete", "node", name, "--ignore-not-found")
    # Registered with labels, as a kubelet registers its Node: the API server tracks the fields'
    # managers from then on (a Node created with no field set is never tracked by updates).
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}))
    args = {"name": name, "state": "cordoned", "owner": "maintenance", "kubeconfig": str(plane.admin_kubeconfig)}
    ok, result = ansible.module(args, name="scv.gpu.node_cordon")
    assert ok and result["outcome"] == "cordoned", result
    plane.kubectl("uncordon", name)
    plane.kubectl("cordon", name)
    tracked = read_object(plane, "node", name, managed_fields=True)
    managers = [entry["manager"] for entry in tracked["metadata"]["managedFields"]
                if "f:unschedulable" in (entry.get("fieldsV1") or {}).get("f:spec", {})]
    assert managers == ["kubectl"], tracked["metadata"]["managedFields"]     # kubectl 1.37's field manager
    ok, result = ansible.module(dict(args, state="uncordoned"), name="scv.gpu.node_cordon")
    assert ok and result["changed"] is True and result["outcome"] == "foreign", result
    assert result["cordoned_by"] == ["kubectl"]
    assert result["msg"] == "node %s stays cordoned: its cordon is kubectl's, not ours" % name
    after = read_object(plane, "node", name)
    assert after["spec"]["unschedulable"] is True
    assert ANNOTATION not in (after["metadata"].get("annotations") or {})     # our stale mark is gone
