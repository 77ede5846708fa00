"""Which rank processes ``gradzip bench cluster`` starts, and which variants each runs.

Two modes (``--mode``):

* ``isolated`` [CHOICE: the default, the mode of every headline figure]: each variant trains in
  rank processes of its own, started for it alone (a launch per variant), one variant after
  another on the same link, from the same seeds on the same batches: what a user sees who
  trains with one configuration. Nothing else lives in the processes' memory, and nothing else
  allocates or frees between its steps.
* ``interleaved``: every variant in the same rank processes (one launch; chunked by memory,
  :func:`gradzip_lab.bench.cluster.chunks`), their steps alternating step by step, so that a drift
  of the machine's load reaches all alike. It stays for comparisons where drift matters more
  than the processes' state; but with many model copies resident it favoured hooks that
  recycle their buffers over hooks that allocate afresh each step (gradzip's PowerSGD against
  torch's, the more so the more variants were interleaved).
* ``both``: each round runs the interleaved launch and the isolated launches, so the report can
  set the two modes' ratios side by side.

``--rounds N`` repeats the whole plan; round ``r`` takes the variants in the selected order
rotated by ``r`` (so over ``N >= number of variants`` rounds each variant runs once in each
position; with two variants the order alternates), and in ``both`` mode the two modes swap
places every round. A variant's figures pool the timed steps of all its launches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

ISOLATED, INTERLEAVED, BOTH = "isolated", "interleaved", "both"
MODES = (ISOLATED, INTERLEAVED, BOTH)


@dataclass(frozen=True)
class Launch:
    """One start of the ``P`` rank processes: its mode, its round (from 0), and the chunks of
    variant names the ranks run (:attr:`RankConfig.variants`: one chunk of one name when
    isolated)."""

    mode: str
    round: int
    chunks: tuple[tuple[str, ...], ...]

    @property
    def names(self) -> list[str]:
        """The variants this launch trains, in order."""
        return [name for chunk in self.chunks for name in chunk]


def modes_of(mode: str) -> list[str]:
    """The measuring modes ``mode`` runs (``both``: interleaved and isolated)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose {', '.join(MODES)}")
    both = (INTERLEAVED, ISOLATED)  # interleaved first in each round, then each alone
    return list(both) if mode == BOTH else [mode]


def rotated(names: list[str], round_index: int) -> list[str]:
    """``names`` rotated left by ``round_index`` (modulo their number)."""
    if not names:
        return []
    k = round_index % len(names)
    return names[k:] + names[:k]


def plan_launches(
    names: list[str],
    mode: str,
    rounds: int,
    chunker: Callable[[list[str]], list[list[str]]],
) -> list[Launch]:
    """Every launch of one world size and rate, in the order they run (see the module
    docstring); ``chunker`` cuts an interleaved launch's variants into chunks that fit memory."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    modes = modes_of(mode)
    launches: list[Launch] = []
    for r in range(rounds):
        order = rotated(names, r)
        for m in modes if r % 2 == 0 else modes[::-1]:
            if m == INTERLEAVED:
                chunks = tuple(tuple(chunk) for chunk in chunker(order))
                launches.append(Launch(m, r, chunks))
            else:
                launches.extend(Launch(m, r, ((name,),)) for name in order)
    return launches
