"""Pods on GPU series: the agent's pod-resources client against a stand-in kubelet speaking the real protobuf
(generated from the kubelet's published api.proto), and a real agent process labelling its series with it."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.kube import podresources
from harness.agent import AgentProcess, pods_on_gpus
from harness.kubelet_podresources import StandInKubelet, pod
from harness.paths import scenario_path, scenario_uuids

GPU = "nvidia.com/gpu"


def test_list_reads_every_pod_container_and_device_and_skips_the_fields_it_does_not_need(kubelet):
    kubelet.pods = [
        pod("train-0", "ml", ("trainer", [(GPU, ["GPU-aaaa", "GPU-bbbb"]), ("example.com/nic", ["nic0"])]),
            ("sidecar", [])),
        pod("infer", "serving", ("server", [("nvidia.com/mig-1g.10gb", ["MIG-cccc"])])),
    ]
    kubelet.pods[0]["containers"][1]["dynamic"] = True     # a DRA claim (field 5) follows the devices (test_dra_pods)
    held = podresources.list_pod_resources(kubelet.socket, timeout=5)
    assert held == [
        {"namespace": "ml", "pod": "train-0", "container": "trainer", "resource": GPU,
         "device_ids": ["GPU-aaaa", "GPU-bbbb"]},
        {"namespace": "ml", "pod": "train-0", "container": "trainer", "resource": "example.com/nic",
         "device_ids": ["nic0"]},
        {"namespace": "serving", "pod": "infer", "container": "server", "resource": "nvidia.com/mig-1g.10gb",
         "device_ids": ["MIG-cccc"]},
        {"namespace": "ml", "pod": "train-0", "container": "sidecar", "resource": "", "device_ids": [],
         "claim_name": "claim", "claim_namespace": "ml", "claim_devices": [
             {"driver": "gpu.nvidia.com", "pool": "", "device": "gpu-0", "cdi_devices": ["nvidia.com/gpu=0"]}]},
    ]
    # The decoder against protobuf's own encoder, byte for byte the kubelet's wire format.
    assert podresources.decode_list_response(kubelet.answer().SerializeToString()) == held


def test_an_answer_larger_than_http2s_first_window_arrives_whole(kubelet):
    kubelet.pods = [pod("job-%04d" % n, "batch-%d" % (n % 7), ("main", [(GPU, ["GPU-%032x" % n])]))
                    for n in range(3000)]
    assert kubelet.answer().ByteSize() > 4 * 65535
    held = podresources.list_pod_resources(kubelet.socket, timeout=10)
    assert len(held) == 3000 and held[-1]["device_ids"] == ["GPU-%032x" % 2999]


def test_the_lister_decodes_an_answer_once_while_the_kubelet_says_the_same(kubelet):
    kubelet.pods = [pod("busy", "elsewhere", ("c", [("nvidia.com/mig-1g.10gb", [
        "MIG-%08x-0000-5000-8000-%012x" % (number, number) for number in range(10000)])]))]
    lister = podresources.PodResourcesLister()
    first = lister(kubelet.socket, timeout=10)
    assert len(first[0]["device_ids"]) == 10000
    assert lister(kubelet.socket, timeout=10) is podresources.UNCHANGED and kubelet.calls == 2   # not decoded
    kubelet.pods[0]["name"] = "busier"
    assert lister(kubelet.socket, timeout=10)[0]["pod"] == "busier"


def test_an_empty_node_is_an_empty_list(kubelet):
    assert podresources.list_pod_resources(kubelet.socket, timeout=5) == []


def test_the_kubelets_refusal_is_named_with_its_status(kubelet):
    import grpc

    kubelet.status = grpc.StatusCode.UNAVAILABLE
    with pytest.raises(podresources.PodResourcesError) as refused:
        podresources.list_pod_resources(kubelet.socket, timeout=5)
    assert str(refused.value) == ("the kubelet refused /v1.PodResourcesLister/List on %s: gRPC status 14: "
                                  "stand-in kubelet told to fail" % kubelet.socket)


def test_a_slow_kubelet_is_given_up_on_within_the_timeout(kubelet):
    kubelet.delay = 30
    started = time.monotonic()
    with pytest.raises(podresources.PodResourcesError, match="did not answer .* within 0.5 s"):
        podresources.list_pod_resources(kubelet.socket, timeout=0.5)
    # The message names the timeout it kept; the bound only tells it from the kubelet's 30 s, with room for a
    # machine running the whole suite beside it.
    assert time.monotonic() - started < 15


def test_no_socket_says_where_it_looked(tmp_path):
    missing = tmp_path / "pod-resources" / "kubelet.sock"
    with pytest.raises(podresources.PodResourcesError) as error:
        podresources.list_pod_resources(str(missing), timeout=1)
    assert str(error.value) == ("no kubelet pod-resources socket at %s (is the kubelet running, and is that its root "
                                "directory?)" % missing)


@pytest.mark.parametrize("reply", [b"HTTP/1.1 400 Bad Request\r\n\r\n", b"", None], ids=["http1", "closes", "silent"])
def test_something_else_on_the_socket_is_an_error_not_a_hang(tmp_path, reply):
    path = str(tmp_path / "other.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    done = threading.Event()

    def serve():
        peer, _addr = listener.accept()
        peer.recv(4096)
        if reply is not None:
            peer.sendall(reply)
            peer.close()
        done.wait(30)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        with pytest.raises(podresources.PodResourcesError) as error:
            podresources.list_pod_resources(path, timeout=1)
    finally:
        done.set()
        listener.close()
    assert time.monotonic() - started < 15      # the 1 s timeout, not the silent server's 30 s
    expected = {"http1": "does not speak gRPC over HTTP/2", "closes": "closed the connection before it answered",
                "silent": "did not answer"}
    assert expected["http1" if reply and reply.startswith(b"HTTP") else "closes" if reply == b"" else "silent"] in \
        str(error.value)


# ------------------------------------------------------------------ the agent


def test_gpu_series_name_the_pods_that_hold_them_shared_or_not_and_drop_them_when_the_pods_end(
        access, agent_command, node, tmp_path, kubelet):
    uuids = scenario_uuids("h100_sxm_x8")
    kubelet.pods = [
        pod("train", "ml", ("trainer", [(GPU, [uuids[0]])])),
        # GPU 1 shared by time-slicing: replicas ::0 and ::3 in two pods, two replicas in one container
        pod("notebook-a", "lab", ("jupyter", [(GPU, [uuids[1] + "::0", uuids[1] + "::1"])])),
        pod("notebook-b", "lab", ("jupyter", [(GPU, [uuids[1] + "::3"])])),
        pod("web", "shop", ("nginx", [("example.com/nic", [uuids[2]])])),     # not NVIDIA's: no label
    ]
    agent = AgentProcess(agent_command, access, node, tmp_path, scenario="h100_sxm_x8",
                         extra=("--pod-resources-socket", kubelet.socket, "--pod-resources-interval", "1"))
    nobody = [("", "", "")]
    try:
        agent.wait_for(lambda: pods_on_gpus(agent).get(0) == [("train", "ml", "trainer")], 20)
        held = pods_on_gpus(agent)
        assert held[1] == [("notebook-a", "lab", "jupyter"), ("notebook-b", "lab", "jupyter")]
        # GPU 1 is shared: its memory is split per pod, beside a series of the whole GPU with no pod
        assert pods_on_gpus(agent, "DCGM_FI_DEV_FB_USED")[1] == nobody + [("notebook-a", "lab", "jupyter"),
                                                                          ("notebook-b", "lab", "jupyter")]
        assert held[2] == nobody and all(held[gpu] == nobody for gpu in range(3, 8))
        # every DCGM series carries them, the agent's own do not
        assert pods_on_gpus(agent, "DCGM_FI_DEV_XID_ERRORS")[0] == [("train", "ml", "trainer")]
        assert 'pod="train"' not in "".join(line for line in agent.metrics_text().splitlines()
                                            if line.startswith("scv_gpu_"))

        kubelet.pods = kubelet.pods[1:]          # the training pod ended
        agent.wait_for(lambda: pods_on_gpus(agent)[0] == nobody, 5)
        assert pods_on_gpus(agent)[1] == [("notebook-a", "lab", "jupyter"), ("notebook-b", "lab", "jupyter")]
    finally:
        agent.stop()


def test_a_kubelet_that_is_gone_or_slow_takes_the_labels_away_and_never_holds_up_a_tick(
        access, agent_command, node, tmp_path, generated):
    uuids = scenario_uuids("titan_xp")
    socket_path = tmp_path / "kubelet.sock"
    agent = AgentProcess(agent_command, access, node, tmp_path, scenario="titan_xp",
                         extra=("--pod-resources-socket", str(socket_path), "--pod-resources-interval", "1"))
    try:
        agent.wait_for(lambda: agent.metrics()["scv_agent_pod_resources_failures_total"] >= 1, 20)
        assert pods_on_gpus(agent)[0] == [("", "", "")]
        assert "pod labels left off GPU series: no kubelet pod-resources socket at %s" % socket_path in \
            agent.log.read_text()
        with StandInKubelet(generated, socket_path) as kubelet:
            kubelet.pods = [pod("render", "gfx", ("blender", [(GPU, [uuids[0]])]))]
            agent.wait_for(lambda: pods_on_gpus(agent)[0] == [("render", "gfx", "blender")], 5)
            assert "pod labels back on GPU series" in agent.log.read_text()
            # A kubelet that stops answering: ticks go on at their interval, the labels go after the 2 s bound.
            kubelet.delay = 60
            ticks = agent.metrics()["scv_agent_ticks_total"]
            agent.wait_for(lambda: pods_on_gpus(agent)[0] == [("", "", "")], 10)
            assert agent.metrics()["scv_agent_ticks_total"] - ticks >= 2
            assert "did not answer /v1.PodResourcesLister/List on %s within 2 s" % socket_path in agent.log.read_text()
    finally:
        agent.stop()


def test_a_mig_device_a_pod_holds_labels_its_gpu_instance(access, agent_command, node, tmp_path, kubelet):
    import json

    scenario = json.loads(scenario_path("h100_mig_mixed").read_text())
    mig = scenario["devices"][0]["migDevices"]
    kubelet.pods = [pod("small", "ml", ("worker", [("nvidia.com/mig-1g.10gb", [mig[2]["uuid"]])])),
                    pod("big", "ml", ("worker", [("nvidia.com/mig-3g.40gb", [mig[0]["uuid"]])])),
                    pod("ghost", "ml", ("worker", [("nvidia.com/mig-1g.10gb",
                                                    ["MIG-00000000-0000-0000-0000-00000000"])]))]
    agent = AgentProcess(agent_command, access, node, tmp_path, scenario="h100_mig_mixed",
                         extra=("--pod-resources-socket", kubelet.socket, "--pod-resources-interval", "1"))

    def holders():
        from prometheus_client.parser import text_string_to_metric_families

        return {(sample.labels["gpu"], sample.labels["GPU_I_ID"]): sample.labels.get("pod", "")
                for family in text_string_to_metric_families(agent.metrics_text()) for sample in family.samples
                if sample.name == "DCGM_FI_DEV_FB_USED"}

    try:
        # each pod on its own GPU instance's series, the others (and the MIG device NVML does not know) nobody's
        want = {("0", "1"): "big", ("0", "2"): "", ("0", "3"): "small", ("0", "4"): "", ("1", "1"): ""}
        agent.wait_for(lambda: holders() == want, 20)
    finally:
        agent.stop()


# ------------------------------------------------------------------ a hostile peer on the socket

def _frame(kind, flags, stream, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def _huffman_a(count):
    """``count`` 'a's Huffman-coded (RFC 7541 appendix B: 'a' is 00011, 5 bits), padded with ones."""
    bits = "00011" * count
    bits += "1" * (-len(bits) % 8)
    return int(bits, 2).to_bytes(len(bits) // 8, "big")


def _floods():
    settings = _frame(4, 0, 0)
    # 48 KiB of one-octet indexed fields (:status 200, 42 octets each listed): within the block bound, over the list's
    indexed = (_frame(1, 0, 1, b"\x88" * 16384) + _frame(9, 0, 1, b"\x88" * 16384)
               + _frame(9, 4, 1, b"\x88" * 16384))
    # one literal whose Huffman-coded value (12.5 KB) decodes to 20000 octets, over the header list's 16 KiB
    coded = _huffman_a(20000)
    length, more = len(coded) - 0x7F, bytearray()
    while length >= 0x80:
        more.append(length & 0x7F | 0x80)
        length >>= 7
    more.append(length)
    huffman = _frame(1, 4, 1, b"\x00\x05x-big" + bytes((0x80 | 0x7F,)) + bytes(more) + coded)
    return {
        # CONTINUATION frames without end, as long as the client reads
        "continuation": (settings + _frame(1, 0, 1, b"\x88"), _frame(9, 0, 1, b"\x88" * 16384)),
        "indexed": (settings + indexed, b""),
        "huffman": (settings + huffman, b""),
        # a short frame (the unit tests take each kind): named, never a traceback
        "short_goaway": (settings + _frame(7, 0, 0, b"\x00\x00\x00\x01"), b""),
    }


class HostilePeer:
    """A unix socket that answers every call with ``first`` and then ``again`` repeated while the client reads
    (at most 512 MiB), as a broken or hostile kubelet might."""

    def __init__(self, path, first, again):
        self.path, self.first, self.again, self.calls = str(path), first, again, 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                peer, _addr = self.listener.accept()
            except OSError:
                return
            self.calls += 1
            try:
                peer.settimeout(5)
                peer.recv(65536)
                peer.sendall(self.first)
                sent = 0
                while self.again and sent < 512 << 20:
                    peer.sendall(self.again * 64)
                    sent += len(self.again) * 64
            except OSError:
                pass
            finally:
                peer.close()

    def close(self):
        self.listener.close()


def _rss_kib(pid):
    for line in open("/proc/%d/status" % pid, encoding="ascii"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("flood", sorted(_floods()))
def test_a_peer_that_floods_the_socket_is_cut_off_within_bounds(access, agent_command, node, tmp_path, generated,
                                                                flood):
    """RFC 9113 10.5.1 and RFC 7541 7.3: the agent bounds the header list, the header block, CONTINUATION frames and
    Huffman output, and names a short frame; under each it keeps its memory, answers /healthz, ticks on, drops the
    pod labels of the last good answer within an interval, and logs no traceback."""
    uuids = scenario_uuids("titan_xp")
    socket_path = tmp_path / "kubelet.sock"
    agent = AgentProcess(agent_command, access, node, tmp_path, scenario="titan_xp",
                         extra=("--pod-resources-socket", str(socket_path), "--pod-resources-interval", "1"))
    try:
        with StandInKubelet(generated, socket_path) as kubelet:
            kubelet.pods = [pod("render", "gfx", ("blender", [(GPU, [uuids[0]])]))]
            agent.wait_for(lambda: pods_on_gpus(agent)[0] == [("render", "gfx", "blender")], 20)
        before = _rss_kib(agent.process.pid)
        first, again = _floods()[flood]
        peer = HostilePeer(socket_path, first, again)
        try:
            ticks = agent.metrics()["scv_agent_ticks_total"]
            agent.wait_for(lambda: pods_on_gpus(agent)[0] == [("", "", "")], 5)       # one interval and the 2 s bound
            agent.wait_for(lambda: peer.calls >= 3, 15)
            assert _rss_kib(agent.process.pid) - before < 10 * 1024, (before, _rss_kib(agent.process.pid))
            assert agent.healthz()[0] == 200
            assert agent.metrics()["scv_agent_ticks_total"] > ticks
        finally:
            peer.close()
        log = agent.log.read_text()
        assert "pod labels left off GPU series" in log and "Traceback" not in log, log[-3000:]
    finally:
        agent.stop()
