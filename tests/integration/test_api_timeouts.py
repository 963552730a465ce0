"""A Kubernetes API server that accepts connections and never answers: the modules fail, in time, and say so."""

from __future__ import annotations

import time

import pytest

from harness import scenario_expectations as expected
from harness.stalled_server import stalled_kubeconfig

REQUEST_TIMEOUT = 4


@pytest.mark.parametrize("module, args", [
    ("scv.gpu.scv", {"name": "stalled-node", "gpu_facts": expected.TITAN_XP}),
    ("scv.gpu.node_labels", {"name": "stalled-node", "gpu_facts": expected.TITAN_XP}),
], ids=["scv", "node_labels"])
def test_a_stalled_server_fails_the_module_within_request_timeout(ansible, control_plane, stalled_server, tmp_path,
                                                                  module, args):
    kubeconfig = stalled_kubeconfig(control_plane, stalled_server, tmp_path / "stalled.kubeconfig")
    start = time.monotonic()
    ok, result = ansible.module(dict(args, kubeconfig=str(kubeconfig), request_timeout=REQUEST_TIMEOUT), name=module)
    took = time.monotonic() - start
    assert not ok
    assert stalled_server.accepted.is_set()
    assert "did not answer within %d s" % REQUEST_TIMEOUT in result["msg"], result
    assert "127.0.0.1:%d" % stalled_server.port in result["msg"], result
    # One timeout, not urllib3's four tries of it: the server took one connection, which waited the whole timeout
    # (counted, not timed from above: a loaded machine makes Ansible's start as slow as it likes).
    assert took >= REQUEST_TIMEOUT, took
    assert len(stalled_server.held) == 1, len(stalled_server.held)


@pytest.mark.every_ansible_line
def test_request_timeout_must_be_positive(ansible, control_plane):
    ok, result = ansible.module({"name": "n", "gpu_facts": expected.TITAN_XP, "request_timeout": 0,
                                 "kubeconfig": str(control_plane.admin_kubeconfig)}, name="scv.gpu.scv")
    assert not ok and "request_timeout: expected seconds > 0" in result["msg"]
