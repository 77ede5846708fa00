"""Accelerate: ``attach_gradzip_hook`` really averages through gradzip's hook on the model that
``Accelerator.prepare`` wrapped, in 2 gloo processes on the CPU.

The ranks are started by the project's harness (:func:`~gradzip.comm.spawn.run_processes`),
which initialises the process group; each rank sets the variables ``accelerate launch`` would,
so the ``Accelerator`` joins that group. ``accelerate`` is imported directly (in
``tests/integrations/_accelerate_job.py``, when a test runs): without it these tests fail
instead of skipping (``make setup`` installs it with the ``dev`` extra).
"""

from __future__ import annotations

from typing import Any

import pytest

import gradzip
from gradzip.comm.spawn import run_processes
from gradzip.errors import GradzipError
from gradzip.schemes import make_scheme
from tests.integrations._trained_ranks import assert_gradzip_averages_were_applied


@pytest.mark.distributed
@pytest.mark.slow
def test_the_attached_hook_averages_every_step() -> None:
    from tests.integrations._accelerate_job import STEPS, accelerate_rank

    # one pair of processes trains twice: with gradzip's hook, then with DDP's all-reduce
    ranks: list[dict[str, Any]] = run_processes(2, accelerate_rank, timeout=60.0, run_timeout=300.0)
    for rank in ranks:
        assert rank["distributed_type"].endswith("MULTI_CPU")
        assert rank["gradzip"]["hook_steps"] == STEPS  # one gradzip step per backward pass
        assert all(sent > 0 for sent in rank["gradzip"]["bytes_sent_per_step"])
    assert_gradzip_averages_were_applied(ranks)


def test_a_model_not_wrapped_in_ddp_is_refused() -> None:
    """One process: ``prepare`` returns the module itself, and the message says why."""
    from accelerate import Accelerator

    from gradzip.integrations.accelerate import attach_gradzip_hook
    from tests.integrations._accelerate_job import model

    accelerator = Accelerator(cpu=True)
    prepared = accelerator.prepare(model())
    scheme = make_scheme("allgather", gradzip.create("dqsg", M=1), run_seed=1)
    with pytest.raises(GradzipError, match=r"wrapped in DistributedDataParallel.*1 process"):
        attach_gradzip_hook(accelerator, prepared, scheme)
