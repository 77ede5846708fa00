"""The methods DQGAN's experiments compare (the seed's Section 4; spec 4.4 baselines), built
from :class:`~gradzip.algorithms.dqgan.dqgan.DQGAN` with the Optimistic Adam update."""

from __future__ import annotations

from typing import Any

from gradzip.algorithms.dqgan.dqgan import DQGAN
from gradzip.algorithms.dqgan.game import Game
from gradzip.comm.transport import Transport
from gradzip.compressors.base import Compressor
from gradzip.compressors.hou import Hou
from gradzip.compressors.identity import Identity

#: The experiments' methods: DQGAN with Hou's quantizer and error feedback, CPOAdam (fp32, no
#: compression) and CPOAdam-GQ (the same quantizer without error feedback).
METHODS = ("dqgan", "cpoadam", "cpoadam-gq")


def cpoadam(game: Game, transport: Transport, *, lr: float = 2e-4, **options: Any) -> DQGAN:
    """Centralized Parallel Optimistic Adam [SEED]: DQGAN with the identity compressor and no
    error feedback, i.e. fp32 operator values averaged at the server (32 bits per coordinate
    each way)."""
    return DQGAN(
        game,
        transport,
        Identity(),
        lr=lr,
        optimizer="optimistic_adam",
        error_feedback=False,
        **options,
    )


def cpoadam_gq(
    game: Game, transport: Transport, compressor: Compressor, *, lr: float = 2e-4, **options: Any
) -> DQGAN:
    """CPOAdam with Gradient Quantization [SEED]: ``Q`` applied with no error feedback
    (``e`` kept at 0), so a biased ``Q`` biases every step."""
    return DQGAN(
        game,
        transport,
        compressor,
        lr=lr,
        optimizer="optimistic_adam",
        error_feedback=False,
        **options,
    )


def make_method(
    name: str, game: Game, transport: Transport, *, lr: float = 2e-4, bits: int = 8, **options: Any
) -> DQGAN:
    """One of :data:`METHODS` with Hou's ``bits``-bit quantizer where it compresses (8 in the
    seed's experiments: "1/4 of full precision")."""
    if name == "dqgan":
        return DQGAN(game, transport, Hou(b=bits), lr=lr, optimizer="optimistic_adam", **options)
    if name == "cpoadam":
        return cpoadam(game, transport, lr=lr, **options)
    if name == "cpoadam-gq":
        return cpoadam_gq(game, transport, Hou(b=bits), lr=lr, **options)
    raise ValueError(f"unknown method {name!r}; choose one of {METHODS}")
