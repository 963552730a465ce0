"""HTTP/2 framed by hand for one unary gRPC call: the frames a server may send, byte by byte.
(grpc-go's kubelet and grpcio answer it in the integration tests.)"""

from __future__ import annotations

import re
import struct

import pytest
from hpack import Decoder, Encoder

from ansible_collections.scv.gpu.plugins.module_utils.kube import grpc_unary as h2
from ansible_collections.scv.gpu.plugins.module_utils.kube.grpc_unary import frame


def settings():
    return frame(h2.SETTINGS, 0, 0, struct.pack(">HI", 0x3, 100))


def headers(pairs, flags=h2.END_HEADERS, encoder=None):
    return frame(h2.HEADERS, flags, 1, (encoder or Encoder()).encode(pairs))


def test_a_whole_answer_fed_a_byte_at_a_time_or_at_once_reads_alike():
    encoder = Encoder()
    wire = (settings() + headers([(":status", "200"), ("content-type", "application/grpc")], encoder=encoder)
            + frame(h2.DATA, 0, 1, b"\x00\x00\x00\x00\x03ab") + frame(h2.DATA, h2.PADDED, 1, b"\x02c\x00\x00")
            + frame(h2.PING, 0, 0, b"12345678")
            + headers([("grpc-status", "0")], h2.END_HEADERS | h2.END_STREAM, encoder))
    for step in (1, len(wire)):
        reader = h2.Reader(1 << 20)
        for start in range(0, len(wire), step):
            reader.feed(wire[start:start + step])
        assert reader.ended and bytes(reader.body) == b"\x00\x00\x00\x00\x03abc"
        assert reader.headers == {":status": "200", "content-type": "application/grpc", "grpc-status": "0"}
        assert reader.replies == [frame(h2.SETTINGS, h2.ACK, 0), frame(h2.PING, h2.ACK, 0, b"12345678")]


def test_a_header_block_split_over_continuation_frames_and_a_trailers_only_answer():
    block = Encoder().encode([(":status", "200"), ("grpc-status", "5"), ("grpc-message", "not%20found")])
    reader = h2.Reader(1 << 20)
    reader.feed(settings() + frame(h2.HEADERS, h2.END_STREAM | h2.PRIORITY, 1, b"\x00\x00\x00\x00\x10" + block[:3])
                + frame(h2.CONTINUATION, h2.END_HEADERS, 1, block[3:]))
    assert reader.ended and reader.headers["grpc-status"] == "5" and reader.headers["grpc-message"] == "not%20found"


@pytest.mark.parametrize("wire, error, says", [
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", h2.ProtocolError, "a frame of 4740180 bytes"),
    (frame(h2.DATA, 0, 1, b"x"), h2.ProtocolError, "its first frame is not SETTINGS (type 0)"),
    (settings() + frame(h2.RST_STREAM, 0, 1, struct.pack(">I", 8)), h2.StreamError, "HTTP/2 error 8"),
    (settings() + frame(h2.GOAWAY, 0, 0, struct.pack(">II", 1, 11)), h2.StreamError, "HTTP/2 error 11"),
    (settings() + frame(h2.DATA, h2.PADDED, 1, b"\x05ab"), h2.ProtocolError, "padding is longer than the frame"),
    (settings() + frame(h2.DATA, 0, 1, b"x" * 11), h2.ProtocolError, "an answer over 10 bytes"),
])
def test_what_is_not_an_answer_is_named(wire, error, says):
    with pytest.raises(error, match=re.escape(says)):
        h2.Reader(10).feed(wire)


def test_the_request_opens_one_window_for_the_answer_and_is_encoded_once():
    wire = h2.request("localhost", "/v1.PodResourcesLister/List", b"", 2.0, 1 << 24)
    assert wire is h2.request("localhost", "/v1.PodResourcesLister/List", b"", 2.0, 1 << 24)
    assert wire.startswith(h2.PREFACE)
    reader, frames, pos = Decoder(), [], len(h2.PREFACE)
    while pos < len(wire):
        length = int.from_bytes(wire[pos:pos + 3], "big")
        frames.append((wire[pos + 3], wire[pos + 4], wire[pos + 9:pos + 9 + length]))
        pos += 9 + length
    assert [(kind, flags) for kind, flags, _payload in frames] == [
        (h2.SETTINGS, 0), (h2.WINDOW_UPDATE, 0), (h2.HEADERS, h2.END_HEADERS), (h2.DATA, h2.END_STREAM)]
    assert frames[0][2] == struct.pack(">HIHI", h2.ENABLE_PUSH, 0, h2.INITIAL_WINDOW_SIZE, 1 << 24)
    assert struct.unpack(">I", frames[1][2])[0] == (1 << 24) - 65535
    assert dict(reader.decode(frames[2][2]))[":path"] == "/v1.PodResourcesLister/List"
    assert frames[3][2] == b"\x00\x00\x00\x00\x00"
