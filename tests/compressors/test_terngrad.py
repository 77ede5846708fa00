"""TernGrad: unbiased ternary quantization, its variance, clipping and max-scale sharing."""

from __future__ import annotations

import math

import pytest
import torch

from gradzip.compressors.terngrad import TernGrad
from gradzip.keys import StreamKey
from gradzip.payload import overhead_bits, parse_payload
from tests.compressors.device_checks import check_device_decode, check_twin_bytes, encode_fake_cuda

KEY = StreamKey(run_seed=11, rank=0, step=0, tensor_index=1)


def sent_scales(payload: bytes, count: int) -> torch.Tensor:
    body = parse_payload(payload)[1]
    return torch.frombuffer(bytearray(body[: 4 * count]), dtype=torch.float32)


def test_unbiased_with_the_ternary_variance() -> None:
    """E[g_hat] = g and E||g_hat - g||^2 = sum_i |g_i|(scale - |g_i|), within 5 s.e."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(600, generator=gen)
    x[:50] = 0.0
    comp, trials = TernGrad(bucket_size=200), 400
    scale = x.view(3, 200).abs().amax(1).double().repeat_interleave(200)
    p = x.abs().double() / scale  # P(|g_hat| = scale)
    err = torch.stack(
        [comp.round_trip(x, KEY.with_step(t))[1].double() - x.double() for t in range(trials)]
    )
    var = x.abs().double() * (scale - x.abs().double())
    assert float(var.max()) <= float(scale.max()) ** 2 / 4
    se = (var / trials).sqrt()
    # the normal approximation of the mean needs both outcomes to be frequent
    live = torch.minimum(p, 1 - p) * trials >= 10
    assert float((err.mean(0)[live] / se[live]).abs().max()) < 5.5
    exact = var == 0
    assert bool((err[:, exact].abs() <= 1e-6 * scale[exact]).all())
    # e = (scale - |g|) w.p. p, -|g| w.p. 1 - p (sign-adjusted): fourth moment for the s.e.
    a = x.abs().double()
    e4 = p * (scale - a) ** 4 + (1 - p) * a**4
    total_se = math.sqrt(float((e4 - var**2).sum()) / trials)
    assert abs(float((err**2).sum(1).mean()) - float(var.sum())) < 5 * total_se


def test_values_are_ternary_per_bucket() -> None:
    x = torch.randn(10, 30, generator=torch.Generator().manual_seed(1))
    enc, out = TernGrad(bucket_size=30).round_trip(x, KEY)
    scales = sent_scales(enc.payload, 10)
    assert torch.equal(scales, x.abs().amax(1))
    ratio = out / scales[:, None]
    assert bool(((ratio == 0) | (ratio.abs() == 1)).all())
    assert bool((torch.sign(out) * torch.sign(x) >= 0).all())


def test_bits() -> None:
    x = torch.randn(1001, generator=torch.Generator().manual_seed(2))
    comp = TernGrad(bucket_size=100)
    enc = comp.encode(x, KEY)
    body = 32 * 11 + 8 * math.ceil(2 * 1001 / 8)
    assert comp.expected_body_bits(x) == body
    assert enc.wire_bits == overhead_bits(parse_payload(enc.payload)[0]) + body
    # the same paper bits as DQSG / QSG with M = 1: n log2(3) + 32 per bucket
    assert enc.paper_bits == pytest.approx(1001 * math.log2(3) + 32 * 11)
    assert TernGrad(bucket_size=None).encode(x, KEY).paper_bits == pytest.approx(
        1001 * math.log2(3) + 32
    )


def test_clipping_to_c_sigma() -> None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    x[17] = 40.0  # an outlier far beyond 2.5 sigma
    std = float(x.double().std(correction=0))  # population std, in float64
    bound = float(torch.tensor(2.5 * std, dtype=torch.float32))
    enc, out = TernGrad(clip_sigma=2.5, bucket_size=None).round_trip(x, KEY)
    assert sent_scales(enc.payload, 1).item() == bound
    assert float(out.abs().max()) <= bound
    assert out[17].item() == bound  # clipped to the bound, then deterministically the scale
    # a bound above max|g| changes nothing: the payload equals the unclipped one (params aside)
    small = torch.randn(1000, generator=torch.Generator().manual_seed(4)).clamp(-2, 2)
    a = TernGrad(clip_sigma=100.0, bucket_size=None).round_trip(small, KEY)[1]
    b = TernGrad(bucket_size=None).round_trip(small, KEY)[1]
    assert torch.equal(a, b)
    # a constant tensor (std 0) is not clipped to zero
    assert bool(
        (
            TernGrad(clip_sigma=2.5, bucket_size=None).round_trip(torch.full((5,), 3.0), KEY)[1]
            == 3
        ).all()
    )
    # near the float32 limit the variance overflows float32: clipping must still work
    huge = torch.tensor([3e38, -3e38, 1.0, 2.0] * 10)
    enc, out = TernGrad(clip_sigma=0.5, bucket_size=None).round_trip(huge, KEY)
    limit = float(torch.tensor(0.5 * float(huge.double().std(correction=0)), dtype=torch.float32))
    assert sent_scales(enc.payload, 1).item() == limit
    assert bool(torch.isfinite(out).all())
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="clip_sigma"):
            TernGrad(clip_sigma=bad, bucket_size=None)


def test_a_shared_max_scale_puts_the_workers_on_one_grid() -> None:
    """Workers agree on max_p ||g_p||_inf (the common grid of the integer-sum schemes); their
    ternary codes then share one grid, add up exactly and stay unbiased."""
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(64, generator=gen) * (p + 1) for p in range(3)]
    grid = TernGrad(bucket_size=None).common_grid()
    assert grid is not None
    shared = torch.stack([grid.grid_statistic(g) for g in grads]).amax(0)
    assert float(shared[0]) == max(float(g.abs().max()) for g in grads)
    step = grid.grid_steps(shared)
    assert float(step[0]) == pytest.approx(float(shared[0]), rel=1e-7)  # one level: the scale
    total = torch.zeros(64, dtype=torch.int64)
    for p, g in enumerate(grads):
        symbols = grid.grid_symbols(g, shared, KEY.with_step(p))
        assert int(symbols.min()) >= 0 and int(symbols.max()) <= 2
        total += symbols.to(torch.int64) - 1
    assert int(total.abs().max()) <= len(grads)
    # the mean over many shared-scale quantizations is still unbiased
    g = grads[0]
    mean = torch.stack(
        [(grid.grid_symbols(g, shared, KEY.with_step(t)).double() - 1) * step for t in range(400)]
    ).mean(0)
    se = math.sqrt(float(shared[0]) ** 2 / 4 / 400)
    assert float((mean - g).abs().max()) < 5.5 * se


def test_the_dqsg_authors_terngrad_on_a_small_tensor() -> None:
    """The DQSG authors' TernGrad (their ``quantizers/ternary_quantizer.py``), by hand: no
    clipping, one scale ``max|g| = 1.0`` per tensor, ``P(g_hat_i = sign(g_i)) = |g_i| / 1.0``.

    ``[0.5, -1.0, 0.25, 0.0]``: entry 1 is always ``-1.0``, entry 3 always 0, entries 0 and 2
    are ``+1.0`` in half and a quarter of the keys (within 5 standard errors over 2000 keys).
    """
    x = torch.tensor([0.5, -1.0, 0.25, 0.0])
    comp = TernGrad(bucket_size=None)  # clip_sigma=None: the authors' variant
    outs = torch.stack([comp.round_trip(x, StreamKey(run_seed=5, step=k))[1] for k in range(2000)])
    assert set(outs.unique().tolist()) <= {-1.0, 0.0, 1.0}
    assert bool((outs[:, 1] == -1.0).all()) and bool((outs[:, 3] == 0.0).all())
    assert bool((outs[:, [0, 2]] >= 0).all())
    for i, p in ((0, 0.5), (2, 0.25)):
        freq = float((outs[:, i] == 1.0).double().mean())
        assert abs(freq - p) < 5 * math.sqrt(p * (1 - p) / 2000)


def test_wen_et_al_clipping_on_a_small_tensor() -> None:
    """Wen et al.'s 2.5-sigma clipping, by hand: ``[10, 0 x 9]`` has mean 1 and population std
    ``sqrt((81 + 9) / 10) = 3``, so it is clipped to 7.5, which becomes the scale; the outlier
    is then sent as exactly 7.5 and the zeros as 0 (the DQSG authors' TernGrad would send 10)."""
    x = torch.zeros(10)
    x[0] = 10.0
    enc, out = TernGrad(clip_sigma=2.5, bucket_size=None).round_trip(x, KEY)
    assert sent_scales(enc.payload, 1).item() == 7.5
    assert out.tolist() == [7.5] + [0.0] * 9
    assert TernGrad(bucket_size=None).round_trip(x, KEY)[1].tolist() == [10.0] + [0.0] * 9


def _spread(n: int, seed: int = 0) -> torch.Tensor:
    """A gradient whose 64-element blocks span float32's range: zero blocks, subnormal ones
    (whose steps need the float64 path), ordinary and huge ones."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    scales = torch.tensor([1.0, 0.0, 1e-42, 3e-3, 1e-38, 3e37, 1e-20, 1.0])
    return x * scales.repeat_interleave(64).repeat(-(-n // 512)).narrow(0, 0, n)


@pytest.mark.parametrize("bucket_size", [None, 7, 64, 512, 4096])
@pytest.mark.parametrize("n", [1, 9, 1000, 2049])
def test_device_path_is_the_host_path(bucket_size: int | None, n: int) -> None:
    """Without clipping, fixed packing: the device payload's bytes and decode are the host's."""
    codec = TernGrad(bucket_size=bucket_size)
    assert codec.device_resident
    key = StreamKey(run_seed=4, rank=0, step=2, tensor_index=3)
    x = _spread(n, seed=n)
    check_twin_bytes(codec, x, key)
    check_device_decode(codec, x, key)
    assert encode_fake_cuda(codec, (n,), key) == len(codec.encode(x, key).payload)


def test_clipping_and_coded_packings_stay_on_the_host() -> None:
    assert not TernGrad(clip_sigma=2.5).device_resident
    assert not TernGrad(packing="dense").device_resident
