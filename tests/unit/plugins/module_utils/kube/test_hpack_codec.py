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


def test_the_canonical_code_decodes_every_byte():
    encoded = hpack.huffman.HuffmanEncoder(hpack.huffman_constants.REQUEST_CODES,
                                           hpack.huffman_constants.REQUEST_CODES_LENGTH).encode(bytes(range(256)))
    assert huffman_decode(encoded) == bytes(range(256))


HEADER = st.tuples(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e), min_size=1, max_size=20)
                   .map(str.lower), st.text(max_size=40))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(HEADER, max_size=12), min_size=1, max_size=4), st.booleans(),
       st.sampled_from([4096, 256, 0]))
def test_blocks_the_hpack_package_encodes_decode_alike(blocks, huffman, table_size):
    encoder, oracle, ours = hpack.Encoder(), hpack.Decoder(), Decoder()
    encoder.header_table_size = table_size
    for block in blocks:
        data = encoder.encode(block, huffman=huffman)
        assert ours.decode(data) == oracle.decode(data, raw=True)


@given(st.lists(HEADER, max_size=12))
def test_what_the_client_encodes_the_hpack_package_reads(headers):
    assert hpack.Decoder().decode(encode(headers)) == headers


@pytest.mark.parametrize("block, says", [
    (b"\x80", "index 0"),
    (b"\xff\x00", "index 127, past the end of the tables"),
    (b"\x3f\xe2\x1f", "a table size update to 4097, over the 4096 allowed"),
    (b"\x10\x05ab", "ends inside a string"),
    (b"\x7f\x80\x80\x80\x80\x80\x80", "does not end"),
    (b"\x10\x81\x00\x00", "padding"),
])
def test_a_block_that_is_not_hpack_is_named(block, says):
    with pytest.raises(HpackError, match=says):
        Decoder().decode(block)
