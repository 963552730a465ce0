# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What validating a GPU node checks, the pods it runs, and the report it writes (private; pure functions).

A check is a dict: ``node``, ``check`` (a name of CHECKS), ``outcome`` (PASSED, FAILED or SKIPPED) and ``reason``
(why it failed or was skipped, empty when it passed). Every check is evidence for the requirements of the CNCF
Kubernetes AI Conformance that CHECKS names.
"""

from __future__ import annotations

import json
import re
from xml.sax.saxutils import quoteattr

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"

# check: (what it shows, the AI Conformance requirements it is evidence for)
CHECKS = {
    "driver": ("the driver is loaded, at the pinned version where one is pinned", ["driver_runtime_management"]),
    "device_nodes": ("every device node a CUDA program opens exists: nvidiactl, nvidia-uvm, nvidia-uvm-tools and "
                     "one nvidiaN per GPU", ["driver_runtime_management"]),
    "dev_char_links": ("each NVIDIA device node has its /dev/char link, which systemd's device cgroup rules need",
                       ["driver_runtime_management"]),
    "cdi_spec": ("the CDI specification names every GPU the driver has, and no other", ["driver_runtime_management"]),
    "fabric": ("on NVSwitch (HGX) boards, every GPU's NVLink fabric is completed, healthy and successful: Fabric "
               "Manager trained it", ["driver_runtime_management"]),
    "container_runtime": ("the container runtime runs NVIDIA's runtime (as its default, where the roles made it so), "
                          "and that runtime is a release with every published security fix",
                          ["driver_runtime_management", "secure_accelerator_access"]),
    "runtime_isolation": ("NVIDIA's runtime ignores NVIDIA_VISIBLE_DEVICES from unprivileged containers and takes "
                          "device lists as volume mounts", ["secure_accelerator_access"]),
    "workload": ("a pod that asks for one GPU runs the workload image on it and exits 0",
                 ["driver_runtime_management", "secure_accelerator_access"]),
    "second_container": ("a second container of the workload pod, which asks for nothing, finds no GPU",
                         ["secure_accelerator_access"]),
    "no_request": ("a pod that asks for no GPU finds none, with NVIDIA_VISIBLE_DEVICES=all in its environment",
                   ["secure_accelerator_access"]),
    "sharing": ("where the node's device plugin shares its GPUs (nvidia.com/gpu.replicas above 1), one more pod than "
                "the node has GPUs, each asking for one, all run at once: at least two of them share a GPU",
                ["gpu_sharing"]),
    "metrics": ("while a pod holds a GPU, the node's agent serves that GPU's utilization series labelled with the "
                "pod, as dcgm-exporter does", ["accelerator_metrics"]),
}
REQUIREMENTS = {
    "secure_accelerator_access": "MUST",
    "accelerator_metrics": "MUST",
    "driver_runtime_management": "SHOULD",
    "gpu_sharing": "SHOULD",
}
POD_CHECKS = ("workload", "second_container", "no_request")
NODE_CHECKS = POD_CHECKS + ("sharing", "metrics")     # what scv.gpu.node_validate reports, in this order


def check(node, name, failure=None, skipped=None):
    """The result of check ``name`` on ``node``: failed with ``failure``, skipped with ``skipped``, else passed."""
    if name not in CHECKS:
        raise ValueError("unknown check %r" % name)
    if failure:
        return {"node": node, "check": name, "outcome": FAILED, "reason": failure}
    if skipped:
        return {"node": node, "check": name, "outcome": SKIPPED, "reason": skipped}
    return {"node": node, "check": name, "outcome": PASSED, "reason": ""}


# ------------------------------------------------------------------------------------------------- host

def missing_device_nodes(present, gpu_minors):
    """The device nodes (names under /dev) a CUDA program needs that ``present`` (a set of names) lacks."""
    wanted = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] + ["nvidia%d" % minor for minor in gpu_minors]
    return [name for name in wanted if name not in present]


def cdi_problems(spec, uuids):
    """What is wrong with a CDI ``spec`` (parsed) for a driver whose GPUs are ``uuids``: [text]."""
    if not isinstance(spec, dict) or not isinstance(spec.get("devices"), list):
        return ["it holds no device list"]
    named = set()
    for device in spec["devices"]:
        if isinstance(device, dict) and isinstance(device.get("name"), str):
            named.add(device["name"])
    gpu_names = {name for name in named if name.startswith("GPU-")}
    problems = ["it lacks GPU %s" % uuid for uuid in uuids if uuid not in named]
    problems += ["it names GPU %s, which the driver does not have" % name for name in sorted(gpu_names - set(uuids))]
    return problems


def isolation_problems(settings):
    """What in NVIDIA's runtime ``settings`` ({key: value}, as nvidia_runtime_config reads them) lets a pod reach
    GPUs it did not ask for: [text]."""
    problems = []
    if settings.get("accept-nvidia-visible-devices-envvar-when-unprivileged", True) is not False:
        problems.append("accept-nvidia-visible-devices-envvar-when-unprivileged is not false: any unprivileged pod "
                        "that sets NVIDIA_VISIBLE_DEVICES gets those GPUs")
    if settings.get("accept-nvidia-visible-devices-as-volume-mounts", False) is not True:
        problems.append("accept-nvidia-visible-devices-as-volume-mounts is not true: the device plugin's volume-mount "
                        "lists reach no container")
    return problems


def fabric_problems(cards):
    """What is wrong with the NVLink fabric of ``cards`` (gpu_facts' cardList, read with the fabric subset):
    (problems [text], whether any card is in a fabric)."""
    problems, in_fabric = [], False
    for card in cards:
        fabric = card.get("fabric")
        if not isinstance(fabric, dict):
            continue
        in_fabric = True
        name = "GPU %s (%s)" % (card.get("id"), card.get("uuid"))
        if fabric.get("state") != "completed":
            problems.append("%s: its NVLink fabric is %s, not completed" % (name, fabric.get("state")))
        elif fabric.get("status") != "Success":
            problems.append("%s: its NVLink fabric failed (%s)" % (name, fabric.get("status")))
        elif fabric.get("healthSummary") not in (None, "healthy"):
            problems.append("%s: its NVLink fabric is %s" % (name, fabric.get("healthSummary")))
    return problems, in_fabric


NVIDIA_RUNTIME = "nvidia-container-runtime"


def runtime_choice_problems(kind, default, runtimes, expect_default):
    """What keeps pods from NVIDIA's runtime in a container runtime's settings: [text]. ``kind``: containerd, crio or
    docker; ``default``: the name of its default runtime; ``runtimes``: {name: the binary it runs, '' when it names
    none}; ``expect_default``: the roles made NVIDIA's runtime the default
    (container_toolkit_<kind>_default_runtime)."""
    nvidia = sorted(name for name, binary in runtimes.items()
                    if binary.rsplit("/", 1)[-1].startswith(NVIDIA_RUNTIME))
    if not nvidia:
        return ["no runtime runs %s (the default is %s): no pod can reach NVIDIA's runtime; run the "
                "container_toolkit role" % (NVIDIA_RUNTIME, default)]
    if expect_default and default not in nvidia:
        return ["the default runtime is %s, not NVIDIA's (%s): pods the device plugin gives GPUs get none of them; "
                "set container_toolkit_%s_default_runtime: true and run the container_toolkit role, or false where "
                "that is meant" % (default, ", ".join(nvidia), kind)]
    return []


# ------------------------------------------------------------------------------------------------- pods

NO_GPU_PROBE = ["sh", "-c", 'for node in /dev/nvidia[0-9]*; do if [ -e "$node" ]; then echo "found $node"; exit 1; '
                'fi; done; echo "no GPU device node"']


def _container(name, spec, env=None, resources=None):
    """A container that runs ``spec`` ({"image", "command", "pull_policy"}) unprivileged. One that fails leaves the
    end of its output as its termination message, which the kubelet reports in the pod's status: no log API needed
    to say why."""
    body = {"name": name, "image": spec["image"], "imagePullPolicy": spec.get("pull_policy") or "IfNotPresent",
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}
    if spec.get("command"):
        body["command"] = list(spec["command"])
    if env:
        body["env"] = [{"name": key, "value": value} for key, value in sorted(env.items())]
    if resources:
        body["resources"] = resources
    return body


def _pod(node, hostname, run_id, suffix, containers, extra=None):
    spec = {"restartPolicy": "Never", "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 5,
            "nodeSelector": {"kubernetes.io/hostname": hostname}, "tolerations": [{"operator": "Exists"}],
            "containers": containers}
    spec.update(extra or {})
    return {"apiVersion": "v1", "kind": "Pod",
            # the node goes in an annotation: a label value is at most 63 characters, a node name 253
            "metadata": {"name": "scv-validate-%s-%s" % (run_id, suffix),
                         "labels": {"app.kubernetes.io/name": "scv-gpu-validation"},
                         "annotations": {"scv.gpu/validated-node": node}},
            "spec": spec}


def _request(request):
    """(resources of the container, extra pod spec) asking for one GPU: ``request`` is {"resource": name} or
    {"claim": name of a ResourceClaim}."""
    if request.get("claim"):
        claims = [{"name": "gpu", "resourceClaimName": request["claim"]}]
        return {"claims": [{"name": "gpu"}]}, {"resourceClaims": claims}
    return {"limits": {request["resource"]: "1"}}, {}


def validation_pods(node, hostname, run_id, workload, probe, request):
    """The two pods of a node's validation, as [(check names, body)]:

    - the workload pod: container ``workload`` asks for the GPU (``request``: {"resource": name} or {"claim": name})
      and runs ``workload`` ({"image", "command"}); container ``no-request`` runs ``probe`` and asks for nothing;
    - the no-request pod: ``probe`` with NVIDIA_VISIBLE_DEVICES=all and NVIDIA_DRIVER_CAPABILITIES=all set.

    Both tolerate every taint (a cordoned node is validated before it is uncordoned), run once, and are pinned to
    the node by its ``kubernetes.io/hostname`` label, so that the scheduler places them and allocates claims."""
    everything = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "all"}
    resources, extra = _request(request)
    return [
        ({"workload": "workload", "second_container": "no-request"},
         _pod(node, hostname, run_id, "workload", [_container("workload", workload, resources=resources),
                                                   _container("no-request", probe, env=everything)], extra)),
        ({"no_request": "probe"}, _pod(node, hostname, run_id, "no-request",
                                       [_container("probe", probe, env=everything)])),
    ]


def sharing_plan(node_body):
    """(pods to run at once, None) where the Node shares its GPUs, else (0, why the sharing check is skipped); read
    from the labels the node's device plugin config gave it (nvidia.com/gpu.replicas, nvidia.com/gpu.count)."""
    labels = (node_body.get("metadata") or {}).get("labels") or {}
    replicas, count = labels.get("nvidia.com/gpu.replicas", ""), labels.get("nvidia.com/gpu.count", "")
    if not replicas.isdigit() or int(replicas) <= 1:
        return 0, "the node's device plugin shares no GPU (nvidia.com/gpu.replicas is %s)" % (replicas or "unset")
    if not count.isdigit() or int(count) == 0:
        return 0, "the node has no nvidia.com/gpu.count label to size the check by"
    # fewer offered than that: the check runs and fails, with the scheduler's message for the pod left out
    return int(count) + 1, None


def metrics_pod(node, hostname, run_id, holder, request, suffix="metrics"):
    """The pod of the metrics check (and each of the sharing check's): container ``holder`` asks for one GPU (as
    ``request`` says) and runs ``holder`` ({"image", "command"}), which keeps running while it is looked at."""
    resources, extra = _request(request)
    return _pod(node, hostname, run_id, suffix, [_container("holder", holder, resources=resources)], extra)


_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\}\s+\S+')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
METRICS_SERIES = "DCGM_FI_DEV_GPU_UTIL"


def series_naming_pod(exposition, namespace, pod, series=METRICS_SERIES):
    """The labels ({name: value}) of each ``series`` sample in a Prometheus text ``exposition`` that names ``pod`` of
    ``namespace`` in its ``pod`` and ``namespace`` labels, as dcgm-exporter and the agent label a GPU's series."""
    found = []
    for line in exposition.splitlines():
        sample = _SAMPLE.match(line)
        if not sample or sample.group(1) != series:
            continue
        labels = dict(_LABEL.findall(sample.group(2)))
        if labels.get("pod") == pod and labels.get("namespace") == namespace:
            found.append(labels)
    return found


def container_outcome(pod, container):
    """(finished, failure or None) of ``container`` in ``pod`` (a Pod as read)."""
    status = pod.get("status") or {}
    for entry in status.get("containerStatuses") or []:
        if entry.get("name") != container:
            continue
        terminated = (entry.get("state") or {}).get("terminated")
        if terminated:
            code = terminated.get("exitCode")
            if code == 0:
                return True, None
            said = " ".join((terminated.get("message") or terminated.get("reason") or "").split())[-300:]
            return True, "container %s exited %s%s" % (container, code, ": %s" % said if said else "")
        waiting = (entry.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff", "CreateContainerError",
                                     "CreateContainerConfigError", "InvalidImageName", "RunContainerError"):
            reason, message = waiting["reason"], waiting.get("message") or ""
            return True, "container %s cannot start: %s: %s" % (container, reason, message)
        break
    return _pod_ended(status, container)


def _pod_ended(status, container):
    """(True, why) where the pod ended before ``container`` ran to its end: the kubelet refused it at admission
    (UnexpectedAdmissionError where no healthy device is left to allocate) or evicted it; else (False, None)."""
    if status.get("phase") != "Failed":
        return False, None
    said = " ".join(("%s: %s" % (status.get("reason") or "Failed", status.get("message") or "")).split())[-300:]
    return True, "container %s never ran to its end, the pod failed: %s" % (container, said)


def pending_reason(pod):
    """Why ``pod`` has not started yet, from its conditions (the scheduler's message), or ''."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return "not scheduled: %s" % (condition.get("message") or condition.get("reason") or "")
    return ""


# ----------------------------------------------------------------------------------------------- report

def _ordered(results):
    nodes = sorted({item["node"] for item in results})
    names = [name for name in CHECKS if any(item["check"] == name for item in results)]
    found = {(item["node"], item["check"]): item for item in results}
    return nodes, names, found


def table(results):
    """A Markdown table, a row per node and a column per check, then the reason of every failure."""
    nodes, names, found = _ordered(results)
    marks = {PASSED: "pass", FAILED: "FAIL", SKIPPED: "skip"}
    lines = ["| node | %s |" % " | ".join(names), "| --- |%s" % (" --- |" * len(names))]
    for node in nodes:
        lines.append("| %s | %s |" % (node, " | ".join(
            marks[found[(node, name)]["outcome"]] if (node, name) in found else "-" for name in names)))
    failures = [item for item in results if item["outcome"] == FAILED]
    if failures:
        lines += ["", "Failures:", ""]
        lines += ["- %s, %s: %s" % (item["node"], item["check"], _one_line(item["reason"])) for item in
                  sorted(failures, key=lambda item: (item["node"], list(CHECKS).index(item["check"])))]
    skipped = [item for item in results if item["outcome"] == SKIPPED]
    if skipped:
        lines += ["", "Skipped:", ""]
        lines += ["- %s, %s: %s" % (item["node"], item["check"], _one_line(item["reason"])) for item in
                  sorted(skipped, key=lambda item: (item["node"], list(CHECKS).index(item["check"])))]
    return "\n".join(lines) + "\n"


def _one_line(text):
    return " ".join(str(text).split())


def junit(results):
    """JUnit XML: a test suite per node, a test case per check."""
    nodes, names, found = _ordered(results)
    failures = sum(1 for item in results if item["outcome"] == FAILED)
    skipped = sum(1 for item in results if item["outcome"] == SKIPPED)
    lines = ['<?xml version="1.0" encoding="UTF-8"?>',
             '<testsuites name="scv.gpu validation" tests="%d" failures="%d" skipped="%d">' % (
                 len(results), failures, skipped)]
    for node in nodes:
        cases = [found[(node, name)] for name in names if (node, name) in found]
        lines.append('  <testsuite name=%s tests="%d" failures="%d" skipped="%d">' % (
            quoteattr(node), len(cases), sum(1 for item in cases if item["outcome"] == FAILED),
            sum(1 for item in cases if item["outcome"] == SKIPPED)))
        for item in cases:
            opening = '    <testcase classname=%s name=%s' % (quoteattr(node), quoteattr(item["check"]))
            if item["outcome"] == PASSED:
                lines.append(opening + "/>")
                continue
            tag = "failure" if item["outcome"] == FAILED else "skipped"
            lines += [opening + ">", "      <%s message=%s/>" % (tag, quoteattr(_one_line(item["reason"]))),
                      "    </testcase>"]
        lines.append("  </testsuite>")
    lines.append("</testsuites>")
    return "\n".join(lines) + "\n"


def conformance(results):
    """The JSON evidence: every requirement with its level, whether the checks for it passed on every node (null
    when no check gave evidence for it), and each check behind it; then what each check shows."""
    requirements = {}
    for name, level in REQUIREMENTS.items():
        evidence = [dict(item) for item in results if name in CHECKS[item["check"]][1]]
        ran = [item for item in evidence if item["outcome"] != SKIPPED]
        requirements[name] = {
            "level": level,
            # None: no check gave evidence for it (none exists yet, or every one was skipped)
            "passed": all(item["outcome"] == PASSED for item in ran) if ran else None,
            "evidence": sorted(evidence, key=lambda item: (item["node"], item["check"])),
        }
    document = {"requirements": requirements,
                "checks": {name: {"shows": shows, "requirements": reqs} for name, (shows, reqs) in CHECKS.items()}}
    return json.dumps(document, indent=2, sort_keys=True) + "\n"
