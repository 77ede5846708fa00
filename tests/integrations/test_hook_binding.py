"""The DDP hook state binds its default transport on first use, not when it is built: a state
can then be built before ``init_process_group`` (Lightning's ``ddp_comm_state``), and the one
transport it binds serves every stage and checkpoint."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import gradzip
from gradzip.comm.local import LocalGroup
from gradzip.comm.transport import Transport
from gradzip.integrations import ddp
from gradzip.integrations.ddp import GradzipHookState
from gradzip.schemes import make_scheme


def test_the_default_transport_is_built_once_on_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Transport] = []

    def distributed_transport() -> Transport:
        """Stands in for DistributedTransport(): a one-rank group, counted."""
        built.append(LocalGroup(1).endpoint(0))
        return built[-1]

    monkeypatch.setattr(ddp, "DistributedTransport", distributed_transport)
    scheme = make_scheme("allgather", gradzip.create("dqsg", M=1), run_seed=3)
    state = GradzipHookState(scheme, torch.nn.Linear(2, 2))
    assert built == []  # no process group is needed to build the state
    saved: dict[str, Any] = state.state_dict()  # the first use binds it
    assert built == [state.transport] and saved["rank"] == 0 and saved["world_size"] == 1
    state.load_state_dict(saved)
    assert built == [state.transport]  # bound once, reused
    given = LocalGroup(1).endpoint(0)
    assert GradzipHookState(scheme, torch.nn.Linear(2, 2), given).transport is given
    assert len(built) == 1  # a given transport builds none
