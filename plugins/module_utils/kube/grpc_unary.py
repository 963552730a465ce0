# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One unary gRPC call over HTTP/2 on a unix socket, framed by hand (private to the collection).

The agent asks the kubelet one question every few seconds, and the answer of a busy node is hundreds
of kilobytes. A general HTTP/2 library turns each 16 KiB DATA frame into objects and events; here a
frame is a 9-byte header read with ``struct`` and a slice of the buffer, which keeps a large answer's
cost to its transfer. Header blocks go through ``hpack_codec`` (RFC 7541). The client opens
one flow-control window for the whole answer, so the server never waits for a window update; it
answers the server's SETTINGS and PING as RFC 9113 requires and ignores what it need not act on.
"""

from __future__ import annotations

import functools
import socket
import struct
import time

from ansible_collections.scv.gpu.plugins.module_utils.kube import hpack_codec

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, CONTINUATION = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x9
WINDOW_UPDATE = 0x8
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
ENABLE_PUSH, INITIAL_WINDOW_SIZE, MAX_HEADER_LIST_SIZE = 0x2, 0x4, 0x6
# RFC 9113 section 10.5.1: what a client must bound, and advertises. A gRPC answer's headers and trailers are a few
# hundred octets; these leave room for any server's and stop a flood within the first frames.
MAX_HEADER_LIST = 16384       # octets of a decoded header list (names, values, 32 each), as SETTINGS says
MAX_HEADER_BLOCK = 65536      # octets of one encoded header block, HEADERS and its CONTINUATIONs together
MAX_CONTINUATIONS = 32        # CONTINUATION frames in one header block
DEFAULT_WINDOW = 65535
MAX_FRAME = 16384            # the largest frame a client takes unless it says otherwise (it does not)
STREAM = 1
_HEADER = struct.Struct(">I B I")    # length (24 bits) and type share the first word; flags; stream


class ProtocolError(Exception):
    """The peer broke HTTP/2, or is not speaking it; the message says how."""


class AnswerTooLarge(ProtocolError):
    """The answer grew past the size the caller takes."""


class StreamError(Exception):
    """The peer reset the call (``code``) or ended the connection (``code``, ``goaway`` true)."""

    def __init__(self, code, goaway=False):
        super().__init__("HTTP/2 error %d" % code)
        self.code, self.goaway = code, goaway


def frame(kind, flags, stream, payload=b""):
    """One HTTP/2 frame."""
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def _unpadded(flags, payload):
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolError("a padded frame whose padding is longer than the frame")
    return payload[1:len(payload) - payload[0]]


@functools.lru_cache(maxsize=8)
def request(authority, path, message, timeout, window):
    """The bytes a client sends for one unary call: preface, SETTINGS, the window, HEADERS and DATA (the same
    call asked again is the same bytes, encoded once)."""
    block = hpack_codec.encode([
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", authority),
        ("content-type", "application/grpc"), ("te", "trailers"),
        ("grpc-timeout", "%dm" % max(1, int(timeout * 1000))),
    ])
    settings = (struct.pack(">HI", ENABLE_PUSH, 0) + struct.pack(">HI", INITIAL_WINDOW_SIZE, window)
                + struct.pack(">HI", MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST))
    return (PREFACE + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", window - DEFAULT_WINDOW))
            + frame(HEADERS, END_HEADERS, STREAM, block)
            + frame(DATA, END_STREAM, STREAM, struct.pack(">BI", 0, len(message)) + message))


class Reader:
    """The answer to stream 1, fed the bytes as they come: ``headers`` (headers and trailers as one dict),
    ``body``, ``ended``; ``replies`` holds what must be sent back (SETTINGS and PING acknowledgements)."""

    def __init__(self, max_body):
        self.decoder, self.max_body = hpack_codec.Decoder(max_header_list=MAX_HEADER_LIST), max_body
        self.buffer, self.body, self.headers, self.block = bytearray(), bytearray(), {}, bytearray()
        self.replies, self.ended, self.frames, self._ending = [], False, 0, False
        self.continuations = 0

    def feed(self, data):
        self.buffer += data
        view, pos = memoryview(self.buffer), 0
        try:
            while len(view) - pos >= 9 and not self.ended:
                word, flags, stream = _HEADER.unpack_from(view, pos)
                length, kind, stream = word >> 8, word & 0xFF, stream & 0x7FFFFFFF
                if length > MAX_FRAME:
                    raise ProtocolError("a frame of %d bytes, over the %d this client takes" % (length, MAX_FRAME))
                if len(view) - pos < 9 + length:
                    break
                self._frame(kind, flags, stream, view[pos + 9:pos + 9 + length])
                pos += 9 + length
        finally:
            view.release()
        del self.buffer[:pos]

    def _frame(self, kind, flags, stream, payload):
        self.frames += 1
        if self.frames == 1 and kind != SETTINGS:
            raise ProtocolError("its first frame is not SETTINGS (type %d)" % kind)
        if kind == DATA and stream == STREAM:
            self.body += _unpadded(flags, payload)
            if len(self.body) > self.max_body:
                raise AnswerTooLarge("an answer over %d bytes" % self.max_body)
            self.ended = bool(flags & END_STREAM)
        elif kind in (HEADERS, CONTINUATION) and stream == STREAM:
            if kind == HEADERS:
                payload = _unpadded(flags, payload)
                self.block += payload[5:] if flags & PRIORITY else payload
                self._ending = bool(flags & END_STREAM)    # the stream ends once its header block does
                self.continuations = 0
            else:
                self.continuations += 1
                if self.continuations > MAX_CONTINUATIONS:
                    raise ProtocolError("a header block in more than %d CONTINUATION frames" % MAX_CONTINUATIONS)
                self.block += payload
            if len(self.block) > MAX_HEADER_BLOCK:
                raise ProtocolError("a header block over the %d octets this client takes" % MAX_HEADER_BLOCK)
            if flags & END_HEADERS:
                try:
                    decoded = self.decoder.decode(bytes(self.block))
                except hpack_codec.HpackError as error:
                    raise ProtocolError(str(error)) from None
                self.headers.update((str(name, "utf-8", "replace"), str(value, "utf-8", "replace"))
                                    for name, value in decoded)
                self.block = bytearray()
                self.ended = self._ending
        elif kind == SETTINGS and not flags & ACK:
            self.replies.append(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self.replies.append(frame(PING, ACK, 0, bytes(payload)))
        elif kind == RST_STREAM and stream == STREAM:
            if len(payload) != 4:
                raise ProtocolError("an RST_STREAM frame of %d octets, not 4" % len(payload))
            raise StreamError(struct.unpack(">I", bytes(payload))[0])
        elif kind == GOAWAY:
            if len(payload) < 8:
                raise ProtocolError("a GOAWAY frame of %d octets, fewer than 8" % len(payload))
            raise StreamError(struct.unpack(">I", bytes(payload[4:8]))[0], goaway=True)


def exchange(sock, message_bytes, reader, deadline):
    """Sends the request and reads until the stream ends; raises socket.timeout past ``deadline``,
    ProtocolError naming the first bytes when the peer closes having sent no whole frame (it speaks
    something else), and ConnectionAbortedError when it closes after that, before the stream ends."""
    sock.sendall(message_bytes)
    while not reader.ended:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout()
        sock.settimeout(left)
        chunk = sock.recv(1 << 18)
        if not chunk:
            if not reader.frames and reader.buffer:
                raise ProtocolError("it answered %r" % bytes(reader.buffer[:40]))
            raise ConnectionAbortedError()
        reader.feed(chunk)
        if reader.replies:
            sock.sendall(b"".join(reader.replies))
            reader.replies = []
