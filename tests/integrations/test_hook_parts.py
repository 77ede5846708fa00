"""The parts of the DDP hook state, each on its own: the step transaction (commit, rollback,
skip), the stage pipeline (order, draining, stopping) and the checkpoint's checks."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

import gradzip
from gradzip.comm.local import LocalGroup
from gradzip.errors import CheckpointError, GradzipError
from gradzip.integrations._checkpoint import STATE_VERSION, HookCheckpoint
from gradzip.integrations._job import BucketJob
from gradzip.integrations._pipeline import DECODE, ENCODE, TRANSFER, StagePipeline
from gradzip.integrations._transaction import StepTransaction
from gradzip.keys import StreamKey
from gradzip.schemes import make_scheme
from gradzip.schemes.base import Scheme


def _scheme(name: str = "allgather") -> Scheme:
    return make_scheme(
        name,
        gradzip.create("topk", **gradzip.get("topk").example_params),
        run_seed=1,
        error_feedback=True,
    )


def _job(position: int = 0, last: bool = True) -> BucketJob:
    return BucketJob(position, last, torch.ones(4), None, torch.futures.Future(), 1)


def _residuals(scheme: Scheme) -> dict[Any, torch.Tensor]:
    return scheme.snapshot()["worker"]


def test_a_step_commits_or_rolls_back_as_a_whole() -> None:
    scheme = _scheme()
    step = StepTransaction(scheme)
    step.begin()
    scheme.encode_own("worker", torch.arange(4.0), StreamKey(tensor_index=0))
    job = _job()
    step.add(job)
    step.finish()
    assert step.step == 1 and not step.open and torch.equal(job.future.wait(), torch.ones(4))
    kept = dict(_residuals(scheme))
    step.begin()
    scheme.encode_own("worker", torch.arange(4.0) * 3, StreamKey(tensor_index=0))
    failed = _job()
    failed.outcome = RuntimeError("boom")
    step.add(failed)
    step.finish()  # the residual written during the failed step is gone
    assert step.step == 1 and _residuals(scheme).keys() == kept.keys()
    assert all(torch.equal(_residuals(scheme)[k], v) for k, v in kept.items())
    with pytest.raises(RuntimeError, match="boom"):
        failed.future.wait()


def test_a_skipped_step_zeroes_its_buckets_and_an_abandoned_one_fails() -> None:
    step = StepTransaction(_scheme())
    step.begin()
    job = _job()
    step.add(job)
    step.skip()
    step.finish()
    assert (step.step, step.skipped_steps) == (0, 1) and torch.equal(job.buffer, torch.zeros(4))
    step.begin()
    job = _job(last=False)
    step.add(job)
    step.abandon()
    assert not step.open and isinstance(job.failure, GradzipError)
    assert "abandoned" in str(job.failure)


def test_the_pipeline_runs_each_item_through_the_stages_in_order() -> None:
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    class Owner:
        pipeline: StagePipeline

        def stage(self, name: str, nxt: int | None, item: int) -> None:
            with lock:
                seen.append((name, item))
            if nxt is not None:
                self.pipeline.submit(nxt, item)

    owner = Owner()
    owner.pipeline = StagePipeline(
        owner,
        (
            lambda o, item: o.stage("encode", TRANSFER, item),
            lambda o, item: o.stage("transfer", DECODE, item),
            lambda o, item: o.stage("decode", None, item),
        ),
        "gradzip-test-pipeline",
    )
    for item in range(5):
        owner.pipeline.submit(ENCODE, item)
    owner.pipeline.drain()
    for name in ("encode", "transfer", "decode"):
        assert [item for stage, item in seen if stage == name] == list(range(5))
    for item in range(5):
        order = [stage for stage, i in seen if i == item]
        assert order == ["encode", "transfer", "decode"]
    owner.pipeline.close()
    owner.pipeline.close()  # idempotent


def test_the_checkpoint_checks_shapes_and_pieces_only_where_the_scheme_says() -> None:
    shapes, dtypes = [torch.Size((6, 2)), torch.Size((3,))], [torch.float32] * 2
    checkpoint = HookCheckpoint(shapes, dtypes, chunk_elements=4)
    transport = LocalGroup(1).endpoint(0)
    for name, pieces_checked in (("allgather", True), ("ps", False)):
        scheme = _scheme(name)
        scheme.feedback["worker"].restore({(0, 0): torch.zeros(7)})  # no piece of that shape
        saved = checkpoint.save(2, 1, transport, scheme)
        assert saved["version"] == STATE_VERSION and saved["chunk_elements"] == 4
        if pieces_checked:
            with pytest.raises(CheckpointError, match="piece 0"):
                checkpoint.parse(saved, transport, scheme)
        else:
            assert checkpoint.parse(saved, transport, scheme).step == 2
        with pytest.raises(CheckpointError, match="shapes"):
            HookCheckpoint(shapes[:1], dtypes[:1], 4).parse(saved, transport, scheme)
