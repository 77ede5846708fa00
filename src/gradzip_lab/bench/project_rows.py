"""One measured row of a ``gradzip bench cluster`` file, as the scaling model's validation
reads it (:mod:`~gradzip_lab.bench.project_validate`) and lends it link probes
(:mod:`~gradzip_lab.bench.project_borrowed_probes`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MeasuredRow:
    """One row of a cluster file."""

    source: str
    model: str
    world_size: int
    rate: str
    bits_per_s: int | None
    variant: str
    step_ms: float
    compute_ms: float | None
    mb_per_rank: float | None
    cpu_count: int
    #: ranks sharing one node's namespace (its loopback unlimited)
    ranks_per_node: int = 1
    #: when the file was written (its ``machine.date``, else the manifest's date; "" unknown)
    measured_at: str = ""
    #: the CPU the file ran on ("" unknown)
    cpu: str = ""
    #: the run's ``--ring-gather-from`` (None: the transport's default, every gather an
    #: all-to-all)
    ring_gather_from: int | None = None
    #: the link probe's all-to-all efficiency at this P and rate (None: the file has no probe)
    alltoall_efficiency: float | None = None
    #: the link probe's latency of one small all-to-all over ``P - 1``: seconds a message
    #: (None: the file has no latency probe)
    probed_alpha_s: float | None = None
    #: the run's ``--segment-from`` (None: one all-to-all per slot exchange)
    segment_from: int | None = None
    #: whether a probe figure was lent by another file's row of the same links
    #: (:func:`~gradzip_lab.bench.project_borrowed_probes.lend_probes`)
    probe_borrowed: bool = False

    @property
    def configuration(self) -> tuple[str, int, str, str, int, int | None, int | None]:
        """What a later measurement of the same thing shares: model, P, rate, variant, K and
        the transport's gather form and segmenting."""
        segments = self.segment_from if self.variant.startswith("gradzip:") else None
        return (
            self.model,
            self.world_size,
            self.rate,
            self.variant,
            self.ranks_per_node,
            self.gathers,
            segments,
        )

    @property
    def gathers(self) -> int | None:
        """The transport's ``ring_gather_from`` where it applies (a gradzip variant), else None
        (torch's variants are DDP's own collectives, whatever the file set)."""
        return self.ring_gather_from if self.variant.startswith("gradzip:") else None
