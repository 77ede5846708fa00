"""What NDQSG costs and risks in Figure 5's setting, measured on real FC-300-100 gradients.

The Figure 5 runs report each run's mean over its workers; these helpers split the figures by
worker group and add what the runs cannot show:

* :func:`group_bits`: raw (log2-alphabet), wire and entropy bits of one DQSG ``M = 2`` worker,
  one nested worker, and one DQSG ``M = 3`` worker (the P1 setting of the authors' code), from
  :func:`~gradzip.experiments.gradient_bits.measure_bits` on one gradient (the raw and wire counts depend
  only on the shapes; the entropy is indicative, see that module);
* :func:`nested_failure_rate`: the share of the nested workers' coordinates decoded wrongly
  (spec 1.6), which the receiver cannot detect. It replays Algorithm 2 on ``workers`` gradients
  of one freshly initialised model, each on its own random batch (the decoding order and
  running-mean side information of :class:`~gradzip.schemes.nested.NestedScheme`), and
  compares every decoded tensor with the true one. At initialisation the workers' gradients
  differ more than late in training, so read the rate as indicative of its order of magnitude.
"""

from __future__ import annotations

import torch

from gradzip.compressors.buckets import papers_scales
from gradzip.compressors.dqsg import DQSG
from gradzip.compressors.ndqsg import NDQSG, failure_rate
from gradzip.experiments.gradient_bits import measure_bits, model_gradient
from gradzip.kernels.running_mean import update_running_mean_
from gradzip.keys import StreamKey
from gradzip.rng import text_generator
from gradzip.schemes.nested import NestedScheme

MODEL = "fc-300-100"
NESTED = {"L1": 3, "k": 3}


def group_bits(seed: int = 0) -> dict[str, dict[str, float]]:
    """Kbit per worker per iteration (``paper``, ``wire``, ``entropy``) for each group."""
    settings = {
        "DQSG M=2": ("dqsg", {"M": 2}),
        "DQSG M=3": ("dqsg", {"M": 3}),
        "nested (L1=3, k=3)": ("ndqsg", NESTED),
    }
    out = {}
    for label, (name, params) in settings.items():
        r = measure_bits(MODEL, name, papers_scales(name, params), seed=seed)
        out[label] = {
            "paper": r.paper_bits / 1000,
            "wire": r.wire_bits / 1000,
            "entropy": r.entropy_bits / 1000,
        }
    return out


def _gradients(workers: int, batch: int, seed: int) -> list[list[torch.Tensor]]:
    """One gradient per worker of the same freshly initialised model, each on its own batch."""
    return [
        model_gradient(MODEL, seed, batch, text_generator(f"gradzip-fig5-failures:{seed}:{rank}"))
        for rank in range(workers)
    ]


def nested_failure_rate(workers: int = 8, batch: int = 32, seed: int = 0) -> list[float]:
    """Per nested worker, the fraction of its coordinates decoded wrongly (all tensors)."""
    coarse = DQSG(**papers_scales("dqsg", {"M": 2}))
    nested = NDQSG(**papers_scales("ndqsg", NESTED))
    # the ranks Algorithm 2 splits off as P1, as the scheme itself does
    first = NestedScheme(nested, coarse=coarse).first_group(workers)
    grads = _gradients(workers, batch, seed)
    wrong = [0.0] * (workers - first)
    total = 0
    for t in range(len(grads[0])):
        mean = torch.zeros_like(grads[0][t])
        total += grads[0][t].numel()
        for rank in range(workers):
            g = grads[rank][t]
            key = StreamKey(run_seed=seed, rank=rank, step=0, tensor_index=t)
            codec = coarse if rank < first else nested
            side = None if rank < first else mean.clone()
            enc = codec.encode(g, key)
            g_hat = codec.decode(
                bytes(enc.payload), expected_key=key, shape=g.shape, dtype=g.dtype, side=side
            )
            if side is not None:
                rate = failure_rate(g, g_hat, side, L1=nested.L1, alpha=nested.alpha)
                wrong[rank - first] += rate * g.numel()
            update_running_mean_(mean, g_hat, rank + 1)
    return [w / total for w in wrong]
