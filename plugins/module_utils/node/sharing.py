# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""NVIDIA device plugin configs (time-slicing and MPS sharing), checked before the role applies them.

Pure functions (private to the collection). The configs are those of the device_plugin role's
``device_plugin_configs``: named configs in the format of NVIDIA's k8s-device-plugin (``version: v1``,
``flags``, ``sharing.timeSlicing`` or ``sharing.mps``). The plugin refuses some mistakes only when a
node loads the config, which leaves that node without a plugin; others it ignores without a word
(an unknown key, ``timeSlicing`` beside ``mps``, a resource it does not offer), which leaves the GPUs
unshared. Both kinds are refused here, before anything is applied, each message naming the
variable and the key and saying what to change.
"""

from __future__ import annotations

import re

from ansible_collections.scv.gpu.plugins.module_utils.node.labels import MIG_STRATEGIES, label_problem, resource_name

VARIABLE = "device_plugin_configs"
# The node label NVIDIA's config manager follows to pick a node's config.
CONFIG_LABEL = "nvidia.com/device-plugin.config"
VERSION = "v1"
SHARING_KINDS = ("timeSlicing", "mps")

_TOP_KEYS = ("version", "flags", "resources", "sharing", "imex")
_BLOCK_KEYS = ("renameByDefault", "failRequestsGreaterThanOne", "resources")
_RESOURCE_KEYS = ("name", "rename", "devices", "replicas")
# The plugin prefixes a bare name with nvidia.com/ and allows 63 characters in all.
_PREFIX = "nvidia.com/"
_SHARED = ".shared"
_MAX_RESOURCE_NAME = 63
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A MIG profile as the mixed strategy names its resource: 1g.10gb, 1c.2g.20gb, 1g.10gb+me, ...
_MIG_PROFILE = re.compile(r"^(\d+c\.)?\d+g\.\d+gb(\+[a-z]+(\.[a-z]+)*)*$")
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_DEVICE_REFERENCE = re.compile(r"^(\d+|\d+:\d+|GPU-%s|MIG-%s|MIG-GPU-%s/\d+/\d+)$" % (_UUID, _UUID, _UUID))
# How many clients one GPU's MPS server takes; NVIDIA's MPS daemon refuses more replicas than that
# (48 from compute capability 7.5 on, 16 before).
_MPS_CLIENTS_NEW, _MPS_CLIENTS_OLD, _MPS_NEW_FROM = 48, 16, (7, 5)


def at(name, *keys):
    """Where a value sits: device_plugin_configs['mps-2'].sharing.mps.resources[0].replicas."""
    path = "%s[%r]" % (VARIABLE, name)
    for key in keys:
        path += "[%d]" % key if isinstance(key, int) else ".%s" % key
    return path


def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool)


def sharing_kind(config):
    """'mps', 'timeSlicing' or None: how a (valid) config shares the GPUs."""
    sharing = config.get("sharing") if isinstance(config, dict) else None
    if not isinstance(sharing, dict):
        return None
    return next((kind for kind in SHARING_KINDS if kind in sharing), None)


def uses_mps(configs, name):
    """Whether config ``name`` of ``configs`` shares the GPUs with MPS."""
    return isinstance(configs, dict) and sharing_kind(configs.get(name)) == "mps"


def default_config(configs, default):
    """The config a node without a choice gets: ``default``, or the only config when there is one."""
    if default:
        return default
    if isinstance(configs, dict) and len(configs) == 1:
        return next(iter(configs))
    return ""


def _plain(value):
    """A copy of nested mappings and lists as plain dicts and lists: what Ansible hands a filter may be its own lazy
    containers, which copy.deepcopy cannot copy on ansible-core 2.19."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def completed(config, mig_strategy):
    """The config as the role writes it: version v1 and the role's MIG strategy filled in where left out."""
    config = _plain(config)
    flags = dict(config.pop("flags", None) or {})
    flags["migStrategy"] = flags.get("migStrategy", mig_strategy)
    done = {"version": config.pop("version", VERSION), "flags": flags}
    done.update(config)
    return done


def _name_problem(name):
    if not isinstance(name, str) or not name:
        return "%s: %r is not a name; name each config with a non-empty string" % (VARIABLE, name)
    problem = label_problem(CONFIG_LABEL, name)
    if problem:
        return ("%s: the config name %r cannot be a value of the node label %s and a ConfigMap key (%s); rename "
                "it" % (VARIABLE, name, CONFIG_LABEL, problem.replace("the value %r " % name, "")))
    return None


def _unknown_keys(value, known, where, what):
    """One message per key of ``value`` outside ``known``: the plugin ignores such a key without a word."""
    return ["%s.%s: the device plugin does not know this key in %s and would ignore it; known keys are %s"
            % (where, key, what, ", ".join(known)) for key in value if key not in known]


def _resource_name_problem(where, name, mig_strategy, kind):
    if not isinstance(name, str) or not name:
        return "%s.name: %r is not a resource name; name nvidia.com/gpu or a MIG resource" % (where, name)
    full = resource_name(name)
    if full == "nvidia.com/gpu":
        return None
    mig = full[len(_PREFIX):]
    if mig.startswith("mig-") and _MIG_PROFILE.match(mig[4:]):
        if mig_strategy != "mixed":
            return ("%s.name: %s is offered only under the mixed MIG strategy, and device_plugin_mig_strategy is "
                    "%s; name nvidia.com/gpu, or set device_plugin_mig_strategy: mixed" % (where, full, mig_strategy))
        if kind == "mps":
            return ("%s.name: %s is a MIG device, and the device plugin does not share MIG devices with MPS; use "
                    "timeSlicing for MIG devices" % (where, full))
        return None
    return ("%s.name: the device plugin offers no resource %s, so it would share nothing; name nvidia.com/gpu%s"
            % (where, full, " or nvidia.com/mig-<profile> (such as nvidia.com/mig-1g.10gb)"
               if mig_strategy == "mixed" else ""))


def _rename_problem(where, rename, name, by_default):
    if not isinstance(rename, str) or not rename:
        return "%s.rename: %r is not a resource name; leave rename out" % (where, rename)
    full = resource_name(rename)
    short = full[len(_PREFIX):]
    if len(full) > _MAX_RESOURCE_NAME or not _DNS_SUBDOMAIN.match(short):
        return ("%s.rename: %s is not a resource name the device plugin accepts (lower-case letters, digits, '-' "
                "and '.', %d characters at most with the nvidia.com/ prefix)" % (where, full, _MAX_RESOURCE_NAME))
    if by_default and isinstance(name, str) and full == resource_name(name) + _SHARED:
        return None
    # The plugin reads the key, then drops it with only a line in its log.
    return ("%s.rename: the device plugin ignores rename and offers the replicas as the resource itself, or as "
            "<name>.shared with renameByDefault: true; remove rename" % where)


def _devices_problem(where, devices):
    if devices == "all":
        return None
    if (_whole(devices) and devices > 0) or (isinstance(devices, list) and devices and all(
            (_whole(item) and item >= 0) or (isinstance(item, str) and _DEVICE_REFERENCE.match(item))
            for item in devices)):
        # Well formed, but the plugin shares every device of the resource whatever it says.
        return ("%s.devices: the device plugin ignores a device selection and shares every device of the resource; "
                "remove devices, or write all" % where)
    return ("%s.devices: %r is not a device selection the device plugin accepts; write all (it shares every device "
            "of the resource)" % (where, devices))


def _resource_problems(where, resource, mig_strategy, kind, by_default):
    if not isinstance(resource, dict):
        return ["%s: %r is not a mapping; write {name: nvidia.com/gpu, replicas: 4}" % (where, resource)]
    problems = _unknown_keys(resource, _RESOURCE_KEYS, where, "a shared resource")
    if "name" not in resource:
        problems.append("%s.name: missing; name the resource to share, such as nvidia.com/gpu" % where)
    else:
        problems.append(_resource_name_problem(where, resource["name"], mig_strategy, kind))
    replicas = resource.get("replicas")
    if "replicas" not in resource:
        problems.append("%s.replicas: missing; say into how many replicas each device is shared (2 or more)"
                        % where)
    elif not _whole(replicas):
        problems.append("%s.replicas: %r is not a whole number; write one of 2 or more, unquoted"
                        % (where, replicas))
    elif replicas < 2:
        problems.append("%s.replicas: %d is fewer than 2, and the device plugin shares a device among 2 or more "
                        "replicas; set 2 or more, or leave the resource out to offer it unshared"
                        % (where, replicas))
    if "rename" in resource:
        problems.append(_rename_problem(where, resource["rename"], resource.get("name"), by_default))
    if "devices" in resource:
        problems.append(_devices_problem(where, resource["devices"]))
    return [problem for problem in problems if problem]


def _block_problems(name, kind, block, mig_strategy):
    where = at(name, "sharing", kind)
    if not isinstance(block, dict):
        return ["%s: %r is not a mapping; write {resources: [{name: nvidia.com/gpu, replicas: 4}]}" % (where, block)]
    problems = _unknown_keys(block, _BLOCK_KEYS, where, "sharing.%s" % kind)
    for flag in ("renameByDefault", "failRequestsGreaterThanOne"):
        if flag in block and not isinstance(block[flag], bool):
            problems.append("%s.%s: %r is not true or false" % (where, flag, block[flag]))
    resources = block.get("resources")
    if not isinstance(resources, list) or not resources:
        problems.append("%s.resources: %s; the device plugin refuses a sharing block without resources, so list "
                        "at least one, such as {name: nvidia.com/gpu, replicas: 4}"
                        % (where, "missing" if "resources" not in block else "%r is not a non-empty list" % resources))
        return problems
    seen = {}
    for index, resource in enumerate(resources):
        problems += _resource_problems("%s.resources[%d]" % (where, index), resource, mig_strategy, kind,
                                       block.get("renameByDefault") is True)
        full = resource_name(resource["name"]) if isinstance(resource, dict) and isinstance(
            resource.get("name"), str) and resource["name"] else None
        if full in seen:
            problems.append("%s.resources[%d].name: %s is listed already at resources[%d]; list each resource once"
                            % (where, index, full, seen[full]))
        elif full:
            seen[full] = index
    return problems


def _flags_problems(name, flags, mig_strategy):
    where = at(name, "flags")
    if not isinstance(flags, dict):
        return ["%s: %r is not a mapping of the device plugin's flags" % (where, flags)]
    if "migStrategy" not in flags or flags["migStrategy"] == mig_strategy:
        return []
    return ["%s.migStrategy: %r differs from device_plugin_mig_strategy (%s), which the plugin's MIG_STRATEGY and the "
            "node labels follow; leave migStrategy out (the role writes device_plugin_mig_strategy) or change "
            "device_plugin_mig_strategy" % (where, flags["migStrategy"], mig_strategy)]


def _sharing_problems(name, sharing, mig_strategy):
    where = at(name, "sharing")
    if not isinstance(sharing, dict):
        return ["%s: %r is not a mapping; write timeSlicing: {...} or mps: {...}" % (where, sharing)]
    problems = _unknown_keys(sharing, SHARING_KINDS, where, "sharing")
    kinds = [kind for kind in SHARING_KINDS if kind in sharing]
    if len(kinds) > 1:
        problems.append("%s: sets both timeSlicing and mps, and the device plugin would use mps and ignore "
                        "timeSlicing; keep one, or make two configs and choose one per node" % where)
    if "mps" in sharing and mig_strategy == "mixed":
        problems.append("%s.mps: the device plugin does not run MPS under the mixed MIG strategy; set "
                        "device_plugin_mig_strategy to none or single, or use timeSlicing" % where)
    for kind in kinds:
        problems += _block_problems(name, kind, sharing[kind], mig_strategy)
    return problems


def one_config_problems(name, config, mig_strategy):
    """What is wrong with config ``name``: each message names the key and says what to do."""
    problem = _name_problem(name)
    if problem:
        return [problem]
    if not isinstance(config, dict):
        return ["%s: %r is not a mapping; write {version: v1, sharing: {timeSlicing: {...}}}" % (at(name), config)]
    problems = _unknown_keys(config, _TOP_KEYS, at(name), "a config")
    if "version" in config and config["version"] != VERSION:
        problems.append("%s: %r is a version the device plugin does not read; write v1 or leave it out"
                        % (at(name, "version"), config["version"]))
    if "flags" in config:
        problems += _flags_problems(name, config["flags"], mig_strategy)
    if config.get("resources"):
        problems.append("%s: the device plugin ignores custom resource names; remove it (sharing.*.renameByDefault "
                        "renames shared resources)" % at(name, "resources"))
    if "sharing" in config:
        problems += _sharing_problems(name, config["sharing"], mig_strategy)
    return problems


def _choice_problems(configs, default, choice, flavor):
    if not configs:
        chosen = (("device_plugin_default_config", default), ("device_plugin_config", choice))
        set_without = [variable for variable, value in chosen if value]
        return ["%s is set, but %s is empty; define the config there, or leave %s unset"
                % (variable, VARIABLE, variable) for variable in set_without]
    problems = []
    if flavor != "nvidia":
        problems.append("%s: configs are read by NVIDIA's device plugin only, and device_plugin_flavor is %s; set "
                        "device_plugin_flavor: nvidia or leave %s empty" % (VARIABLE, flavor, VARIABLE))
    names = ", ".join(sorted(str(name) for name in configs))
    if not default_config(configs, default):
        problems.append("device_plugin_default_config: unset, and %s has %d configs (%s); name the one a node "
                        "without device_plugin_config gets" % (VARIABLE, len(configs), names))
    for variable, value in (("device_plugin_default_config", default), ("device_plugin_config", choice)):
        if value and value not in configs:
            problems.append("%s: %r is not a config of %s (%s); name one of them" % (variable, value, VARIABLE, names))
    return problems


def config_problems(configs, mig_strategy="none", default="", choice="", flavor="nvidia"):
    """Everything wrong with the configs, the default and one host's choice; empty when all is well."""
    if configs in (None, ""):
        configs = {}
    if not isinstance(configs, dict):
        return ["%s: %r is not a mapping of config names to configs" % (VARIABLE, configs)]
    if mig_strategy not in MIG_STRATEGIES:
        return ["device_plugin_mig_strategy: %r is none, single or mixed" % (mig_strategy,)]
    problems = _choice_problems(configs, default, choice, flavor)
    for name, config in configs.items():
        problems += one_config_problems(name, config, mig_strategy)
    return problems


def _capability(card):
    """A card's compute capability as (major, minor), or None when the facts do not say."""
    match = re.match(r"^(\d+)\.(\d+)$", str(card.get("computeCapability") or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def host_problems(configs, choice, fact, node):
    """Why the chosen config cannot run on node ``node`` whose GPUs ``fact`` (gpu_facts' nvidia_gpu) describes.

    Only MPS depends on the GPUs: the plugin refuses MPS on MIG devices, and the MPS daemon refuses
    more replicas than a GPU's MPS server takes clients.
    """
    if not uses_mps(configs, choice) or not isinstance(fact, dict):
        return []
    cards = [card for card in fact.get("cardList") or [] if isinstance(card, dict)]
    where = at(choice, "sharing", "mps")
    problems = []
    mig = [str(position) for position, card in enumerate(cards) if card.get("migEnabled")]
    if mig:
        problems.append("node %s: config %r shares its GPUs with MPS, but MIG is enabled on GPU %s, and MPS cannot "
                        "share MIG devices; choose a timeSlicing config for this host (device_plugin_config), or "
                        "disable MIG" % (node, choice, ", ".join(mig)))
    limits = []
    for position, card in enumerate(cards):
        capability = _capability(card)
        if capability:
            clients = _MPS_CLIENTS_NEW if capability >= _MPS_NEW_FROM else _MPS_CLIENTS_OLD
            limits.append((clients, position, card["computeCapability"]))
    if not limits:
        return problems
    clients, gpu, capability = min(limits, key=lambda limit: limit[0])
    for index, resource in enumerate(configs[choice]["sharing"]["mps"]["resources"]):
        if resource["replicas"] > clients:
            problems.append("node %s: %s.resources[%d].replicas: %d is more than the %d clients an MPS server takes on "
                            "GPU %s (compute capability %s); set %d or fewer"
                            % (node, where, index, resource["replicas"], clients, gpu, capability, clients))
    return problems
