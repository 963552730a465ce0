"""Which pods hold which GPU: device IDs as NVIDIA's device plugin hands them out, and a kubelet that fails."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent.pod_attribution import PodAttribution, device_holders
from ansible_collections.scv.gpu.plugins.module_utils.kube.podresources import PodResourcesError, decode_list_response
from harness.agent_samples import pb


def held(pod, container, resource, *ids, namespace="ns"):
    return {"namespace": namespace, "pod": pod, "container": container, "resource": resource,
            "device_ids": list(ids)}


CARDS = [{"id": 0, "uuid": "GPU-0"}, {"id": 1, "uuid": "GPU-1"}, {"id": 2, "uuid": "GPU-2"}]


def test_replicas_of_a_shared_gpu_count_once_per_container_and_other_resources_not_at_all():
    holders = device_holders([
        held("a", "c", "nvidia.com/gpu", "GPU-1::0", "GPU-1::1"),
        held("b", "c", "nvidia.com/gpu.shared", "GPU-1::2"),
        held("n", "c", "example.com/nic", "GPU-2"),
    ])
    assert holders == {"GPU-1": [("a", "ns", "c"), ("b", "ns", "c")]}


def test_cards_are_found_by_uuid_and_by_index_and_mig_devices_by_their_gpu_instance():
    answers = [[held("p", "c", "nvidia.com/gpu", "GPU-0"), held("q", "c", "nvidia.com/gpu", "2"),
                held("m", "c", "nvidia.com/mig-1g.10gb", "MIG-x"), held("g", "c", "nvidia.com/mig-1g.10gb", "MIG-y")]]
    kept = []

    def lister(_path, _timeout, keep=None, _drivers=None):
        kept.append(keep)
        return answers[0]

    pods = PodAttribution("/none", 10, threading.Event(), lister=lister)
    listed = []

    def mig_devices():
        listed.append(1)
        return {"MIG-x": ("GPU-1", 3)}

    pods.learn(CARDS, mig_devices)
    pods.refresh()
    # device names too: GKE's MIG devices (nvidia<index>/gi<instance>) are found in either ID type
    assert kept == [frozenset({b"0", b"1", b"2", b"GPU-0", b"GPU-1", b"GPU-2", b"MIG-x", b"nvidia0", b"nvidia1",
                               b"nvidia2"})]
    # a MIG device's holder is its GPU instance's, not the whole GPU's; MIG-y is no device of this node
    assert pods.by_card(CARDS) == {0: [("p", "ns", "c")], 2: [("q", "ns", "c")]}
    assert pods.by_instance(CARDS) == {(1, 3): [("m", "ns", "c")]}
    pods.learn(CARDS, mig_devices)
    assert len(listed) == 1                        # the same cards, the same static readings: not listed again
    pods.learn(CARDS, mig_devices, generation=1)   # the static readings were read again (a SIGHUP): listed again
    pods.learn(CARDS[:2], mig_devices, generation=1)
    assert len(listed) == 3
    answers[0] = []
    pods.refresh()
    assert pods.by_card(CARDS) == {}


def test_mig_devices_that_cannot_be_listed_are_said_once_and_asked_for_again(caplog):
    pods = PodAttribution("/none", 10, threading.Event(), lister=lambda *_args: [])

    def broken():
        raise RuntimeError("NVML is not initialised")

    with caplog.at_level(logging.WARNING, logger="scv-gpu-agent"):
        pods.learn(CARDS, broken)
        pods.learn(CARDS, broken)
    assert len(caplog.records) == 1 and "NVML is not initialised" in caplog.records[0].getMessage()
    pods.learn(CARDS, dict)
    assert pods._local == frozenset({b"0", b"1", b"2", b"GPU-0", b"GPU-1", b"GPU-2", b"nvidia0", b"nvidia1",
                                     b"nvidia2"})


def test_devices_of_no_gpu_here_are_left_out_as_the_answer_is_decoded():
    foreign = ["MIG-%05d" % number for number in range(10000)]
    device = pb(1, "nvidia.com/mig-1g.10gb") + b"".join(pb(2, uuid) for uuid in foreign + ["MIG-x::3"])
    message = pb(1, pb(1, "busy") + pb(2, "ns") + pb(3, pb(1, "c") + pb(2, device)))
    assert decode_list_response(message)[0]["device_ids"][-2:] == ["MIG-09999", "MIG-x::3"]
    assert decode_list_response(message, keep=frozenset({b"MIG-x", b"GPU-0"})) == [
        held("busy", "c", "nvidia.com/mig-1g.10gb", "MIG-x::3")]


def test_the_same_answer_for_other_local_devices_is_decoded_again(monkeypatch):
    from ansible_collections.scv.gpu.plugins.module_utils.kube import podresources

    message = pb(1, pb(1, "p") + pb(2, "ns") + pb(3, pb(1, "c") + pb(2, pb(1, "nvidia.com/gpu") + pb(2, "GPU-1"))))
    monkeypatch.setattr(podresources, "call", lambda *_args: message)
    lister = podresources.PodResourcesLister()
    assert lister("/x", 1, frozenset({b"GPU-0"})) == [held("p", "c", "nvidia.com/gpu")]
    assert lister("/x", 1, frozenset({b"GPU-0"})) is podresources.UNCHANGED
    assert lister("/x", 1, frozenset({b"GPU-1"})) == [held("p", "c", "nvidia.com/gpu", "GPU-1")]


def test_the_same_answer_again_is_not_worked_through_again_even_after_a_failure(monkeypatch):
    """PodResourcesLister answers UNCHANGED when the kubelet's bytes are those it read last: the holders are
    kept as they are. A failed read clears the pods; the same answer
    after it brings back the holders worked out from it before, without decoding it again."""
    from ansible_collections.scv.gpu.plugins.module_utils.agent import pod_attribution as module
    from ansible_collections.scv.gpu.plugins.module_utils.kube import podresources

    messages = [b"\x0a\x02\x0a\x00", b"\x0a\x02\x0a\x00", PodResourcesError("gone"), b"\x0a\x02\x0a\x00"]
    decoded = []

    def call(_path, _method, _request, _timeout):
        message = messages.pop(0)
        if isinstance(message, Exception):
            raise message
        return message

    monkeypatch.setattr(podresources, "call", call)
    monkeypatch.setattr(podresources, "decode_list_response",
                        lambda message, _keep=None, _drivers=None: decoded.append(message) or [held("m", "c", "nvidia.com/gpu", "GPU-0")])
    pods = PodAttribution("/none", 10, threading.Event())
    pods.refresh()
    first = pods.holders
    pods.refresh()
    assert pods.holders is first and len(decoded) == 1
    pods.refresh()
    assert pods.holders == {}
    pods.refresh()
    assert len(decoded) == 1 and pods.by_card(CARDS) == {0: [("m", "ns", "c")]}
    assert module.UNCHANGED is podresources.UNCHANGED


def test_devices_with_the_same_holders_share_one_list():
    holders = device_holders([held("busy", "c", "nvidia.com/mig-1g.10gb", *("MIG-%d" % n for n in range(100)))])
    assert len({id(found) for found in holders.values()}) == 1


def test_a_failing_kubelet_drops_every_label_and_is_logged_once_until_it_answers(caplog):
    outcome = [PodResourcesError("no kubelet pod-resources socket at /x")]

    def lister(_path, _timeout, _keep=None, _drivers=None):
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return outcome[0]

    pods = PodAttribution("/x", 10, threading.Event(), lister=lister)
    pods.holders = {"GPU-0": [("stale", "ns", "c")]}
    with caplog.at_level(logging.INFO, logger="scv-gpu-agent"):
        pods.refresh()
        pods.refresh()
        assert pods.by_card(CARDS) == {} and pods.failures == 2
        outcome[0] = [held("p", "c", "nvidia.com/gpu", "GPU-0")]
        pods.refresh()
    assert pods.by_card(CARDS) == {0: [("p", "ns", "c")]} and pods.refreshes == 3
    messages = [record.getMessage() for record in caplog.records]
    assert messages == ["pod labels left off GPU series: no kubelet pod-resources socket at /x",
                        "pod labels back on GPU series: the kubelet's pod-resources API answers again"]


@pytest.mark.parametrize("data, problem", [
    (b"\x0a\x05ab", "field 1 is cut short"),
    (b"\x0a", "a varint runs past its end"),
    (b"\x0b", "wire type 3 in field 1"),
])
def test_an_answer_that_is_not_protobuf_is_named_as_such(data, problem):
    with pytest.raises(PodResourcesError, match=problem):
        decode_list_response(data)


def test_an_answer_no_decoder_foresaw_leaves_the_thread_running_and_clears_stale_pods(caplog):
    """The reading thread outlives any failure of a read: the ended pod leaves the GPU's series at once,
    and the next interval's read puts back what the kubelet then says."""
    answers = [[held("ended", "c", "nvidia.com/gpu", "GPU-0")], UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"),
               KeyError("containers"), [held("next", "c", "nvidia.com/gpu", "GPU-1")]]
    read = threading.Event()
    stopping = threading.Event()

    def lister(_path, _timeout, _keep=None, _drivers=None):
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        read.set()
        if isinstance(answer, Exception):
            raise answer
        return answer

    pods = PodAttribution("/x", 0.01, stopping, lister=lister)
    with caplog.at_level(logging.INFO, logger="scv-gpu-agent"):
        pods.start()
        try:
            deadline = time.monotonic() + 10
            while pods.refreshes < 5 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert pods.is_alive() and pods.refreshes >= 5 and pods.failures == 2
            assert pods.by_card(CARDS) == {1: [("next", "ns", "c")]}
        finally:
            stopping.set()
            pods.join(5)
    messages = [record.getMessage() for record in caplog.records]
    assert ("pod labels left off GPU series: the kubelet's pod-resources answer could not be read (UnicodeDecodeError: "
            "'utf-8' codec can't decode byte 0xff in position 0: bad)") in messages
    assert "pod labels left off GPU series: the kubelet's pod-resources answer could not be read (KeyError: " \
           "'containers')" in messages


def test_a_failed_read_clears_the_pods_it_read_before():
    answers = [[held("ended", "c", "nvidia.com/gpu", "GPU-0")], RuntimeError("half an answer")]

    def lister(_path, _timeout, _keep=None, _drivers=None):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    pods = PodAttribution("/x", 10, threading.Event(), lister=lister)
    pods.refresh()
    assert pods.by_card(CARDS) == {0: [("ended", "ns", "c")]}
    pods.refresh()
    assert pods.by_card(CARDS) == {} and pods.problem.endswith("(RuntimeError: half an answer)")
