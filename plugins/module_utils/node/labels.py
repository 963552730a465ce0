# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""GPU node labels from the nvidia_gpu fact (private to the collection; pure functions).

The names and value formats are those of NVIDIA's GPU feature discovery (GFD), which
manifests and schedulers already select on, plus one key of the site's choosing
(``gpu/nvidia=<model>`` by default) for DaemonSets that select on a key of their own. The labels in
:data:`GFD_KEYS` and the site's key are ours: they are set, changed and removed to match
the facts. Every other label of a Node is left alone.
"""

from __future__ import annotations

import re

from ansible_collections.scv.gpu.plugins.module_utils.host.pci import bus_key

PREFIX = "nvidia.com/"
GFD_KEYS = tuple(PREFIX + name for name in (
    "gpu.present",
    "gpu.product",
    "gpu.replicas",
    "gpu.sharing-strategy",
    "gpu.count",
    "gpu.memory",
    "gpu.clique",
    "gpu.family",
    "gpu.compute.major",
    "gpu.compute.minor",
    "gpu.mode",
    "cuda.driver.major",
    "cuda.driver.minor",
    "cuda.driver.rev",
    "cuda.runtime.major",
    "cuda.runtime.minor",
    "cuda.driver-version.major",
    "cuda.driver-version.minor",
    "cuda.driver-version.revision",
    "cuda.driver-version.full",
    "cuda.runtime-version.major",
    "cuda.runtime-version.minor",
    "cuda.runtime-version.full",
    "mig.capable",
    "mig.strategy",
    "mps.capable",
    "vgpu.present",
))
MIG_STRATEGIES = ("none", "single", "mixed")
# The device plugin's resource for whole GPUs (and, under the single MIG strategy, for MIG devices).
GPU_RESOURCE = PREFIX + "gpu"

# A MIG device's attributes as GFD labels them: label suffix, key of the fact's "attributes".
MIG_ATTRIBUTE_LABELS = (
    ("memory", "memory"),
    ("multiprocessors", "multiprocessors"),
    ("slices.gi", "gpuInstanceSlices"),
    ("slices.ci", "computeInstanceSlices"),
    ("engines.copy", "copyEngines"),
    ("engines.decoder", "decoders"),
    ("engines.encoder", "encoders"),
    ("engines.jpeg", "jpegEngines"),
    ("engines.ofa", "ofaEngines"),
)
_MIG_ATTRIBUTE_SUFFIXES = tuple(suffix for suffix, _key in MIG_ATTRIBUTE_LABELS if suffix != "memory")
# The labels of one MIG profile under the mixed strategy: nvidia.com/mig-<profile>.<suffix>.
_MIXED_KEY = re.compile(r"^nvidia\.com/mig-[A-Za-z0-9._+-]+\.(count|product|replicas|sharing-strategy|%s)$"
                        % "|".join(re.escape(suffix) for suffix, _key in MIG_ATTRIBUTE_LABELS))
_SINGLE_KEYS = tuple(PREFIX + "gpu." + suffix for suffix in _MIG_ATTRIBUTE_SUFFIXES)

# PCI classes: a VGA controller is a GPU in graphics mode, a 3D controller one in compute mode.
_PCI_MODES = {"0x030000": "graphics", "0x030200": "compute"}

_NOT_GFD_CHARACTERS = re.compile(r"[^A-Za-z0-9\-_. ]")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def sanitise_product(name):
    """A GPU name as GFD writes it in a label: characters outside [A-Za-z0-9-_. ] removed, spaces
    turned into '-' ('NVIDIA H100 80GB HBM3' -> 'NVIDIA-H100-80GB-HBM3'). GFD does not shorten a long
    name; ``label_problem`` tells when the value cannot be a label's."""
    return _NOT_GFD_CHARACTERS.sub("", name or "").strip().replace(" ", "-").strip("-_.")


def label_problem(key, value):
    """Why the API server would refuse ``key=value`` on a Node (and refuse the whole patch with it), or None."""
    if not valid_label_key(key):
        return "%r is not a valid label key" % key
    if len(value) > 63:
        return "the value %r is %d characters long, over the 63 a label value may have" % (value, len(value))
    if not _LABEL_VALUE.match(value):
        return ("the value %r is not a valid label value (letters, digits, '-', '_' and '.', beginning and ending "
                "with a letter or digit)" % value)
    return None


def _valid(labels, refused):
    """``labels`` without those the API server would refuse; each left out is named in ``refused``
    ({key: why}), as nfd-master leaves out each label of GFD's it cannot set and keeps the rest."""
    kept = {}
    for key, value in labels.items():
        problem = label_problem(key, value)
        if problem is None:
            kept[key] = value
        elif refused is not None:
            refused[key] = problem
    return kept


def valid_label_key(key):
    """Whether ``key`` is a valid Kubernetes label key (optional DNS prefix, then a name)."""
    prefix, _sep, name = key.rpartition("/")
    return bool(_LABEL_KEY.match(key)) and len(name) <= 63 and len(prefix) <= 253


def _version_parts(version):
    parts = (version or "").split(".")
    return parts if all(part.isdigit() for part in parts) and parts != [""] else []


def owns(key, gpu_label_key):
    """Whether label ``key`` is one this collection sets (and so removes when it no longer applies)."""
    return key in GFD_KEYS or key == gpu_label_key or key in _SINGLE_KEYS or bool(_MIXED_KEY.match(key))


def mig_resource_name(profile):
    """A MIG profile as GFD and the device plugin name its resource ('1g.5gb+me' -> '1g.5gb.me')."""
    return profile.replace("+", ".")


def desired_labels(fact, gpu_label_key, mig_strategy="none", refused=None, config=None):
    """The labels a node with this nvidia_gpu fact should carry (ours only), as GFD writes them
    with ``--mig-strategy mig_strategy`` and ``config``, the node's device plugin config in NVIDIA's format
    (None: no config file, GFD's defaults). A label whose value no Node may carry (a long GPU name with a
    MIG profile after it) is left out, and named with the reason in the dict ``refused`` when given.

    A node whose driver sees no GPU gets only ``vgpu.present``; one whose driver cannot be read gets those
    :func:`pci_labels` gives from its PCI bus. With several models, the GPU labels describe the
    first GPU's model and count only the GPUs of that model: GFD picks one of the models at
    random, so this is always one of the answers GFD can give, and always the same one.
    """
    fact = fact or {}
    cards = [card for card in fact.get("cardList") or [] if card.get("model")]
    if not fact.get("nvml_available"):
        return pci_labels(fact.get("pci_gpus"), gpu_label_key, refused)
    if not cards:
        # GFD's one label for a node whose driver sees no GPU
        return {PREFIX + "vgpu.present": _vgpu_present(fact.get("pci_gpus"))}
    labels = {PREFIX + "gpu.present": "true", PREFIX + "vgpu.present": _vgpu_present(fact.get("pci_gpus"))}
    labels.update(_version_labels(fact))
    labels[PREFIX + "mig.capable"] = "true" if any("migEnabled" in card for card in cards) else "false"
    labels[PREFIX + "gpu.mode"] = _gpu_mode(cards, fact.get("pci_gpus"))
    shares = config_sharing(config)
    labels[PREFIX + "mps.capable"] = "true" if shares[0] == "mps" and not mps_refusal(fact) else "false"
    labels.update(_gpu_labels(cards, shares))
    labels.update(_clique_label(cards))
    if mig_strategy == "single":
        labels.update(_single_labels(cards, shares))
    elif mig_strategy == "mixed":
        labels.update(_mixed_labels(cards, shares))
    if mig_strategy in ("single", "mixed"):
        labels[PREFIX + "mig.strategy"] = mig_strategy
    labels[gpu_label_key] = sanitise_product(cards[0]["model"])
    return _valid(labels, refused)


def _version_labels(fact):
    labels = {}
    driver = _version_parts(fact.get("driver_version"))
    if 2 <= len(driver) <= 3:
        driver = driver + [""] * (3 - len(driver))
        labels[PREFIX + "cuda.driver-version.full"] = fact["driver_version"]
        for name, short, part in zip(("major", "minor", "revision"), ("major", "minor", "rev"), driver):
            labels[PREFIX + "cuda.driver-version." + name] = part
            labels[PREFIX + "cuda.driver." + short] = part
    runtime = _version_parts(fact.get("cuda_driver_version"))
    if len(runtime) >= 2:
        labels[PREFIX + "cuda.runtime-version.full"] = "%s.%s" % tuple(runtime[:2])
        for name, part in zip(("major", "minor"), runtime):
            labels[PREFIX + "cuda.runtime-version." + name] = part
            labels[PREFIX + "cuda.runtime." + name] = part
    return labels


def config_sharing(config):
    """A device plugin config's sharing as GFD reads it: (the strategy, {resource name: (replicas, renamed)}).

    The strategy is ``mps`` when ``sharing.mps`` gives a resource more than one replica, else ``time-slicing``
    when ``sharing.timeSlicing`` does, else ``none``. The resources are those of ``mps`` when the key is there at
    all, else those of ``timeSlicing``; the first entry of a name counts. A shared resource is renamed
    (``<name>.shared``) exactly when ``renameByDefault`` is set, as the plugin ignores a ``rename`` of its own.
    """
    sharing = _mapping(_mapping(config).get("sharing"))
    mps, slicing = sharing.get("mps"), _mapping(sharing.get("timeSlicing"))
    chosen = _mapping(mps) if mps is not None else slicing
    resources = {}
    for resource in _entries(chosen):
        resources.setdefault(resource_name(resource.get("name")), (_replicas(resource), bool(chosen.get("renameByDefault"))))

    def replicated(part):
        return any(_replicas(resource) > 1 for resource in _entries(_mapping(part)))

    strategy = "mps" if mps is not None and replicated(mps) else "time-slicing" if replicated(slicing) else "none"
    return strategy, resources


def resource_name(name):
    """A config's resource name as the device plugin reads it: one without the nvidia.com/ prefix gets it
    (``gpu`` is ``nvidia.com/gpu``)."""
    return name if not isinstance(name, str) or name.startswith(PREFIX) else PREFIX + name


def _mapping(value):
    return value if isinstance(value, dict) else {}


def _entries(part):
    resources = part.get("resources")
    return [resource for resource in resources if isinstance(resource, dict)] if isinstance(resources, list) else []


def _replicas(resource):
    """A resource's replicas, 0 where it has none (a config is checked before it reaches the labels)."""
    replicas = resource.get("replicas")
    return replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else 0


def mps_refusal(fact):
    """Why MPS cannot be offered on these GPUs, or None: NVIDIA's plugin and GFD refuse it while any GPU has
    MIG enabled."""
    enabled = [card.get("index", position) for position, card in enumerate((fact or {}).get("cardList") or [])
               if card.get("migEnabled")]
    if enabled:
        return "MPS sharing is not supported while MIG is enabled (GPU %s)" % ", ".join(str(index) for index in enabled)
    return None


def _sharing_labels(prefix, resource, shares, product):
    """``<resource>.replicas``, ``.sharing-strategy`` and ``.product`` (with ``-SHARED`` after a replicated,
    unrenamed resource's name). ``shares`` None: GFD's labels of a resource it does not share (replicas 0)."""
    if shares is None:
        return {prefix + "replicas": "0", prefix + "sharing-strategy": "none", prefix + "product": product}
    strategy, resources = shares
    replicas, renamed = resources.get(resource, (1, False))
    replicas = max(replicas, 1)
    return {prefix + "replicas": str(replicas), prefix + "sharing-strategy": strategy if replicas > 1 else "none",
            prefix + "product": product + ("-SHARED" if replicas > 1 and not renamed else "")}


def _gpu_labels(cards, shares):
    """product, count, memory, family and compute capability of the first GPU's model, and how it is
    shared. GFD shares no GPU of a model whose every GPU has MIG enabled."""
    first = cards[0]
    same = [card for card in cards if card["model"] == first["model"]]
    labels = _sharing_labels(PREFIX + "gpu.", GPU_RESOURCE, None if all(card.get("migEnabled") for card in same)
                             else shares, sanitise_product(first["model"]))
    labels[PREFIX + "gpu.count"] = str(len(same))
    if first.get("totalMemory"):
        labels[PREFIX + "gpu.memory"] = str(first["totalMemory"])
    compute = _version_parts(first.get("computeCapability"))
    if len(compute) == 2 and compute[0] != "0":
        labels[PREFIX + "gpu.compute.major"], labels[PREFIX + "gpu.compute.minor"] = compute
        if first.get("family"):
            labels[PREFIX + "gpu.family"] = first["family"]
    return labels


NO_CLUSTER = "00000000-0000-0000-0000-000000000000"


def _clique_label(cards):
    """``gpu.clique``, ``<cluster UUID>.<clique ID>`` of the NVLink fabric the GPUs are attached to, as GFD
    writes it: a GPU is attached once its fabric is completed with a success status and a cluster UUID
    (a single HGX board has none), and the label is left out when none is, or when the attached ones
    disagree on the cluster or the clique. It needs the fabric facts (``gather_subset`` fabric)."""
    attached = {(fabric["clusterUuid"], fabric["cliqueId"]) for fabric in (card.get("fabric") for card in cards)
                if fabric and fabric["state"] == "completed" and fabric.get("status") == "Success"
                and fabric["clusterUuid"] != NO_CLUSTER}
    if len({cluster for cluster, _clique in attached}) != 1 or len({clique for _cluster, clique in attached}) != 1:
        return {}
    cluster, clique = attached.pop()
    return {PREFIX + "gpu.clique": "%s.%d" % (cluster, clique)}


def mig_devices(cards):
    """(parent card, MIG device) for every MIG device with a profile, in GPU order."""
    return [(card, device) for card in cards if card.get("migEnabled")
            for device in card.get("migDevices") or [] if device.get("profile")]


def _profile_labels(prefix, resource, shares, card, device, count):
    product = "%s-MIG-%s" % (sanitise_product(card["model"]),
                             _NOT_GFD_CHARACTERS.sub("", mig_resource_name(device["profile"])))
    labels = _sharing_labels(prefix, resource, shares, product)
    labels[prefix + "count"] = str(count)
    attributes = device.get("attributes") or {}
    for suffix, key in MIG_ATTRIBUTE_LABELS:
        if key in attributes:
            labels[prefix + suffix] = str(attributes[key])
    return labels


def single_strategy_faults(cards):
    """What the ``single`` MIG strategy cannot take in these cards, as GFD (which labels the node invalid) and
    NVIDIA's device plugin (which will not start) both judge it: {"empty": positions of GPUs with MIG on and
    no MIG device, "profiles": the MIG profiles when there is more than one, "mig_off": positions of GPUs
    with MIG off beside GPUs with it on}, the faults found only; {} for none."""
    enabled = [position for position, card in enumerate(cards) if card.get("migEnabled")]
    if not enabled:
        return {}
    faults = {}
    empty = [position for position in enabled if not cards[position].get("migDevices")]
    if empty:
        faults["empty"] = empty
    profiles = sorted({device["profile"] for _card, device in mig_devices(cards)})
    if len(profiles) > 1:
        faults["profiles"] = profiles
    if len(enabled) != len(cards):
        faults["mig_off"] = [position for position in range(len(cards)) if position not in enabled]
    return faults


def _single_labels(cards, shares):
    """Strategy single: the node's GPUs are its MIG devices, all of one profile. Anything else is
    labelled invalid (product '<model>-MIG-INVALID', count, memory and replicas 0, no sharing strategy), as
    GFD does."""
    enabled = [card for card in cards if card.get("migEnabled")]
    if not enabled:
        return {}
    devices = mig_devices(cards)
    if single_strategy_faults(cards) or not devices:     # no MIG device with a readable profile: none to name
        return {PREFIX + "gpu.product": sanitise_product(enabled[0]["model"]) + "-MIG-INVALID",
                PREFIX + "gpu.count": "0", PREFIX + "gpu.memory": "0",
                PREFIX + "gpu.replicas": "0", PREFIX + "gpu.sharing-strategy": ""}
    card, device = devices[0]
    return _profile_labels(PREFIX + "gpu.", GPU_RESOURCE, shares, card, device, len(devices))


def _mixed_labels(cards, shares):
    """Strategy mixed: nvidia.com/mig-<profile>.* for every MIG profile the node has."""
    labels, counts, first = {}, {}, {}
    for card, device in mig_devices(cards):
        name = mig_resource_name(device["profile"])
        counts[name] = counts.get(name, 0) + 1
        first.setdefault(name, (card, device))
    for name, (card, device) in first.items():
        labels.update(_profile_labels("%smig-%s." % (PREFIX, name), "%smig-%s" % (PREFIX, name), shares, card, device,
                                      counts[name]))
    return labels


def _pci_of(pci_gpus):
    from_bus = {}
    for gpu in pci_gpus if isinstance(pci_gpus, list) else []:
        if isinstance(gpu, dict) and bus_key(gpu.get("busId")) is not None:
            from_bus[bus_key(gpu["busId"])] = gpu
    return from_bus


def _gpu_mode(cards, pci_gpus):
    """'graphics' or 'compute' when every GPU's PCI class says so, else 'unknown' (GFD's rule,
    which also answers 'unknown' when a GPU's PCI entry cannot be read)."""
    pci = _pci_of(pci_gpus)
    modes = set()
    for card in cards:
        gpu = pci.get(bus_key(card.get("pciBusId")))
        if gpu is None:
            return "unknown"
        modes.add(_PCI_MODES.get(gpu.get("class"), "unknown"))
    return modes.pop() if len(modes) == 1 else "unknown"


def _vgpu_present(pci_gpus):
    return "true" if any(gpu.get("vgpu") for gpu in _pci_of(pci_gpus).values()) else "false"


def pci_labels(pci_gpus, gpu_label_key, refused=None):
    """The labels of a node whose driver does not answer, from the GPUs its PCI bus has.

    ``gpu.present`` and the site's key, so that a driver-installer DaemonSet selecting on either
    reaches the node before any driver runs. The key's value is the model NVML will report
    (from the device ID), so it does not change when the driver comes up, or ``pci-10de-<device>``
    for a device the table does not know. Nothing for a node without NVIDIA GPUs.
    """
    gpus = [gpu for gpu in pci_gpus if isinstance(gpu, dict) and isinstance(gpu.get("deviceId"), str)
            and gpu["deviceId"].startswith("0x")] if isinstance(pci_gpus, list) else []
    if not gpus:
        return {}
    first = gpus[0]
    model = first.get("model") if isinstance(first.get("model"), str) else None
    value = sanitise_product(model) if model else "pci-10de-%s" % first["deviceId"][2:]
    return _valid({PREFIX + "gpu.present": "true", gpu_label_key: value}, refused)


def label_changes(current, desired, gpu_label_key):
    """The merge patch that takes a Node's labels from ``current`` to ``desired`` for the keys we
    own: {key: value} to set, {key: None} to remove. Empty when nothing changes."""
    current = current or {}
    changes = {key: value for key, value in desired.items() if current.get(key) != value}
    changes.update({key: None for key in current if owns(key, gpu_label_key) and key not in desired})
    return changes
