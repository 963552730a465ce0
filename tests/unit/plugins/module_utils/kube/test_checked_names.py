"""No request is built from a name the API server would refuse: both clients check it first."""

from __future__ import annotations

import socket

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.common.names import object_name_problem
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError, checked_name
from ansible_collections.scv.gpu.plugins.module_utils.kube.rest_client import RestClient
from ansible_collections.scv.gpu.plugins.module_utils.scv.resource import SCV


@pytest.mark.parametrize("name, good", [
    ("node-a", True), ("gpu-7.rack-3.example.com", True), ("a" * 253, True), ("0", True),
    ("node-a/status", False), ("..", False), (".", False), ("Node-A", False), ("a" * 254, False),
    ("-node", False), ("node-", False), ("node_a", False), ("", False), (None, False), ("a..b", False),
])
def test_the_rule_is_the_api_servers_dns_subdomain(name, good):
    assert (object_name_problem(name, "Node") is None) is good


@pytest.fixture
def client():
    # An API server address nobody listens on: a request would fail as "unreachable", not with the name's problem.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = {"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                  "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:%d" % port,
                                                         "insecure-skip-tls-verify": True}}],
                  "users": [{"name": "u", "user": {"token": "t"}}]}
    return RestClient(kubeconfig, timeout=1, resource=SCV)


@pytest.mark.parametrize("call", [
    lambda c: c.get("node-a/status"), lambda c: c.delete(".."), lambda c: c.get_node("Node-A"),
    lambda c: c.patch_node("node-a/status", {}), lambda c: c.patch_node_status("..", {}),
    lambda c: c.replace_status({"metadata": {"name": "x/y"}}), lambda c: c.create({"metadata": {"name": "UP"}}),
    lambda c: next(c.watch("a/b", "1", 5)),
], ids=["get", "delete", "get_node", "patch_node", "patch_node_status", "replace_status", "create", "watch"])
def test_the_agents_client_refuses_before_any_request(client, call):
    with pytest.raises(ApiError) as refused:
        call(client)
    assert "is not a Kubernetes" in str(refused.value) and "nothing was sent to the API server" in str(refused.value)
    assert refused.value.status == 422 and client.requests == 0


def test_checked_name_gives_the_name_back():
    assert checked_name("Node", "node-a") == "node-a"
