"""What a training step exchanges, and the parts every training method builds it from: the
configured compressor, scheme and :class:`~gradzip.sync.GradientSync`, a rank's bits, and
:class:`Exchanged`, the result of one step's exchange.

It sits below both the trainer and the training methods
(:mod:`gradzip.experiments.methods`), so a method can build its exchange without importing
the trainer, and the configuration (which names the methods) imports neither.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

import gradzip
from gradzip.comm.transport import Transport
from gradzip.compressors.base import Compressor
from gradzip.errors import ConfigError
from gradzip.experiments.traffic import step_traffic
from gradzip.schemes import make_scheme
from gradzip.schemes.base import Scheme
from gradzip.simulation.workers import WorkerStep
from gradzip.sync import GradientSync

if TYPE_CHECKING:  # read as data only; the configuration imports the methods, which import this
    from gradzip.experiments.config import TrainConfig


def make_compressor(config: TrainConfig, name: str | None = None, **overrides: Any) -> Compressor:
    """The configured compressor (``packing="entropy"`` when entropy coding is on)."""
    params = {**config.compressor_params, **overrides} if name is None else dict(overrides)
    if config.entropy:
        params["packing"] = "entropy"
    codec = name or config.compressor
    try:
        cls = gradzip.get(codec)
    except (KeyError, ValueError) as err:
        raise ConfigError(f"compressor {codec!r}: {err}") from err
    keys = [p.name for p in keyword_parameters(cls)]
    unknown = sorted(set(params) - set(keys))
    if unknown:
        raise ConfigError(
            f"compressor {codec!r} has no parameter {', '.join(map(repr, unknown))}; "
            f"its parameters: {', '.join(keys) or 'none'}"
        )
    try:
        return cls(**params)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"compressor {codec!r}: {err}") from err


def keyword_parameters(target: Callable[..., Any]) -> list[inspect.Parameter]:
    """The named keyword parameters of ``target`` (a class: of its ``__init__``), no ``self``,
    ``*args`` or ``**kwargs``: the keys a compressor, scheme or ``--param`` target takes."""
    function = target.__init__ if isinstance(target, type) else target  # type: ignore[misc]
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        p
        for p in inspect.signature(function).parameters.values()
        if p.name != "self" and p.kind in kinds
    ]


def make_sync(config: TrainConfig, transport: Transport) -> GradientSync:
    """One rank's synchronisation object for ``config``."""
    return GradientSync(transport, scheme=scheme_for_config(config))


def scheme_for_config(config: TrainConfig) -> Scheme:
    """The configured scheme around the configured compressor (each rank builds its own)."""
    options = dict(config.scheme_params)
    if config.resolved_scheme().startswith("nested") and "coarse" not in options:
        # the paper's P1 workers: DQSG with Delta = 1/2 (spec 1.10, Figure 5)
        # its scales bucketed as the fine compressor's (the nested decoder pairs them)
        bucket = {k: v for k, v in config.compressor_params.items() if k == "bucket_size"}
        options["coarse"] = make_compressor(config, "dqsg", M=2, **bucket)
    try:
        scheme = make_scheme(
            config.resolved_scheme(),
            make_compressor(config),
            run_seed=config.seed,
            error_feedback=config.error_feedback,
            **options,
        )
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        if isinstance(err, TypeError) and "unexpected keyword" in str(err):
            from gradzip.schemes import SchemeSpec

            cls = SchemeSpec.parse(config.resolved_scheme()).scheme_class
            skip = ("compressor", "run_seed")
            valid = [p.name for p in keyword_parameters(cls) if p.name not in skip]
            raise ConfigError(
                f"scheme {config.resolved_scheme()!r}: {err}; its parameters (--scheme-param): "
                f"{', '.join(valid)}"
            ) from err
        raise ConfigError(f"scheme {config.resolved_scheme()!r}: {err}") from err
    return scheme


def rank_bits(sync: GradientSync, step: int) -> dict[str, float | None]:
    """This rank's bits for ``step``: its own payloads (wire, paper, entropy) and everything it
    sent and received as counted by its transport (:mod:`gradzip.experiments.traffic`)."""
    produced = list(sync.scheme.produced.values())
    traffic = step_traffic(sync.transport.meter, step)
    if not produced:  # schemes that never send a whole compressor payload (integer sums)
        return {"wire_bits": None, "paper_bits": None, "entropy_bits": None, **traffic}
    return {
        "wire_bits": float(sum(e.wire_bits for e in produced)),
        "paper_bits": float(sum(e.paper_bits for e in produced)),
        "entropy_bits": float(sum(e.entropy_bits for e in produced)),
        **traffic,
    }


@dataclass
class Exchanged:
    """What one step's exchange returns: the averaged gradients, every rank's bits, and the
    workers' losses (rank order) and correct predictions, gathered over all workers. A
    training method that computes the new parameters itself (``--method qesgd``) returns them
    as ``params`` instead of ``means``, and no optimizer step is taken."""

    means: list[torch.Tensor] | None
    bits: list[dict[str, float | None]]
    losses: list[float]
    correct: int
    params: list[torch.Tensor] | None = None
    #: whether the run stops after this step (a signal asked it to); the same on every rank
    stop: bool = False


Exchange = Callable[[int, WorkerStep], Exchanged]
