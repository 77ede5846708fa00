"""The hook's thread pipeline: three stages (encode, transfer, decode), one thread each."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from gradzip.integrations._worker import BucketWorker

#: the stages, in the order every item goes through them
STAGES = ("encode", "transfer", "decode")
ENCODE, TRANSFER, DECODE = range(len(STAGES))


class StagePipeline:
    """Three :class:`~gradzip.integrations._worker.BucketWorker` threads, started on the first
    item: ``handlers[k](owner, item)`` runs stage ``k`` of an item, items run in submission
    order in each stage, and a stage hands an item on with :meth:`submit`.

    [CHOICE] The threads hold ``owner`` (the hook state) only weakly, as the pipeline does: a
    state that is garbage collected stops its threads (see ``BucketWorker``).
    """

    def __init__(
        self,
        owner: object,
        handlers: tuple[Callable[[Any, Any], None], ...],
        name: str,
    ) -> None:
        if len(handlers) != len(STAGES):
            raise ValueError(f"a pipeline needs {len(STAGES)} handlers, got {len(handlers)}")
        self._owner = weakref.ref(owner)
        self._handlers = handlers
        self._name = name
        self._workers: tuple[BucketWorker, ...] | None = None

    def submit(self, stage: int, item: object) -> None:
        """Queue ``item`` for ``stage`` (starting the threads on first use)."""
        if self._workers is None:
            owner = self._owner()
            if owner is None:  # pragma: no cover - the owner calls this
                raise RuntimeError("the pipeline's owner is gone")
            self._workers = tuple(
                BucketWorker(owner, handle, f"{self._name}-{stage_name}")
                for stage_name, handle in zip(STAGES, self._handlers, strict=True)
            )
        self._workers[stage].submit(item)

    def drain(self, after: int = -1) -> None:
        """Wait until every stage later than ``after`` (every stage by default) has run what
        was submitted to it, in stage order."""
        for worker in (self._workers or ())[after + 1 :]:
            worker.drain()

    def close(self) -> None:
        """Run what was submitted, then stop and join the threads (idempotent)."""
        for worker in self._workers or ():
            worker.close()
