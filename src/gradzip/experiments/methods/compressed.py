"""The default training method: compressed gradients. Each rank's gradient goes through the
configured scheme around the configured compressor (``--compressor``, ``--param``,
``--scheme``, ``--scheme-param``, ``--error-feedback``) in a
:class:`~gradzip.sync.GradientSync`, and every rank applies the same averaged gradient with
the configured optimizer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gradzip.comm.pool import RankPool
from gradzip.comm.transport import Transport
from gradzip.experiments.exchange import Exchanged, make_sync, rank_bits, scheme_for_config
from gradzip.experiments.methods.base import RankSetup, TrainingMethod, gather_metrics
from gradzip.experiments.stopping import StopRequest
from gradzip.simulation.workers import WorkerStep

if TYPE_CHECKING:  # types only: the configuration names the methods, the trainer runs them
    from gradzip.experiments.config import TrainConfig
    from gradzip.experiments.trainer import Trainer


class CompressedGradients(TrainingMethod):
    name = "compressed-gradients"
    summary = (
        "the compressor and scheme exchange the gradients, the optimizer applies their mean "
        "(the default)"
    )

    def preflight(self, config: TrainConfig) -> None:
        scheme_for_config(config)

    def run_label(self, config: TrainConfig) -> str:
        return config.compressor

    def record(self, config: TrainConfig) -> dict[str, Any]:
        return {"scheme": config.resolved_scheme()}

    def simulated(
        self, trainer: Trainer, pool: RankPool, states: list[Any] | None, stop: StopRequest
    ) -> RankSetup:
        syncs = [make_sync(trainer.config, transport) for transport in pool.transports]
        if states is not None:
            for sync, state in zip(syncs, states, strict=True):
                sync.load_state_dict(state)

        def exchange(step: int, out: WorkerStep) -> Exchanged:
            def on_rank(transport: Transport) -> tuple[list[Any], dict[str, float | None]]:
                sync = syncs[transport.rank]
                means = sync.synchronize([g[transport.rank] for g in out.grads])
                assert means is not None  # non-finite gradients raise (the default)
                return means, rank_bits(sync, step)

            results = pool.run(on_rank)
            return Exchanged(
                results[0][0],
                [r[1] for r in results],
                [float(v) for v in out.loss],
                int(out.correct.sum()),
                stop=stop.requested,
            )

        return RankSetup(exchange, lambda: [sync.state_dict() for sync in syncs])

    def process(
        self, trainer: Trainer, transport: Transport, state: Any | None, stop: StopRequest
    ) -> RankSetup:
        sync = make_sync(trainer.config, transport)
        if state is not None:
            sync.load_state_dict(state)

        def exchange(step: int, out: WorkerStep) -> Exchanged:
            means = sync.synchronize([g[0] for g in out.grads])
            assert means is not None
            return Exchanged(means, **gather_metrics(transport, out, rank_bits(sync, step), stop))

        return RankSetup(exchange, sync.state_dict)
