"""node_cordon against a real kube-apiserver under concurrent writers and hand-edited marks.

The competing writes are real: kubectl and a second API client write the same Node between the
module's read and its write, so every 409 below is the API server's own.
"""

from __future__ import annotations

import json
import threading

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.kube.client import NodeClient
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import CONFLICT_ATTEMPTS, ApiError
from ansible_collections.scv.gpu.plugins.module_utils.node.cordon import ANNOTATION
from ansible_collections.scv.gpu.plugins.modules.node_cordon import apply
from harness.control_plane import read_object

OWNER = "maintenance"


def fresh_node(plane, name, cordoned_by_kubectl=False):
    """A Node registered with a label, as a kubelet registers it, so that its fields' managers are tracked."""
    plane.kubectl("delete", "node", name, "--ignore-not-found")
    plane.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}))
    if cordoned_by_kubectl:
        plane.kubectl("cordon", name)


class Interfering:
    """The module's Node client, with another writer labelling the Node after each of the first ``storm`` reads."""

    def __init__(self, plane, storm):
        self.client = NodeClient.connect(kubeconfig=str(plane.admin_kubeconfig))
        self.plane, self.storm, self.reads = plane, storm, 0
        real_get = self.client.get

        def get(name):
            found = real_get(name)
            self.reads += 1
            if self.reads <= self.storm:
                plane.kubectl("label", "node", name, "--overwrite", "writer=%d" % self.reads)
            return found

        self.client.get = get


def test_a_409_storm_ends_in_a_clear_error_and_writes_nothing(control_plane):
    name = "cordon-storm"
    fresh_node(control_plane, name)
    interfering = Interfering(control_plane, storm=100)
    with pytest.raises(ApiError) as error:
        apply(interfering.client, name, "cordoned", OWNER, False)
    assert interfering.reads == CONFLICT_ATTEMPTS          # each attempt read afresh, and then no more
    message = str(error.value)
    assert "conflict (409)" in message and "5 times in a row: another client is writing it without pause" in message
    assert "Nothing of ours was written" in message and "--show-managed-fields" in message
    after = read_object(control_plane, "node", name, managed_fields=True)
    assert not after["spec"].get("unschedulable") and ANNOTATION not in (after["metadata"].get("annotations") or {})
    assert after["metadata"]["labels"]["writer"] == str(CONFLICT_ATTEMPTS)   # the other writer lost nothing


def test_a_storm_that_ends_in_time_lets_the_cordon_through_and_keeps_the_other_writes(control_plane):
    name = "cordon-storm-short"
    fresh_node(control_plane, name)
    interfering = Interfering(control_plane, storm=CONFLICT_ATTEMPTS - 1)
    before, after, outcome, changed = apply(interfering.client, name, "cordoned", OWNER, False)
    assert (outcome, changed) == ("cordoned", True) and interfering.reads == CONFLICT_ATTEMPTS
    stored = read_object(control_plane, "node", name, managed_fields=True)
    assert stored["spec"]["unschedulable"] is True and stored["metadata"]["annotations"][ANNOTATION] == OWNER
    assert stored["metadata"]["labels"]["writer"] == str(CONFLICT_ATTEMPTS - 1)
    assert before["metadata"]["labels"]["writer"] == str(CONFLICT_ATTEMPTS - 1)   # decided from the last read


def test_a_concurrent_writer_and_two_cordons_at_once_lose_nothing(control_plane):
    """A thread relabels the Node 20 times a second (a busy controller) while two owners cordon and uncordon."""
    name = "cordon-concurrent"
    fresh_node(control_plane, name)
    writer = NodeClient.connect(kubeconfig=str(control_plane.admin_kubeconfig))
    stop, written = threading.Event(), []

    def relabel():
        while not stop.is_set():
            count = len(written) + 1
            writer.resource.patch(name=name, body={"metadata": {"labels": {"writer": str(count)}}},
                                  content_type="application/merge-patch+json")
            written.append(count)
            stop.wait(0.05)

    thread = threading.Thread(target=relabel)
    thread.start()
    outcomes = []
    try:
        while len(written) < 2:
            stop.wait(0.01)
        during = len(written)
        for _round in range(5):
            for state, owner in (("cordoned", OWNER), ("cordoned", "other-team"), ("uncordoned", "other-team"),
                                 ("uncordoned", OWNER)):
                # The other writer writes again between any two of ours, however busy the machine is.
                seen = len(written)
                while len(written) == seen and thread.is_alive():
                    stop.wait(0.005)
                client = NodeClient.connect(kubeconfig=str(control_plane.admin_kubeconfig))
                outcomes.append(apply(client, name, state, owner, False)[2])
        during = len(written) - during
    finally:
        stop.set()
        thread.join(timeout=10)
    assert during >= 20, during                         # the writer did write while we worked
    # first come owns it: the other team neither marks our cordon nor lifts it; we lift ours
    assert outcomes == ["cordoned", "foreign", "foreign", "uncordoned"] * 5
    stored = read_object(control_plane, "node", name, managed_fields=True)
    assert not stored["spec"].get("unschedulable") and ANNOTATION not in (stored["metadata"].get("annotations") or {})
    assert stored["metadata"]["labels"]["writer"] == str(written[-1])    # no write of the other client was lost


def annotate(plane, name, value):
    plane.kubectl("annotate", "node", name, "--overwrite", "%s=%s" % (ANNOTATION, value))


def client_for(plane):
    return NodeClient.connect(kubeconfig=str(plane.admin_kubeconfig))


def test_our_mark_forged_on_an_operators_cordon_does_not_make_it_ours(control_plane):
    name = "cordon-forged-mark"
    fresh_node(control_plane, name, cordoned_by_kubectl=True)
    annotate(control_plane, name, OWNER)
    assert apply(client_for(control_plane), name, "cordoned", OWNER, False)[2:] == ("foreign", False)
    before, after, outcome, changed = apply(client_for(control_plane), name, "uncordoned", OWNER, False)
    assert (outcome, changed) == ("foreign", True)       # the forged mark is removed, the cordon stays
    stored = read_object(control_plane, "node", name, managed_fields=True)
    assert stored["spec"]["unschedulable"] is True and ANNOTATION not in (stored["metadata"].get("annotations") or {})


@pytest.mark.parametrize("mark", ["other-team", "", "MAINTENANCE", "maintenance "])
def test_our_cordon_whose_mark_was_changed_by_hand_is_not_lifted(control_plane, mark):
    name = "cordon-retagged"
    fresh_node(control_plane, name)
    assert apply(client_for(control_plane), name, "cordoned", OWNER, False)[2] == "cordoned"
    annotate(control_plane, name, mark)
    before, after, outcome, changed = apply(client_for(control_plane), name, "uncordoned", OWNER, False)
    assert (outcome, changed) == ("foreign", False)
    stored = read_object(control_plane, "node", name, managed_fields=True)
    assert stored["spec"]["unschedulable"] is True and stored["metadata"]["annotations"][ANNOTATION] == mark


def test_our_mark_left_on_a_schedulable_node_is_cleaned_up(control_plane):
    name = "cordon-stale-mark"
    fresh_node(control_plane, name)
    annotate(control_plane, name, OWNER)
    assert apply(client_for(control_plane), name, "uncordoned", OWNER, False)[2:] == ("schedulable", True)
    assert ANNOTATION not in (read_object(control_plane, "node", name, managed_fields=True)["metadata"].get("annotations") or {})


def test_our_cordon_with_its_managed_fields_stripped_is_still_ours(control_plane):
    """managedFields: [] in an update makes the API server drop them: the Node no longer says who set
    what, and our mark is then what counts (the next write starts the tracking anew)."""
    name = "cordon-stripped"
    fresh_node(control_plane, name)
    assert apply(client_for(control_plane), name, "cordoned", OWNER, False)[2] == "cordoned"
    control_plane.kubectl("patch", "node", name, "--type=merge", "-p", json.dumps({"metadata": {"managedFields": []}}))
    stored = read_object(control_plane, "node", name, managed_fields=True)
    assert "managedFields" not in stored["metadata"], stored["metadata"].get("managedFields")
    assert apply(client_for(control_plane), name, "uncordoned", OWNER, False)[2:] == ("uncordoned", True)
    assert not read_object(control_plane, "node", name, managed_fields=True)["spec"].get("unschedulable")
