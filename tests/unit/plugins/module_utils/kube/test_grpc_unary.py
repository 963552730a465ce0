"""HTTP/2 framed by hand for one unary gRPC call: the frames a server may send, byte by byte. Frame types,
flags and settings are written as RFC 9113 numbers them, not with the module's own names.
(grpc-go's kubelet and grpcio answer it in the integration tests.)"""

from __future__ import annotations

import re
import struct

import pytest
from hpack import Decoder, Encoder

from ansible_collections.scv.gpu.plugins.module_utils.kube import grpc_unary as h2

# RFC 9113, section 6: frame types, then flags
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20


def frame(kind, flags, stream, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def settings():
    return frame(SETTINGS, 0, 0, struct.pack(">HI", 0x3, 100))


def headers(pairs, flags=END_HEADERS, encoder=None):
    return frame(HEADERS, flags, 1, (encoder or Encoder()).encode(pairs))


def test_the_module_frames_as_the_rfc_does():
    assert h2.frame(PING, ACK, 0, b"12345678") == frame(PING, ACK, 0, b"12345678")


def test_a_whole_answer_fed_a_byte_at_a_time_or_at_once_reads_alike():
    encoder = Encoder()
    wire = (settings() + headers([(":status", "200"), ("content-type", "application/grpc")], encoder=encoder)
            + frame(DATA, 0, 1, b"\x00\x00\x00\x00\x03ab") + frame(DATA, PADDED, 1, b"\x02c\x00\x00")
            + frame(DATA, PADDED, 1, b"\x00") + frame(PING, 0, 0, b"12345678") + frame(PING, ACK, 0, b"87654321")
            + frame(SETTINGS, ACK, 0) + frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x10\x00")
            + frame(DATA, 0, 3, b"another stream's") + headers([("grpc-status", "0")], END_HEADERS | END_STREAM, encoder))
    for step in (1, len(wire)):
        reader = h2.Reader(1 << 20)
        for start in range(0, len(wire), step):
            reader.feed(wire[start:start + step])
        assert reader.ended and bytes(reader.body) == b"\x00\x00\x00\x00\x03abc"
        assert reader.headers == {":status": "200", "content-type": "application/grpc", "grpc-status": "0"}
        assert reader.replies == [frame(SETTINGS, ACK, 0), frame(PING, ACK, 0, b"12345678")]


def test_a_header_block_split_over_continuation_frames_and_a_trailers_only_answer():
    block = Encoder().encode([(":status", "200"), ("grpc-status", "5"), ("grpc-message", "not%20found")])
    reader = h2.Reader(1 << 20)
    reader.feed(settings() + frame(HEADERS, END_STREAM | PRIORITY, 1, b"\x00\x00\x00\x00\x10" + block[:3]))
    assert not reader.ended                          # the stream ends with its header block, not before
    reader.feed(frame(CONTINUATION, END_HEADERS, 1, block[3:]))
    assert reader.ended and reader.headers == {":status": "200", "grpc-status": "5", "grpc-message": "not%20found"}


def test_the_largest_frame_and_answer_it_takes():
    reader = h2.Reader(16384)
    reader.feed(settings() + frame(DATA, END_STREAM, 1, b"x" * 16384))
    assert reader.ended and len(reader.body) == 16384


@pytest.mark.parametrize("wire, error, says", [
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", h2.ProtocolError, "a frame of 4740180 bytes"),
    (settings() + b"\x00\x40\x01" + bytes(6), h2.ProtocolError, "a frame of 16385 bytes, over the 16384"),
    (frame(DATA, 0, 1, b"x"), h2.ProtocolError, "its first frame is not SETTINGS (type 0)"),
    (settings() + frame(RST_STREAM, 0, 1, struct.pack(">I", 8)), h2.StreamError, "HTTP/2 error 8"),
    (settings() + frame(GOAWAY, 0, 0, struct.pack(">II", 1, 11) + b"bye"), h2.StreamError, "HTTP/2 error 11"),
    (settings() + frame(DATA, PADDED, 1, b"\x03ab"), h2.ProtocolError, "padding is longer than the frame"),
    (settings() + frame(DATA, PADDED, 1, b""), h2.ProtocolError, "padding is longer than the frame"),
    (settings() + frame(DATA, 0, 1, b"x" * 11), h2.AnswerTooLarge, "an answer over 10 bytes"),
    (settings() + frame(HEADERS, END_HEADERS, 1, b"\x80"), h2.ProtocolError, "index 0"),
    # short frames a peer may send: named, never a struct.error
    (settings() + frame(RST_STREAM, 0, 1, b"\x00\x08"), h2.ProtocolError, "an RST_STREAM frame of 2 octets, not 4"),
    (settings() + frame(GOAWAY, 0, 0, b"\x00\x00\x00\x01"), h2.ProtocolError, "a GOAWAY frame of 4 octets"),
])
def test_what_is_not_an_answer_is_named(wire, error, says):
    with pytest.raises(error, match=re.escape(says)) as caught:
        h2.Reader(10).feed(wire)
    if error is h2.StreamError:
        assert caught.value.goaway is (says == "HTTP/2 error 11")


def test_a_reset_on_another_stream_is_not_this_calls():
    reader = h2.Reader(10)
    reader.feed(settings() + frame(RST_STREAM, 0, 3, struct.pack(">I", 8)))
    assert not reader.ended


def test_the_request_opens_one_window_for_the_answer_and_is_encoded_once():
    wire = h2.request("localhost", "/v1.PodResourcesLister/List", b"", 2.0, 1 << 24)
    assert wire is h2.request("localhost", "/v1.PodResourcesLister/List", b"", 2.0, 1 << 24)
    assert wire.startswith(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    frames, pos = [], 24
    while pos < len(wire):
        length = int.from_bytes(wire[pos:pos + 3], "big")
        frames.append((wire[pos + 3], wire[pos + 4], int.from_bytes(wire[pos + 5:pos + 9], "big"),
                       wire[pos + 9:pos + 9 + length]))
        pos += 9 + length
    assert [frame[:3] for frame in frames] == [(SETTINGS, 0, 0), (WINDOW_UPDATE, 0, 0), (HEADERS, END_HEADERS, 1),
                                               (DATA, END_STREAM, 1)]
    # SETTINGS_ENABLE_PUSH (2) off, SETTINGS_INITIAL_WINDOW_SIZE (4), SETTINGS_MAX_HEADER_LIST_SIZE (6) as the
    # client enforces it; the connection's window widened to match
    assert frames[0][3] == (b"\x00\x02\x00\x00\x00\x00\x00\x04" + (1 << 24).to_bytes(4, "big")
                            + b"\x00\x06" + h2.MAX_HEADER_LIST.to_bytes(4, "big"))
    assert int.from_bytes(frames[1][3], "big") == (1 << 24) - 65535
    assert Decoder().decode(frames[2][3]) == [
        (":method", "POST"), (":scheme", "http"), (":path", "/v1.PodResourcesLister/List"),
        (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers"),
        ("grpc-timeout", "2000m")]
    assert frames[3][3] == b"\x00\x00\x00\x00\x00"
    assert b"grpc-timeout\x021m" in h2.request("localhost", "/x", b"", 0.0001, 1 << 24)


@pytest.mark.parametrize("sent, error, says", [
    (b"HTTP/1", h2.ProtocolError, "it answered b'HTTP/1'"),          # no whole frame: it speaks something else
    (settings(), ConnectionAbortedError, None),                        # HTTP/2, but gone before the answer
    (b"", ConnectionAbortedError, None),
])
def test_a_peer_that_closes_before_the_answer_is_told_apart(sent, error, says):
    import socket
    import time

    ours, theirs = socket.socketpair()
    try:
        theirs.sendall(sent)
        theirs.shutdown(socket.SHUT_WR)              # it says no more; the request still reaches it
        with pytest.raises(error, match=re.escape(says) if says else None):
            h2.exchange(ours, b"request", h2.Reader(10), time.monotonic() + 5)
        assert theirs.recv(7) == b"request"
    finally:
        ours.close()
        theirs.close()


# RFC 9113 section 10.5.1 and RFC 7541 section 7.3: what a client must bound, each stopped within its bound.

def test_a_flood_of_continuation_frames_stops_at_the_bound():
    reader = h2.Reader(10)
    flood = frame(HEADERS, 0, 1, b"\x88") + b"".join(frame(CONTINUATION, 0, 1, b"\x88" * 16384) for _frame_number in range(64))
    with pytest.raises(h2.ProtocolError, match="a header block over the 65536 octets"):
        reader.feed(settings() + flood)
    assert len(reader.block) <= h2.MAX_HEADER_BLOCK + 16384
    empty = frame(HEADERS, 0, 1, b"\x88") + frame(CONTINUATION, 0, 1) * 1000
    with pytest.raises(h2.ProtocolError, match="in more than 32 CONTINUATION frames"):
        h2.Reader(10).feed(settings() + empty)


def test_a_block_of_one_octet_indexed_fields_stops_at_the_header_list_bound():
    """Each \\x88 (:status 200) is 1 octet coded and 42 listed: 16384 / 42 fields fit, one more does not."""
    fits = 16384 // 42
    reader = h2.Reader(10)
    reader.feed(settings() + frame(HEADERS, END_HEADERS, 1, b"\x88" * fits))
    with pytest.raises(h2.ProtocolError, match="a header list over the 16384 octets"):
        h2.Reader(10).feed(settings() + frame(HEADERS, END_HEADERS, 1, b"\x88" * (fits + 1)))


def test_a_huffman_value_that_would_expand_past_the_bound_stops_decoding_there():
    encoder = Encoder()
    block = encoder.encode([("x-big", "a" * 20000)])
    assert len(block) < 16384          # one frame, coded shorter than the value
    with pytest.raises(h2.ProtocolError, match="decodes past the"):
        h2.Reader(10).feed(settings() + frame(HEADERS, END_HEADERS, 1, block))


def test_the_bounds_take_what_is_exactly_at_them():
    """Each bound is the most a peer may send: exactly that is taken, one more is not."""
    def block_in(continuations, octets=1):
        return frame(HEADERS, 0, 1, b"\x88" * octets) + frame(CONTINUATION, 0, 1) * (continuations - 1) + \
            frame(CONTINUATION, END_HEADERS, 1, b"\x88")
    h2.Reader(10).feed(settings() + block_in(32))
    with pytest.raises(h2.ProtocolError, match="in more than 32 CONTINUATION frames"):
        h2.Reader(10).feed(settings() + block_in(33))
    # 65536 octets of header block: 16383 + 3 * 16384 + 1, as HEADERS and CONTINUATIONs; each field 42 listed,
    # so the list bound is raised for this one reader
    exact = (frame(HEADERS, 0, 1, b"\x88" * 16383) + frame(CONTINUATION, 0, 1, b"\x88" * 16384) * 3
             + frame(CONTINUATION, END_HEADERS, 1, b"\x88"))
    reader = h2.Reader(10)
    reader.decoder.max_header_list = None
    reader.feed(settings() + exact)
    assert reader.headers[":status"] == "200"
    with pytest.raises(h2.ProtocolError, match="a header block over the 65536 octets"):
        h2.Reader(10).feed(settings() + exact[:-10] + frame(CONTINUATION, END_HEADERS, 1, b"\x88\x88"))
    # a GOAWAY of exactly 8 octets is one
    with pytest.raises(h2.StreamError, match="HTTP/2 error 2"):
        h2.Reader(10).feed(settings() + frame(GOAWAY, 0, 0, struct.pack(">II", 1, 2)))
    with pytest.raises(h2.ProtocolError, match="a GOAWAY frame of 7 octets"):
        h2.Reader(10).feed(settings() + frame(GOAWAY, 0, 0, struct.pack(">II", 1, 2)[:7]))


def test_a_header_list_of_exactly_the_bound_is_taken():
    """A Huffman value decoding to exactly the room left is taken; the list's fields count 32 octets each too."""
    encoder = Encoder()
    # one field: name (5) + value + 32 = 16384
    block = encoder.encode([("x-big", "a" * (16384 - 5 - 32))])
    reader = h2.Reader(10)
    reader.feed(settings() + frame(HEADERS, END_HEADERS, 1, block))
    assert len(reader.headers["x-big"]) == 16384 - 37
    with pytest.raises(h2.ProtocolError, match="over the 16384 octets"):
        h2.Reader(10).feed(settings() + frame(HEADERS, END_HEADERS, 1,
                                              Encoder().encode([("x-big", "a" * (16384 - 5 - 31))])))
