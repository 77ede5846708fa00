"""What ``gradzip tune`` runs on each rank (under ``torchrun``) or once (offline): measure,
rank, print on rank 0. Kept apart from :mod:`gradzip_lab.tune` (the Python API) because it owns
the process group's set-up and the printing."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gradzip.schemes.hierarchical import ranks_per_node_from_environment
from gradzip_lab.bench.project_links import Link
from gradzip_lab.bench.project_models import named_model
from gradzip_lab.tune import ranking_table, recommend, snippet
from gradzip_lab.tune_link import DEFAULT_SIZES_MB, LinkEstimate, measure_link


@dataclass(frozen=True)
class TuneResult:
    """What a tune run found: the link (measured or given), the best variant, the seconds."""

    link: Link
    measured: LinkEstimate | None
    best: str
    seconds: float


def tune(
    model_name: str,
    *,
    world_size: int | None = None,
    link_gbit: float | None = None,
    alpha_s: float = 30e-6,
    sizes_mb: Sequence[float] = DEFAULT_SIZES_MB,
    codec_numel: int = 1 << 21,
    local_world_size: int | None = None,
    intra_gbit: float | None = None,
    show: bool = True,
) -> TuneResult:
    """Measure (the link only when ``world_size`` and ``link_gbit`` are not given: then under
    an initialised default process group), rank the variants, print on rank 0.

    ``local_world_size``: the ranks of one node (default: torchrun's ``LOCAL_WORLD_SIZE``, else
    1), which adds the hierarchical candidate (:func:`gradzip_lab.tune.candidates`); its node
    links run at ``intra_gbit`` (default: the inter-rank link's rate) with the same alpha."""
    if local_world_size is None:
        local_world_size = ranks_per_node_from_environment()
    start = time.perf_counter()
    measured = None
    if world_size is None or link_gbit is None:
        measured = measure_link(sizes_mb)
        world_size = measured.world_size
        link = Link(
            measured.alpha_s,
            measured.gbit_per_s,
            # [CHOICE] an all-to-all faster than the ring is priced at the ring's rate
            alltoall_efficiency=min(1.0, measured.alltoall_efficiency),
        )
    else:
        link = Link(alpha_s, link_gbit)
    model, sample = named_model(model_name)
    intra = link if intra_gbit is None else Link(link.alpha_s, intra_gbit)
    ranked = recommend(
        model,
        sample,
        world_size,
        link,
        local_world_size=local_world_size,
        intra_link=intra,
        codec_numel=codec_numel,
    )
    seconds = time.perf_counter() - start
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if show and rank0:
        if measured is not None:
            print(
                f"link measured over {world_size} ranks: alpha {1e6 * measured.alpha_s:.1f} us, "
                f"{measured.gbit_per_s:.3f} Gbit/s (all-gathers of "
                + ", ".join(f"{b / 1e6:g}" for b, _ in measured.points)
                + f" MB; an all-reduce ran at {measured.allreduce_gbit_per_s:.3f} Gbit/s, an "
                f"all-to-all at {measured.alltoall_efficiency:.2f}x the all-gather's rate)"
            )
            if measured.rate_is_lower_bound:
                print(
                    "  the times did not grow with the sizes (the link is faster than they "
                    "resolve): the rate is the best throughput seen, a lower bound on the "
                    "link's"
                )
        else:
            print(
                f"link given: {world_size} ranks, {link_gbit:g} Gbit/s, alpha {1e6 * alpha_s:g} us"
            )
        print(f"{model_name}, predicted step per variant (alpha-beta model, codecs timed here):")
        print(ranking_table(ranked))
        best = ranked[0].variant
        print(f"\nuse: {best}   (gradzip bench cluster --variants '{best}')")
        print(snippet(best))
        print(f"tuned in {seconds:.1f} s")
    return TuneResult(link, measured, ranked[0].variant, seconds)


def tune_under_torchrun(model_name: str, backend: str, **kwargs: object) -> TuneResult:
    """Join the default process group from torchrun's environment, tune, leave it."""
    if "WORLD_SIZE" not in os.environ:
        raise ValueError(
            "no torchrun environment (WORLD_SIZE unset): run under torchrun, or give "
            "--world-size and --link-rate to tune offline"
        )
    torch.set_num_threads(1)
    dist.init_process_group(backend)
    try:
        return tune(model_name, **kwargs)  # type: ignore[arg-type]
    finally:
        dist.destroy_process_group()
