"""A file that is not a kubeconfig is called what it is, not "a kubeconfig without a current context"."""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.kube.rest_client import RestClient


@pytest.mark.parametrize("text, message", [
    ("server: [unclosed\n", "cannot read the kubeconfig %s: it is not YAML: while parsing a flow sequence"),
    ("just some words\n", "the kubeconfig %s is not a kubeconfig: it holds a str, not a mapping with clusters"),
    ("", "the kubeconfig %s is not a kubeconfig: it holds nothing, not a mapping"),
    ("- a\n- b\n", "is not a kubeconfig: it holds a list"),
    ("[section]\nkey = value\n", "it is not YAML: expected '<document start>'"),
    ("apiVersion: v1\nkind: Config\n", "is not a kubeconfig: it has no clusters, contexts or users (keys: "
                                       "apiVersion, kind)"),
    ("apiVersion: v1\nclusters: []\ncontexts: [{name: a, context: {cluster: c}}]\n",
     "has no current context (current-context: None)"),
])
def test_a_file_that_is_not_a_kubeconfig_is_named_as_such(tmp_path, text, message):
    path = tmp_path / "kubelet.conf"
    path.write_text(text)
    with pytest.raises(ApiError) as refused:
        RestClient.from_file(str(path))
    expected = message % path if "%s" in message else message
    assert expected in str(refused.value)
