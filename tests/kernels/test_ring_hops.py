"""The fused hop kernels of the pipelined ring give the unfused formulation's bytes and sums:
``pack_ints(requantize(sums))`` (or ``pack_ints(int32(sums))`` for an exact sum) on the way out,
``add_scaled(acc, unpack_ints(message), unit)`` on the way in, and refuse every corrupt
message with the error ``unpack_ints`` raises."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradzip.errors import (
    ChecksumMismatchError,
    CorruptPayloadError,
    KeyMismatchError,
    PayloadMismatchError,
    TruncatedPayloadError,
)
from gradzip.kernels.grid_sums import add_scaled, requantize
from gradzip.kernels.ring_hops import (
    TILE,
    add_packed,
    add_packed_ints,
    encode_packed,
    pack_int_sums,
)
from gradzip.keys import StreamKey
from gradzip.payload import Header, build_payload
from gradzip.rng import derive_seed
from gradzip.schemes._messages import INT_CODEC, frame_ints, open_ints, pack_ints, unpack_ints
from gradzip.schemes._pipelined_ring import HopCode

KEY = StreamKey(7, 1, 2, 3, 4)
#: lengths around the tile and the 8-symbol groups: none, short, not a multiple of 8, several
#: tiles with a ragged end
LENGTHS = [0, 1, 13, 8 * 37, TILE + 5, 2 * TILE + 8 * 3 + 7]


def reference_message(code: HopCode, sums: torch.Tensor) -> tuple[bytes, torch.Tensor]:
    """The unfused encode: the integers, then ``pack_ints``; and what a receiver decodes."""
    levels = (1 << code.bits) - 1
    if code.exact:
        q = sums.to(torch.int32)
    else:
        factor = levels / (code.ranks * code.top)
        q = requantize(sums, factor, derive_seed(KEY, domain="local"), levels)
    decoded = torch.empty_like(sums)
    add_scaled(decoded, q, 1.0 if code.exact else code.unit, replace=True)
    return pack_ints(q, code.bits, KEY), decoded


def hop_sums(code: HopCode, n: int, seed: int) -> torch.Tensor:
    """Partial sums of ``code.ranks`` codes in ``[0, top]``: integers (exact or not), and
    for a re-quantized hop also fractional sums (a re-quantized message decodes to those)."""
    gen = torch.Generator().manual_seed(seed)
    if code.exact or seed % 2:
        return torch.randint(0, code.ranks * code.top + 1, (n,), generator=gen).float()
    return torch.rand(n, generator=gen) * (code.ranks * code.top)


def codes(bits: int) -> list[HopCode]:
    """One exact hop (one rank's codes at their own width) and two re-quantized ones."""
    top = (1 << bits) - 1
    return [HopCode(top, bits, 1), HopCode(top, bits, 2), HopCode(max(1, top // 3), bits, 5)]


@pytest.mark.parametrize("bits", range(1, 25))
def test_fused_encode_gives_the_unfused_bytes_and_kept_values(bits: int) -> None:
    for index, code in enumerate(codes(bits)):
        for n in LENGTHS:
            sums = hop_sums(code, n, seed=100 * bits + 10 * index + n % 7)
            expected, decoded = reference_message(code, sums)
            assert bytes(code.encode(sums, KEY)) == expected, (code, n)
            kept = sums.clone()
            assert bytes(code.encode_kept(kept, KEY)) == expected, (code, n)
            assert torch.equal(kept, decoded), (code, n)


@pytest.mark.parametrize("bits", range(1, 25))
@pytest.mark.parametrize("replace", [False, True])
def test_fused_add_gives_the_unfused_sums(bits: int, replace: bool) -> None:
    for index, code in enumerate(codes(bits)):
        for n in LENGTHS:
            sums = hop_sums(code, n, seed=100 * bits + 10 * index + n % 5)
            message, _ = reference_message(code, sums)
            acc = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 1000
            expected = acc.clone()
            unit = 1.0 if code.exact else code.unit
            add_scaled(expected, unpack_ints(message, n, bits, KEY), unit, replace)
            code.add_into(acc, message, KEY, replace)
            assert torch.equal(acc, expected), (code, n)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 24, 31])
@pytest.mark.parametrize("replace", [False, True])
def test_integer_add_gives_the_unpacked_sums(bits: int, replace: bool) -> None:
    """The integer all-reduce's hop: ``acc += unpack_ints(message)`` (or ``acc = ...``) on
    int32 sums, at widths with their own vectorized layouts and up to int32's 31 bits."""
    for n in LENGTHS:
        gen = torch.Generator().manual_seed(bits * 1000 + n)
        q = torch.randint(0, 1 << bits, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
        message = pack_ints(q, bits, KEY)
        acc = torch.randint(0, 1 << 20, (n,), generator=gen, dtype=torch.int32)
        expected = unpack_ints(message, n, bits, KEY) + (0 if replace else acc)
        add_packed_ints(acc, open_ints(message, n, bits, KEY), bits, replace)
        assert torch.equal(acc, expected.to(torch.int32)), n


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 24, 31])
def test_integer_pack_gives_the_pack_ints_message(bits: int) -> None:
    """The integer all-reduce's message body packed by the kernel into a dirty buffer equals
    ``pack_ints``' (every byte written, padding bits zero)."""
    for n in LENGTHS:
        gen = torch.Generator().manual_seed(bits * 7 + n)
        q = torch.randint(0, 1 << bits, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
        message = frame_ints(n, bits, KEY, lambda out, q=q: pack_int_sums(q, bits, out))
        assert bytes(message) == pack_ints(q, bits, KEY), n
        dirty = np.full((n * bits + 7) // 8, 0xFF, dtype=np.uint8)
        pack_int_sums(q, bits, dirty)
        assert dirty.tobytes() == bytes(open_ints(pack_ints(q, bits, KEY), n, bits, KEY)), n


@pytest.mark.parametrize("bits", [1, 2, 3, 5, 8, 13])
def test_integer_pack_discards_bits_above_the_width(bits: int) -> None:
    """An out-of-range sum (a peer's message of the right width but values beyond the sum's
    range) cannot spill into its neighbours' bits: it is packed as its low ``bits`` bits."""
    n = 8 * 11 + 3
    q = torch.randint(0, 1 << 20, (n,), generator=torch.Generator().manual_seed(bits))
    q = q.to(torch.int32)
    message = frame_ints(n, bits, KEY, lambda out: pack_int_sums(q, bits, out))
    assert bytes(message) == pack_ints(q & ((1 << bits) - 1), bits, KEY)


def test_integer_add_refuses_what_it_cannot_hold() -> None:
    body = np.zeros(4, dtype=np.uint8)
    with pytest.raises(ValueError, match="int32"):
        add_packed_ints(torch.zeros(10), body, 3, False)
    with pytest.raises(ValueError, match="31 bits"):
        add_packed_ints(torch.zeros(1, dtype=torch.int32), body, 32, False)
    with pytest.raises(ValueError, match="body bytes"):
        add_packed_ints(torch.zeros(10, dtype=torch.int32), np.zeros(5, dtype=np.uint8), 3, False)
    with pytest.raises(ValueError, match="output bytes"):
        pack_int_sums(torch.zeros(10, dtype=torch.int32), 3, np.zeros(5, dtype=np.uint8))
    with pytest.raises(ValueError, match="int32"):
        pack_int_sums(torch.zeros(10, dtype=torch.int64), 3, np.zeros(4, dtype=np.uint8))


def test_encode_overwrites_every_byte_of_a_dirty_output() -> None:
    """The payload buffer is recycled (arbitrary contents): every body byte, padding bits
    included, is written."""
    for bits in (3, 7, 13):
        code = HopCode((1 << bits) - 1, bits, 2)
        sums = hop_sums(code, 8 * 5 + 3, seed=bits)
        out = np.full((len(sums) * bits + 7) // 8, 0xFF, dtype=np.uint8)
        factor = ((1 << bits) - 1) / (2 * code.top)
        seed = derive_seed(KEY, domain="local")
        encode_packed(sums, bits, out, exact=False, factor=factor, seed=seed)
        expected, _ = reference_message(code, sums)
        assert out.tobytes() == expected[-4 - len(out) : -4]  # the body, before the CRC


def corrupted(message: bytes, bits: int, n: int) -> dict[str, tuple[bytes, int, type]]:
    """Hostile variants of a message of ``n`` integers at ``bits``: (bytes, bits expected by
    the receiver, the error ``unpack_ints`` raises)."""
    flipped = bytearray(message)
    flipped[len(flipped) // 2] ^= 0x10
    other_key = StreamKey(7, 1, 2, 3, 5)
    body = (n * bits + 7) // 8

    def framed(body_bytes: bytes, key: StreamKey = KEY, count: int = n, width: int = bits) -> bytes:
        header = Header(INT_CODEC, torch.float32, (count,), width, key, b"")
        return build_payload(header, [body_bytes])

    padding = bytearray(body)
    padding[-1] = 0xFF
    return {
        "checksum": (bytes(flipped), bits, ChecksumMismatchError),
        "truncated": (message[:-3], bits, TruncatedPayloadError),
        "key": (framed(bytes(body), key=other_key), bits, KeyMismatchError),
        "shape": (framed(bytes(body), count=n + 1), bits, PayloadMismatchError),
        "width": (message, bits + 1, PayloadMismatchError),
        "short body": (framed(bytes(body - 1)), bits, TruncatedPayloadError),
        "long body": (framed(bytes(body + 1)), bits, CorruptPayloadError),
        "padding": (framed(bytes(padding)), bits, CorruptPayloadError),
        "kind": (
            build_payload(Header(INT_CODEC + 1, torch.float32, (n,), 0, KEY, b""), [bytes(4 * n)]),
            bits,
            PayloadMismatchError,
        ),
    }


@pytest.mark.parametrize("bits", [3, 12])
def test_a_corrupt_message_raises_what_unpack_ints_raises_and_leaves_the_sums(bits: int) -> None:
    n = 8 * 9 + 5  # n * bits not a multiple of 8 for both widths: the padding is checked
    code = HopCode((1 << bits) - 1, bits, 2)
    message, _ = reference_message(code, hop_sums(code, n, seed=bits))
    for name, (bad, width, error) in corrupted(message, bits, n).items():
        with pytest.raises(error):
            unpack_ints(bad, n, width, KEY)
        acc = torch.arange(n, dtype=torch.float32)
        with pytest.raises(error):
            HopCode(code.top, width, 2).add_into(acc, bad, KEY, replace=False)
        assert torch.equal(acc, torch.arange(n, dtype=torch.float32)), name


def test_the_kernels_refuse_mismatched_buffers_by_name() -> None:
    sums = torch.zeros(10)
    with pytest.raises(ValueError, match="output bytes"):
        encode_packed(sums, 3, np.zeros(3, dtype=np.uint8), exact=True)
    with pytest.raises(ValueError, match="24 bits"):
        encode_packed(sums, 25, np.zeros(32, dtype=np.uint8), exact=True)
    with pytest.raises(ValueError, match="float32"):
        encode_packed(sums.double(), 3, np.zeros(4, dtype=np.uint8), exact=True)
    with pytest.raises(ValueError, match="body bytes"):
        add_packed(sums, np.zeros(5, dtype=np.uint8), 3, 1.0, False)


def test_frame_ints_writes_the_pack_ints_message() -> None:
    q = torch.randint(0, 32, (77,), generator=torch.Generator().manual_seed(0))

    def write(out: np.ndarray) -> None:
        out[:] = np.frombuffer(pack_ints(q, 5, KEY)[-4 - len(out) : -4], dtype=np.uint8)

    assert bytes(frame_ints(77, 5, KEY, write)) == pack_ints(q, 5, KEY)
