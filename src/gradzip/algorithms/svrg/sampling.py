"""Mini-batch indices from keyed, stateless random streams (spec 0.4).

* :func:`local_batch`: worker ``alpha``'s own batch ``I_alpha`` at a communication round,
  uniform with replacement and independent between workers (LPC-SVRG step "worker alpha
  samples", ALPC-SVRG's low-precision gradient). Local randomness: only that worker needs it.
* :func:`shared_batch`: ALPC-SVRG's double-sampling batch ``J``, the same on every worker
  ("identical random seeds", [SEED]), drawn from shared randomness keyed by the run seed and
  the round; the spec's ``seed(base, -1, t, 0)`` uses rank ``-1``, which a
  :class:`~gradzip.keys.StreamKey` writes as ``2**64 - 1`` [CHOICE].
* :func:`shared_choice`: one index every rank agrees on (LPC-SVRG's uniformly drawn output
  iterate in the nonconvex case).

Indices are ``word % n`` of raw 64-bit SFC64 words, whose stream NumPy keeps stable across
versions and platforms; the modulo bias is below ``n / 2**64``. Being stateless, the streams
need no checkpoint and a failed round cannot put the ranks out of step.
"""

from __future__ import annotations

import numpy as np
import torch

from gradzip.keys import StreamKey
from gradzip.rng import derive_seed, shared_words

#: ``tensor_index`` of the sampling keys: apart from the message's key (index 0), whose local
#: stream drives the quantizer's stochastic rounding
SAMPLE_TENSOR_INDEX = 1
#: the spec's rank ``-1`` of the shared batch
SHARED_RANK = 2**64 - 1
_OUTPUT_TENSOR_INDEX = 2
_LOCAL_SALT = 0x5A3D_C0DE_BA7C


def _indices(words: np.ndarray, n: int) -> torch.Tensor:
    return torch.from_numpy((words % np.uint64(n)).astype(np.int64))


def _check(n: int, size: int) -> None:
    if n < 1 or size < 1:
        raise ValueError(f"cannot sample {size} indices out of {n}")


def local_batch(run_seed: int, rank: int, step: int, n: int, size: int) -> torch.Tensor:
    """``size`` indices in ``[0, n)``, uniform with replacement, private to ``rank``."""
    _check(n, size)
    key = StreamKey(run_seed, rank, step, SAMPLE_TENSOR_INDEX)
    words = np.random.SFC64(derive_seed(key, domain="local") ^ _LOCAL_SALT).random_raw(size)
    return _indices(words, n)


def shared_batch(run_seed: int, step: int, n: int, size: int) -> torch.Tensor:
    """``size`` indices in ``[0, n)``, uniform with replacement, equal on every rank."""
    _check(n, size)
    words = shared_words(StreamKey(run_seed, SHARED_RANK, step, 0)).random_raw(size)
    return _indices(words, n)


def shared_choice(run_seed: int, n: int) -> int:
    """One index in ``[0, n)`` that every rank of the run draws alike."""
    _check(n, 1)
    words = shared_words(StreamKey(run_seed, SHARED_RANK, 0, _OUTPUT_TENSOR_INDEX)).random_raw(1)
    return int(words[0] % np.uint64(n))
