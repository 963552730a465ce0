# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""HPACK (RFC 7541), the part a gRPC client needs: decoding the header blocks a server sends, and
encoding a request's few headers as literals (private to the collection).

Decoding follows the RFC whole: the static table, the dynamic table with its size updates and
evictions, integers with their prefixes, and Huffman-coded strings. The Huffman code is canonical,
so the code lengths of Appendix B give every code; a decoding table is built from them once. A
general HPACK package would cost the agent about a megabyte of tables for a handful of headers.
"""

from __future__ import annotations

STATIC = (
    (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"), (":path", "/index.html"),
    (":scheme", "http"), (":scheme", "https"), (":status", "200"), (":status", "204"), (":status", "206"),
    (":status", "304"), (":status", "400"), (":status", "404"), (":status", "500"), ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""), ("accept", ""),
    ("access-control-allow-origin", ""), ("age", ""), ("allow", ""), ("authorization", ""), ("cache-control", ""),
    ("content-disposition", ""), ("content-encoding", ""), ("content-language", ""), ("content-length", ""),
    ("content-location", ""), ("content-range", ""), ("content-type", ""), ("cookie", ""), ("date", ""),
    ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""), ("if-match", ""),
    ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""), ("if-unmodified-since", ""),
    ("last-modified", ""), ("link", ""), ("location", ""), ("max-forwards", ""), ("proxy-authenticate", ""),
    ("proxy-authorization", ""), ("range", ""), ("referer", ""), ("refresh", ""), ("retry-after", ""),
    ("server", ""), ("set-cookie", ""), ("strict-transport-security", ""), ("transfer-encoding", ""),
    ("user-agent", ""), ("vary", ""), ("via", ""), ("www-authenticate", ""),
)
# Appendix B: the length in bits of the code of each symbol, 0 to 255, then EOS (256).
CODE_LENGTHS = bytes.fromhex(
    "0d171c1c1c1c1c1c1c181e1c1c1e1c1c1c1c1c1c1c1c1e1c1c1c1c1c1c1c1c1c060a0a0c0d06080b0a0a080b08060606"
    "0505050606060606060607080f060c0a0d06070707070707070707070707070707070707070707070807080d130d0e06"
    "0f05060506050606060507070606060506070605050607070707070f0b0e0d1c14161414161616171617171717171817"
    "181816171817171717151617161717181615141616171715171616181516171715151615171617171416161617161617"
    "1a1a1413161716191a1a1a1b1b1a181913151a1b1b1a1b1815151a1a1c1b1b1b14181415161515171616191918181a17"
    "1a1b1a1a1b1b1b1b1b1c1b1b1b1b1b1a1e")
EOS = 256
DEFAULT_TABLE_SIZE = 4096
_DECODING = {}


class HpackError(ValueError):
    """A header block that is not HPACK; the message says where it broke."""


def _decoding():
    """{(code length, code): symbol}, the canonical code of CODE_LENGTHS (built at the first use)."""
    if not _DECODING:
        code, previous = 0, None
        for symbol in sorted(range(len(CODE_LENGTHS)), key=lambda symbol: (CODE_LENGTHS[symbol], symbol)):
            length = CODE_LENGTHS[symbol]
            if previous is not None:      # the next code of this length, widened to it (section 5.2's canonical code)
                code = (code + 1) << (length - previous)
            previous = length
            _DECODING[(length, code)] = symbol
    return _DECODING


def huffman_decode(data, limit=None):
    """The bytes Huffman-coded in ``data``: the padding must be fewer than 8 bits, all ones (section 5.2).
    Raises HpackError once the decoded bytes would pass ``limit`` (section 7.3: a decoder bounds what a string
    may expand to), before decoding the rest."""
    table, out, code, length = _decoding(), bytearray(), 0, 0
    for byte in data:
        for shift in range(7, -1, -1):
            code, length = (code << 1) | (byte >> shift) & 1, length + 1
            symbol = table.get((length, code))
            if symbol is not None:
                if symbol == EOS:
                    raise HpackError("a Huffman string holds the end-of-string code")
                out.append(symbol)
                code, length = 0, 0
                if limit is not None and len(out) > limit:
                    raise HpackError("a Huffman string that decodes past the %d octets a header list may hold"
                                     % limit)
    # The code is complete: every 30 bits hold a symbol, so what is left is shorter and padding only.
    if length > 7 or code != (1 << length) - 1:
        raise HpackError("a Huffman string ends with padding that is not a prefix of the end-of-string code")
    return bytes(out)


def _integer(data, pos, prefix):
    """(value, position after it) of an integer with a ``prefix``-bit prefix at ``data[pos]`` (section 5.1);
    the callers see that ``data[pos]`` is there."""
    mask = (1 << prefix) - 1
    value = data[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        if pos >= len(data) or shift > 28:
            raise HpackError("a header block holds an integer that does not end")
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _string(data, pos, limit=None):
    """(bytes, position after them) of a string literal (section 5.2); ``limit`` bounds its decoded length."""
    if pos >= len(data):
        raise HpackError("a header block ends before a string")
    huffman = data[pos] & 0x80
    length, pos = _integer(data, pos, 7)
    if pos + length > len(data):
        raise HpackError("a header block ends inside a string")
    raw = bytes(data[pos:pos + length])
    return (huffman_decode(raw, limit) if huffman else raw), pos + length


class Decoder:
    """Decodes the header blocks of one connection, in order: the dynamic table lives from block to block."""

    def __init__(self, max_size=DEFAULT_TABLE_SIZE, max_header_list=None):
        self.dynamic, self.size, self.max_size, self.limit = [], 0, max_size, max_size
        # RFC 9113 section 6.5.2 and 10.5.1: the header list size the client takes (each field's name and value
        # plus 32 octets), enforced while decoding, so a block of one-byte indexed fields cannot expand unbounded
        self.max_header_list = max_header_list

    def _entry(self, index):
        if index == 0:
            raise HpackError("a header block names index 0")
        if index <= len(STATIC):
            name, value = STATIC[index - 1]
            return name.encode(), value.encode()
        if index - len(STATIC) > len(self.dynamic):
            raise HpackError("a header block names index %d, past the end of the tables" % index)
        return self.dynamic[index - len(STATIC) - 1]

    def _add(self, name, value):
        self.dynamic.insert(0, (name, value))
        self.size += len(name) + len(value) + 32
        self._evict()

    def _evict(self):
        while self.size > self.max_size and self.dynamic:
            name, value = self.dynamic.pop()
            self.size -= len(name) + len(value) + 32

    def decode(self, block):
        """[(name, value)] of a whole header block, as bytes; HpackError once the list passes max_header_list."""
        headers, pos, listed, bound = [], 0, 0, self.max_header_list

        def counted(field):
            nonlocal listed
            listed += len(field[0]) + len(field[1]) + 32
            if bound is not None and listed > bound:
                raise HpackError("a header list over the %d octets this client takes" % bound)
            return field

        while pos < len(block):
            first = block[pos]
            if first & 0x80:                                   # indexed
                index, pos = _integer(block, pos, 7)
                headers.append(counted(self._entry(index)))
                continue
            if first & 0xE0 == 0x20:                           # dynamic table size update
                size, pos = _integer(block, pos, 5)
                if size > self.limit:
                    raise HpackError("a table size update to %d, over the %d allowed" % (size, self.limit))
                self.max_size = size
                self._evict()
                continue
            indexing = bool(first & 0x40)
            index, pos = _integer(block, pos, 6 if indexing else 4)
            name = self._entry(index)[0] if index else None
            room = None if bound is None else bound - listed
            if name is None:
                name, pos = _string(block, pos, room)
            value, pos = _string(block, pos, room)
            if indexing:
                self._add(name, value)
            headers.append(counted((name, value)))
        return headers


def _literal_integer(value, prefix, first):
    mask = (1 << prefix) - 1
    if value < mask:
        return bytes((first | value,))
    out, value = bytearray((first | mask,)), value - mask
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode(headers):
    """A header block of ``headers`` ([(name, value)] as text), each a literal never indexed, with a literal
    name and no Huffman code: what any decoder takes, and nothing to keep in step with it."""
    out = bytearray()
    for name, value in headers:
        out.append(0x10)
        for text in (name, value):
            data = text.encode("utf-8")
            out += _literal_integer(len(data), 7, 0) + data
    return bytes(out)
