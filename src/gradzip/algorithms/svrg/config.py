"""Typed, validated settings of LPC-SVRG, ALPC-SVRG and the SGD baselines.

Fields shared by all: ``batch`` is the per-worker mini-batch ``B`` (the total is ``M*B``);
``b``/``theta``/``scheme``/``packing`` describe the inner message (spec 3.2, 3.3; ``b=None`` is
full precision); ``run_seed`` keys every random stream (sampling, stochastic rounding);
``record_every`` says how often the objective is recorded (0: epoch ends only) and
``record_rank`` which rank evaluates it (``None``: every rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from gradzip.algorithms.svrg.channel import SCHEMES, InnerScheme
from gradzip.choices import check_choice, choices_of
from gradzip.codecs.symbols import PACKINGS, Packing

#: the baselines of spec 3.8: fp32 SGD, QSGD, QSGD with error compensation
SgdMethod = Literal["sgd", "qsgd", "ecq-sgd"]
SGD_METHODS: tuple[SgdMethod, ...] = choices_of(SgdMethod)
#: what LPC-SVRG returns: the last epoch's point, or a uniformly drawn inner iterate
SvrgOutput = Literal["last", "random"]
OUTPUTS: tuple[SvrgOutput, ...] = choices_of(SvrgOutput)


def _positive_int(value: object, what: str, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")


def _positive_float(value: object, what: str, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{what} must be a number, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{what} must be positive and finite, got {value!r}")


def _common(c: _Message) -> None:
    _positive_int(c.batch, "batch")
    if c.b is not None and (isinstance(c.b, bool) or not isinstance(c.b, int) or c.b < 2):
        # the upper limit is the LPC codec's, checked when it is built
        raise ValueError(f"b must be an int >= 2, or None for fp32 messages, got {c.b!r}")
    if not (isinstance(c.theta, (int, float)) and 0 < c.theta <= 1):
        raise ValueError(f"theta must lie in (0, 1], got {c.theta!r}")
    check_choice("scheme", c.scheme, SCHEMES)
    check_choice("packing", c.packing, PACKINGS)
    if isinstance(c.run_seed, bool) or not isinstance(c.run_seed, int) or c.run_seed < 0:
        raise ValueError(f"run_seed must be an int >= 0, got {c.run_seed!r}")
    if not isinstance(c.record_every, int) or c.record_every < 0:
        raise ValueError(f"record_every must be an int >= 0, got {c.record_every!r}")


@dataclass(frozen=True)
class _Message:
    batch: int = 1
    b: int | None = 4
    theta: float = 1.0
    scheme: InnerScheme = "a"
    packing: Packing = "fixed"
    run_seed: int = 0
    record_every: int = 0
    record_rank: int | None = 0


@dataclass(frozen=True)
class LPCSVRGConfig(_Message):
    """LPC-SVRG (Algorithm 1, spec 3.4).

    ``lr``: the constant step ``eta`` (None: the theory's ``1/(3L)`` with ``L = max_i L_i``
    [RECON, Reddi et al.]; the paper tunes it). ``inner``: ``m`` rounds per epoch (None:
    ``n // (M*B)``, one pass over the data, as ``m = n^(1/3)`` with ``M*B = n^(2/3)``).
    ``output``: ``"last"`` returns ``x_tilde`` (convex case); ``"random"`` a uniformly drawn
    inner iterate ``x_a`` (the nonconvex guarantee), the same on every rank.
    """

    epochs: int = 10
    lr: float | None = None
    inner: int | None = None
    output: SvrgOutput = "last"

    def __post_init__(self) -> None:
        _common(self)
        _positive_int(self.epochs, "epochs")
        _positive_float(self.lr, "lr", allow_none=True)
        _positive_int(self.inner, "inner", allow_none=True)
        check_choice("output", self.output, OUTPUTS)


@dataclass(frozen=True)
class ALPCSVRGConfig(_Message):
    """ALPC-SVRG (Algorithms 2 and 3, spec 3.5, 3.6 [RECON from Katyusha]).

    ``L``: the smoothness constant in the step sizes ``a = 1/(3 tau1 L)`` and ``1/(3L)`` (None:
    ``max_i L_i``; in practice a tuning knob like a learning rate). ``sigma``: the strong
    convexity of ``F`` (None: the problem's plus the prox's). ``strongly_convex``: Algorithm 2
    (True) or 3 (False); None picks 2 when ``sigma > 0``. ``tau1`` overrides Algorithm 2's
    ``min(sqrt(m sigma / (3L)), 1/2)``; ``tau2 = 1/2`` is Katyusha's default. ``inner``: ``m``
    (None: ``2n / (M*B)``, Katyusha's default). ``double_batch``: the size of the shared
    full-precision batch ``J`` (None: ``batch``).
    """

    epochs: int = 10
    L: float | None = None
    sigma: float | None = None
    strongly_convex: bool | None = None
    tau1: float | None = None
    tau2: float = 0.5
    inner: int | None = None
    double_batch: int | None = None

    def __post_init__(self) -> None:
        _common(self)
        _positive_int(self.epochs, "epochs")
        _positive_float(self.L, "L", allow_none=True)
        if self.sigma is not None and not (self.sigma >= 0 and math.isfinite(self.sigma)):
            raise ValueError(f"sigma must be a finite number >= 0, got {self.sigma!r}")
        if self.tau1 is not None and not 0 < self.tau1 <= 0.5:
            raise ValueError(f"tau1 must lie in (0, 1/2], got {self.tau1!r}")
        if not 0 < self.tau2 <= 0.5:
            raise ValueError(f"tau2 must lie in (0, 1/2], got {self.tau2!r}")
        _positive_int(self.inner, "inner", allow_none=True)
        _positive_int(self.double_batch, "double_batch", allow_none=True)


@dataclass(frozen=True)
class SGDConfig(_Message):
    """The baselines of spec 3.8: ``method="sgd"`` (fp32), ``"qsgd"`` (QSGD, ``levels``
    positive levels, max-norm scale) or ``"ecq-sgd"`` (the same with error compensation).

    Step ``lr_t = lr / (1 + lr_decay * t)`` ("diminishing" [CHOICE]; ``lr_decay=0`` is
    constant). ``b``/``theta`` are unused (QSGD's width is ``ceil(log2(2*levels + 1))``).
    """

    steps: int = 1000
    lr: float = 0.01
    lr_decay: float = 0.0
    method: SgdMethod = "sgd"
    levels: int = 7

    def __post_init__(self) -> None:
        _common(self)
        _positive_int(self.steps, "steps")
        _positive_float(self.lr, "lr")
        if not (self.lr_decay >= 0 and math.isfinite(self.lr_decay)):
            raise ValueError(f"lr_decay must be a finite number >= 0, got {self.lr_decay!r}")
        check_choice("method", self.method, SGD_METHODS)
        _positive_int(self.levels, "levels")
        if self.scheme != "a":
            raise ValueError("the SGD baselines use scheme (a), as in the paper's experiments")
