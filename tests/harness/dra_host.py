"""A simulated DRA-ready GPU host for the dra_driver tests, and the Node that stands for it.

The host: the NVML simulator's GPUs (the scenario's driver version), containerd's config.toml
in a temporary folder, and the container_toolkit role's scv-gpu-cdi-refresh with the stand-in
nvidia-smi (the driver's program, which asks the simulator) and NVIDIA's own nvidia-ctk on PATH,
writing from a stand-in driver root (harness.nvidia_toolkit), so the CDI specification and its
fingerprint are real. The Node: created by the admin as a kubelet would register it, with the
kubelet version and allocatable GPUs set through its status as the kubelet would report them;
the ResourceSlice a DRA plugin publishes is created with the node's own credentials.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

from harness.nvidia_toolkit import DriverRoot, host_bin, install_toolkit
from harness.paths import ROOT, SIMULATOR_DIR, scenario_path

SCRIPT = ROOT / "roles" / "container_toolkit" / "files" / "scv-gpu-cdi-refresh"
IMAGE = "registry.example.com/nvidia/dra-driver-nvidia-gpu:v0.4.0"
# containerd 1.7's config with CDI on (version 2 keeps it off unless enable_cdi says so)
CONTAINERD_CDI = """version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
"""
PLAY = """
- hosts: localhost
  gather_facts: false
  roles:
    - role: scv.gpu.dra_driver
"""
# The same over several simulated hosts, each with its own environment (run_role_on_hosts)
HOSTS_PLAY = """
- hosts: dra_hosts
  gather_facts: false
  environment: "{{ dra_host_environment }}"
  roles:
    - role: scv.gpu.dra_driver
"""


def suffix(ansible):
    return re.sub(r"[^a-z0-9]+", "-", ansible.venv.name.lower()).strip("-")


class DraHost:
    """Files of one simulated host under ``tmp_path``; ``settings()`` gives the role's variables for it."""

    def __init__(self, tmp_path, monkeypatch=None):
        self.root = tmp_path / "host"
        self.bin = host_bin(self.root / "bin")
        self.refresh = self.root / "scv-gpu-cdi-refresh"
        self.refresh.write_bytes(SCRIPT.read_bytes())
        self.refresh.chmod(0o755)
        self.spec = self.root / "etc" / "cdi" / "nvidia.yaml"
        self.state = self.root / "var" / "lib" / "scv-gpu" / "cdi.fingerprint"
        self.containerd = self.root / "etc" / "containerd" / "config.toml"
        self.containerd.parent.mkdir(parents=True)
        self.containerd.write_text(CONTAINERD_CDI)
        self.crio = self.root / "etc" / "crio"
        self.sysfs = self.root / "sys"
        self.sysfs.mkdir()
        # the playbook's tasks on "the host" (localhost) find the stand-ins first; several hosts in one
        # run are given them through environment() instead
        if monkeypatch is not None:
            monkeypatch.setenv("PATH", "%s:%s" % (self.bin, os.environ["PATH"]))

    def crio_files(self, files):
        """CRI-O's configuration files: {path relative to /etc/crio: text} (crio.conf, crio.conf.d/...)."""
        for name, text in files.items():
            path = self.crio / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def imports(self, files):
        """Files beside config.toml for its imports: {path relative to its folder: text}."""
        for name, text in files.items():
            path = self.containerd.parent / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def toolkit(self, version=None):
        """NVIDIA's nvidia-ctk and CDI hook of ``version`` (None: the release pinned for the tests) on the PATH."""
        install_toolkit(self.bin, version)

    def generate_spec(self, scenario):
        """The spec and fingerprint for ``scenario``'s GPUs, as container_toolkit leaves them."""
        root = DriverRoot(self.root / ("driver-root-%s" % scenario), scenario_path(scenario))
        env = root.env({"PATH": "%s:/usr/sbin:/usr/bin:/sbin:/bin" % self.bin, "LD_LIBRARY_PATH": str(SIMULATOR_DIR)})
        done = subprocess.run(root.namespaced([self.refresh, "--output", self.spec, "--state", self.state]),
                              env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0 and done.stdout.strip() in ("generated", "unchanged"), done.stdout + done.stderr

    def environment(self, scenario):
        """What this host's tasks run with when several hosts share one run: its stand-ins and its GPUs."""
        return {"PATH": "%s:%s" % (self.bin, os.environ["PATH"]), "NVMLSIM_CONFIG": str(scenario_path(scenario))}

    def settings(self, plane, node, namespace, **more):
        values = {"dra_driver_kubeconfig": str(plane.admin_kubeconfig), "dra_driver_node_name": node,
                  "dra_driver_namespace": namespace, "dra_driver_image": IMAGE,
                  "dra_driver_containerd_config": str(self.containerd), "dra_driver_cdi_spec": str(self.spec),
                  "dra_driver_crio_config": str(self.crio / "crio.conf"),
                  "dra_driver_crio_config_dir": str(self.crio / "crio.conf.d"),
                  "dra_driver_cdi_state": str(self.state), "dra_driver_cdi_refresh": str(self.refresh),
                  "dra_driver_sysfs": str(self.sysfs)}
        values.update(more)
        return values


def put_node(plane, name, labels=None, kubelet="v1.37.1", gpus=None):
    """A Node as its kubelet registers it: labels, then its status (kubelet version, allocatable GPUs)."""
    plane.kubectl("delete", "node", name, "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}))
    status = {"nodeInfo": {"kubeletVersion": kubelet}}
    if gpus is not None:
        status["allocatable"] = status["capacity"] = {"nvidia.com/gpu": str(gpus), "cpu": "8", "pods": "110"}
    publish_status(plane, name, status)


def publish_status(plane, node, status):
    """The node's status as its kubelet reports it, written by the admin: kubectl reads nodes/status before it
    patches, which the Node authorizer does not grant the node itself."""
    plane.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}))


def publish_slice(plane, node, devices=1):
    """A ResourceSlice of gpu.nvidia.com for ``node``, created with the node's credentials as its DRA plugin does."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "%s-gpu.nvidia.com" % node},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-%d" % index,
                                  "attributes": {"type": {"string": "gpu"}}} for index in range(devices)]}}
    plane.kubectl("create", "-f", "-", input_text=json.dumps(body), kubeconfig=plane.node_kubeconfig(node))


def node_object(plane, name):
    return json.loads(plane.kubectl("get", "node", name, "-o", "json").stdout)


def run_role(ansible, tmp_path, scenario, settings, *extra):
    play = tmp_path / "dra-driver.yml"
    play.write_text(PLAY)
    return ansible.playbook(play, scenario, "-e", json.dumps(settings), *extra)


def run_role_on_hosts(ansible, tmp_path, hosts):
    """The role in one run over several simulated hosts: {inventory name: (settings, environment)}, each
    host reached locally with its own variables and environment (its GPUs, its stand-ins)."""
    inventory = {"all": {"children": {"dra_hosts": {"hosts": {
        name: dict(settings, ansible_connection="local", dra_host_environment=environment)
        for name, (settings, environment) in hosts.items()}}}}}
    (tmp_path / "hosts.json").write_text(json.dumps(inventory))
    play = tmp_path / "dra-driver-hosts.yml"
    play.write_text(HOSTS_PLAY)
    return ansible.playbook(play, None, "-i", str(tmp_path / "hosts.json"), "--forks", str(len(hosts)))
