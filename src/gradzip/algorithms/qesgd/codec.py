"""The offset ``z`` of QESGD as real payloads: ``Q_{delta_t,b}`` of the whole flat vector, or
of its buckets with one ``delta`` each, through the registered ``qesgd`` compressor.

* One bucket (the paper's "whole vector", spec 2.4): the payload is
  ``qesgd(delta=delta_t, bits=b).encode(z_hat)``. ``delta_t`` is in the payload header as a
  codec parameter (not in the body: spec 2.1 says both sides compute it), so a receiver whose
  schedule disagrees gets a :class:`~gradzip.errors.PayloadMismatchError` naming both deltas
  instead of a wrong model.
* Buckets: coordinate ``i`` of bucket ``B`` is divided by ``delta_B`` and quantized on the unit
  grid, ``qesgd(delta=1, bits=b)``, then multiplied back by ``delta_B``. With one bucket and
  ``b <= 8`` this is bit for bit the single-delta path (the compressor itself divides in
  float32); for ``b > 8`` the quotient is rounded to float32 before the float64 rounding step,
  so the rounding probabilities carry float32's relative error (about ``2^-24 |k|``)
  [CHOICE]. A bucket with ``delta_B = 0`` quantizes to 0. The header's codec parameters also
  carry a digest of the deltas [CHOICE]: the first 64 bits of SHA-256 of the per-bucket deltas
  as little-endian float32, in 16 hex digits, so a receiver on another schedule (another ``c``,
  epoch or full-gradient norm) is told so by name here too. Sending the deltas themselves
  would cost ``32`` bits per bucket and step; the digest is a fixed 17 bytes (a length byte
  and the digits), and two different schedules share a digest with probability ``2^-64``.

Bits: ``b * d`` in the body (``b``-bit two's complement codes, packed; no scales: the deltas
are not sent) plus one payload header, about 30-40 bytes with one bucket and 17 bytes more with
buckets (the digest). ``paper_bits = b * d``.

Variance (spec 2.1): per coordinate inside the grid ``(a' - v)(v - a' + delta) <= delta^2/4``,
so ``E||Q(z_hat) - z_hat||^2 <= d delta^2 / 4`` when nothing is clipped; Lemma 1 bounds the
error against any point of the grid's hull.

References: QESGD paper eqs. (3)-(4), Algorithm 3 ("send z to all workers"); spec 2.1-2.3.
"""

from __future__ import annotations

import hashlib
import struct
import warnings

import torch

from gradzip.accounting import Encoded
from gradzip.algorithms.qesgd.schedule import bucket_count, check_bits
from gradzip.codecs.symbols import Packing, check_packing
from gradzip.compressors.base import ParamValue, encode_params
from gradzip.compressors.buckets import check_bucket_size, per_element
from gradzip.compressors.qesgd import QESGD
from gradzip.errors import KeyMismatchError, PayloadMismatchError
from gradzip.keys import StreamKey
from gradzip.payload import parse_payload

_DIGEST_DIGITS = 16  # hex digits of the deltas' digest: 64 bits


def deltas_digest(deltas: torch.Tensor) -> str:
    """The first 64 bits of SHA-256 of ``deltas`` as little-endian float32, in hex."""
    raw = deltas.detach().reshape(-1).to(torch.float32).cpu().numpy().astype("<f4").tobytes()
    return hashlib.sha256(raw).hexdigest()[:_DIGEST_DIGITS]


class _BucketGrid(QESGD):
    """``qesgd(delta=1)`` for the quotients ``z / delta_B``, with the deltas' digest as its last
    wire parameter (not registered: its payloads are ``qesgd`` payloads, which a plain
    ``qesgd`` decoder refuses because of that extra parameter)."""

    def __init__(self, bits: int, packing: Packing, digest: str) -> None:
        super().__init__(delta=1.0, bits=bits, packing=packing)
        self.digest = digest

    def wire_params(self) -> dict[str, ParamValue]:
        return {**super().wire_params(), "deltas": self.digest}


class OffsetCodec:
    """Encode and decode the flat float32 offset with per-bucket steps ``deltas`` (float32)."""

    def __init__(self, bits: int = 8, bucket_size: int = 0, packing: Packing = "fixed") -> None:
        self.bits = check_bits(bits)
        self.bucket_size = check_bucket_size(bucket_size)
        self.packing = check_packing(packing)
        self._cache: dict[float | str, QESGD] = {}

    def compressor(self, delta: float) -> QESGD:
        """The ``qesgd`` compressor of step ``delta`` (kept: ``delta`` changes once per epoch)."""
        comp = self._cache.get(delta)
        if comp is None:
            with warnings.catch_warnings():
                # delta == 0 was already reported once by the schedule
                warnings.simplefilter("ignore", UserWarning)
                comp = QESGD(delta=delta, bits=self.bits, packing=self.packing)
            self._cache = {delta: comp}  # one epoch at a time
        return comp

    def _grid(self, deltas: torch.Tensor) -> QESGD:
        """The compressor of a payload quantized with ``deltas``: ``delta_t`` itself (one
        bucket) or the unit grid carrying the deltas' digest (buckets)."""
        if deltas.numel() == 1:
            return self.compressor(float(deltas[0]))
        digest = deltas_digest(deltas)
        comp = self._cache.get(digest)
        if comp is None:
            comp = _BucketGrid(self.bits, self.packing, digest)
            self._cache = {digest: comp}
        return comp

    def _check(self, numel: int, deltas: torch.Tensor) -> None:
        expected = bucket_count(numel, self.bucket_size)
        if deltas.numel() != expected:
            raise ValueError(
                f"qesgd: {deltas.numel()} deltas for {expected} bucket(s) of a "
                f"{numel}-coordinate offset"
            )

    def _per_element(self, deltas: torch.Tensor, numel: int) -> torch.Tensor:
        return per_element(deltas.to(torch.float32), numel, self.bucket_size)

    def encode(self, z_hat: torch.Tensor, deltas: torch.Tensor, key: StreamKey) -> Encoded:
        """``Q_{delta,b}(z_hat)`` as a payload (raises on NaN/Inf in ``z_hat``)."""
        z_hat = z_hat.detach().reshape(-1).to(torch.float32)
        self._check(z_hat.numel(), deltas)
        grid = self._grid(deltas)
        if deltas.numel() == 1 or not bool(torch.isfinite(z_hat).all()):
            return grid.encode(z_hat, key)  # (raises NonFiniteInputError on NaN/Inf)
        step = self._per_element(deltas, z_hat.numel())
        scaled = torch.where(step > 0, z_hat / torch.where(step > 0, step, 1.0), 0.0)
        # a tiny delta may overflow the quotient; +-2^b clips exactly as the grid would
        limit = float(2**self.bits)
        return grid.encode(scaled.clamp_(-limit, limit), key)

    def clipped(self, z_hat: torch.Tensor, deltas: torch.Tensor) -> int:
        """How many coordinates of ``z_hat`` lie outside the grid's range ``[-2^(b-1) delta,
        (2^(b-1) - 1) delta]`` and are clipped (the method's only bias; a tuning signal for
        ``c``: a large share means the range ``|grad F(w_0)| / (c sqrt(t+1))`` is too small)."""
        z_hat = z_hat.detach().reshape(-1).to(torch.float32)
        self._check(z_hat.numel(), deltas)
        step = self._per_element(deltas, z_hat.numel())
        lo, hi = -(2.0 ** (self.bits - 1)) * step, (2.0 ** (self.bits - 1) - 1) * step
        return int(((z_hat < lo) | (z_hat > hi)).sum())

    def decode(
        self, payload: bytes | memoryview | torch.Tensor, deltas: torch.Tensor, key: StreamKey, numel: int
    ) -> torch.Tensor:
        """The offset ``delta_B * k`` (flat float32) from a payload of :meth:`encode`; a payload
        quantized with other deltas raises :class:`PayloadMismatchError` naming both."""
        self._check(numel, deltas)
        grid = self._grid(deltas)
        try:
            out = grid.decode(payload, expected_key=key, shape=(numel,), dtype=torch.float32)
        except KeyMismatchError:
            raise
        except PayloadMismatchError as err:
            host = payload.cpu().numpy().tobytes() if isinstance(payload, torch.Tensor) else payload
            theirs = _sender_schedule(parse_payload(host)[0].params, grid)
            if theirs is None:
                raise
            mine = grid.digest if isinstance(grid, _BucketGrid) else repr(grid.delta)
            raise PayloadMismatchError(
                f"qesgd: the offset payload was quantized on another delta schedule than this "
                f"receiver's: {theirs} != {mine} here (the ranks' c, epoch or full-gradient "
                "norm(s) differ)"
            ) from err
        if deltas.numel() == 1:
            return out
        return out.mul_(self._per_element(deltas, numel))


def _sender_schedule(params: bytes, grid: QESGD) -> str | None:
    """The sender's delta (one bucket) or deltas' digest (buckets), when its payload's codec
    parameters differ from ``grid``'s in that field only; else ``None``."""
    mine = encode_params(grid.wire_params())
    if len(params) != len(mine) or params == mine:
        return None
    if isinstance(grid, _BucketGrid):  # the digest is the last field, a fixed-size string
        n = _DIGEST_DIGITS
        same_rest = params[:-n] == mine[:-n]
        return f"deltas digest {params[-n:].decode('ascii', 'replace')}" if same_rest else None
    # one bucket: delta is the first field, a float64 (QESGD.wire_params)
    (delta,) = struct.unpack_from("<d", params)
    return f"delta {delta!r}" if params[8:] == mine[8:] else None
