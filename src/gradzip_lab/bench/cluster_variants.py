"""The variants ``gradzip bench cluster`` compares: a data table, and how each is put on DDP.

Every variant trains its own copy of the model (same initial weights, same batches) wrapped in
its own ``DistributedDataParallel`` over its own gloo process group (``dist.new_group``), so no
variant's collectives can interleave with another's. To add a gradzip configuration, add a row
to :data:`VARIANT_TABLE`; its name is its :class:`~gradzip.schemes.spec.ExchangeSpec`,
``gradzip:<compressor>[<params>][+ef]:<scheme spec>`` (e.g.
``gradzip:topk[ratio=0.01,index_coding=rice,value_codec=qsgd]+ef:allgather``), which is also how
``--variants`` names any other gradzip configuration.

* ``none``: a hook that hands back the rank's own gradient at once (no communication): the
  compute time of a step (forward, backward, DDP's bucketing, the optimizer).
* ``fp32``: DDP without a hook (its own bucketed, asynchronous float32 all-reduce).
* ``fp16_hook``: ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook``.
* ``powersgd_r1``, ``powersgd_r4``: PyTorch's ``powerSGD_hook`` (rank 1 or 4, error feedback and
  warm start on, ``start_powerSGD_iter=2`` so the warm-up steps cover its two vanilla all-reduce
  iterations and every timed step is compressed; ``min_compression_rate=2``, the default, so
  small tensors such as biases are all-reduced uncompressed). [CHOICE] How it is run: its stock
  hook issues the second and later collectives of a bucket from future callbacks on gloo's
  thread, which deadlocked gloo when other variants' steps were interleaved. Here it has its own
  process group AND the wrapper :func:`waited_powersgd_hook` waits for each bucket's future
  before returning a completed one, so every rank issues the same collectives in the same
  order; the price is that PowerSGD's communication no longer overlaps the rest of backward.
* ``gradzip:...``: :func:`gradzip.integrations.ddp.register_gradzip_hook` with the scheme over a
  :class:`~gradzip.comm.distributed.DistributedTransport` on the variant's own group; its meter
  counts the payload bytes (reported beside the measured wire bytes).

[CHOICE] Best scheme per compressor, chosen from the step times of every scheme on this cluster
(fc-300-100, P = 2, 100 Mbit/s): the all-gather is the default for every quantizer (nested
all-gather for ndqsg) but onebit, which keeps the ring: its bytes per rank stay 2(P-1)/P of a
payload as P grows where the all-gather's grow like P - 1. The other schemes stay in the table as
non-default rows (run them by name with ``--variants``) to re-check at P = 4 and after transport
changes.
"""

# [CHOICE] no ``from __future__ import annotations``: DDP's ``register_comm_hook`` compares a
# hook's ``bucket`` annotation with the class ``GradBucket`` itself, and refuses a string.
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed import GradBucket  # type: ignore[attr-defined]  # re-exported by torch

if TYPE_CHECKING:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from gradzip.comm.meter import ByteMeter
    from gradzip.schemes.spec import ExchangeSpec

RUN_SEED = 2024


@dataclass(frozen=True)
class Variant:
    """One row of the comparison. ``kind`` is ``none``, ``fp32``, ``fp16_hook``, ``powersgd``
    or ``gradzip``; the other fields are the kind's settings."""

    kind: str
    compressor: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    scheme: str = ""  # a scheme spec (gradzip.schemes.spec), e.g. powersgd[r1,start2]
    error_feedback: bool = False
    rank: int = 0  # PowerSGD's matrix approximation rank
    default: bool = True  # run without --variants (False: alternatives, run when named)

    @classmethod
    def of_spec(cls, text: str) -> "Variant":
        """The gradzip variant that ``text`` (an exchange spec) names, not a default one."""
        from gradzip.schemes.spec import ExchangeSpec

        spec = ExchangeSpec.parse(text)
        return cls(
            "gradzip",
            spec.compressor,
            dict(spec.params),
            str(spec.scheme),
            spec.error_feedback,
            default=False,
        )

    @property
    def spec(self) -> "ExchangeSpec":
        """A gradzip variant's compressor, parameters, error feedback and scheme."""
        from gradzip.schemes.spec import ExchangeSpec

        return ExchangeSpec.of(self.compressor, self.params, self.error_feedback, self.scheme)

    @property
    def name(self) -> str:
        if self.kind == "gradzip":
            return str(self.spec)
        if self.kind == "powersgd":
            return f"powersgd_r{self.rank}"
        return self.kind


VARIANT_TABLE: tuple[Variant, ...] = (
    Variant("none"),
    Variant("fp32"),
    Variant("fp16_hook"),
    Variant("powersgd", rank=1),
    Variant("powersgd", rank=4),
    Variant("gradzip", "dqsg", {"M": 2}, "allgather"),
    Variant("gradzip", "ndqsg", {}, "nested[allgather]"),
    Variant("gradzip", "qsgd", {}, "allgather"),
    Variant("gradzip", "terngrad", {}, "allgather"),
    # all-gather: one compression with the fused error-feedback step (the ring compresses twice
    # and keeps two residuals; at P = 2 it sent as much and stepped 974 against 443 ms)
    Variant("gradzip", "onebit", {}, "allgather", error_feedback=True),
    Variant("gradzip", "topk", {"ratio": 0.01}, "allgather", error_feedback=True),
    # the sub-bit top-k: Rice-coded index gaps and one-level QSGD values (about 10 bits a kept
    # value against 56: compressors/_sparse_coding.py)
    Variant(
        "gradzip",
        "topk",
        {"ratio": 0.01, "index_coding": "rice", "value_codec": "qsgd"},
        "allgather",
        error_feedback=True,
    ),
    # PowerSGD inside gradzip (its own error feedback; the factors as fp16 payloads: half the
    # bytes of torch's hook at the same rank), its first two steps uncompressed as torch's
    # (start_powerSGD_iter=2): both sides train the same warm-up steps alike
    Variant("gradzip", "fp16", {}, "powersgd[r1,start2]", error_feedback=True),
    Variant("gradzip", "fp16", {}, "powersgd[r1]", error_feedback=True, default=False),
    Variant("gradzip", "identity", {}, "powersgd[r1,start2]", error_feedback=True, default=False),
    Variant("gradzip", "fp16", {}, "powersgd[r4]", error_feedback=True, default=False),
    # the factors as 8-bit QSGD codes summed exactly by a ring (the all-reduce-compatible
    # integer sums): fewer bytes than all-gathered factors from P = 3 on, more rounds
    Variant(
        "gradzip",
        "qsgd",
        {"s": 127},
        "powersgd[r1,allreduce,start2]",
        error_feedback=True,
        default=False,
    ),
    # the other schemes each compressor fits, to compare when named with --variants
    Variant("gradzip", "dqsg", {"M": 2}, "ring", default=False),
    Variant("gradzip", "dqsg", {"M": 2}, "allreduce", default=False),
    Variant("gradzip", "ndqsg", {}, "nested[server]", default=False),
    Variant("gradzip", "qsgd", {}, "allreduce", default=False),
    Variant("gradzip", "qsgd", {}, "ring", default=False),
    Variant("gradzip", "terngrad", {}, "allreduce", default=False),
    Variant("gradzip", "terngrad", {}, "ring", default=False),
    Variant("gradzip", "onebit", {}, "ring", error_feedback=True, default=False),
    Variant(
        "gradzip",
        "topk",
        {"ratio": 0.001, "index_coding": "rice", "value_codec": "qsgd"},
        "allgather",
        error_feedback=True,
        default=False,
    ),
)

VARIANTS_BY_NAME: dict[str, Variant] = {v.name: v for v in VARIANT_TABLE}


def select(names: list[str] | None) -> list[Variant]:
    """The variants called ``names`` (table order kept, then any other gradzip exchange spec
    in the order given; the default ones for None). ``ValueError`` naming the unknown ones and
    the choices."""
    if not names:
        return [v for v in VARIANT_TABLE if v.default]
    extra: list[Variant] = []
    unknown = []
    for n in names:
        if n in VARIANTS_BY_NAME:
            continue
        try:
            variant = Variant.of_spec(n) if n.startswith("gradzip:") else None
        except ValueError:
            variant = None
        if variant is None:
            unknown.append(n)
        elif variant.name in VARIANTS_BY_NAME:  # the same spec written another way
            names = [*names, variant.name]
        elif variant.name not in {v.name for v in extra}:
            extra.append(variant)
    if unknown:
        raise ValueError(
            f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS_BY_NAME)} "
            "or write gradzip:<compressor>[<params>][+ef]:<scheme>"
        )
    return [v for v in VARIANT_TABLE if v.name in names] + extra


def local_gradient_hook(_: object, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The ``none`` variant's hook: the bucket's own gradient, no communication."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def waited_powersgd_hook(state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """PyTorch's ``powerSGD_hook``, waited for before returning (see the module docstring)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

    result = powerSGD_hook(state, bucket).wait()
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(result)
    return future


def attach(
    variant: Variant,
    ddp: "DistributedDataParallel",
    group: "dist.ProcessGroup",
    timeout: float,
    ring_gather_from: int | None = None,
    segment_from: int | None = None,
) -> "ByteMeter | None":
    """Register ``variant``'s hook on ``ddp`` (its process group ``group``); returns the gradzip
    byte meter of a gradzip variant, else None. ``ring_gather_from``, ``segment_from``: the
    gradzip transport's (:class:`~gradzip.comm.distributed.DistributedTransport`)."""
    if variant.kind in ("none", "fp32"):
        if variant.kind == "none":
            ddp.register_comm_hook(None, local_gradient_hook)
        return None
    if variant.kind == "fp16_hook":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

        ddp.register_comm_hook(group, fp16_compress_hook)
        return None
    if variant.kind == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

        state = PowerSGDState(
            process_group=group,
            matrix_approximation_rank=variant.rank,
            start_powerSGD_iter=2,
            use_error_feedback=True,
            warm_start=True,
            random_seed=RUN_SEED,
        )
        ddp.register_comm_hook(state, waited_powersgd_hook)
        return None
    if variant.kind == "gradzip":
        from gradzip.comm.distributed import DistributedTransport
        from gradzip.integrations.ddp import register_gradzip_hook

        scheme = variant.spec.build(RUN_SEED)
        transport = DistributedTransport(
            group=group,
            timeout=timeout,
            ring_gather_from=ring_gather_from,
            segment_from=segment_from,
        )
        hook_state = register_gradzip_hook(ddp, scheme, transport=transport)
        return hook_state.transport.meter
    raise ValueError(f"unknown variant kind {variant.kind!r}")
