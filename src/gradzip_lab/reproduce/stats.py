"""The few statistics ``gradzip reproduce --seeds`` reports: mean, sample standard deviation
and Student's paired t-test with its 95% confidence interval.

SciPy is not a dependency of gradzip, so the t distribution is computed here from the
regularized incomplete beta function (a continued fraction evaluated with Lentz's method):
the two-sided p-value of ``t`` with ``df`` degrees of freedom is ``I_x(df/2, 1/2)`` with
``x = df / (df + t^2)``, and the quantile is found by bisection on that p-value. Both are
accurate to about 1e-10, far more than a 3-seed comparison needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: the level at which a difference is called significant (two-sided)
ALPHA = 0.05


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean (``values`` not empty)."""
    if not values:
        raise ValueError("mean of no values")
    return math.fsum(values) / len(values)


def sample_sd(values: Sequence[float]) -> float | None:
    """The sample standard deviation (divisor ``n - 1``); ``None`` for fewer than 2 values."""
    if len(values) < 2:
        return None
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (len(values) - 1))


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 1000):
        # the even step, then the odd step, of the fraction's terms
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < eps:
            break
    return result


def regularized_beta(a: float, b: float, x: float) -> float:
    """``I_x(a, b)``, the regularized incomplete beta function, for ``0 <= x <= 1``."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x = {x} outside [0, 1]")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    # the fraction converges fast on this side of the mean; use the symmetry on the other
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """``P(|T| >= |t|)`` for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"df = {df} must be positive")
    if math.isinf(t):
        return 0.0
    return regularized_beta(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The ``t`` with ``P(T <= t) = p`` (``0.5 <= p < 1``), e.g. ``t_quantile(0.975, 2)`` =
    4.3027, the half-width factor of a 95% interval from 3 values."""
    if not 0.5 <= p < 1.0:
        raise ValueError(f"p = {p} outside [0.5, 1)")
    tail = 2.0 * (1.0 - p)  # the two-sided p-value the quantile has
    low, high = 0.0, 1.0
    while t_two_sided_p(high, df) > tail:
        high *= 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        if t_two_sided_p(middle, df) > tail:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2.0


@dataclass(frozen=True)
class PairedTest:
    """Student's paired t-test of ``a - b`` over seeds (one difference per seed)."""

    n: int
    mean: float
    sd: float | None
    t: float | None  # None: fewer than 2 seeds, or every difference exactly 0
    p: float | None
    ci_low: float | None  # the 95% confidence interval of the mean difference
    ci_high: float | None

    @property
    def significant(self) -> bool | None:
        """``p < ALPHA``; ``None`` when there is no test (a single seed)."""
        return None if self.p is None else self.p < ALPHA

    def verdict(self) -> str:
        """One plain sentence a report prints beside the figures."""
        if self.p is None:
            if self.n < 2:
                return "no test: one seed"
            return "identical in every seed"
        if self.significant:
            return f"significant at the 5% level (p = {self.p:.3g})"
        return (
            f"NOT significant at the 5% level (p = {self.p:.3g}): within the seed-to-seed "
            f"noise of {self.n} seeds"
        )


def paired_t_test(differences: Sequence[float]) -> PairedTest:
    """The paired t-test of per-seed differences against 0 (``n - 1`` degrees of freedom)
    and the 95% confidence interval of their mean.

    Every difference exactly equal (sd 0): no noise at all, so p = 0 when they are not 0 (a
    deterministic figure such as a bit count) and no test when they are all 0."""
    n = len(differences)
    m = mean(differences)
    sd = sample_sd(differences)
    if sd is None:
        return PairedTest(n, m, None, None, None, None, None)
    if sd == 0.0:
        if m == 0.0:
            return PairedTest(n, m, sd, None, None, m, m)
        return PairedTest(n, m, sd, math.copysign(math.inf, m), 0.0, m, m)
    se = sd / math.sqrt(n)
    t = m / se
    half = t_quantile(1.0 - ALPHA / 2.0, n - 1) * se
    return PairedTest(n, m, sd, t, t_two_sided_p(t, n - 1), m - half, m + half)
