"""Bits one worker sends per iteration for a real model gradient: "Table 1 without training".

:func:`measure_bits` builds a model of :mod:`gradzip.models.paper` (seeded), computes ONE
real gradient on a small random batch, encodes every parameter tensor's gradient with a
registered compressor and reports, per worker per iteration (spec 0.5; 1 Kbit = 1000 bits):

* ``paper_bits``: the papers' raw count the compressor reports;
* ``wire_bits``: measured, ``8 * len(payload)`` summed over the real payloads (headers and CRCs
  included), one payload per parameter tensor;
* ``entropy_bits``: the empirical entropy of the symbols plus the side data (Table 2's measure);

beside the uncompressed Baseline ``32 n``. Tensor ``i`` (in ``model.parameters()`` order) is
encoded under ``StreamKey(run_seed=seed, rank=0, step=0, tensor_index=i)``, as worker 0's first
message would be.

The gradient [CHOICE]: no dataset is needed. The batch (``batch`` examples, default 8: the
per-worker share of the DQSG paper's total batch 256 over its 32 workers) is drawn from a
``torch.Generator`` seeded from ``seed`` (a separate stream from the model's initialisation):
MNIST-like inputs uniform in ``[0, 1)`` (the authors scale pixels to ``[0, 1]``), CIFAR-like inputs
standard normal (standardised crops), labels uniform over the 10 classes. The loss is the mean
softmax cross-entropy, in ``eval()`` mode (no dropout, as the authors' ``keep_prob = 1.0``). The
paper and wire counts depend only on the shapes for most codecs; entropy depends on the gradient,
and a random batch at initialisation is not a trained model's gradient, so read the entropy
column as indicative, not as a reproduction of Table 2.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)

from gradzip.compressors import Compressor, create, get, names
from gradzip.errors import GradzipError
from gradzip.experiments.exchange import keyword_parameters
from gradzip.keys import StreamKey
from gradzip.models.paper import build_model, model_info
from gradzip.rng import text_generator

#: default examples in the gradient's batch (256 total / 32 workers, the DQSG paper's Table 2)
DEFAULT_BATCH = 8


class UsageError(GradzipError, ValueError):
    """A bad model, compressor or parameter; the message is one line naming the choices."""


@dataclass(frozen=True)
class TensorBits:
    """The bits of one parameter tensor's encoded gradient."""

    index: int
    shape: tuple[int, ...]
    numel: int
    paper_bits: float
    wire_bits: int
    entropy_bits: float
    payload_bytes: int


@dataclass(frozen=True)
class BitsReport:
    """Bits per worker per iteration of one model and compressor."""

    model: str
    compressor: str
    params: dict[str, Any]
    seed: int
    batch: int
    tensors: tuple[TensorBits, ...]

    @property
    def n(self) -> int:
        """Number of parameters."""
        return sum(t.numel for t in self.tensors)

    @property
    def baseline_bits(self) -> int:
        """Uncompressed float32: ``32 n``."""
        return 32 * self.n

    @property
    def paper_bits(self) -> float:
        return sum(t.paper_bits for t in self.tensors)

    @property
    def wire_bits(self) -> int:
        return sum(t.wire_bits for t in self.tensors)

    @property
    def entropy_bits(self) -> float:
        return sum(t.entropy_bits for t in self.tensors)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready figures, totals in bits and Kbit."""
        out = asdict(self)
        out["parameters"] = self.n
        for kind in ("baseline", "paper", "wire", "entropy"):
            bits = getattr(self, f"{kind}_bits")
            out[f"{kind}_bits"] = bits
            out[f"{kind}_kbit"] = bits / 1000.0
        return out


def _batch_generator(seed: int) -> torch.Generator:
    return text_generator(f"gradzip-bits-batch:{seed}")


def model_gradient(
    model: str,
    seed: int = 0,
    batch: int = DEFAULT_BATCH,
    generator: torch.Generator | None = None,
) -> list[torch.Tensor]:
    """One real gradient of ``model`` (seeded init) on a random batch, per parameter tensor;
    the batch is drawn from ``generator`` (default: one derived from ``seed``)."""
    info = model_info(model)
    if batch < 1:
        raise UsageError(f"batch must be >= 1, got {batch}")
    net = build_model(model, seed)
    net.eval()
    gen = generator if generator is not None else _batch_generator(seed)
    shape = (batch, *info.input_shape)
    x = (
        torch.rand(shape, generator=gen)
        if info.dataset == "MNIST"
        else torch.randn(shape, generator=gen)
    )
    y = torch.randint(0, info.num_classes, (batch,), generator=gen)
    params = list(net.parameters())
    loss = F.cross_entropy(net(x), y)
    return [g.detach() for g in torch.autograd.grad(loss, params)]


def make_compressor(compressor: str, params: Mapping[str, Any]) -> Compressor:
    """Instantiate ``compressor``; a bad or missing parameter becomes a one-line UsageError."""
    if compressor not in names():
        raise UsageError(f"unknown compressor {compressor!r}; choices: {', '.join(names())}")
    missing = [
        p.name
        for p in keyword_parameters(get(compressor))
        if p.default is inspect.Parameter.empty and p.name not in params
    ]
    if missing:
        needed = " ".join(f"--param {m}=VALUE" for m in missing)
        raise UsageError(f"{compressor} needs {needed}")
    try:
        return create(compressor, **params)
    except (ValueError, TypeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UsageError(f"{compressor}: {first}") from None


def measure_bits(
    model: str,
    compressor: str,
    params: Mapping[str, Any] | None = None,
    seed: int = 0,
    batch: int = DEFAULT_BATCH,
) -> BitsReport:
    """Encode one real gradient of ``model`` with ``compressor`` and count its bits per tensor."""
    try:
        model_info(model)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if not 0 <= seed < 2**63:
        raise UsageError(f"seed must lie in [0, 2**63), got {seed}")
    codec = make_compressor(compressor, dict(params or {}))
    rows = []
    for i, g in enumerate(model_gradient(model, seed, batch)):
        enc = codec.encode(g, StreamKey(run_seed=seed, rank=0, step=0, tensor_index=i))
        rows.append(
            TensorBits(
                i,
                tuple(g.shape),
                g.numel(),
                enc.paper_bits,
                enc.wire_bits,
                enc.entropy_bits,
                len(enc.payload),
            )
        )
    return BitsReport(model, codec.describe(), dict(params or {}), seed, batch, tuple(rows))


def format_report(r: BitsReport) -> str:
    """Plain text: the per-tensor breakdown, then the totals beside the Baseline ``32 n``."""
    info = model_info(r.model)
    paper = f", {info.paper_name} of the DQSG paper" if info.paper_name else ""
    lines = [
        f"model       {r.model} ({info.dataset}{paper}): {r.n:,} parameters in "
        f"{len(r.tensors)} tensors, {info.layout} layout",
        f"compressor  {r.compressor}",
        f"gradient    one real gradient, random batch of {r.batch} (seed {r.seed}), no dataset",
        "",
        f"{'tensor':>6} {'shape':>14} {'numel':>11} {'paper Kbit':>11} {'wire Kbit':>11} "
        f"{'entropy Kbit':>13}",
    ]
    for t in r.tensors:
        shape = "x".join(str(d) for d in t.shape)
        lines.append(
            f"{t.index:>6} {shape:>14} {t.numel:>11,} {t.paper_bits / 1e3:>11.1f} "
            f"{t.wire_bits / 1e3:>11.1f} {t.entropy_bits / 1e3:>13.1f}"
        )
    lines += ["", "per worker per iteration (1 Kbit = 1000 bits)"]
    lines.append(f"{'':<16} {'Kbit':>11} {'bits/param':>11} {'vs baseline':>12}")
    for label, bits in (
        ("Baseline 32n", r.baseline_bits),
        ("paper bits", r.paper_bits),
        ("wire bits", r.wire_bits),
        ("entropy bits", r.entropy_bits),
    ):
        ratio = f"{r.baseline_bits / bits:>11.2f}x" if bits else f"{'-':>12}"
        lines.append(f"{label:<16} {bits / 1e3:>11.1f} {bits / r.n:>11.3f} {ratio}")
    return "\n".join(lines)


def write_json(report: BitsReport, path: str | Path) -> None:
    """Write :meth:`BitsReport.to_dict` to ``path``."""
    Path(path).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
