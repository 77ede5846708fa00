"""Do the max-norm quantizers' defaults train a wide model? Dryden's 784-4096-4096-4096-10 MLP
(``dryden-mlp``, 36.8M parameters, He initialisation) trained through gradzip's DDP hook on 2
gloo ranks, plain SGD lr 0.1, batch 32 per rank of real MNIST (the same batches every run), for
``--steps`` steps: each compressor once with its default (512-entry buckets) and once
with the papers' one scale per tensor (``bucket_size=None``), beside fp32.

Run: ``.venv/bin/python benchmarks/wide_mlp_defaults.py [--steps 7]`` (a few minutes on 2
cores). Prints, per configuration, the loss at the first and the last step and the bytes each
rank sent per step as counted by the transport.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import gradzip
from gradzip.comm.spawn import run_processes
from gradzip.comm.transport import Transport
from gradzip.data.datasets import load_dataset
from gradzip.integrations.ddp import register_gradzip_hook
from gradzip.models.paper import build_model
from gradzip.schemes import make_scheme

#: (label, compressor, params, scheme)
CONFIGS: list[tuple[str, str, dict[str, Any], str]] = [
    ("fp32", "identity", {}, "allgather"),
    ("dqsg M=2 default", "dqsg", {"M": 2}, "allgather"),
    ("dqsg M=2 per tensor", "dqsg", {"M": 2, "bucket_size": None}, "allgather"),
    ("qsgd default", "qsgd", {}, "allgather"),
    ("qsgd per tensor", "qsgd", {"bucket_size": None}, "allgather"),
    ("terngrad default", "terngrad", {}, "allgather"),
    ("terngrad per tensor", "terngrad", {"bucket_size": None}, "allgather"),
]


def train(transport: Transport, steps: int) -> list[dict[str, Any]]:
    data = load_dataset("MNIST")
    rows_of_rank = slice(32 * transport.rank, 32 * (transport.rank + 1))
    x, y = data.train_x[rows_of_rank], data.train_y[rows_of_rank]
    rows = []
    for label, name, params, scheme in CONFIGS:
        net = build_model("dryden-mlp", seed=0)  # the same weights on both ranks
        ddp = DistributedDataParallel(net)
        compressor = gradzip.create(name, **params)
        register_gradzip_hook(ddp, make_scheme(scheme, compressor, run_seed=0), transport)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        sent_before = transport.meter.total().sent
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        sent = (transport.meter.total().sent - sent_before) / steps
        rows.append({"label": label, "losses": losses, "sent_bytes_per_step": sent})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=7)
    args = parser.parse_args()
    ranks = run_processes(2, train, args.steps, timeout=600.0)
    print(
        f"{'configuration':<22} {'loss, step 1':>12} {'loss, last':>12} {'MB sent/rank/step':>18}"
    )
    for row0, row1 in zip(ranks[0], ranks[1], strict=True):
        first = (row0["losses"][0] + row1["losses"][0]) / 2
        last = (row0["losses"][-1] + row1["losses"][-1]) / 2
        sent = (row0["sent_bytes_per_step"] + row1["sent_bytes_per_step"]) / 2 / 1e6
        print(f"{row0['label']:<22} {first:>12.4g} {last:>12.4g} {sent:>18.2f}")


if __name__ == "__main__":
    main()
