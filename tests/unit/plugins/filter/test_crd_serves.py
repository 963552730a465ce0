"""The roles' "does the server serve this CRD version" check: only a listed, served version counts."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.scv.gpu.plugins.filter.crd_serves import scv_gpu_crd_serves as crd_serves


def crd(*versions):
    return {"kind": "CustomResourceDefinition",
            "spec": {"versions": [{"name": name, "served": served, "storage": False} for name, served in versions]}}


@pytest.mark.parametrize("resources, version, serves", [
    ([crd(("v1", True))], "v1", True),
    ([crd(("v1beta1", True), ("v1", False))], "v1", False),
    ([crd(("v1beta1", False), ("v1", True))], "v1beta1", False),
    ([crd(("v1alpha1", True), ("v1beta1", True))], "v1beta1", True),
    ([crd(("v1", "true"))], "v1", False),
    ([crd(("v1beta1", True))], "v1", False),
    ([], "v1", False),
    (None, "v1", False),
    ([{"spec": {}}], "v1", False),
])
def test_only_a_listed_served_version_counts(resources, version, serves):
    assert crd_serves(resources, version) is serves


@pytest.mark.parametrize("version", ["", None, 1])
def test_a_version_that_is_not_a_name_is_an_error(version):
    with pytest.raises(AnsibleFilterError, match="crd_serves: the version must be a name"):
        crd_serves([crd(("v1", True))], version)
