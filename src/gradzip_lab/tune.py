"""``gradzip tune``: which variant to use on *your* link, codecs and model.

It measures what the scaling model (:mod:`gradzip_lab.bench.project_variants`) needs, on the
machines it runs on: the link's alpha and beta over the default process group
(:func:`gradzip_lab.tune_link.measure_link`, under ``torchrun``; or given: ``world_size`` and
``link``), the codecs on the model's parameter shapes (real payloads, timed encode and decode),
and a forward and backward of the model; then ranks every candidate variant by predicted step
time. The first is the recommendation, printed as a ready-to-paste DDP hook and as its
``gradzip bench cluster --variants`` spelling.

Python API::

    from gradzip_lab.tune import recommend
    ranked = recommend(model, sample_batch, world_size=16, link=Link(30e-6, 10.0))
    print(ranked[0].variant, snippet(ranked[0].variant))

[CHOICE] The candidates are the projection's flat variants (``ring_allreduce`` among them), and,
when the ranks sit ``K > 1`` to a node on at least two nodes (``local_world_size``: torchrun's
``LOCAL_WORLD_SIZE`` under ``gradzip tune``), ``gradzip:qsgd:hierarchical[ranks_per_node=K]``:
the DDP hook runs any scheme over the default process group (a scheme that does not pipeline
runs whole in the hook's transfer stage), so a hierarchical exchange is a hook like any other.
``hier[K]:`` (a ZeRO++-style design the library does not implement) is never a candidate. The
hierarchical candidate's node links are ``intra_link`` (default: the measured link, which
overstates its step where the node's own links are faster).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gradzip_lab.bench.project_codecs import compute_seconds
from gradzip_lab.bench.project_links import Link
from gradzip_lab.bench.project_models import parameter_shapes
from gradzip_lab.bench.project_variants import (
    DEFAULT_VARIANTS,
    Network,
    Prediction,
    Workload,
    predict,
)

#: the candidates whatever the node size (the flat variants)
CANDIDATES: tuple[str, ...] = tuple(
    v for v in DEFAULT_VARIANTS if not v.startswith("hier[") and ":hierarchical" not in v
)
#: the hierarchical candidate's spelling, for ``K`` ranks a node
HIERARCHICAL = "gradzip:qsgd:hierarchical[ranks_per_node={k}]"


def candidates(world_size: int, local_world_size: int = 1) -> tuple[str, ...]:
    """:data:`CANDIDATES`, plus :data:`HIERARCHICAL` when ``local_world_size`` ranks a node
    (``> 1``) divide ``world_size`` into at least two nodes."""
    k = local_world_size
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"the ranks per node must be a positive int, got {k!r}")
    if k > 1 and world_size % k == 0 and world_size >= 2 * k:
        return (*CANDIDATES, HIERARCHICAL.format(k=k))
    return CANDIDATES


def recommend(
    model: torch.nn.Module,
    sample_batch: torch.Tensor,
    world_size: int,
    link: Link,
    *,
    variants: Sequence[str] | None = None,
    local_world_size: int = 1,
    intra_link: Link | None = None,
    compute_s: float | None = None,
    overlap: float = 0.0,
    codec_numel: int = 1 << 21,
) -> list[Prediction]:
    """Every candidate's predicted step on ``world_size`` ranks joined by ``link``, fastest
    first. ``variants``: default :func:`candidates` for ``local_world_size`` ranks a node
    (whose node links are ``intra_link``, default ``link``). ``compute_s``: a forward and
    backward's seconds (default: timed on ``sample_batch`` here, the loss being the output's
    mean)."""
    if world_size < 2:
        raise ValueError(f"tuning needs a world size >= 2, got {world_size}")
    chosen = candidates(world_size, local_world_size) if variants is None else tuple(variants)
    seconds = compute_seconds(model, sample_batch) if compute_s is None else compute_s
    work = Workload(parameter_shapes(model), seconds, codec_numel=codec_numel)
    net = Network(link, link if intra_link is None else intra_link, overlap)
    return sorted((predict(v, work, world_size, net) for v in chosen), key=lambda r: r.step_s)


def snippet(variant: str) -> str:
    """Python that puts ``variant`` on a ``DistributedDataParallel`` model ``ddp``."""
    if variant == "fp32":
        return "# DDP's own float32 all-reduce: register no hook"
    if variant == "fp16_hook":
        return (
            "from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import "
            "fp16_compress_hook\nddp.register_comm_hook(None, fp16_compress_hook)"
        )
    if variant.startswith("powersgd_r"):
        rank = int(variant[len("powersgd_r") :])
        return (
            "from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps\n"
            f"state = ps.PowerSGDState(process_group=None, matrix_approximation_rank={rank}, "
            "start_powerSGD_iter=2)\nddp.register_comm_hook(state, ps.powerSGD_hook)"
        )
    if variant.startswith("gradzip:"):
        return (
            "from gradzip.integrations.ddp import register_gradzip_hook\n"
            "from gradzip.schemes.spec import ExchangeSpec\n"
            f"scheme = ExchangeSpec.parse({variant!r}).build(run_seed=0)\n"
            "state = register_gradzip_hook(ddp, scheme)"
        )
    raise ValueError(f"no snippet for variant {variant!r}")


def ranking_table(ranked: Sequence[Prediction]) -> str:
    """The ranked variants: predicted step, its comm and codec parts, MB a rank sends."""
    fp32 = next((r.step_s for r in ranked if r.variant == "fp32"), None)
    width = max(len(r.variant) for r in ranked)
    lines = [
        f"{'#':>2} {'variant':<{width}} {'step ms':>9} {'comm ms':>9} {'codec ms':>9} "
        f"{'MB/rank':>9} {'vs fp32':>8}"
    ]
    for i, r in enumerate(ranked, 1):
        gain = f"{fp32 / r.step_s:8.2f}" if fp32 else f"{'-':>8}"
        lines.append(
            f"{i:>2} {r.variant:<{width}} {1e3 * r.step_s:>9.1f} {1e3 * r.comm_s:>9.1f} "
            f"{1e3 * r.codec_s:>9.1f} {r.bytes_per_rank / 1e6:>9.3f} {gain}"
        )
    return "\n".join(lines)
