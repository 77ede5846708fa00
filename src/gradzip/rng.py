"""Shared and local randomness, keyed by (run seed, rank, step, tensor index, chunk).

Two kinds of random numbers exist (spec 0.4):

* **Shared randomness** (DQSG/NDQSG dithers, randk indices): sender and every receiver must
  regenerate identical numbers. :func:`shared_uniform` derives them from a :class:`StreamKey`.
* **Local randomness** (stochastic rounding in QSGD, TernGrad, Hou, LPC, QESGD; row sampling in
  the Dryden codecs): only the sender needs it. :func:`local_uniform` derives it from the same
  key in a separate domain, so it never coincides with the shared stream.

Seed derivation (spec 0.4, [CHOICE]): ``sha256(f"{run_seed}:{rank}:{step}:{tensor_index}")``, first
8 bytes little-endian, masked to 63 bits; a non-zero ``chunk`` is appended as ``:{chunk}`` and local
randomness prefixes ``local:``. The derivation is stateless, so a dropped message cannot
desynchronise the streams and a checkpoint needs no RNG state.

Generation [CHOICE, differs from the spec's torch.Generator suggestion on purpose]: numbers come
from NumPy's SFC64 *bit generator* (seeded through ``SeedSequence(seed)``), whose raw 64-bit
stream NumPy guarantees to be stable across versions and platforms (``torch.Generator`` and
``numpy.random.Generator.random`` make no such promise). SFC64 replaced PCG64 for speed: its raw
stream is about twice as fast, and generation dominates the DQSG/NDQSG round trip. Each 64-bit
word gives two 32-bit words (low half first); each 32-bit word ``w`` becomes the float32
``(w >> 9) * 2**-23`` in ``[0, 1)`` by setting the exponent bits of 1.0 and subtracting 1, which
is exact. The numbers are made on the CPU, in NumPy-allocated memory (NumPy asks the kernel for
huge pages, so a fresh 64 MB buffer costs a few ms of page faults rather than ~45 ms), and moved
to the caller's device, so every device and every process sees the same stream. The global RNGs
of Python, NumPy and torch are never touched.

Hot paths that add the dither to something anyway can call :func:`shared_uniform_plus_one`,
which returns ``1 + shared_uniform(key, n)`` exactly and skips the subtraction pass.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from gradzip.keys import StreamKey

_ONE_BITS = np.uint32(0x3F800000)  # float32 bit pattern of 1.0
_MASK63 = 2**63 - 1


def derive_seed(key: StreamKey, *, domain: str = "shared") -> int:
    """The 63-bit seed of ``key``'s stream in ``domain`` (``"shared"`` or ``"local"``)."""
    text = f"{key.run_seed}:{key.rank}:{key.step}:{key.tensor_index}"
    if key.chunk:
        text += f":{key.chunk}"
    if domain == "local":
        text = "local:" + text
    elif domain != "shared":
        raise ValueError(f"unknown randomness domain {domain!r}; use 'shared' or 'local'")
    return seed_from_text(text)


def seed_from_text(text: str) -> int:
    """A 63-bit seed named by ``text``: the first 8 bytes of its SHA-256, little-endian, top
    bit cleared. Each user of seeds names its own domain in the text, so streams never
    coincide."""
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "little") & _MASK63


def text_generator(text: str) -> torch.Generator:
    """A fresh CPU ``torch.Generator`` seeded by :func:`seed_from_text` (global RNGs untouched)."""
    return torch.Generator().manual_seed(seed_from_text(text))


def _one_plus_uniform(seed: int, n: int) -> torch.Tensor:
    """``1 + u`` for ``n`` uniforms ``u`` of the stream ``seed``: float32 in ``[1, 2)``, exact."""
    if n < 0:
        raise ValueError(f"cannot draw a negative number ({n}) of uniforms")
    words = np.random.SFC64(seed).random_raw((n + 1) // 2)
    bits = words.view(np.uint32)[:n]
    np.right_shift(bits, 9, out=bits)
    np.bitwise_or(bits, _ONE_BITS, out=bits)
    return torch.from_numpy(bits.view(np.float32))  # exactly 1 + k * 2**-23


def _uniform_from_seed(seed: int, n: int) -> torch.Tensor:
    return _one_plus_uniform(seed, n).sub_(1.0)


def shared_uniform(
    key: StreamKey, n: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """``n`` float32 uniforms in ``[0, 1)`` that sender and receiver regenerate identically."""
    u = _uniform_from_seed(derive_seed(key, domain="shared"), n)
    return u if device is None else u.to(device)


def shared_uniform_plus_one(
    key: StreamKey, n: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Exactly ``1 + shared_uniform(key, n)`` (float32 in ``[1, 2)``), one pass cheaper.

    For hot paths that add the dither to a value anyway (DQSG, NDQSG): the caller folds the
    ``-1`` into its own constant. The result is a fresh tensor the caller may modify in place.
    """
    u = _one_plus_uniform(derive_seed(key, domain="shared"), n)
    return u if device is None else u.to(device)


def local_uniform_plus_one(
    key: StreamKey, n: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Exactly ``1 + local_uniform(key, n)``, one pass cheaper (see
    :func:`shared_uniform_plus_one`); a fresh tensor the caller may modify in place."""
    u = _one_plus_uniform(derive_seed(key, domain="local"), n)
    return u if device is None else u.to(device)


def local_uniform(key: StreamKey, n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``n`` float32 uniforms in ``[0, 1)`` for the sender's own stochastic rounding or sampling.

    Deterministic given the key (so encodes are reproducible), independent of the shared stream.
    """
    u = _uniform_from_seed(derive_seed(key, domain="local"), n)
    return u if device is None else u.to(device)


def local_generator(key: StreamKey) -> np.random.Generator:
    """A NumPy generator in the local domain, for draws other than uniforms (e.g. sampling)."""
    return np.random.Generator(np.random.PCG64(derive_seed(key, domain="local") ^ 0x5A5A))


def shared_words(key: StreamKey) -> np.random.SFC64:
    """The raw 64-bit word stream (``.random_raw(n)``) of ``key`` in the shared domain, for shared
    draws other than the dither (random indices). Raw SFC64 words are stable across NumPy
    versions and platforms; the stream is separated from the dither's by a different seed."""
    return np.random.SFC64(derive_seed(key, domain="shared") ^ 0x5EED_0F_1D1CE5)
