"""Lightning: ``GradzipDDPStrategy`` really averages through gradzip's hook on the CPU (where
Lightning's own ``DDPStrategy(ddp_comm_hook=...)`` registers no hook), in 2 gloo processes.

The ranks are started by the project's harness (:func:`~gradzip.comm.spawn.run_processes`),
which initialises the process group; each rank sets the environment of an externally launched
Lightning job (``LOCAL_RANK`` and friends, as torchrun would), so Lightning starts no processes
of its own and uses that group. ``lightning`` is imported directly (in
``tests/integrations/_lightning_job.py``, when a test runs): without it these tests fail instead
of skipping (``make setup`` installs it with the ``dev`` extra).
"""

from __future__ import annotations

from typing import Any

import pytest

import gradzip
from gradzip.comm.spawn import run_processes
from gradzip.errors import GradzipError
from tests.integrations._trained_ranks import assert_gradzip_averages_were_applied


@pytest.mark.distributed
@pytest.mark.slow
def test_the_strategy_runs_the_gradzip_hook_on_the_cpu_every_step() -> None:
    from tests.integrations._lightning_job import STEPS, lightning_rank

    # one pair of processes fits twice: gradzip's strategy, then Lightning's plain DDP
    ranks: list[dict[str, Any]] = run_processes(2, lightning_rank, timeout=60.0, run_timeout=300.0)
    for rank in ranks:
        assert rank["gradzip"]["optimizer_steps"] == rank["plain"]["optimizer_steps"] == STEPS
        assert rank["hook_steps"] == STEPS  # one gradzip step per backward pass
        assert all(sent > 0 for sent in rank["bytes_sent_per_step"])  # payloads every step
    assert_gradzip_averages_were_applied(ranks)


def test_the_strategy_refuses_torch_hooks_and_a_non_scheme() -> None:
    from gradzip.integrations.lightning import GradzipDDPStrategy
    from tests.integrations._lightning_job import lossy_scheme

    with pytest.raises(TypeError, match="ddp_comm_hook"):
        GradzipDDPStrategy(lossy_scheme(), ddp_comm_hook=lambda state, bucket: None)
    with pytest.raises(TypeError, match="needs a gradzip Scheme"):
        GradzipDDPStrategy(gradzip.create("dqsg", M=1))  # type: ignore[arg-type]
    with pytest.raises(GradzipError, match="built when Trainer\\.fit wraps"):
        _ = GradzipDDPStrategy(lossy_scheme()).hook_state
