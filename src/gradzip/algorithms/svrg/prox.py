"""Proximal operators of the nonsmooth part ``h`` of ``F = f + h`` (spec 3.1 [CHOICE]).

``prox_{eta h}(v) = argmin_y h(y) + ||y - v||^2 / (2 eta)``. Four ``h`` are provided:

=============  ================================  ==========================================
name           ``h(x)``                          ``prox_{eta h}(v)``
=============  ================================  ==========================================
``none``       0                                 ``v``
``l1``         ``lam ||x||_1``                   ``sign(v) max(|v| - eta lam, 0)``
``l2``         ``(lam / 2) ||x||^2``             ``v / (1 + eta lam)``
``l2-ball``    0 on ``||x|| <= r``, else +inf    ``v min(1, r / ||v||)`` (projection)
=============  ================================  ==========================================

Every operator is deterministic and element-wise or a single norm, so every rank applying it to
the same ``v`` gets the same bits.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import ClassVar

import torch


def _check_eta(eta: float) -> None:
    if not (eta > 0 and math.isfinite(eta)):
        raise ValueError(f"the prox step eta must be positive and finite, got {eta}")


def _nonnegative(value: float, what: str) -> float:
    value = float(value)
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{what} must be a finite number >= 0, got {value}")
    return value


class Prox(ABC):
    """``h`` through its proximal operator and its value."""

    name: ClassVar[str]
    #: ``h`` is ``strong_convexity``-strongly convex (used by ALPC-SVRG's weights)
    strong_convexity: float = 0.0

    @abstractmethod
    def apply(self, v: torch.Tensor, eta: float) -> torch.Tensor:
        """``prox_{eta h}(v)`` (a new tensor)."""

    @abstractmethod
    def value(self, x: torch.Tensor) -> float:
        """``h(x)`` (``inf`` outside the domain)."""

    def __call__(self, v: torch.Tensor, eta: float) -> torch.Tensor:
        _check_eta(eta)
        return self.apply(v, eta)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NoProx(Prox):
    """``h = 0``: the proximal step is the identity (plain SVRG / Katyusha)."""

    name = "none"

    def apply(self, v: torch.Tensor, eta: float) -> torch.Tensor:
        return v.clone()

    def value(self, x: torch.Tensor) -> float:
        return 0.0


class L1(Prox):
    """``h = lam ||x||_1``: soft thresholding at ``eta lam`` (sparse solutions)."""

    name = "l1"

    def __init__(self, lam: float) -> None:
        self.lam = _nonnegative(lam, "l1: lam")

    def apply(self, v: torch.Tensor, eta: float) -> torch.Tensor:
        return torch.sign(v) * (v.abs() - eta * self.lam).clamp_min(0)

    def value(self, x: torch.Tensor) -> float:
        return self.lam * float(x.abs().sum())

    def __repr__(self) -> str:
        return f"L1(lam={self.lam})"


class L2(Prox):
    """``h = (lam/2) ||x||^2``: shrinkage by ``1 + eta lam``; ``h`` is ``lam``-strongly
    convex."""

    name = "l2"

    def __init__(self, lam: float) -> None:
        self.lam = _nonnegative(lam, "l2: lam")
        self.strong_convexity = self.lam

    def apply(self, v: torch.Tensor, eta: float) -> torch.Tensor:
        return v / (1.0 + eta * self.lam)

    def value(self, x: torch.Tensor) -> float:
        return 0.5 * self.lam * float(x.pow(2).sum())

    def __repr__(self) -> str:
        return f"L2(lam={self.lam})"


class L2Ball(Prox):
    """``h`` = the indicator of ``{x : ||x||_2 <= radius}``: Euclidean projection (``eta``
    plays no role). :meth:`value` allows a relative ``1e-6`` excess for rounding."""

    name = "l2-ball"

    def __init__(self, radius: float) -> None:
        radius = float(radius)
        if not (radius > 0 and math.isfinite(radius)):
            raise ValueError(f"l2-ball: radius must be positive and finite, got {radius}")
        self.radius = radius

    def apply(self, v: torch.Tensor, eta: float) -> torch.Tensor:
        norm = float(torch.linalg.vector_norm(v))
        return v.clone() if norm <= self.radius else v * (self.radius / norm)

    def value(self, x: torch.Tensor) -> float:
        inside = float(torch.linalg.vector_norm(x)) <= self.radius * (1 + 1e-6)
        return 0.0 if inside else math.inf

    def __repr__(self) -> str:
        return f"L2Ball(radius={self.radius})"


PROXES: dict[str, type[Prox]] = {cls.name: cls for cls in (NoProx, L1, L2, L2Ball)}


def make_prox(name: str, value: float | None = None) -> Prox:
    """The prox called ``name`` (``none``, ``l1``, ``l2``, ``l2-ball``); ``value`` is ``lam``
    for ``l1``/``l2`` and the radius for ``l2-ball``."""
    if name not in PROXES:
        raise ValueError(f"unknown prox {name!r}; choose one of {sorted(PROXES)}")
    if name == "none":
        if value is not None:
            raise ValueError("prox 'none' takes no value")
        return NoProx()
    if value is None:
        raise ValueError(f"prox {name!r} needs a value (lam for l1/l2, the radius for l2-ball)")
    return PROXES[name](value)  # type: ignore[call-arg]  # l1, l2, l2-ball take one value
