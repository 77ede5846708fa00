"""The DDP hook on the device path (CPU tensors through ``forced_device_payloads``, simulated
ranks): device payloads on the wire, joined and split per bucket, averaged into the bucket
where it lives, the same means as the host path bit for bit."""

from __future__ import annotations

import pytest
import torch

from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.device.host_reads import count_host_reads
from gradzip.device.mode import forced_device_payloads
from gradzip.integrations.ddp import GradzipHookState
from tests.integrations.test_ddp_hook import _grads, _run_step, scheme

GROUPINGS = [[(0, 1, 2, 3)], [(3, 2), (1,), (0,)], [(3,), (2, 1, 0)]]


def hooked(codec: str, ef: bool, device: bool) -> list[list[list[torch.Tensor]]]:
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    params = list(net.parameters())
    shapes = [tuple(p.shape) for p in params]

    def body(transport: Transport) -> list[list[torch.Tensor]]:
        state = GradzipHookState(scheme("allgather", codec, ef), net, transport)
        out = []
        for step, grouping in enumerate(GROUPINGS):
            out.append(_run_step(state, params, _grads(transport.rank, step, shapes), grouping))
        state.close()
        return out

    if not device:
        return run_local(3, body)
    with forced_device_payloads():
        return run_local(3, body)


@pytest.mark.parametrize(
    ("codec", "ef"),
    [("fp16", False), ("dqsg", False), ("qsgd", True), ("onebit", True), ("topk", True)],
)
def test_hook_device_path_equals_host_path(codec: str, ef: bool) -> None:
    host, device = hooked(codec, ef, False), hooked(codec, ef, True)
    for rank_host, rank_device in zip(host, device, strict=True):
        for step_host, step_device in zip(rank_host, rank_device, strict=True):
            for h, d in zip(step_host, step_device, strict=True):
                assert torch.equal(h.view(torch.int32), d.view(torch.int32))


def test_hook_reads_only_headers_and_flags() -> None:
    """The device path of the hook reads nothing gradient-sized on the host: every read is a
    header prefix, a payload length or a flag (at most 128 bytes)."""
    with count_host_reads() as reads:
        hooked("dqsg", False, True)
    assert reads.count > 0
    assert reads.largest <= 128, reads.describe()
    assert all(what == "host_read" for what, _, _ in reads.records), reads.describe()
