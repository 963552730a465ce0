"""playbooks/site.yml end to end: this machine as a GPU node (NVML simulator), the real API server.

The API-side stages (Scv, labels, device plugin) run for real, twice: the second run must change
nothing. The host stages (driver, toolkit, agent) change hosts: test_collection runs the whole
playbook with --check from the installed tarball, as `make demo` runs it, and checks that this
machine is left as it was. Their real runs are the molecule scenarios.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from harness.ansible import recap
from harness.control_plane import install_scv_crd, read_object

INVENTORY = """
all:
  children:
    gpu_nodes:
      hosts:
        localhost:
          ansible_connection: local
          k8s_node_name: {node}
          scv_gpu_kubeconfig: {kubeconfig}
"""


def inventory(tmp_path, plane, node):
    path = tmp_path / "inventory.yml"
    path.write_text(INVENTORY.format(node=node, kubeconfig=plane.admin_kubeconfig))
    return str(path)


@pytest.mark.every_ansible_line
def test_site_publishes_labels_deploys_and_a_second_run_changes_nothing(ansible, scv_crd, tmp_path):
    plane = scv_crd
    node = "site-node-%s" % ansible.version.replace(".", "-")
    plane.kubectl("delete", "node", node, "--ignore-not-found")
    plane.kubectl("delete", "scv", node, "--ignore-not-found")
    plane.kubectl("delete", "daemonset", "-n", "kube-system", "nvidia-device-plugin-daemonset", "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    hosts = inventory(tmp_path, plane, node)

    first = ansible.playbook("playbooks/site.yml", "h100_sxm_x8", "-i", hosts, "--skip-tags", "host_roles")
    assert first.returncode == 0, first.stdout + first.stderr
    assert recap(first.stdout)["changed"] >= 3   # the Scv, the labels, the DaemonSet
    scv = read_object(plane, "scv", node)
    assert scv["status"]["cardNumber"] == 8
    labels = read_object(plane, "node", node)["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3" and labels["gpu/nvidia"] == "NVIDIA-H100-80GB-HBM3"
    assert plane.kubectl("get", "daemonset", "-n", "kube-system", "nvidia-device-plugin-daemonset",
                         check=False).returncode == 0

    second = ansible.playbook("playbooks/site.yml", "h100_sxm_x8", "-i", hosts, "--skip-tags", "host_roles")
    assert second.returncode == 0, second.stdout + second.stderr
    assert recap(second.stdout)["changed"] == 0, second.stdout


@pytest.mark.parametrize("extra, message", [
    (("--tags", "drvier"), "unknown area(s) drvier in --tags or --skip-tags; drift.yml reads driver, toolkit, scv, "
                           "labels, dra. Nothing was read or changed."),
    (("--tags", "scv", "--skip-tags", "lables"), "unknown area(s) lables in --tags or --skip-tags"),
    (("-e", "scv_gpu_hosts=gpu_fleet"),
     "no host of the inventory matches gpu_fleet: put the GPU nodes in the group gpu_nodes, or set scv_gpu_hosts. "
     "Nothing was read or changed."),
], ids=["typo", "skip-typo", "no-hosts"])
def test_drift_refuses_what_it_cannot_read_instead_of_saying_no_drift(ansible, control_plane, tmp_path, extra,
                                                                      message):
    hosts = inventory(tmp_path, control_plane, "drift-refused")
    done = ansible.playbook("playbooks/drift.yml", "h100_sxm_x8", "-i", hosts, "--check", *extra)
    assert done.returncode == 2, done.stdout + done.stderr
    assert " ".join(message.split()) in " ".join(done.stdout.split())
    assert "no drift" not in done.stdout


def test_drift_reports_hand_made_changes_and_exits_non_zero(ansible, scv_crd, tmp_path):
    plane = scv_crd
    node = "drift-node-%s" % ansible.version.replace(".", "-")
    plane.kubectl("delete", "node", node, "--ignore-not-found")
    plane.kubectl("delete", "scv", node, "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    hosts = inventory(tmp_path, plane, node)
    site = ansible.playbook("playbooks/site.yml", "h100_sxm_x8", "-i", hosts, "--tags", "scv,labels")
    assert site.returncode == 0, site.stdout + site.stderr

    forgot = ansible.playbook("playbooks/drift.yml", "h100_sxm_x8", "-i", hosts, "--tags", "scv,labels",
                              "-e", "ansible_become=false")
    assert forgot.returncode == 2 and "Run drift.yml with --check" in forgot.stdout + forgot.stderr
    assert recap(forgot.stdout)["ok"] == 1    # only the first play's check of the tags and hosts

    clean = ansible.playbook("playbooks/drift.yml", "h100_sxm_x8", "-i", hosts, "--tags", "scv,labels",
                             "-e", "ansible_become=false", "--check", "--diff")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert '"msg": "no drift"' in clean.stdout
    assert recap(clean.stdout)["changed"] == 0 and recap(clean.stdout)["failed"] == 0

    # by hand: a label changed, another added by someone else (not ours), and the Scv deleted
    plane.kubectl("label", "node", node, "nvidia.com/gpu.count=9", "team=ml", "--overwrite")
    plane.kubectl("delete", "scv", node)
    drifted = ansible.playbook("playbooks/drift.yml", "h100_sxm_x8", "-i", hosts, "--tags", "scv,labels",
                               "-e", "ansible_become=false", "--check", "--diff")
    assert drifted.returncode == 2, drifted.stdout + drifted.stderr
    assert ("localhost has drifted from the desired state: Scv: the node has no Scv; "
            "labels: nvidia.com/gpu.count differs") in drifted.stdout + drifted.stderr, drifted.stdout
    removed = [line for line in drifted.stdout.splitlines() if line.startswith("-") and not line.startswith("---")]
    assert any('"nvidia.com/gpu.count": "9"' in line for line in removed), drifted.stdout   # the diff shows it
    # and it changed nothing
    labels = read_object(plane, "node", node)["metadata"]["labels"]
    assert labels["nvidia.com/gpu.count"] == "9" and labels["team"] == "ml"
    assert plane.kubectl("get", "scv", node, check=False).returncode != 0


def test_drift_reports_every_area_even_when_one_cannot_be_checked(ansible, control_plane, tmp_path):
    plane = control_plane
    node = "drift-partial-%s" % ansible.version.replace(".", "-")
    plane.kubectl("delete", "node", node, "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "Node",
                                                              "metadata": {"name": node}}))
    plane.kubectl("delete", "crd", "scvs.core.run-linux.com", "--ignore-not-found")   # the Scv area cannot be read
    try:
        hosts = inventory(tmp_path, plane, node)
        done = ansible.playbook("playbooks/drift.yml", "h100_sxm_x8", "-i", hosts, "--tags", "scv,labels",
                                "-e", "ansible_become=false", "-e", '{"scv_publish_install_crd": false}', "--check")
        assert done.returncode == 2, done.stdout + done.stderr
        report = " ".join((done.stdout + done.stderr).split())
        assert ("localhost has drifted from the desired state: Scv: could not be checked: the scvs.core.run-linux.com "
                "custom resource definition is not installed") in report, report[-2500:]
        assert "labels: nvidia.com/gpu.present differs" in report     # the labels area still reported
    finally:
        plane.kubectl("delete", "node", node, "--ignore-not-found")
        install_scv_crd(plane)


def test_drift_reports_a_toolkit_that_is_not_installed_before_its_repository_is(ansible, control_plane, tmp_path):
    """This machine has neither the toolkit nor its repository: in check mode apt cannot resolve the package, and
    dpkg's answer, as for the driver, says the install would change something."""
    assert not pathlib.Path("/etc/apt/sources.list.d/nvidia-container-toolkit.sources").exists()
    hosts = inventory(tmp_path, control_plane, "drift-toolkit")
    done = ansible.playbook("playbooks/drift.yml", "h100_sxm_x8", "-i", hosts, "--tags", "toolkit", "--check")
    report = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, report[-2500:]
    assert "toolkit: the packages differ from the desired version" in report and "\"msg\": \"no drift\"" not in report, \
        report[-4000:]
    assert "NVIDIA runtime config: /etc/nvidia-container-runtime/config.toml differs" in report, report[-4000:]
