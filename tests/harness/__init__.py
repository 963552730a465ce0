"""What the tests and the benchmarks run against, imported by name (``tests`` on the Python path):

- ``paths``: where the checkout keeps the collection, the simulator, its scenarios and the agent's wheels;
- ``common``: ``wait_until`` and ``free_port``;
- ``control_plane``: a real etcd and kube-apiserver (also a command: ``python -m harness.control_plane``),
  ``read_object`` and ``install_scv_crd``;
- ``stalled_server``: an API server that accepts connections and never answers;
- ``agent``: the Scv agent as the role installs it, run as a process for one node; ``agent_fleet``: many;
- ``kubelet_podresources``: a stand-in kubelet serving pod-resources; ``real_kubelet``: a real one, with
  containerd and a device plugin;
- ``containerd``: Debian's containerd, and generated configs read back by a containerd binary;
- ``in_process``: ``run_module``, a module's main() in this process;
- ``ansible``: the ``ansible`` and ``ansible-playbook`` commands of one ansible-core line, and ``recap``;
- ``pci_sysfs`` and ``kernel_modules``: sysfs PCI trees and kernel modules built for a test;
- ``mig_placement``: where a scenario file's GPU instances sit (what nvidia-mig-parted's fixtures record);
- ``yoda_scheduler``: the Yoda scheduler's reading of an Scv;
- ``dra_host``: a simulated host ready for NVIDIA's DRA driver, its Node, and what its kubelet and DRA plugin publish;
- ``scenario_expectations`` and ``label_expectations``: what each simulator scenario must give, worked out by hand.
"""
