"""Distributed QESGD split along its seam: the server-worker messages and failure notices
(``qesgd.messages``) work on their own, with any server rank, and ``DistributedQESGD`` keeps its
public API in ``qesgd.server`` within the project's file-size rule."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

import gradzip.algorithms.qesgd.server as qesgd_server
from gradzip.algorithms.qesgd.messages import ANCHOR, CODES, GRAD, ServerLink
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.errors import GradzipError, NonFiniteInputError


def test_server_link_gathers_in_rank_order_broadcasts_and_spreads_failures() -> None:
    """Server rank 1 of 3: the gather holds every rank's vector in rank order, the broadcast
    gives every rank the same bits, and a NaN on rank 2 reaches every rank as an error on the
    stream the workers read next."""

    def rank(transport: Transport) -> tuple[list[torch.Tensor] | None, bytes, str, int]:
        link = ServerLink(transport, server=1, run_seed=4)
        mine = torch.arange(5.0) + 10 * transport.rank
        gathered = link.gather(mine, 3, GRAD, reply=CODES)
        value = torch.linspace(-1, 1, 5) if link.is_server else None
        shared = link.broadcast(value, 3, ANCHOR, 5).numpy().tobytes()
        bad = mine.clone()
        if transport.rank == 2:
            bad[1] = float("nan")
        try:
            link.gather(bad, 4, GRAD, reply=CODES)
            link.receive(CODES)  # a worker learns of the failure where it waits next
            message = ""
        except NonFiniteInputError as err:
            message = str(err)
        return gathered, shared, message, transport.meter.total(collective="qesgd_grad").sent

    results = run_local(3, rank)
    gathered = results[1][0]
    assert gathered is not None and results[0][0] is None and results[2][0] is None
    assert [v.tolist() for v in gathered] == [
        [float(i + 10 * r) for i in range(5)] for r in range(3)
    ]
    assert len({r[1] for r in results}) == 1
    assert all("step 4" in r[2] and "rank(s) [2]" in r[2] for r in results), results
    assert results[1][3] == 0 and results[0][3] > 0  # the server's own vector never travels
    with pytest.raises(GradzipError, match="server rank"):
        run_local(2, lambda t: ServerLink(t, server=2, run_seed=0))


def test_distributed_qesgd_keeps_its_api_within_the_file_size_rule() -> None:
    params = list(inspect.signature(qesgd_server.DistributedQESGD.__init__).parameters)
    assert params == [
        "self",
        "transport",
        "w0",
        "batch_size",
        "bits",
        "c",
        "bucket_size",
        "weight_decay",
        "output",
        "run_seed",
        "server",
        "packing",
        "schedule",
    ]
    # one responsibility per file, at most about 250 lines (the project's small-file rule)
    here = Path(qesgd_server.__file__).parent
    for name in ("server.py", "messages.py", "checkpoint.py"):
        assert len((here / name).read_text().splitlines()) <= 260, name
