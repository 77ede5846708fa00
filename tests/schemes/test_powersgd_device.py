"""PowerSGD on the device path, checked on CPU tensors through ``forced_device_payloads`` and on
fake CUDA tensors: the torch twins of the low-rank kernels equal the numba kernels bit for bit,
simulated ranks give the host path's factors, payloads and means bit for bit, the step reads
a bounded number of small values on the host, and the factor computation and encoding run on
fake CUDA tensors (where any read of a value raises)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.compressors import registry
from gradzip.device.host_reads import HostReads, count_host_reads
from gradzip.device.mode import forced_device_payloads
from gradzip.kernels import lowrank, lowrank_torch
from gradzip.keys import StreamKey
from gradzip.schemes._powersgd_ops import DEVICE_OPS
from gradzip.schemes.powersgd import PowerSGD

P = 3
#: several shapes: one sent whole (1-D), small and odd matrices, a 4-D weight, a wide one
SHAPES = [(40,), (33, 20), (16, 3, 3, 3), (9, 130), (70, 64)]
FACTOR_CODECS = ["fp16", "identity", "bf16"]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bits of a float32 tensor, for bitwise comparisons (-0.0 and NaN included)."""
    return t.reshape(-1).view(torch.int32)


@pytest.mark.parametrize("rank", [1, 2, 4])
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (7, 8), (65, 130), (100, 513), (1030, 9)])
def test_torch_twins_equal_numba_kernels(shape: tuple[int, int], rank: int) -> None:
    n, m = shape
    r = min(rank, n, m)
    g = torch.Generator().manual_seed(n * 1000 + m + r)
    matrix = torch.randn(n, m, generator=g) * 1e3
    qt = torch.randn(r, m, generator=g)
    pt = torch.empty(r, n)
    lowrank.project_into(matrix, qt, pt)
    assert torch.equal(bits(pt), bits(lowrank_torch.project(matrix, qt)))
    ortho = pt.clone()
    lowrank.orthonormalize_(ortho)
    assert torch.equal(bits(ortho), bits(lowrank_torch.orthonormalized(pt)))
    back = torch.empty(r, m)
    lowrank.back_project_into(matrix, ortho, back)
    assert torch.equal(bits(back), bits(lowrank_torch.back_project(matrix, ortho)))
    out = torch.empty(n, m)
    lowrank.reconstruct_into(ortho, back, out)
    assert torch.equal(bits(out), bits(lowrank_torch.reconstruct(ortho, back)))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("rank", [1, 3])
@pytest.mark.parametrize("shape", [(1, 1), (7, 8), (65, 130), (1030, 9)])
def test_fused_host_kernels_equal_the_steps_they_fuse(
    shape: tuple[int, int], rank: int, residual: bool
) -> None:
    """``M + e`` with ``P`` in one pass, and ``P Q^T`` with the residual in one pass, give the
    bits of the sum, the projection, the reconstruction and the subtraction done one by one
    (the device twins' order); the inputs are left as they were."""
    n, m = shape
    r = min(rank, n, m)
    g = torch.Generator().manual_seed(n * 7 + m + r)
    gradient = torch.randn(n, m, generator=g) * 1e3
    kept = torch.randn(n, m, generator=g) if residual else None
    inputs = [gradient] + ([kept] if kept is not None else [])
    before = [x.clone() for x in inputs]
    qt = torch.randn(r, m, generator=g)
    matrix, pt = torch.empty(n, m), torch.empty(r, n)
    lowrank.sum_and_project_into(gradient, kept, matrix, qt, pt)
    expected = gradient + kept if kept is not None else gradient.clone()
    assert torch.equal(bits(matrix), bits(expected))
    assert torch.equal(bits(pt), bits(lowrank_torch.project(expected, qt)))
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(inputs, before, strict=True))
    back = torch.randn(r, m, generator=g)
    out = torch.empty(n, m)
    lowrank.reconstruct_subtracting(pt, back, out, matrix)
    approximation = lowrank_torch.reconstruct(pt, back)
    assert torch.equal(bits(out), bits(approximation))
    assert torch.equal(bits(matrix), bits(expected - approximation))
    untouched = expected.clone()
    lowrank.reconstruct_subtracting(pt, back, out, None)
    assert torch.equal(bits(out), bits(approximation))
    assert torch.equal(bits(expected), bits(untouched))


@pytest.mark.parametrize("device", [False, True])
def test_means_of_a_float32_group_lie_end_to_end(device: bool) -> None:
    """Both paths write a float32 group's means (approximated and whole) into one run, in the
    tensors' order, so the DDP hook can hand the run to DDP whole; the gradients and the kept
    residuals stay as they were."""
    from gradzip.flat_views import adjacent_flat

    def body(t: Transport) -> None:
        scheme = PowerSGD(registry.get("identity")(), run_seed=7, error_feedback=True)
        for step in range(2):
            grads = gradients(t.rank, step)
            copies = [x.clone() for x in grads]
            kept = list(scheme.snapshot()["residual"].values())
            kept_copies = [r.clone() for r in kept]
            means, down = scheme.reduce_many_if_all_finite(t, grads, range(len(grads)), step, True)
            assert not down
            run = adjacent_flat(means)
            assert run is not None and run.numel() == sum(x.numel() for x in grads)
            assert all(torch.equal(a, b) for a, b in zip(grads, copies, strict=True))
            # the residuals kept before the step are replaced, never written
            assert all(torch.equal(a, b) for a, b in zip(kept, kept_copies, strict=True))
            assert len(scheme.snapshot()["residual"]) == 4  # the four matrices of SHAPES

    if not device:
        run_local(P, body)
        return
    with forced_device_payloads():
        run_local(P, body)


def test_zero_columns_stay_zero_on_both_paths() -> None:
    pt = torch.zeros(2, 17)
    host = pt.clone()
    lowrank.orthonormalize_(host)
    assert torch.equal(bits(host), bits(lowrank_torch.orthonormalized(pt)))


def test_pairwise_sum_is_the_binary_counter_tree() -> None:
    """A sum whose rounding shows the tree: ``1 + 2**-24`` terms grouped as pairs first."""
    x = torch.tensor([1.0, 2.0**-24, 2.0**-24, 2.0**-24, 2.0**-24])
    # ((1 + e) + (e + e)) + e: 1 + e rounds to 1, then 1 + 2e is exact, then + e rounds to even
    expected = torch.tensor(1.0) + torch.tensor(2.0**-23)
    expected = expected + torch.tensor(2.0**-24)
    assert torch.equal(lowrank_torch.pairwise_sum(x, 0), expected)


def gradients(rank: int, step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(s, generator=g) * 0.01 for s in SHAPES]


Run = tuple[list[list[torch.Tensor]], list[Any], dict[str, dict[Any, torch.Tensor]]]


def train(codec: str, rank: int, ef: bool, steps: int, device: bool) -> list[Run]:
    """Per simulated rank: every step's means, every factor payload sent (as host bytes,
    converted here in the test harness only), and the final warm starts and residuals."""

    def body(t: Transport) -> Run:
        cls = registry.get(codec)
        scheme = PowerSGD(cls(**cls.example_params), run_seed=7, error_feedback=ef, rank=rank)
        sent: list[Any] = []
        original = t.all_gather_flagged

        def spy(payload, ok, collective="all_gather", **sizes):  # type: ignore[no-untyped-def]
            sent.append(payload)
            return original(payload, ok, collective, **sizes)

        t.all_gather_flagged = spy  # type: ignore[method-assign]
        out = []
        for step in range(steps):
            grads = gradients(t.rank, step)
            means, down = scheme.reduce_many_if_all_finite(
                t, grads, list(range(len(grads))), step, True
            )
            assert not down
            out.append([m.clone() for m in means])
        return out, sent, scheme.snapshot()

    if not device:
        return run_local(P, body)
    with forced_device_payloads():
        return run_local(P, body)


@pytest.mark.parametrize("ef", [False, True])
@pytest.mark.parametrize("rank", [1, 2, 4])
@pytest.mark.parametrize("codec", FACTOR_CODECS)
def test_device_path_equals_host_path_bit_for_bit(codec: str, rank: int, ef: bool) -> None:
    host = train(codec, rank, ef, steps=3, device=False)
    device = train(codec, rank, ef, steps=3, device=True)
    for (h_means, h_sent, h_state), (d_means, d_sent, d_state) in zip(host, device, strict=True):
        for h_step, d_step in zip(h_means, d_means, strict=True):
            for h, d in zip(h_step, d_step, strict=True):
                assert h.dtype == d.dtype and h.shape == d.shape
                assert torch.equal(bits(h), bits(d))
        assert len(h_sent) == len(d_sent)
        for h, d in zip(h_sent, d_sent, strict=True):
            assert isinstance(d, torch.Tensor) and d.dtype == torch.uint8
            # [test harness only] the device payload's bytes, read back to compare
            assert bytes(h) == bytes(d.numpy())
        for part in ("q", "residual"):
            assert h_state[part].keys() == d_state[part].keys()
            for slot, value in h_state[part].items():
                assert torch.equal(bits(value), bits(d_state[part][slot]))
        assert bool(h_state["residual"]) == ef


def test_device_step_reads_a_bounded_number_of_small_values() -> None:
    """One bucket of several tensors over P ranks, fp16 factors, error feedback: the two
    all-gathers of a bucket read, per rank, the encode's finite flag and a header and a flag
    per payload decoded (1 + 2P each). Nothing else reaches the host (no matrix, factor or
    residual), and every read is at most 128 bytes."""

    def body(t: Transport) -> None:
        scheme = PowerSGD(registry.get("fp16")(), run_seed=7, error_feedback=True, rank=2)
        for step in range(2):
            grads = gradients(t.rank, step)
            scheme.reduce_many_if_all_finite(t, grads, list(range(len(grads))), step, True)

    reads: HostReads
    with forced_device_payloads(), count_host_reads() as reads:
        run_local(P, body)
    per_bucket_and_rank = 2 * (1 + 2 * P)
    assert reads.count <= 2 * P * per_bucket_and_rank, reads.describe()
    assert reads.largest <= 128, reads.describe()


@pytest.mark.parametrize("ef", [False, True])
@pytest.mark.parametrize("codec", FACTOR_CODECS)
def test_factors_and_encode_run_on_fake_cuda(codec: str, ef: bool) -> None:
    """The factor computation, the orthonormalisation, ``P Q^T``, the residual and the
    factor payloads' encoding complete on fake CUDA tensors: no value is read anywhere."""
    cls = registry.get(codec)
    scheme = PowerSGD(cls(**cls.example_params), run_seed=7, error_feedback=ef, rank=2)
    with FakeTensorMode(allow_non_fake_inputs=True):
        grads = [torch.randn(64, 3, 3, 3, device="cuda"), torch.randn(33, 130, device="cuda")]
        if ef:  # a residual from an earlier step
            for i, g in enumerate(grads):
                scheme._residuals[i] = torch.randn(
                    g.shape[0], g.numel() // g.shape[0], device="cuda"
                )
        sets = [scheme._factor_set(g, i, DEVICE_OPS) for i, g in enumerate(grads)]
        for f in sets:
            f.matrix, f.pt = DEVICE_OPS.matrix_projected(f.gradient, f.residual, f.qt)
        first = torch.cat([f.pt.reshape(-1) for f in sets])
        encoded = scheme.compressor.encode(first, StreamKey(7, 0, 0, 0, 0))
        assert isinstance(encoded.payload, torch.Tensor)
        assert encoded.payload.device.type == "cuda"
        for f in sets:
            f.pt = DEVICE_OPS.orthonormalized(f.pt)
            f.qt = DEVICE_OPS.back_project(f.built, f.pt)
        second = torch.cat([f.qt.reshape(-1) for f in sets])
        encoded = scheme.compressor.encode(second, StreamKey(7, 0, 0, 1, 0))
        assert isinstance(encoded.payload, torch.Tensor)
        for f in sets:
            approximation = DEVICE_OPS.reconstructed(f.pt, f.qt, f.built, True)
            assert approximation.device.type == "cuda"
            assert f.built.device.type == "cuda"
            room = torch.empty(f.built.numel(), device="cuda")
            placed = DEVICE_OPS.reconstructed(f.pt, f.qt, f.built, False, room)
            assert placed.device.type == "cuda" and placed._base is room  # written in the room
