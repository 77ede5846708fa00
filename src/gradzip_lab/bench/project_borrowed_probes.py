"""Link probes lent to the cluster rows whose own file has none.

The link probe (:mod:`gradzip_lab.bench.cluster_probe`) measures what the alpha-beta model
cannot know of the emulated links: the all-to-all's byte rate against the ring's, and the
latency of one small collective with every rank of the machine on its cores (0.3 ms a message
at P = 2, 1 ms at P = 4, 6 ms a collective at P = 8, two orders of magnitude over the 30 us a
message the model assumes without a probe). Files written before the probe existed ran on the
same links: [CHOICE] a row without its own figure takes the newest one measured at the same
world size, rate, ranks a node and CPU (each figure on its own: a file may hold the efficiency
but not the latency), and the validation table marks it borrowed. A row whose configuration was
never probed keeps the defaults.
"""

from __future__ import annotations

from dataclasses import replace

from gradzip_lab.bench.project_rows import MeasuredRow

#: the fields a probe gives a row
_PROBED = ("alltoall_efficiency", "probed_alpha_s")


def _link_key(row: MeasuredRow) -> tuple[int, str, int, str]:
    return (row.world_size, row.rate, row.ranks_per_node, row.cpu)


def lend_probes(rows: list[MeasuredRow]) -> list[MeasuredRow]:
    """``rows`` with each missing probe figure taken from the newest row of the same links that
    has it (:data:`MeasuredRow.probe_borrowed` set on the rows that took one)."""
    newest: dict[tuple[tuple[int, str, int, str], str], float] = {}
    for row in sorted(rows, key=lambda r: r.measured_at):  # a later row's figure replaces
        for name in _PROBED:
            value = getattr(row, name)
            if value is not None:
                newest[_link_key(row), name] = value
    lent: list[MeasuredRow] = []
    for row in rows:
        links = _link_key(row)
        efficiency = row.alltoall_efficiency
        if efficiency is None:
            efficiency = newest.get((links, "alltoall_efficiency"))
        alpha = row.probed_alpha_s
        if alpha is None:
            alpha = newest.get((links, "probed_alpha_s"))
        if (efficiency, alpha) != (row.alltoall_efficiency, row.probed_alpha_s):
            row = replace(
                row, alltoall_efficiency=efficiency, probed_alpha_s=alpha, probe_borrowed=True
            )
        lent.append(row)
    return lent
