"""What a training step costs on the wire, every byte counted: the workers' own uplink payloads
and the bytes each rank sent and received as counted by its transport, beside fp32 ring
all-reduce at the same P.

Per rank, per step (from :class:`~gradzip.comm.meter.ByteMeter`): ``sent_bits`` and
``received_bits`` count every message of the step (payloads, their 8-byte length prefixes, a
server's downlinks, the finite-gradient agreement flags, headers and CRCs). Over the ranks a
row keeps the mean and the maximum (a parameter server sends far more than its workers, and the
busiest rank bounds the step time).

The fp32 reference is what a bandwidth-optimal ring all-reduce of ``d`` float32 values makes
each rank send, and receive: ``2 (P - 1) / P * 32 d`` bits (reduce-scatter then all-gather).
(``32 d`` alone, the figure the papers compare against, is one worker's uplink.)
"""

from __future__ import annotations

from gradzip.comm.meter import ByteMeter

#: the per-rank fields a step row averages over the ranks and also keeps the maximum of
RANK_TOTALS = ("sent_bits", "received_bits")


def step_traffic(meter: ByteMeter, step: int) -> dict[str, float]:
    """Bits this rank sent and received in ``step``, every message included."""
    total = meter.total(step=step)
    return {"sent_bits": float(8 * total.sent), "received_bits": float(8 * total.received)}


def fp32_ring_allreduce_bits(parameters: int, workers: int) -> float:
    """Bits each rank sends (and receives) per step in a ring all-reduce of ``parameters``
    float32 values over ``workers`` ranks: ``2 (P - 1) / P * 32 d``."""
    return 2.0 * (workers - 1) / workers * 32.0 * parameters


def combine_ranks(per_rank: list[dict[str, float | None]]) -> dict[str, float | None]:
    """One row's bits from every rank's: the mean of each field (None if any rank has none),
    and ``<field>_max`` for the transport totals."""
    out: dict[str, float | None] = {}
    for key in per_rank[0]:
        values = [r[key] for r in per_rank]
        present = [v for v in values if v is not None]
        out[key] = None if len(present) < len(values) else sum(present) / len(present)
        if key in RANK_TOTALS:
            out[f"{key}_max"] = None if len(present) < len(values) else max(present)
    return out
