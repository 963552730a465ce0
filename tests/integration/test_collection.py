"""The collection as a user installs it: the built tarball, its declared dependencies and nothing else.

Galaxy is out of reach here, so the declared dependencies are copied from the ``ansible``
package's bundle of collections; every other collection of that bundle stays out of the path,
and Ansible is told not to look in site-packages, so an undeclared dependency fails the run.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

from harness.ansible import recap
from harness.control_plane import install_scv_crd
from harness.paths import ROOT

GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
FQCN = re.compile(r"(?<![\w.])(?:ansible_collections\.)?([a-z][a-z0-9_]*)\.([a-z][a-z0-9_]*)\.[a-z_][a-z0-9_]*")


def _bundled_collections(ansible):
    """namespace.name of every collection the ansible package bundles (what a role could use)."""
    bundle = pathlib.Path(subprocess.run(
        [str(ansible.python), "-c", "import ansible_collections.kubernetes.core as c; print(list(c.__path__)[0])"],
        capture_output=True, text=True, check=True).stdout.strip()).parent.parent
    return bundle, {"%s.%s" % (path.parent.parent.name, path.parent.name) for path in bundle.glob("*/*/MANIFEST.json")}


@pytest.mark.every_ansible_line
def test_galaxy_declares_every_collection_that_roles_playbooks_and_plugins_use(ansible):
    """Any name of a real collection in what the tarball ships (tests aside) must be a declared dependency."""
    _bundle, collections = _bundled_collections(ansible)
    assert {"kubernetes.core", "community.general", "ansible.posix"} <= collections
    used = {}
    for folder in ("roles", "playbooks", "plugins", "meta"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in (".yml", ".yaml", ".py", ".j2"):
                for match in FQCN.finditer(path.read_text()):
                    name = "%s.%s" % match.groups()
                    if name in collections:
                        used.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert {"kubernetes.core", "community.general"} <= set(used)
    missing = {name: sorted(files) for name, files in used.items() if name not in GALAXY["dependencies"]}
    assert missing == {}, "used but not declared in galaxy.yml dependencies: %s" % missing


@pytest.fixture(scope="module")
def installed(tmp_path_factory, ansible):
    """The tarball from ansible-galaxy collection build, installed into an empty path with its declared dependencies."""
    work = tmp_path_factory.mktemp("galaxy")
    galaxy = str(ansible.venv / "bin" / "ansible-galaxy")
    built = subprocess.run([galaxy, "collection", "build", str(ROOT), "--output-path", str(work)],
                           capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stdout + built.stderr
    tarball = next(work.glob("scv-gpu-*.tar.gz"))
    path = work / "collections"
    # Only this path: make exports ANSIBLE_COLLECTIONS_PATH (the checkout's scv.gpu), and ansible-galaxy skips a
    # collection it finds installed in any configured path.
    isolated = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(path), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false")
    done = subprocess.run([galaxy, "collection", "install", str(tarball), "-p", str(path), "--no-deps", "--force"],
                          env=isolated, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    bundle, _collections = _bundled_collections(ansible)
    for name in GALAXY["dependencies"]:
        namespace, collection = name.split(".")
        shutil.copytree(bundle / namespace / collection, path / "ansible_collections" / namespace / collection)
    installed_names = {"%s.%s" % (manifest.parent.parent.name, manifest.parent.name)
                       for manifest in (path / "ansible_collections").glob("*/*/MANIFEST.json")}
    assert installed_names == {"scv.gpu"} | set(GALAXY["dependencies"])
    return path


def _isolated_env(ansible, path, scenario):
    env = ansible.env(scenario)
    env.update(ANSIBLE_COLLECTIONS_PATH=str(path), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false")
    return env


@pytest.mark.every_ansible_line
def test_the_tarball_holds_no_development_files(installed):
    root = installed / "ansible_collections" / "scv" / "gpu"
    assert (root / "roles" / "scv_agent" / "tasks" / "present.yml").is_file()
    assert (root / "plugins" / "plugin_utils" / "_agent_zipapp.py").is_file()
    for unwanted in ("build", ".venv", "Makefile", "benchmarks", "tools", ".ci"):
        assert not (root / unwanted).exists(), unwanted


@pytest.mark.every_ansible_line
def test_site_in_check_mode_runs_from_the_installed_tarball(ansible, installed, control_plane, tmp_path):
    plane = control_plane
    install_scv_crd(plane)
    node = "galaxy-node-%s" % ansible.version.replace(".", "-")
    plane.kubectl("delete", "node", node, "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    hosts = tmp_path / "inventory.yml"
    hosts.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": str(ansible.python),
        "k8s_node_name": node, "scv_gpu_kubeconfig": str(plane.admin_kubeconfig)}}}}}}))
    site = installed / "ansible_collections" / "scv" / "gpu" / "playbooks" / "site.yml"
    # what the host stages would write on this machine
    watched = [pathlib.Path(p) for p in ("/etc/apt/sources.list.d/scv-gpu-nvidia-driver.sources",
                                         "/etc/apt/sources.list.d/nvidia-container-toolkit.sources",
                                         "/etc/modprobe.d/scv-gpu-blacklist-nouveau.conf",
                                         "/etc/systemd/system/scv-gpu-agent.service", "/opt/scv-gpu")]
    before = {path: path.exists() for path in watched}
    done = subprocess.run([str(ansible.venv / "bin" / "ansible-playbook"), "-i", str(hosts), str(site), "--check"],
                          env=_isolated_env(ansible, installed, "h100_sxm_x8"), capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert recap(done.stdout)["failed"] == 0
    assert "would install once the package lists are refreshed nvidia-driver" in done.stdout
    # check mode wrote nothing through the API, nor on this machine
    assert plane.kubectl("get", "scv", node, check=False).returncode != 0
    assert {path: path.exists() for path in watched} == before


@pytest.mark.every_ansible_line
def test_module_defaults_carry_the_connection_through_the_action_group(ansible, installed, control_plane, tmp_path):
    plane = control_plane
    install_scv_crd(plane)
    node = "group-node-%s" % ansible.version.replace(".", "-")
    plane.kubectl("delete", "scv", node, "--ignore-not-found")
    playbook = tmp_path / "group.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "module_defaults": {"group/scv.gpu.k8s": {"kubeconfig": str(plane.admin_kubeconfig)}},
        "tasks": [
            {"name": "Read the GPUs", "scv.gpu.gpu_facts": {}},
            {"name": "Publish the Scv", "scv.gpu.scv": {"name": node, "gpu_facts": "{{ ansible_facts.nvidia_gpu }}"}},
            {"name": "Read it back with kubernetes.core", "kubernetes.core.k8s_info": {
                "api_version": "core.run-linux.com/v1", "kind": "Scv", "name": node}, "register": "read"},
            {"name": "Check it", "ansible.builtin.assert": {"that": ["read.resources | length == 1",
                                                                     "read.resources[0].status.cardNumber == 1"]}},
        ]}]))
    env = _isolated_env(ansible, installed, "titan_xp")
    env.pop("KUBECONFIG", None)
    env.pop("K8S_AUTH_KUBECONFIG", None)
    env["HOME"] = str(tmp_path)     # no ~/.kube/config to fall back on
    done = subprocess.run([str(ansible.venv / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=%s" % ansible.python, str(playbook)],
                          env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert recap(done.stdout)["changed"] == 1
    plane.kubectl("delete", "scv", node)
