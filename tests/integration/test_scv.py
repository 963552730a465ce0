"""scv.gpu.scv against a real kube-apiserver (harness.control_plane), on every ansible-core line."""

from __future__ import annotations

import copy
import json
import re

import pytest

from harness import scenario_expectations as expected
from harness.control_plane import install_scv_crd as install_crd, read_object
from harness.in_process import run_module

SCV_CARD = {   # what the TITAN Xp facts publish: SCV's fields plus the stable extras
    "id": 0, "model": "TITAN Xp", "totalMemory": 12194, "freeMemory": 11950, "clock": 5705, "core": 1911,
    "power": 250, "bandwidth": 15760, "health": "Healthy",
    "uuid": "GPU-8d3c1f0a-6b2e-4a1d-9c7e-2f4b6a8d0c1e", "pciBusId": "00000000:01:00.0",
    "computeCapability": "6.1", "family": "pascal",
}


def node_name(ansible, test):
    """Objects are cluster-wide and the control plane is shared: one name per ansible line and test."""
    return "%s-%s" % (test.replace("_", "-"), ansible.version.replace(".", "-"))


def publish(ansible, plane, name, facts, kubeconfig=None, check=False, diff=False, **options):
    args = dict(name=name, gpu_facts=facts, kubeconfig=str(kubeconfig or plane.admin_kubeconfig), **options)
    return ansible.module(args, name="scv.gpu.scv", check=check, diff=diff)


@pytest.mark.every_ansible_line
def test_publish_creates_then_rerun_writes_nothing(ansible, scv_crd, api_requests):
    plane, name = scv_crd, node_name(ansible, "first-publish")
    ok, result = publish(ansible, plane, name, expected.TITAN_XP)
    assert ok, result
    assert (result["changed"], result["created"], result["status_updated"]) == (True, True, True)

    scv = read_object(plane, "scv", name)
    assert scv["spec"] == {"updateInterval": 1000}
    status = scv["status"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", status.pop("updateTime"))
    assert status == {"cardList": [SCV_CARD], "cardNumber": 1, "healthyCardNumber": 1,
                      "totalMemorySum": 12194, "freeMemorySum": 11950}
    assert scv["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "scv.gpu"}

    before = api_requests.snapshot()
    ok, again = publish(ansible, plane, name, expected.TITAN_XP)
    requests = api_requests.delta(before, api_requests.snapshot())
    assert ok, again
    assert (again["changed"], again["created"], again["status_updated"]) == (False, False, False)
    assert requests == {("GET", "", ""): 1}
    assert read_object(plane, "scv", name)["metadata"]["resourceVersion"] == scv["metadata"]["resourceVersion"]


def test_one_changed_card_is_one_status_write(ansible, scv_crd, api_requests):
    plane, name = scv_crd, node_name(ansible, "changed-card")
    ok, result = publish(ansible, plane, name, expected.H100_SXM_X8)
    assert ok, result
    facts = copy.deepcopy(expected.H100_SXM_X8)
    facts["cardList"][3]["freeMemory"] -= 4096
    facts["freeMemorySum"] -= 4096

    before = api_requests.snapshot()
    ok, result = publish(ansible, plane, name, facts)
    requests = api_requests.delta(before, api_requests.snapshot())
    assert ok, result
    assert (result["changed"], result["created"], result["status_updated"]) == (True, False, True)
    assert requests == {("GET", "", ""): 1, ("PUT", "status", ""): 1}
    status = read_object(plane, "scv", name)["status"]
    assert status["cardList"][3]["freeMemory"] == 78005 - 4096
    assert status["freeMemorySum"] == expected.H100_SXM_X8["freeMemorySum"] - 4096
    assert [card["bandwidth"] for card in status["cardList"]] == [63008] * 8


def test_node_without_gpus(ansible, scv_crd):
    plane, name = scv_crd, node_name(ansible, "no-gpus")
    ok, result = publish(ansible, plane, name, expected.NO_GPUS)
    assert ok, result
    status = read_object(plane, "scv", name)["status"]
    assert set(status) == {"updateTime"}   # SCV omits zero values; readers see 0 cards
    ok, again = publish(ansible, plane, name, expected.NO_GPUS)
    assert ok and again["changed"] is False


def test_unhealthy_card_reasons_are_published(ansible, scv_crd):
    plane, name = scv_crd, node_name(ansible, "lost-card")
    ok, result = publish(ansible, plane, name, expected.LOST_CARD)
    assert ok, result
    status = read_object(plane, "scv", name)["status"]
    # the lost card is published apart, so that schedulers reading cardList never count it
    assert [card["id"] for card in status["cardList"]] == [0, 1, 3]
    assert status["unhealthyCardList"] == [{"id": 2, "health": "Unhealthy", "healthReasons": [expected.LOST]}]
    assert (status["cardNumber"], status["healthyCardNumber"], status["unhealthyCardNumber"],
            status["totalMemorySum"]) == (3, 3, 1, 3 * 16384)


def test_deleted_by_hand_is_recreated(ansible, scv_crd):
    plane, name = scv_crd, node_name(ansible, "recreated")
    assert publish(ansible, plane, name, expected.TITAN_XP)[0]
    plane.kubectl("delete", "scv", name)
    ok, result = publish(ansible, plane, name, expected.TITAN_XP)
    assert ok, result
    assert result["created"] is True
    assert read_object(plane, "scv", name)["status"]["cardList"] == [SCV_CARD]


def test_state_absent(ansible, scv_crd):
    plane, name = scv_crd, node_name(ansible, "absent")
    assert publish(ansible, plane, name, expected.TITAN_XP)[0]
    args = dict(name=name, state="absent", kubeconfig=str(plane.admin_kubeconfig))
    ok, result = ansible.module(args, name="scv.gpu.scv")
    assert ok and result["changed"] is True, result
    assert read_object(plane, "scv", name, missing_ok=True) is None
    ok, result = ansible.module(args, name="scv.gpu.scv")
    assert ok and result["changed"] is False, result


def test_spec_someone_changed_is_kept_unless_forced(ansible, scv_crd):
    plane, name = scv_crd, node_name(ansible, "spec")
    assert publish(ansible, plane, name, expected.TITAN_XP)[0]
    plane.kubectl("patch", "scv", name, "--type=merge", "-p", '{"spec":{"updateInterval":5000}}')
    ok, result = publish(ansible, plane, name, expected.TITAN_XP)
    assert ok and result["changed"] is False, result
    assert "Scv %s keeps spec.updateInterval=5000, which someone set; set force_spec=true" % name in ansible.last_output
    assert read_object(plane, "scv", name)["spec"]["updateInterval"] == 5000
    ok, result = publish(ansible, plane, name, expected.TITAN_XP, force_spec=True)
    assert ok and result["spec_updated"] is True and result["changed"] is True, result
    assert read_object(plane, "scv", name)["spec"]["updateInterval"] == 1000


@pytest.mark.every_ansible_line
def test_check_mode_uses_server_side_dry_run(ansible, scv_crd, api_requests):
    plane, name = scv_crd, node_name(ansible, "check")
    before = api_requests.snapshot()
    ok, result = publish(ansible, plane, name, expected.TITAN_XP, check=True)
    requests = api_requests.delta(before, api_requests.snapshot())
    assert ok and result["changed"] is True and result["created"] is True, result
    assert requests == {("GET", "", ""): 1, ("POST", "", "All"): 1}
    assert read_object(plane, "scv", name, missing_ok=True) is None

    assert publish(ansible, plane, name, expected.TITAN_XP)[0]
    version = read_object(plane, "scv", name)["metadata"]["resourceVersion"]
    facts = copy.deepcopy(expected.TITAN_XP)
    facts["cardList"][0]["freeMemory"] = 100
    before = api_requests.snapshot()
    ok, result = publish(ansible, plane, name, facts, check=True)
    requests = api_requests.delta(before, api_requests.snapshot())
    assert ok and result["changed"] is True and result["status_updated"] is True, result
    assert requests == {("GET", "", ""): 1, ("PUT", "status", "All"): 1}
    assert read_object(plane, "scv", name)["metadata"]["resourceVersion"] == version
    assert result["scv"]["status"]["cardList"][0]["freeMemory"] == 100


def test_diff_mode_shows_spec_and_status(scv_crd, capsys):
    """In this process: Ansible's one-line output drops the diff."""
    from ansible_collections.scv.gpu.plugins.modules import scv as scv_module

    plane, name = scv_crd, "diff"
    plane.kubectl("delete", "scv", name, "--ignore-not-found")
    args = dict(name=name, gpu_facts=expected.TITAN_XP, kubeconfig=str(plane.admin_kubeconfig), _ansible_diff=True)
    code, result = run_module(capsys, scv_module, args)
    assert code == 0, result
    assert result["diff"]["before"] == {}
    assert result["diff"]["after"]["spec"] == {"updateInterval": 1000}
    assert result["diff"]["after"]["status"]["cardList"] == [SCV_CARD]
    facts = copy.deepcopy(expected.TITAN_XP)
    facts["cardList"][0]["freeMemory"] = 2048
    code, result = run_module(capsys, scv_module, dict(args, gpu_facts=facts))
    assert code == 0, result
    assert result["diff"]["before"]["status"]["cardList"][0]["freeMemory"] == 11950
    assert result["diff"]["after"]["status"]["cardList"][0]["freeMemory"] == 2048
    code, result = run_module(capsys, scv_module, dict(args, gpu_facts=facts, _ansible_diff=False))
    assert code == 0 and result["changed"] is False and "diff" not in result


def test_kubectl_get_scv_columns(ansible, scv_crd):
    plane, name = scv_crd, node_name(ansible, "columns")
    assert publish(ansible, plane, name, expected.LOST_CARD)[0]
    lines = plane.kubectl("get", "scv", name).stdout.splitlines()
    assert lines[0].split() == ["NAME", "CARDS", "UNHEALTHY", "FREE", "MIB", "TOTAL", "MIB", "UPDATED", "AGE"]
    assert len(lines) == 2
    row = lines[1].split()
    assert row[:5] == [name, "3", "1", str(3 * 16150), str(3 * 16384)]


def test_scv_readme_example_is_accepted_unchanged(scv_crd):
    """The object from SCV's README, less what only a server sets."""
    plane = scv_crd
    spec = {"updateInterval": 1000}
    status = {
        "cardList": [{"bandwidth": 8000, "clock": 5705, "core": 1911, "freeMemory": 12196, "health": "Healthy",
                      "id": 0, "model": "TITAN Xp", "power": 250, "totalMemory": 12196}],
        "cardNumber": 1, "freeMemorySum": 12196, "totalMemorySum": 12196, "updateTime": "2021-05-21T01:55:13Z",
    }
    body = {"apiVersion": "core.run-linux.com/v1", "kind": "Scv", "metadata": {"name": "gpu02-poweredge-t420"},
            "spec": spec}
    plane.kubectl("delete", "scv", "gpu02-poweredge-t420", "--ignore-not-found")
    created = json.loads(plane.kubectl("create", "-o", "json", "-f", "-", input_text=json.dumps(body)).stdout)
    created["status"] = status
    plane.kubectl("replace", "--subresource=status", "-f", "-", input_text=json.dumps(created))
    scv = read_object(plane, "scv", "gpu02-poweredge-t420")
    assert scv["spec"] == spec
    assert scv["status"] == status


def test_invalid_status_is_rejected_naming_the_field(ansible, scv_crd):
    """The module refuses such facts itself now; a status the server rejects is still explained field by field."""
    from ansible_collections.scv.gpu.plugins.module_utils.kube.client import ResourceClient
    from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
    from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import SCV

    plane, name = scv_crd, node_name(ansible, "invalid")
    assert publish(ansible, plane, name, expected.TITAN_XP)[0]
    client = ResourceClient.connect(resource=SCV, kubeconfig=str(plane.admin_kubeconfig), request_timeout=30)
    body = client.get(name)
    body["status"]["cardList"][0]["health"] = "Broken"
    with pytest.raises(ApiError) as error:
        client.replace_status(body)
    assert "cannot update the status of Scv %s: the API server rejected it as invalid (422)" % name in str(error.value)
    assert "status.cardList[0].health" in str(error.value)


@pytest.mark.every_ansible_line
def test_bad_facts_fail_before_any_request(ansible, scv_crd, api_requests):
    plane, name = scv_crd, node_name(ansible, "bad-facts")
    before = api_requests.snapshot()
    ok, result = publish(ansible, plane, name, {"cardList": [{"id": "zero", "freeMemory": -1}]})
    assert not ok
    assert result["msg"] == (
        "gpu_facts for node %s is not usable: gpu_facts.cardList[0].id: expected the card's NVML index "
        "(an integer >= 0), got 'zero'; gpu_facts.cardList[0].freeMemory: expected an integer >= 0, got -1; "
        "gpu_facts.cardList[0].health: expected Healthy or Unhealthy, got None" % name)
    assert api_requests.delta(before, api_requests.snapshot()) == {}


def test_forbidden_names_verb_resource_and_user(ansible, scv_crd):
    plane = scv_crd
    nobody = plane.kubeconfig("nobody", "nobody")
    ok, result = publish(ansible, plane, node_name(ansible, "forbidden"), expected.TITAN_XP, kubeconfig=nobody)
    assert not ok
    assert result["msg"].startswith("cannot get Scv %s: forbidden (403): " % node_name(ansible, "forbidden"))
    assert 'User "nobody" cannot get resource "scvs"' in result["msg"]


def test_unreachable_api_server(ansible, scv_crd, tmp_path):
    from harness.common import free_port

    plane = scv_crd
    config = json.loads(plane.admin_kubeconfig.read_text())
    dead = "https://127.0.0.1:%d" % free_port()
    config["clusters"][0]["cluster"]["server"] = dead
    kubeconfig = tmp_path / "dead.kubeconfig"
    kubeconfig.write_text(json.dumps(config))
    ok, result = publish(ansible, plane, "unreachable", expected.TITAN_XP, kubeconfig=kubeconfig)
    assert not ok
    assert "the Kubernetes API at %s is unreachable" % dead in result["msg"]


def test_crd_not_installed_says_how_to_install(ansible, control_plane):
    plane = control_plane
    plane.kubectl("delete", "crd", "scvs.core.run-linux.com", "--ignore-not-found", "--wait=true")
    try:
        ok, result = publish(ansible, plane, node_name(ansible, "no-crd"), expected.TITAN_XP)
        assert not ok
        assert result["msg"].startswith("the scvs.core.run-linux.com custom resource definition is not installed")
        assert "kubectl apply -f roles/scv_publish/files/scvs.core.run-linux.com.yml" in result["msg"]
    finally:
        install_crd(plane)


def test_conflict_is_retried(scv_crd, monkeypatch):
    """A real 409: another writer updates the object between our read and our write."""
    from ansible_collections.scv.gpu.plugins.module_utils.kube.client import ResourceClient
    from ansible_collections.scv.gpu.plugins.module_utils.scv.publisher import publish
    from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import SCV

    plane = scv_crd
    name = "conflict"
    plane.kubectl("delete", "scv", name, "--ignore-not-found")
    client = ResourceClient.connect(resource=SCV, kubeconfig=str(plane.admin_kubeconfig))
    publish(client, name, expected.TITAN_XP, 1000)

    reads = []
    original_get = client.get

    def get_then_race(scv_name):
        obj = original_get(scv_name)
        reads.append(obj["metadata"]["resourceVersion"])
        if len(reads) == 1:   # a concurrent writer moves the object on
            plane.kubectl("label", "scv", scv_name, "race=%d" % len(reads), "--overwrite")
        return obj

    monkeypatch.setattr(client, "get", get_then_race)
    facts = copy.deepcopy(expected.TITAN_XP)
    facts["cardList"][0]["freeMemory"] = 1
    result = publish(client, name, facts, 1000)
    assert result["status_updated"] is True
    assert len(reads) == 2 and reads[0] != reads[1]
    assert read_object(plane, "scv", name)["status"]["cardList"][0]["freeMemory"] == 1


def test_role_installs_access_rules_and_nodes_write_only_their_own(ansible, scv_crd, tmp_path):
    """Two node identities against the real API server, after the scv_publish role ran."""
    plane = scv_crd
    playbook = tmp_path / "access.yml"
    playbook.write_text(
        "- hosts: localhost\n"
        "  gather_facts: false\n"
        "  roles:\n"
        "    - role: scv.gpu.scv_publish\n"
        "      vars:\n"
        "        scv_publish_kubeconfig: %s\n"
        "        scv_publish_state: absent\n"
        "        scv_publish_node_name: role-node-%s\n" % (plane.admin_kubeconfig, ansible.version.replace(".", "-")))
    done = ansible.playbook(str(playbook), "titan_xp")
    assert done.returncode == 0, done.stdout + done.stderr

    a, b = "node-a-" + ansible.version.replace(".", "-"), "node-b-" + ansible.version.replace(".", "-")
    node_a = plane.node_kubeconfig(a)
    for node in (a, b):
        plane.kubectl("delete", "scv", node, "--ignore-not-found")
    ok, result = publish(ansible, plane, a, expected.TITAN_XP, kubeconfig=node_a)
    assert ok and result["created"] is True, result
    ok, result = publish(ansible, plane, b, expected.TITAN_XP, kubeconfig=node_a)
    assert not ok
    assert result["msg"].startswith("cannot create Scv %s: forbidden (403)" % b)
    assert "node %s may only write its own Scv (named %s), not %s" % (a, a, b) in result["msg"]

    ok, result = publish(ansible, plane, b, expected.TITAN_XP)   # the admin may
    assert ok, result
    for verb in (("label", "scv", b, "x=y"), ("delete", "scv", b)):
        denied = plane.kubectl(*verb, kubeconfig=node_a, check=False)
        assert denied.returncode != 0 and "may only write its own Scv" in denied.stderr, denied.stderr
    denied = plane.kubectl("replace", "--subresource=status", "-f", "-", kubeconfig=node_a, check=False,
                           input_text=plane.kubectl("get", "scv", b, "-o", "json").stdout)
    assert denied.returncode != 0 and "may only write its own Scv" in denied.stderr, denied.stderr
    assert plane.kubectl("delete", "scv", a, kubeconfig=node_a).returncode == 0


def test_control_plane_authorizers(control_plane):
    """The Node and RBAC authorizers are on: a node may read its own Node only, a nobody nothing."""
    plane = control_plane
    node = plane.node_kubeconfig("authz-node")
    can_i = plane.kubectl("auth", "can-i", "get", "nodes/authz-node", kubeconfig=node, check=False).stdout
    assert can_i.strip() == "yes"
    can_i = plane.kubectl("auth", "can-i", "get", "nodes/other-node", kubeconfig=node, check=False).stdout
    assert can_i.startswith("no - node: node 'authz-node' cannot read")
    nobody = plane.kubeconfig("nobody", "nobody")
    assert plane.kubectl("auth", "can-i", "get", "nodes", kubeconfig=nobody, check=False).stdout.strip() == "no"
    resources = plane.kubectl("api-resources", "--api-group=admissionregistration.k8s.io", "-o", "name").stdout
    assert "validatingadmissionpolicies.admissionregistration.k8s.io" in resources.split()


@pytest.mark.every_ansible_line
def test_role_publishes_and_a_second_run_changes_nothing(ansible, scv_crd, tmp_path):
    plane = scv_crd
    name = node_name(ansible, "role")
    plane.kubectl("delete", "scv", name, "--ignore-not-found")
    command = ("playbooks/scv.yml", "titan_xp", "-e", "scv_publish_kubeconfig=%s" % plane.admin_kubeconfig,
               "-e", "scv_publish_node_name=%s" % name)
    first = ansible.playbook(*command)
    assert first.returncode == 0, first.stdout + first.stderr
    assert read_object(plane, "scv", name)["status"]["cardList"] == [SCV_CARD]
    second = ansible.playbook(*command)
    assert second.returncode == 0, second.stdout + second.stderr
    assert re.search(r"localhost\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", second.stdout), second.stdout


@pytest.mark.every_ansible_line
def test_role_rejects_bad_variables_before_anything_runs(ansible, scv_crd, api_requests):
    plane = scv_crd
    before = api_requests.snapshot()
    done = ansible.playbook("playbooks/scv.yml", "titan_xp", "-e", "scv_publish_kubeconfig=%s" % plane.admin_kubeconfig,
                            "-e", "scv_publish_state=gone")
    assert done.returncode != 0
    assert "scv_publish_state" in done.stdout and "gone" in done.stdout
    assert api_requests.delta(before, api_requests.snapshot()) == {}


# ------------------------------------------------------------ hostile and unlucky input

def test_names_that_are_not_node_names_are_refused_before_any_call(ansible, scv_crd, api_requests, tmp_path):
    """Each bad name, as the tasks of one play: refused before any request, and another node's Scv untouched."""
    plane = scv_crd
    other = node_name(ansible, "name-victim")
    published, result = publish(ansible, plane, other, expected.TITAN_XP)
    assert published, result
    spec_before = read_object(plane, "scv", other)["spec"]
    before = api_requests.snapshot()
    names = ["", "node-b/status", "Node-B", "node_b", "-node", "a" * 254, "node b"]
    calls = [("scv.gpu.scv", dict(name=name, gpu_facts=expected.TITAN_XP, kubeconfig=str(plane.admin_kubeconfig),
                                  force_spec=True, update_interval=7)) for name in names]
    wrong = [(name, result) for name, (ok, result) in zip(names, ansible.modules(calls, tmp_path))
             if ok or not (result["msg"].startswith("name: ") and "nothing was sent to the API server" in result["msg"])]
    assert not wrong, wrong
    assert api_requests.delta(before, api_requests.snapshot()) == {}
    assert read_object(plane, "scv", other)["spec"] == spec_before


@pytest.mark.parametrize("card_change, message", [
    ({"model": 5}, "gpu_facts.cardList[0].model: expected a string, got 5"),
    ({"health": "Broken"}, "gpu_facts.cardList[0].health: expected Healthy or Unhealthy, got 'Broken'"),
    ({"healthReasons": "hot"}, "gpu_facts.cardList[0].healthReasons: expected a list of strings, got 'hot'"),
])
def test_facts_of_the_wrong_types_create_nothing(ansible, scv_crd, api_requests, card_change, message):
    plane, name = scv_crd, node_name(ansible, "typed-facts")
    plane.kubectl("delete", "scv", name, "--ignore-not-found")
    facts = copy.deepcopy(expected.TITAN_XP)
    facts["cardList"][0].update(card_change)
    before = api_requests.snapshot()
    ok, result = publish(ansible, plane, name, facts)
    assert not ok and message in result["msg"], result
    assert api_requests.delta(before, api_requests.snapshot()) == {}
    assert read_object(plane, "scv", name, missing_ok=True) is None


def test_a_failed_status_write_leaves_no_empty_scv(ansible, scv_crd):
    """An identity that may create and delete Scvs but not write their status: the create is undone."""
    plane, name = scv_crd, node_name(ansible, "half-written")
    plane.kubectl("delete", "scv", name, "--ignore-not-found")
    plane.kubectl("apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "scv-no-status"},
         "rules": [{"apiGroups": ["core.run-linux.com"], "resources": ["scvs"],
                    "verbs": ["get", "create", "delete"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "scv-no-status"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "scv-no-status"},
         "subjects": [{"kind": "User", "name": "scv-no-status", "apiGroup": "rbac.authorization.k8s.io"}]}]}))
    kubeconfig = plane.kubeconfig("scv-no-status", "scv-no-status")
    ok, result = publish(ansible, plane, name, expected.TITAN_XP, kubeconfig=kubeconfig)
    assert not ok
    assert "cannot update the status of Scv %s: forbidden (403)" % name in result["msg"]
    assert result["msg"].endswith("the Scv created a moment before was deleted again"), result["msg"]
    assert read_object(plane, "scv", name, missing_ok=True) is None


def test_a_spec_that_is_not_an_object_is_named_not_a_traceback(ansible, scv_crd):
    """A hand-edited Scv under a CRD that does not type its spec (SCV's own CRD, or an edited one)."""
    plane, name = scv_crd, node_name(ansible, "list-spec")
    crd = read_object(plane, "crd", "scvs.core.run-linux.com")
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    schema["spec"] = {"x-kubernetes-preserve-unknown-fields": True}
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        crd["metadata"].pop(key, None)
    crd.pop("status", None)
    plane.kubectl("replace", "-f", "-", input_text=json.dumps(crd))
    try:
        plane.kubectl("delete", "scv", name, "--ignore-not-found")
        created = plane.kubectl("create", "-f", "-", check=False, input_text=json.dumps({
            "apiVersion": "core.run-linux.com/v1", "kind": "Scv", "metadata": {"name": name}, "spec": [1000]}))
        assert created.returncode == 0, created.stderr
        ok, result = publish(ansible, plane, name, expected.TITAN_XP)
        assert not ok
        assert result["msg"].startswith("Scv %s has a spec that is not an object (a list)" % name), result
        ok, result = publish(ansible, plane, name, expected.TITAN_XP, force_spec=True)
        assert ok, result
        assert read_object(plane, "scv", name)["spec"] == {"updateInterval": 1000}
    finally:
        plane.kubectl("delete", "scv", name, "--ignore-not-found")
        install_crd(plane)


@pytest.mark.parametrize("name", ["node-b/status", "Node-B"])
def test_the_role_refuses_a_bad_node_name_with_the_modules_rule_before_any_change(ansible, scv_crd, api_requests,
                                                                                  name):
    plane = scv_crd
    before = {resource: api_requests.snapshot(resource) for resource in ("scvs", "customresourcedefinitions")}
    done = ansible.playbook("playbooks/scv.yml", "titan_xp", "-e", "scv_publish_kubeconfig=%s" % plane.admin_kubeconfig,
                            "-e", "scv_publish_node_name=%s" % name)
    assert done.returncode != 0
    assert ("scv_publish_node_name of host localhost: %r is not a Kubernetes node name: lower-case letters" % name
            in done.stdout), done.stdout
    assert "Nothing was changed." in done.stdout
    for resource, counts in before.items():
        assert api_requests.delta(counts, api_requests.snapshot(resource)) == {}, resource
