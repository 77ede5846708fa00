"""Seed schedules of the shared dither: gradzip's keyed derivation, or the authors' chain.

Spec 0.4. ``"keyed"`` (the default, [CHOICE]) names each message's seed by its key
(:func:`gradzip.rng.derive_seed`): stateless, distinct for every worker, round and tensor.

``"chain"`` ([CODE], for faithful reproduction of the DQSG/NDQSG authors' code) follows their
rule: worker ``p`` starts from a seed ``s_p(0)`` in ``[1000, 1000000)``; each iteration re-seeds
NumPy's legacy Mersenne Twister with ``s_p(t)``, draws that iteration's ``draws`` dither
uniforms (one double each), and takes ``s_p(t + 1)`` as the next ``randint(1000, 1000000)`` of
the same stream. The step is a fixed function on 999,000 values, so every chain falls into a
cycle (``docs/spec/index.md`` 0.4 and ``benchmarks/seed_schedule_cycles.py`` measure it; that is
why it is not the default). gradzip keeps its own Philox dither: the message seed is named by
``(s_p(t), tensor, chunk)``, so two messages whose chain seeds coincide share their dither, as
in the authors' code. ``s_p(t)`` is a function of ``(run seed, p, t)`` alone, so sender and
receiver agree and a resumed run recomputes it (one chain step per iteration; the step is memoized once per process, :func:`chain_next_seed`, so every schedule of the process
shares the walk). The global random generators are never touched.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import numpy as np

from gradzip.choices import check_choice, choices_of
from gradzip.keys import StreamKey
from gradzip.rng import derive_seed, seed_from_text

#: the schedules a dithered compressor accepts
#: how a dithered compressor draws its dither seeds: keyed by the stream key, or the
#: authors' chain of seeds [CODE]
SeedScheduleName = Literal["keyed", "chain"]
SEED_SCHEDULES: tuple[SeedScheduleName, ...] = choices_of(SeedScheduleName)
#: the authors' seed range, ``[CHAIN_MIN_SEED, CHAIN_MAX_SEED)`` [CODE]
CHAIN_MIN_SEED = 1000
CHAIN_MAX_SEED = 1000000
#: the bound of the process-wide memo of :func:`chain_next_seed`: the chains of a run fall into
#: short cycles, so it holds every seed they visit, and it stays bounded over the ~10^6 seeds
CHAIN_MEMO_SIZE = 1 << 16


def check_seed_schedule(seed_schedule: SeedScheduleName, chain_draws: int | None) -> int | None:
    """Validate a compressor's ``seed_schedule`` and ``chain_draws``; the draws to keep."""
    check_choice("seed_schedule", seed_schedule, SEED_SCHEDULES)
    if seed_schedule == "keyed":
        if chain_draws is not None:
            raise ValueError("chain_draws applies only to seed_schedule='chain'")
        return None
    if isinstance(chain_draws, bool) or not isinstance(chain_draws, int) or chain_draws < 0:
        raise ValueError(
            "seed_schedule='chain' needs chain_draws=<the dither uniforms the authors draw per "
            f"iteration: the model's number of gradient elements>, got {chain_draws!r}"
        )
    return chain_draws


@lru_cache(maxsize=CHAIN_MEMO_SIZE)
def chain_next_seed(seed: int, draws: int) -> int:
    """The authors' next seed: re-seed the legacy Mersenne Twister with ``seed``, draw
    ``draws`` uniforms, then ``randint(CHAIN_MIN_SEED, CHAIN_MAX_SEED)`` [CODE]. Memoized for
    the whole process (at most :data:`CHAIN_MEMO_SIZE` steps), so sender, receiver and every
    rank's codec share one walk (chains share cycles)."""
    state = np.random.RandomState(seed)
    if draws:
        state.random_sample(draws)
    return int(state.randint(CHAIN_MIN_SEED, CHAIN_MAX_SEED))


def chain_start_seed(run_seed: int, rank: int) -> int:
    """Worker ``rank``'s first chain seed, in the authors' range [CHOICE: the authors draw it
    from the global generator; gradzip names it by ``(run_seed, rank)``]."""
    span = CHAIN_MAX_SEED - CHAIN_MIN_SEED
    return CHAIN_MIN_SEED + seed_from_text(f"chain-start:{run_seed}:{rank}") % span


class ChainSeeds:
    """``s_p(t)`` of every worker, memoized: a function of ``(run_seed, rank, step)``; its
    steps come from the process-wide memo of :func:`chain_next_seed`."""

    def __init__(self, draws: int) -> None:
        self.draws = draws
        self._chains: dict[tuple[int, int], list[int]] = {}

    def seed(self, run_seed: int, rank: int, step: int) -> int:
        """The chain seed of worker ``rank`` at iteration ``step``."""
        chain = self._chains.setdefault((run_seed, rank), [chain_start_seed(run_seed, rank)])
        while len(chain) <= step:
            chain.append(chain_next_seed(chain[-1], self.draws))
        return chain[step]


class SeedSchedule:
    """The shared-dither seed of a message under ``"keyed"`` or ``"chain"`` (spec 0.4)."""

    def __init__(
        self, seed_schedule: SeedScheduleName = "keyed", chain_draws: int | None = None
    ) -> None:
        draws = check_seed_schedule(seed_schedule, chain_draws)
        self.name = seed_schedule
        self._chain = None if draws is None else ChainSeeds(draws)

    @property
    def chain_draws(self) -> int | None:
        return None if self._chain is None else self._chain.draws

    @property
    def chain_seeds(self) -> ChainSeeds | None:
        """The ``s_p(t)`` this schedule names its seeds by (``None`` for ``"keyed"``)."""
        return self._chain

    def wire_params(self) -> dict[str, str | int]:
        """Header parameters: none for ``"keyed"`` (so its payloads are unchanged); the
        schedule and its draws for ``"chain"``, so a receiver on another schedule refuses the
        payload instead of decoding with the wrong dither."""
        if self._chain is None:
            return {}
        return {"seed_schedule": self.name, "chain_draws": self._chain.draws}

    def shared_seed(self, key: StreamKey) -> int:
        """The 63-bit Philox seed of ``key``'s shared stream."""
        if self._chain is None:
            return derive_seed(key, domain="shared")
        chained = self._chain.seed(key.run_seed, key.rank, key.step)
        text = f"chain:{chained}:{key.tensor_index}"
        if key.chunk:
            text += f":{key.chunk}"
        return seed_from_text(text)
