"""Layers that keep the DQSG authors' TensorFlow parameter layout inside PyTorch modules.

The grouped codecs see a parameter's *storage* layout (One-bit groups along the first dimension,
spec 1.9), so the models of :mod:`gradzip.models.paper` store their parameters exactly as
the authors' TensorFlow code does [CODE: afshinabdi/DistributedTraining-CEO, ``models/*.py``]:

* :class:`Dense`: weight ``[in, out]``, output ``x @ W + b`` (``layout="in_out"``); or PyTorch's
  ``[out, in]`` with ``F.linear`` (``layout="out_in"``).
* :class:`ConvSame`: kernel ``[kh, kw, cin, cout]``, permuted to PyTorch's ``[cout, cin, kh, kw]``
  in ``forward`` (TensorFlow's ``conv2d`` is a cross-correlation too, so no flip is needed) and
  zero-padded like TensorFlow's ``padding="SAME"`` (stride 1, odd kernels).
* :func:`max_pool_same`: TensorFlow's SAME max pooling, whose padding is asymmetric (the extra
  row/column goes at the end) and never wins the max.
* :func:`lrn`: ``tf.nn.lrn`` semantics through ``F.local_response_norm``.

Nothing here modifies a parameter in ``forward`` or branches on data, so the models work with
``torch.func.functional_call`` and ``torch.func.vmap`` over stacked parameters.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)
from torch import nn

from gradzip.choices import check_choice, choices_of

#: how a :class:`Dense` weight is stored: ``[in, out]`` (TensorFlow) or ``[out, in]`` (PyTorch)
Layout = Literal["in_out", "out_in"]

#: Truncation of the initial weights, in standard deviations [CODE: ``st.truncnorm(-2, 2, ...)``].
TRUNCATION = 2.0

#: Standard deviation of ``N(0, 1)`` truncated to ``[-2, 2]``: a weight drawn with parameter
#: ``sd`` has standard deviation ``TRUNCATED_STD_FACTOR * sd`` (about ``0.880 sd``).
TRUNCATED_STD_FACTOR = math.sqrt(
    1.0
    - 2
    * TRUNCATION
    * math.exp(-(TRUNCATION**2) / 2)
    / math.sqrt(2 * math.pi)
    / math.erf(TRUNCATION / math.sqrt(2))
)


def truncated_normal_(tensor: torch.Tensor, sd: float, generator: torch.Generator) -> None:
    """Fill ``tensor`` in place from ``N(0, sd^2)`` truncated to ``+-2 sd``, drawn from ``generator``.

    ``sd`` is the parameter of the untruncated normal, as in ``scipy.stats.truncnorm(-2, 2,
    scale=sd)`` and ``tf.truncated_normal(stddev=sd)``.
    """
    bound = TRUNCATION * sd
    with torch.no_grad():
        nn.init.trunc_normal_(tensor, 0.0, sd, -bound, bound, generator=generator)


class Dense(nn.Module):
    """Fully connected layer; ``layout="in_out"`` stores the weight ``[in, out]`` (TensorFlow)."""

    def __init__(self, n_in: int, n_out: int, layout: Layout = "in_out") -> None:
        super().__init__()
        check_choice("layout", layout, choices_of(Layout))
        self.layout = layout
        shape = (n_in, n_out) if layout == "in_out" else (n_out, n_in)
        self.weight = nn.Parameter(torch.empty(shape))
        self.bias = nn.Parameter(torch.empty(n_out))

    @property
    def fan_in(self) -> int:
        """Inputs per output unit."""
        return int(self.weight.shape[0 if self.layout == "in_out" else 1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "in_out":
            return x @ self.weight + self.bias
        return F.linear(x, self.weight, self.bias)


class ConvSame(nn.Module):
    """Stride-1 convolution with TensorFlow's SAME padding; kernel stored ``[kh, kw, cin, cout]``."""

    def __init__(self, kh: int, kw: int, cin: int, cout: int) -> None:
        super().__init__()
        if kh % 2 == 0 or kw % 2 == 0:
            raise ValueError(f"SAME padding is implemented for odd kernels only, got {kh}x{kw}")
        self.weight = nn.Parameter(torch.empty(kh, kw, cin, cout))
        self.bias = nn.Parameter(torch.empty(cout))

    @property
    def fan_in(self) -> int:
        """Inputs per output channel, ``kh * kw * cin``."""
        kh, kw, cin, _ = self.weight.shape
        return int(kh * kw * cin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kh, kw = self.weight.shape[0], self.weight.shape[1]
        kernel = self.weight.permute(3, 2, 0, 1)  # [kh, kw, cin, cout] -> [cout, cin, kh, kw]
        return F.conv2d(x, kernel, self.bias, padding=(kh // 2, kw // 2))


def _same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow's SAME padding (before, after) of one spatial dimension."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def max_pool_same(x: torch.Tensor, kernel: int, stride: int) -> torch.Tensor:
    """``tf.nn.max_pool(..., padding="SAME")`` on NCHW input: output size ``ceil(size/stride)``.

    The padding is ``-inf``, so a padded position never wins; for a 3x3/2 pool on 24 rows it is
    (0, 1): 24 -> 12 -> 6, with windows starting at rows 0, 2, 4, ...
    """
    top, bottom = _same_padding(x.shape[-2], kernel, stride)
    left, right = _same_padding(x.shape[-1], kernel, stride)
    if top or bottom or left or right:
        x = F.pad(x, (left, right, top, bottom), value=-math.inf)
    return F.max_pool2d(x, kernel, stride)


def lrn(x: torch.Tensor, depth_radius: int, bias: float, alpha: float, beta: float) -> torch.Tensor:
    """``tf.nn.lrn`` on NCHW input: ``x / (bias + alpha * sum_{|c'-c| <= r} x_c'^2) ** beta``.

    TensorFlow sums the squares over the ``2r + 1`` channels ``c - r .. c + r`` (clipped at the
    edges) and multiplies the *sum* by ``alpha``. PyTorch's ``local_response_norm(size, alpha)``
    multiplies the *mean* over ``size`` channels (zero-padded, so always divided by ``size``) by
    ``alpha``. Hence ``size = 2r + 1`` and ``alpha_torch = (2r + 1) * alpha_tf``: CifarNet's
    ``tf.nn.lrn(x, 4, bias=1.0, alpha=0.001/9, beta=0.75)`` is ``size=9, alpha=0.001``.
    """
    size = 2 * depth_radius + 1
    return F.local_response_norm(x, size, alpha=alpha * size, beta=beta, k=bias)
