"""Entropy of the DQSG paper's ternary messages (Table 2) under every scale rule in the authors' code.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/table2_scale_rules.py [--model fc-300-100]
[--epochs 5] [--checkpoints 11] [--per-worker-batch 6] [--workers 32] [--seed 0]``.

The training is the authors' (``NDQSG/compare_algorithms_{fc,lenet}.py``): plain gradient
descent, learning rate 0.01 times 0.9 per epoch, ``--per-worker-batch`` examples for each of
``--workers`` workers (6 x 32: their total batch of 200 split over 32 workers; 8 is the paper's
256), the authors' initialisation (:func:`gradzip.models.paper.build_model`). It steps on the
mean of the workers' exact gradients [CHOICE: the quantized runs are unbiased estimates of this
trajectory, and one trajectory lets every rule see the same gradients]. At ``--checkpoints``
evenly spaced iterations (the first is iteration 0) it computes each worker's gradient on its own
examples and the entropy of one ternary message per worker, ``q_i = sign(g_i) * Bern(|g_i| /
scale)``, counted as the authors count it: per parameter tensor (weights and biases), the
empirical ``n * H`` of its symbols, plus 32 bits per scale, summed over tensors and averaged over
the workers. The scale rules (columns):

* ``worker``: each worker's own max-norm per tensor; the authors' ``qsg_quantizer.py`` (QSGD,
  ``num-levels`` 1, no bucket) and ``dithered_quantizer.py`` (DQSGD). At the first checkpoint
  gradzip's registered ``qsgd`` (``s=1``) and ``dqsg`` (``M=1``) compressors repeat it (the
  ``entropy_bits`` of their payloads), as a check that the rule is the library's.
* ``shared``: one scale per tensor, the maximum of the workers' max-norms; the option the authors'
  ``ternary_quantizer.py`` names ("infinity norm or max of all workers").
* ``worker-clip`` / ``shared-clip``: Wen et al.'s TernGrad, each worker's tensor clipped to
  ``+-2.5 std`` first, its own or the shared maximum as the scale.
* ``worker-rows``: the authors' bucketed variant (``bucket-size`` ``[[300, 300, 100], [300, 100,
  10]]`` for FC-300-100, ``[[400, 400, 512, 512], [32, 64, 512, 10]]`` for LeNet; one scale per
  bucket of a tensor's flattened entries).

The last rows print the mean over the checkpoints (the authors record the entropy at every
iteration of 5 epochs; the paper does not say which iterations its figure averages) and that mean
against the paper's DQSGD / QSGD / TernGrad cells. Expected run time on a 2-core CPU: FC-300-100
5 epochs about 1 minute; LeNet 1 epoch several minutes.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)

from gradzip.accounting import empirical_entropy_bits
from gradzip.compressors import create
from gradzip.data.batches import EpochBatches
from gradzip.data.datasets import load_dataset
from gradzip.keys import StreamKey
from gradzip.models.paper import build_model

#: the paper's Table 2 (Kbit per worker per iteration, 32 workers): DQSGD, QSGD, TernGrad
PAPER = {"fc-300-100": (38.6, 38.2, 48.23), "lenet": (299.7, 307.3, 438.2)}
#: the authors' bucket sizes per parameter tensor, in ``parameters()`` order (weight, bias, ...)
ROW_BUCKETS = {
    "fc-300-100": (300, 300, 300, 100, 100, 10),
    "lenet": (400, 32, 400, 64, 512, 512, 512, 10),
}
#: Wen et al.'s clipping, in standard deviations of the tensor
CLIP_SIGMA = 2.5
SCALE_BITS = 32
RULES = ("worker", "shared", "worker-clip", "shared-clip", "worker-rows")
CODECS = (("qsgd codec", "qsgd", {"s": 1, "norm": "max"}), ("dqsg codec", "dqsg", {"M": 1}))

Grads = list[list[torch.Tensor]]  # [worker][tensor], flattened


def clipped(g: torch.Tensor) -> torch.Tensor:
    """``g`` clipped to ``+-CLIP_SIGMA * std(g)`` (population std); unchanged if ``std == 0``."""
    bound = CLIP_SIGMA * float(g.double().std(unbiased=False))
    return g.clamp(-bound, bound) if bound > 0 else g


def ternary_bits(g: torch.Tensor, scale: torch.Tensor, gen: torch.Generator) -> float:
    """``n * H`` of one ternary message of ``g`` (one scale per row of ``g``, a 2-D view)."""
    p = torch.where(scale > 0, g.abs() / scale.clamp(min=1e-38), torch.zeros_like(g))
    sent = torch.rand(g.shape, generator=gen) < p.clamp(max=1.0)
    symbols = (torch.sign(g) * sent + 1).to(torch.uint8)
    return empirical_entropy_bits(symbols)


def rule_bits(rule: str, grads: Grads, buckets: Sequence[int], gen: torch.Generator) -> float:
    """Mean over the workers of one message's entropy bits (symbols plus 32 bits per scale)."""
    tensors = [
        [clipped(g) for g in per_worker] if rule.endswith("-clip") else per_worker
        for per_worker in grads
    ]
    total = 0.0
    for t in range(len(tensors[0])):
        rows = buckets[t] if rule == "worker-rows" else tensors[0][t].numel()
        views = [w[t].view(-1, rows) for w in tensors]
        maxima = [v.abs().amax(dim=1, keepdim=True) for v in views]
        if rule.startswith("shared"):
            shared = torch.stack(maxima).amax(dim=0)
            maxima = [shared] * len(views)
        for v, scale in zip(views, maxima, strict=True):
            total += ternary_bits(v, scale, gen) + SCALE_BITS * scale.numel()
    return total / len(grads)


def codec_bits(codec: str, params: dict[str, float], grads: Grads, step: int) -> float:
    """Mean over the workers of the ``entropy_bits`` of gradzip's ``codec`` (one scale per
    tensor), each tensor sent under its own stream key as in a training step."""
    compressor = create(codec, **params, bucket_size=None)
    total = 0.0
    for rank, per_worker in enumerate(grads):
        for t, g in enumerate(per_worker):
            key = StreamKey(run_seed=0, rank=rank, step=step, tensor_index=t)
            total += compressor.encode(g, key).entropy_bits
    return total / len(grads)


def worker_gradients(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, workers: int
) -> Grads:
    """Each worker's flattened gradients on its slice of the batch (mean cross-entropy)."""
    out: Grads = []
    for xk, yk in zip(x.chunk(workers), y.chunk(workers), strict=True):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(xk), yk).backward()
        out.append([p.grad.detach().reshape(-1).clone() for p in model.parameters()])  # type: ignore[union-attr]
    return out


def measure(args: argparse.Namespace, report: Callable[[str], None]) -> None:
    data = load_dataset("mnist")
    model = build_model(args.model, args.seed)
    total_batch = args.per_worker_batch * args.workers
    batches = EpochBatches(len(data.train_y), total_batch, args.workers, args.seed)
    steps = round(args.epochs * batches.steps_per_epoch)
    marks = sorted(
        {round(i * steps / max(args.checkpoints - 1, 1)) for i in range(args.checkpoints)}
    )
    columns = RULES
    report(
        f"{args.model}: {args.workers} workers x {args.per_worker_batch} examples, plain GD lr "
        f"{args.lr} x {args.lr_decay}/epoch ({batches.steps_per_epoch} iterations), {steps} "
        "iterations; Kbit per worker per iteration"
    )
    report(f"{'iteration':>9} {'epoch':>6} " + " ".join(f"{c:>11}" for c in columns))
    gen = torch.Generator().manual_seed(args.seed)
    sums = dict.fromkeys(columns, 0.0)
    started = time.perf_counter()
    for step in range(steps + 1):
        epoch, within = divmod(step, batches.steps_per_epoch)
        idx = batches.indices(epoch, within).reshape(-1)
        x, y = data.train_x[idx], data.train_y[idx]
        if step in marks:
            grads = worker_gradients(model, x, y, args.workers)
            row = {rule: rule_bits(rule, grads, ROW_BUCKETS[args.model], gen) for rule in RULES}
            for c in columns:
                sums[c] += row[c]
            report(
                f"{step:>9} {step / batches.steps_per_epoch:>6.2f} "
                + " ".join(f"{row[c] / 1000:>11.1f}" for c in columns)
            )
            if step == 0:
                check = ", ".join(
                    f"{label} {codec_bits(codec, params, grads, step) / 1000:.1f}"
                    for label, codec, params in CODECS
                )
                report(f"{'':>16} (the worker rule by gradzip's compressors: {check})")
            with torch.no_grad():  # step on the mean of the workers' gradients
                for k, p in enumerate(model.parameters()):
                    p.grad = torch.stack([w[k] for w in grads]).mean(0).view_as(p)
        else:
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
        if step == steps:
            break
        lr = args.lr * args.lr_decay**epoch
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad  # type: ignore[operator]
    means = {c: sums[c] / len(marks) / 1000 for c in columns}
    report(f"{'mean':>16} " + " ".join(f"{means[c]:>11.1f}" for c in columns))
    for label, paper in zip(("DQSGD", "QSGD", "TernGrad"), PAPER[args.model], strict=True):
        cells = " ".join(f"{100 * (means[c] / paper - 1):>+10.1f}%" for c in columns)
        report(f"{'vs ' + label + f' {paper:g}':>16} {cells}")
    report(f"({time.perf_counter() - started:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(PAPER), default="fc-300-100")
    parser.add_argument("--epochs", type=float, default=5.0)
    parser.add_argument("--checkpoints", type=int, default=11)
    parser.add_argument("--per-worker-batch", type=int, default=6)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--lr-decay", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    measure(args, lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
