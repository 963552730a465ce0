"""HPACK as the agent's gRPC client decodes and encodes it, against RFC 7541's own examples and against the
hpack package (a test dependency only) as an oracle."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.scv.gpu.plugins.module_utils.kube.hpack_codec import (
    Decoder,
    HpackError,
    encode,
    huffman_decode,
)


def test_the_rfcs_request_examples_with_huffman_coding_and_the_dynamic_table():
    """RFC 7541 C.4.1 and C.4.2: the second request reuses the entry the first added."""
    decoder = Decoder()
    first = bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff")
    assert decoder.decode(first) == [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"),
                                     (b":authority", b"www.example.com")]
    second = bytes.fromhex("828684be5886a8eb10649cbf")
    assert decoder.decode(second) == [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"),
                                      (b":authority", b"www.example.com"), (b"cache-control", b"no-cache")]
    assert decoder.size == 110


def test_a_byte_of_padding_after_a_whole_code_is_refused():
    from ansible_collections.scv.gpu.plugins.module_utils.kube.hpack_codec import _decoding

    (length, code), symbol = next((key, symbol) for key, symbol in _decoding().items() if key[0] == 8)
    assert huffman_decode(bytes((code,))) == bytes((symbol,))
    with pytest.raises(HpackError, match="padding"):
        huffman_decode(bytes((code, 0xFF)))             # eight bits of padding: one too many


def test_evictions_keep_the_table_within_its_size():
    def entry(name):                    # a literal added to the table: 1 + 7 + 32 = 40 bytes
        return b"\x40\x01" + name + b"\x07" + b"v" * 7

    decoder = Decoder(max_size=80)
    decoder.decode(entry(b"a") + entry(b"b") + entry(b"c"))      # a is evicted; b and c fill the 80 bytes
    assert decoder.size == 80 and decoder.decode(b"\xbe\xbf") == [(b"c", b"v" * 7), (b"b", b"v" * 7)]
    decoder.decode(b"\x40\x01e\x08" + b"w" * 8)                  # 41 bytes: b and c both go
    assert decoder.size == 41 and decoder.decode(b"\xbe") == [(b"e", b"w" * 8)]
    with pytest.raises(HpackError, match="index 63, past the end"):
        decoder.decode(b"\xbf")


def test_the_end_of_string_code_inside_a_string_is_refused():
    with pytest.raises(HpackError, match="holds the end-of-string code"):
        huffman_decode(b"\xff\xff\xff\xff")         # 30 ones are EOS, the code no string may hold


def test_the_canonical_code_decodes_every_byte():
    encoded = hpack.huffman.HuffmanEncoder(hpack.huffman_constants.REQUEST_CODES,
                                           hpack.huffman_constants.REQUEST_CODES_LENGTH).encode(bytes(range(256)))
    assert huffman_decode(encoded) == bytes(range(256))


HEADER = st.tuples(st.one_of(st.sampled_from(["content-type", ":status", "grpc-status", "www-authenticate"]),
                             st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e), min_size=1, max_size=20)
                             .map(str.lower)),
                   st.one_of(st.text(max_size=40), st.text(min_size=120, max_size=300)))


@settings(max_examples=300, deadline=None)
@given(st.lists(HEADER, min_size=1, max_size=6),
       st.lists(st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=10), min_size=1, max_size=6),
       st.booleans(), st.sampled_from([4096, 256, 128, 64, 0]))
def test_blocks_the_hpack_package_encodes_decode_alike(pool, blocks, huffman, table_size):
    """Headers drawn from a small pool, so the encoder refers back to its dynamic table as it fills and evicts;
    some sent never-indexed, as sensitive ones are."""
    encoder, oracle, ours = hpack.Encoder(), hpack.Decoder(), Decoder()
    encoder.header_table_size = table_size
    for block in blocks:
        headers = [(hpack.NeverIndexedHeaderTuple if sensitive else hpack.HeaderTuple)(*pool[pick % len(pool)])
                   for pick, sensitive in block]
        data = encoder.encode(headers, huffman=huffman)
        assert ours.decode(data) == oracle.decode(data, raw=True)


def test_entries_fill_the_table_to_its_size_and_no_further():
    """Section 4.1: an entry's size is its name's and value's lengths and 32; the table holds up to max_size."""
    fits = b"\x40\x02ab\x06cdefgh"            # 2 + 6 + 32 = 40 bytes: kept in a 40-byte table
    assert Decoder(max_size=40).decode(fits + b"\xbe") == [(b"ab", b"cdefgh")] * 2
    over = b"\x40\x02ab\x07cdefghi"           # 41 bytes: evicted at once
    with pytest.raises(HpackError, match="index 62, past the end"):
        Decoder(max_size=40).decode(over + b"\xbe")


def test_the_last_static_entry_integers_at_their_limit_and_a_size_update_to_the_limit():
    assert Decoder().decode(b"\xbd") == [(b"www-authenticate", b"")]
    decoder = Decoder()
    assert decoder.decode(b"\x3f\xe1\x1f") == [] and decoder.max_size == 4096
    five = b"\x10\x7f\x80\x80\x80\x80\x01"     # a name length of 127 + 2**28, in five continuation bytes
    with pytest.raises(HpackError, match="ends inside a string"):
        Decoder().decode(five + b"x")
    with pytest.raises(HpackError, match="does not end"):
        Decoder().decode(b"\x10\x7f\x80\x80\x80\x80\x80\x01x")


@given(st.lists(HEADER, max_size=12))
def test_what_the_client_encodes_the_hpack_package_reads(headers):
    assert hpack.Decoder().decode(encode(headers)) == headers


def test_long_names_and_values_take_several_length_bytes():
    headers = [("x-" + "n" * 200, "v" * 20000), ("n" * 127, "v" * 254), ("m" * 255, "w" * 128)]
    decoder = hpack.Decoder()
    decoder.max_header_list_size = 1 << 20
    assert decoder.decode(encode(headers)) == headers


@pytest.mark.parametrize("block, says", [
    (b"\x80", "index 0"),
    (b"\xff\x00", "index 127, past the end of the tables"),
    (b"\x3f\xe2\x1f", "a table size update to 4097, over the 4096 allowed"),
    (b"\x10\x05ab", "ends inside a string"),
    (b"\x7f\x80\x80\x80\x80\x80\x80", "does not end"),
    (b"\x10\x81\x00\x00", "padding"),
    (b"\x01", "ends before a string"),
    (b"\x10\x7f\x80", "does not end"),
    (b"\x10\x82\x1f\xff", "padding"),                    # 'a' (00011) and 11 bits of padding
])
def test_a_block_that_is_not_hpack_is_named(block, says):
    with pytest.raises(HpackError, match=says):
        Decoder().decode(block)
