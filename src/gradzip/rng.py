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

Generation [CHOICE; spec 0.4 records why a torch.Generator is not used]: numbers come
from Philox4x32-10 (Salmon et al., SC 2011; cuRAND's and PyTorch's CUDA generator), a
counter-based generator: element ``i`` of a stream is computed from ``(seed, domain, i)`` alone,
so it vectorizes, splits across threads without changing a bit, and runs on any device. The
exact layout (key = the seed's 32-bit halves, counter = block index ``j // 4`` and the domain,
word ``j`` = word ``j % 4`` of its block) is in :mod:`gradzip.kernels.philox`. CPU streams come
from numba kernels (:mod:`gradzip.kernels.philox`), other devices use torch operations
(:mod:`gradzip.kernels.philox_torch`) that give the same bits, so every device and every process
sees the same stream. Domains (the counter word ``c2``): shared uniforms 0, local uniforms 1,
shared index words 2; local streams also have their own seed (``local:`` prefix). The global
RNGs of Python, NumPy and torch are never touched.

Uniforms [CHOICE]: each 32-bit word gives TWO uniforms, one per 16-bit half ``h`` (low half
first: uniform ``i`` is half ``i % 2`` of word ``i // 2``), each the midpoint ``u = (h + 1/2) *
2**-16`` of one of ``2**16`` equal cells of ``(0, 1)``, made exactly as the float32 with bit
pattern ``0x3F800000 | (h << 7) | 0x40`` (that is ``1 + u``) minus 1. ``u`` is never 0 or 1,
is symmetric about 1/2 and has mean exactly 1/2. Why: it halves the Philox work per uniform,
which was about half of a dithered codec's encode and decode time. Consequence: a subtractive
dither or a stochastic rounding driven by such a ``u`` is biased by at most ``2**-17`` of a
quantization step (``P(round up) = p`` within ``2**-17``), four orders of magnitude below the
quantization noise's standard deviation ``step / sqrt(12)``. Raw words (:func:`shared_words`)
keep all 32 bits. Payloads made with the earlier one-uniform-per-word streams (wire-format
version 2) are refused by version number.

Hot paths that add the dither to something anyway can call :func:`shared_uniform_plus_one`,
which returns ``1 + shared_uniform(key, n)`` exactly and skips the subtraction pass.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import numpy as np
import torch

from gradzip.choices import check_choice, choices_of
from gradzip.kernels.philox import (
    LOCAL_UNIFORM,
    SHARED_UNIFORM,
    SHARED_WORDS,
    philox_one_plus_uniform,
    philox_words,
)
from gradzip.kernels.philox_torch import philox_one_plus_uniform_torch
from gradzip.keys import StreamKey

_MASK63 = 2**63 - 1
#: which stream a seed is for: the one every rank draws alike (shared dithers), or a rank's own
Domain = Literal["shared", "local"]
_DOMAINS: tuple[Domain, ...] = choices_of(Domain)


def derive_seed(key: StreamKey, *, domain: Domain = "shared") -> int:
    """The 63-bit seed of ``key``'s stream in ``domain`` (``"shared"`` or ``"local"``)."""
    text = f"{key.run_seed}:{key.rank}:{key.step}:{key.tensor_index}"
    if key.chunk:
        text += f":{key.chunk}"
    if check_choice("domain", domain, _DOMAINS) == "local":
        text = "local:" + text
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


def _one_plus_uniform(
    seed: int, stream: int, n: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """``1 + u`` for ``n`` uniforms ``u`` of the stream ``(seed, stream)``: float32 in
    ``(1, 2)``, exact; made where ``device`` says (CPU by default), same bits everywhere."""
    if n < 0:
        raise ValueError(f"cannot draw a negative number ({n}) of uniforms")
    if device is not None and torch.device(device).type != "cpu":
        return philox_one_plus_uniform_torch(seed, stream, 0, n, device)
    return torch.from_numpy(philox_one_plus_uniform(seed, stream, 0, n))


def shared_uniform(
    key: StreamKey, n: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """``n`` float32 uniforms in ``(0, 1)`` that sender and receiver regenerate identically."""
    return shared_uniform_from_seed(derive_seed(key, domain="shared"), n, device)


def shared_uniform_from_seed(
    seed: int, n: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """``n`` shared uniforms of the stream whose seed is ``seed`` (a seed schedule's, see
    :mod:`gradzip.seed_schedule`); ``shared_uniform(key, n)`` is this with the keyed seed."""
    return _one_plus_uniform(seed, SHARED_UNIFORM, n, device).sub_(1.0)


def shared_uniform_plus_one(
    key: StreamKey, n: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Exactly ``1 + shared_uniform(key, n)`` (float32 in ``(1, 2)``), one pass cheaper.

    For hot paths that add the dither to a value anyway (DQSG, NDQSG): the caller folds the
    ``-1`` into its own constant. The result is a fresh tensor the caller may modify in place.
    """
    return shared_uniform_plus_one_from_seed(derive_seed(key, domain="shared"), n, device)


def shared_uniform_plus_one_from_seed(
    seed: int, n: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Exactly ``1 + shared_uniform_from_seed(seed, n)``: :func:`shared_uniform_plus_one` for a
    seed schedule's seed; a fresh tensor the caller may modify in place."""
    return _one_plus_uniform(seed, SHARED_UNIFORM, n, device)


def local_uniform_plus_one(
    key: StreamKey, n: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Exactly ``1 + local_uniform(key, n)``, one pass cheaper (see
    :func:`shared_uniform_plus_one`); a fresh tensor the caller may modify in place."""
    return _one_plus_uniform(derive_seed(key, domain="local"), LOCAL_UNIFORM, n, device)


def local_uniform(key: StreamKey, n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``n`` float32 uniforms in ``(0, 1)`` for the sender's own stochastic rounding or sampling.

    Deterministic given the key (so encodes are reproducible), independent of the shared stream.
    """
    return _one_plus_uniform(derive_seed(key, domain="local"), LOCAL_UNIFORM, n, device).sub_(1.0)


def local_generator(key: StreamKey) -> np.random.Generator:
    """A NumPy generator in the local domain, for draws other than uniforms (e.g. sampling)."""
    return np.random.Generator(np.random.PCG64(derive_seed(key, domain="local") ^ 0x5A5A))


class PhiloxWords:
    """A position in a Philox word stream: :meth:`random_raw` returns its next 64-bit words.

    64-bit word ``j`` is ``w[2j] | w[2j+1] << 32`` of the stream's 32-bit words ``w`` (low half
    first), so consecutive calls read consecutive parts of one stream, as NumPy bit generators'
    ``random_raw`` does.
    """

    def __init__(self, seed: int, stream: int) -> None:
        self.seed = seed
        self.stream = stream
        self.position = 0  # 64-bit words already returned

    def random_raw(self, size: int) -> np.ndarray:
        """The next ``size`` 64-bit words (``uint64``)."""
        n = int(size)
        if n < 0:
            raise ValueError(f"cannot draw a negative number ({n}) of words")
        words = philox_words(self.seed, self.stream, 2 * self.position, 2 * n)
        self.position += n
        return words.view(np.uint64)  # little-endian: word 2j is the low half


def shared_words(key: StreamKey) -> PhiloxWords:
    """The raw 64-bit word stream (``.random_raw(n)``) of ``key`` in the shared domain, for shared
    draws other than the dither (random indices): the Philox stream of the shared seed in its
    own domain (:data:`~gradzip.kernels.philox.SHARED_WORDS`), so it never meets the dither's."""
    return PhiloxWords(derive_seed(key, domain="shared"), SHARED_WORDS)
