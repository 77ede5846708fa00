"""The all-gather scheme, error feedback and GradientSync on the device path, checked on CPU
tensors through ``forced_device_payloads`` with simulated ranks: the same means as the host
path bit for bit, device payloads on the wire, and a bounded number of host reads."""

from __future__ import annotations

import pytest
import torch

from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.compressors import registry
from gradzip.device.host_reads import HostReads, count_host_reads
from gradzip.device.mode import forced_device_payloads
from gradzip.errors import NonFiniteInputError
from gradzip.schemes.allgather_decode import AllGatherDecode
from gradzip.sync import GradientSync

P = 3
SHAPES = [(300,), (17, 9), (1,)]
ALLGATHER_CODECS = [
    n
    for n in registry.names()
    if (c := registry.get(n)(**registry.get(n).example_params)).device_resident
    and AllGatherDecode.compatible(c)
]


def gradients(rank: int, step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(s, generator=g) * 0.01 for s in SHAPES]


def train(name: str, ef: bool, steps: int, device: bool) -> list[list[list[torch.Tensor]]]:
    def body(t: Transport) -> list[list[torch.Tensor]]:
        cls = registry.get(name)
        scheme = AllGatherDecode(cls(**cls.example_params), run_seed=5, error_feedback=ef)
        sync = GradientSync(t, scheme=scheme)
        out = []
        for step in range(steps):
            means = sync.synchronize(gradients(t.rank, step))
            assert means is not None
            out.append([m.clone() for m in means])
        return out

    if not device:
        return run_local(P, body)
    with forced_device_payloads():
        return run_local(P, body)


@pytest.mark.parametrize("ef", [False, True])
@pytest.mark.parametrize("name", ALLGATHER_CODECS)
def test_device_means_equal_host_means(name: str, ef: bool) -> None:
    host = train(name, ef, steps=3, device=False)
    device = train(name, ef, steps=3, device=True)
    for rank_host, rank_device in zip(host, device, strict=True):
        for step_host, step_device in zip(rank_host, rank_device, strict=True):
            for h, d in zip(step_host, step_device, strict=True):
                assert h.dtype == d.dtype and h.shape == d.shape
                assert torch.equal(h.view(-1).view(torch.int32), d.view(-1).view(torch.int32))


def test_all_fourteen_allgather_codecs_are_covered() -> None:
    assert {"dqsg", "qsgd", "terngrad", "onebit", "topk", "randk", "fp16"} <= set(ALLGATHER_CODECS)


def test_device_payloads_travel_and_reads_are_bounded() -> None:
    """One GradientSync step of three tensors over P ranks with error feedback reads on the
    host, per tensor and rank: the encode's finite flag (1), the sender's own decode for its
    residual (a header and a flag: 2), and per payload averaged a header and a flag (2 P):
    at most 2P + 3, each read at most 128 bytes. Nothing gradient-sized reaches the host."""
    seen: list[object] = []

    def body(t: Transport) -> None:
        scheme = AllGatherDecode(registry.get("dqsg")(M=2), run_seed=5, error_feedback=True)
        sync = GradientSync(t, scheme=scheme)
        original = t.all_gather_flagged

        def spy(payload, ok, collective="all_gather", **sizes):  # type: ignore[no-untyped-def]
            seen.append(payload)
            return original(payload, ok, collective, **sizes)

        t.all_gather_flagged = spy  # type: ignore[method-assign]
        sync.synchronize(gradients(t.rank, 0))

    reads: HostReads
    with forced_device_payloads(), count_host_reads() as reads:
        run_local(P, body)
    assert seen and all(isinstance(p, torch.Tensor) for p in seen)
    per_tensor = 2 * P + 3
    assert reads.count <= P * len(SHAPES) * per_tensor, reads.describe()
    assert reads.largest <= 128, reads.describe()


def test_non_finite_gradient_raises_everywhere_and_keeps_residuals() -> None:
    def body(t: Transport) -> tuple[str, bool]:
        scheme = AllGatherDecode(registry.get("qsgd")(), run_seed=5, error_feedback=True)
        sync = GradientSync(t, scheme=scheme)
        sync.synchronize(gradients(t.rank, 0))
        before = scheme.snapshot()
        bad = gradients(t.rank, 1)
        if t.rank == 1:
            bad[0][3] = float("nan")
        try:
            sync.synchronize(bad)
        except NonFiniteInputError as err:
            after = scheme.snapshot()
            same = all(
                torch.equal(before[role][slot], after[role][slot])
                for role in before
                for slot in before[role]
            )
            return str(err), same
        return "no error", False

    with forced_device_payloads():
        results = run_local(P, body)
    for message, unchanged in results:
        assert "rank" in message or "finite" in message.lower(), message
        assert unchanged
