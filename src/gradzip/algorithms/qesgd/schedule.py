"""QESGD's quantization step ``delta_t``: the practical schedule, the theory's, and the full
gradient at ``w_0`` that the practical schedule is calibrated on.

Practical schedule (spec 2.3, [SEED] section 5): ``delta_t = ||grad F(w_0)||_2 /
(c * sqrt(t) * 2^(b-1))`` with ``c`` chosen from {1, 2, 3, 4, 5, 10}. The paper counts epochs
from 1; we evaluate it as ``sqrt(t + 1)`` with ``t`` the epoch index starting at 0 [CHOICE, spec
2.3]. The full gradient is computed once, at ``w_0`` (:func:`full_gradient`), and its norm kept
as float32 (in Alg. 3 the server broadcasts it once). Why it works: the grid's range
``delta_t * 2^(b-1) = ||grad F(w_0)|| / (c sqrt(t+1))`` is the theory's bound
``||grad F(w_t)|| / mu`` on ``|z_t^*|`` (Lemma 2) with the unknown ``mu`` folded into ``c`` and
``||grad F(w_t)||^2 = O(1/t)`` (Corollary 4) standing in for the gradient at ``w_t``, so the
quantization variance ``d delta_t^2 / 4`` decays like ``1/t`` without computing a full gradient
per epoch.

Buckets [SEED text: "QESGD can also use this trick when compressing z"; the per-bucket rule is
ours, CHOICE]: with ``bucket_size = m`` the offset is cut into consecutive slices of ``m``
coordinates and slice ``B`` uses ``||grad F(w_0)_B||_2`` in place of the whole norm (one float32
per bucket, sent once). A bucket whose gradient at ``w_0`` is exactly zero (inputs that are
always 0, a layer behind a zero-initialised one, units dead at ``w_0`` that may revive) would get
``delta = 0`` and its parameters could never move; it takes instead the norm an even spread of
the whole gradient would give it, ``||grad F(w_0)|| sqrt(m_B / d)`` [CHOICE].

Theory (Lemma 2, Theorem 3, Corollary 4 [SEED]): :func:`theory_delta` is
``||grad F(w_t)|| / (mu 2^(b-1))``, which puts every coordinate of the epoch's optimum offset
``z_t^*`` inside the grid; :func:`contraction_factor` is Theorem 3's factor
``1/(mu eta K) + kappa d / (mu eta 2^(2b))`` and :func:`corollary4` picks ``K`` and ``b``.

References: Zhao, Gao & Li, "Quantized Epoch-SGD for Communication-Efficient Distributed
Learning", Lemma 2, Theorem 3, Corollary 4 and section 5; spec section 2.3.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from gradzip.compressors.buckets import check_bucket_size, num_buckets

MAX_BITS = 16


def check_bits(bits: int) -> int:
    """Validate a bit width ``b`` (an int in ``[1, 16]``, the range the ``qesgd`` codec packs)."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"qesgd: bits must be an int in [1, {MAX_BITS}], got {bits!r}")
    return bits


def bucket_count(numel: int, bucket_size: int) -> int:
    """Buckets of a vector of ``numel`` coordinates (:func:`num_buckets`), at least one: the
    schedule always carries the whole-vector ``delta``, even for an empty vector."""
    return max(1, num_buckets(numel, bucket_size))


def bucket_norms(flat: torch.Tensor, bucket_size: int = 0) -> torch.Tensor:
    """``||x_B||_2`` of each bucket of the flat vector ``flat``, accumulated in float64 and
    returned as float32 (what travels). A bucket that is all zeros gets ``||x|| sqrt(m_B / d)``
    instead (``m_B`` its length, ``d`` the vector's), so that its ``delta`` is not 0 for good
    (module docstring); only an all-zero vector gives zero norms."""
    x = flat.detach().reshape(-1).to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise ValueError("qesgd: the full gradient holds NaN or Inf; cannot calibrate delta")
    nb = bucket_count(x.numel(), check_bucket_size(bucket_size))
    whole: torch.Tensor = torch.linalg.vector_norm(x)
    if nb == 1:
        return whole.reshape(1).to(torch.float32)
    padded = torch.zeros(nb * bucket_size, dtype=torch.float64)
    padded[: x.numel()] = x
    norms: torch.Tensor = torch.linalg.vector_norm(padded.view(nb, bucket_size), dim=1)
    sizes = torch.full((nb,), float(bucket_size), dtype=torch.float64)
    sizes[-1] = x.numel() - bucket_size * (nb - 1)
    even_share = whole * torch.sqrt(sizes / x.numel())
    return torch.where(norms > 0, norms, even_share).to(torch.float32)


@dataclass(frozen=True)
class DeltaSchedule:
    """The practical ``delta_t`` of spec 2.3, one value per bucket.

    ``norms`` are ``||grad F(w_0)_B||_2`` (one entry: the whole vector), rounded to float32 on
    construction (to nearest): the server broadcasts them as float32 (spec 2.3), so a schedule
    built locally from a float64 norm equals the one every receiver builds from the broadcast
    value, and gives the same deltas bit for bit. ``bits`` is ``b`` and ``c`` the paper's
    constant. ``delta(t)`` returns float32 ``norms / (c sqrt(t+1) 2^(b-1))`` (computed in
    float64, rounded once), the same on every rank. A zero norm (given explicitly, or from an
    all-zero full gradient: :func:`bucket_norms` replaces a zero bucket otherwise) gives ``delta
    = 0``: that bucket's offset stays 0 (spec 2.1; warned once, at construction).
    """

    norms: tuple[float, ...]
    bits: int = 8
    c: float = 1.0
    bucket_size: int = 0

    def __post_init__(self) -> None:
        check_bits(self.bits)
        check_bucket_size(self.bucket_size)
        if not (isinstance(self.c, int | float) and math.isfinite(self.c) and self.c > 0):
            raise ValueError(f"qesgd: c must be a positive number, got {self.c!r}")
        if not self.norms:
            raise ValueError("qesgd: the schedule needs at least one gradient norm")
        if any(not (math.isfinite(v) and v >= 0) for v in self.norms):
            raise ValueError("qesgd: gradient norms must be finite and >= 0")
        # what travels is float32 (spec 0.3, 2.3): a norm kept in float64 here could give other
        # deltas than the receivers' copy of it
        norms32 = torch.tensor([float(v) for v in self.norms], dtype=torch.float64).float()
        if not bool(torch.isfinite(norms32).all()):
            raise ValueError("qesgd: a gradient norm is beyond the float32 range")
        object.__setattr__(self, "norms", tuple(norms32.tolist()))
        if self.bucket_size == 0 and len(self.norms) != 1:
            raise ValueError(f"qesgd: {len(self.norms)} norms given without a bucket_size")
        if any(v == 0 for v in self.norms):
            warnings.warn(
                "qesgd: a gradient norm of the schedule is zero: that bucket's offset will "
                "always quantize to 0 (delta == 0)",
                stacklevel=2,
            )

    @classmethod
    def from_gradient(
        cls, full_grad: torch.Tensor, bits: int = 8, c: float = 1.0, bucket_size: int = 0
    ) -> DeltaSchedule:
        """The schedule calibrated on the flat full gradient at ``w_0``."""
        norms = bucket_norms(full_grad, bucket_size)
        return cls(tuple(float(v) for v in norms), bits, float(c), bucket_size)

    def fits(self, numel: int) -> bool:
        """Whether the schedule has one norm per bucket of a ``numel``-coordinate vector."""
        return len(self.norms) == bucket_count(numel, self.bucket_size)

    def delta(self, epoch: int) -> torch.Tensor:
        """``delta_t`` per bucket for epoch ``epoch`` (0-based), float32."""
        if epoch < 0:
            raise ValueError(f"qesgd: epoch must be >= 0, got {epoch}")
        scale = self.c * math.sqrt(epoch + 1) * 2.0 ** (self.bits - 1)
        return (torch.tensor(self.norms, dtype=torch.float64) / scale).to(torch.float32)


def theory_delta(grad_norm: float, mu: float, bits: int) -> float:
    """Lemma 2's ``delta_t = ||grad F(w_t)|| / (mu 2^(b-1))``: with it every coordinate of the
    epoch's optimal offset ``z_t^* = w^* - w_t`` lies in the grid's hull (``|z_t^*| <=
    ||grad F(w_t)|| / mu`` for a ``mu``-strongly convex ``F``)."""
    if not (mu > 0 and math.isfinite(mu)) or not (grad_norm >= 0 and math.isfinite(grad_norm)):
        raise ValueError(f"need mu > 0 and a finite gradient norm, got {mu}, {grad_norm}")
    return grad_norm / (mu * 2.0 ** (check_bits(bits) - 1))


def contraction_factor(mu: float, L: float, d: int, eta: float, K: int, bits: int) -> float:
    """Theorem 3's factor ``1/(mu eta K) + kappa d / (mu eta 2^(2b))`` (``kappa = L/mu``):
    ``E[F(w_{t+1}) - F*] <= factor * E[F(w_t) - F*] + eta G^2 / 2`` with Lemma 2's delta."""
    kappa = L / mu
    return 1.0 / (mu * eta * K) + kappa * d / (mu * eta * 4.0**bits)


@dataclass(frozen=True)
class EpochParameters:
    """Corollary 4's choice for one epoch: ``K`` inner steps, ``bits`` and the factor."""

    K: int
    bits: int
    factor: float


def corollary4(mu: float, L: float, d: int, eta: float) -> EpochParameters:
    """``K_t`` and ``b_t`` of Corollary 4, rounded up, with Theorem 3's factor for them.

    The seed prints ``K_t = 1/(3 mu eta_t)``, but then ``1/(mu eta K) = 3`` and the factor cannot
    be the stated 2/3; ``K_t = 3/(mu eta_t)`` with ``2^(2 b_t) = kappa d K_t`` gives exactly
    ``1/3 + 1/3 = 2/3``, so that is what we use [SEED-R: the extraction lost the fraction's
    layout]. Rounding ``K`` and ``b`` up only lowers the factor (at most 2/3).
    """
    K = math.ceil(3.0 / (mu * eta))
    bits = max(1, math.ceil(math.log2(math.sqrt((L / mu) * d * K))))
    return EpochParameters(K, check_bits(bits), contraction_factor(mu, L, d, eta, K, bits))


Batch = tuple[torch.Tensor, torch.Tensor]


def full_gradient(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batches: Iterable[Batch],
) -> list[torch.Tensor]:
    """``grad F(w)`` at the model's current parameters over the samples of ``batches``: the
    mean of the per-sample gradients, one tensor per trainable parameter (in
    ``model.parameters()`` order). ``loss_fn`` must return the *mean* loss of a batch; batches
    may differ in size (each is weighted by its size). Gradients are accumulated in float64 and
    returned as float32; the parameters' ``.grad`` fields are left untouched.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros(p.shape, dtype=torch.float64) for p in params]
    count = 0
    for x, y in batches:
        n = int(x.shape[0])
        grads = torch.autograd.grad(loss_fn(model(x), y), params, allow_unused=True)
        for acc, g in zip(total, grads, strict=True):
            if g is not None:
                acc.add_(g.detach().to(torch.float64).cpu(), alpha=n)
        count += n
    if count == 0:
        raise ValueError("full_gradient: no samples in the batches")
    return [(acc / count).to(torch.float32) for acc in total]


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors concatenated as one flat float32 CPU vector (``model.parameters()`` order)."""
    if not tensors:
        return torch.zeros(0, dtype=torch.float32)
    return torch.cat([t.detach().reshape(-1).to(torch.float32).cpu() for t in tensors])


def unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The inverse of :func:`flatten`: ``flat`` cut into views shaped like ``like``."""
    out, offset = [], 0
    for t in like:
        out.append(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
    if offset != flat.numel():
        raise ValueError(f"qesgd: {flat.numel()} values for tensors of {offset} in all")
    return out


@torch.no_grad()
def write_flat(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy ``flat`` (as :func:`flatten` lays it out) into ``params`` in place."""
    for p, value in zip(params, unflatten(flat, params), strict=True):
        p.copy_(value)
