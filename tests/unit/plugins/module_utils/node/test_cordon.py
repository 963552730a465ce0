"""Cordons that remember their owner: only ours are lifted."""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.node.cordon import ANNOTATION, cordon, uncordon


def node(unschedulable=False, owner=None, managers=None):
    metadata = {"name": "gpu-1", "annotations": {"team": "ml"}}
    if owner:
        metadata["annotations"][ANNOTATION] = owner
    if managers is not None:   # who set spec.unschedulable, as the API server records it
        metadata["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}] + [
            {"manager": manager, "operation": "Update", "fieldsV1": {"f:spec": {"f:unschedulable": {}}}}
            for manager in managers]
    return {"metadata": metadata, "spec": {"unschedulable": True} if unschedulable else {}}


@pytest.mark.parametrize("before, patch, outcome", [
    (node(), {"spec": {"unschedulable": True}, "metadata": {"annotations": {ANNOTATION: "me"}}}, "cordoned"),
    (node(unschedulable=True, owner="me"), None, "ours"),
    (node(unschedulable=True), None, "foreign"),
    (node(unschedulable=True, owner="another tool"), None, "foreign"),
    (node(unschedulable=True, owner="me", managers=["scv.gpu"]), None, "ours"),
    (node(unschedulable=True, owner="me", managers=["kubectl-cordon"]), None, "foreign"),
])
def test_cordon(before, patch, outcome):
    assert cordon(before, "me") == (patch, outcome)


@pytest.mark.parametrize("before, patch, outcome", [
    (node(unschedulable=True, owner="me"),
     {"spec": {"unschedulable": None}, "metadata": {"annotations": {ANNOTATION: None}}}, "uncordoned"),
    (node(unschedulable=True), None, "foreign"),
    (node(unschedulable=True, owner="another tool"), None, "foreign"),
    (node(), None, "schedulable"),
    # someone lifted our cordon by hand: only the stale mark goes
    (node(owner="me"), {"metadata": {"annotations": {ANNOTATION: None}}}, "schedulable"),
    (node(unschedulable=True, owner="me", managers=["scv.gpu"]),
     {"spec": {"unschedulable": None}, "metadata": {"annotations": {ANNOTATION: None}}}, "uncordoned"),
    # uncordoned by hand, then cordoned again by an operator: theirs stays, our stale mark goes
    (node(unschedulable=True, owner="me", managers=["kubectl-cordon"]),
     {"metadata": {"annotations": {ANNOTATION: None}}}, "foreign"),
    (node(unschedulable=True, owner="me", managers=[]), {"metadata": {"annotations": {ANNOTATION: None}}},
     "foreign"),
])
def test_uncordon(before, patch, outcome):
    assert uncordon(before, "me") == (patch, outcome)
