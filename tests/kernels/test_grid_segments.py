"""The batched (segmented) grid kernels give, for every tensor of a batch, the bits of the
per-tensor kernels run on that tensor alone: its bucket scales, its symbols under its own key
and its decode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradzip.compressors._scaled_stochastic import stochastic_symbols
from gradzip.compressors.buckets import bucket_absmax, num_buckets
from gradzip.kernels.grid_segments import (
    encode_segments,
    rescale_segments,
    segment_absmax,
    segment_layout,
)
from gradzip.kernels.grid_sums import mean_from_sums
from gradzip.keys import StreamKey
from gradzip.rng import derive_seed

#: lengths: one value, under a Philox block, a bucket boundary, odd, past a parallel task
#: (32,768) and an empty tensor
SIZES = (1, 7, 512, 513, 1000, 40_000, 0, 3)


def tensors(sizes: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(n, generator=g) * (1 + i) for i, n in enumerate(sizes)]
    if sizes[-1] >= 3:  # a zero bucket, with a negative zero in it
        out[-1] = torch.tensor([0.0, -0.0, 0.0])
    return out


def keys(count: int) -> list[StreamKey]:
    return [StreamKey(run_seed=9, rank=2, step=5, tensor_index=10 + i) for i in range(count)]


def per_tensor_scales(xs: list[torch.Tensor], bucket: int) -> list[torch.Tensor]:
    return [bucket_absmax(x, bucket) for x in xs if x.numel()]


@pytest.mark.parametrize("bucket", [0, 8, 100, 512])
def test_scales_are_each_tensors_bucket_absmax(bucket: int) -> None:
    xs = tensors(SIZES)
    layout = segment_layout(SIZES, bucket)
    got = segment_absmax(torch.cat(xs), layout)
    expected = torch.cat(per_tensor_scales(xs, bucket))
    assert got.numpy().tobytes() == expected.numpy().tobytes()  # +0.0 for the zero bucket
    assert layout.scale_count == sum(num_buckets(n, bucket) for n in SIZES)


@pytest.mark.parametrize(
    ("s", "per", "clip"),
    [
        (1, 1, False),
        (4, 4, False),
        (16, 16, False),
        (127, 127, False),
        (200, 200, False),
        (4, 1, True),
    ],
    ids=["ternary", "s4", "s16", "s127-float32", "s200-float64", "clipped"],
)
@pytest.mark.parametrize("bucket", [0, 100, 512])
def test_symbols_are_each_tensors_own(s: int, per: int, clip: bool, bucket: int) -> None:
    """Each segment's symbols equal ``stochastic_symbols`` of its tensor alone under its key:
    the same scales per bucket, the uniforms drawn from its own stream and index 0."""
    xs = tensors(SIZES, seed=1)
    layout = segment_layout(SIZES, bucket)
    scales = [sc * (1.0 if not clip else 0.3) for sc in per_tensor_scales(xs, bucket)]
    live = [x for x in xs if x.numel()]
    ks = keys(len(SIZES))
    live_keys = [k for k, n in zip(ks, SIZES, strict=True) if n]
    seeds = [derive_seed(k, domain="local") for k in ks]
    got = encode_segments(torch.cat(xs), torch.cat(scales), layout, per, s, clip, seeds)
    assert got.dtype == torch.int32
    expected = [
        stochastic_symbols(x, sc, per, s, k, bucket, may_overload=clip).to(torch.int32)
        for x, sc, k in zip(live, scales, live_keys, strict=True)
    ]
    assert torch.equal(got, torch.cat(expected))
    if clip:
        assert int(got.min()) == 0 and int(got.max()) == 2 * s  # some values were clipped


@pytest.mark.parametrize("count", [1, 4])
@pytest.mark.parametrize("bucket", [0, 100, 512])
def test_rescale_is_each_tensors_mean_from_sums(count: int, bucket: int) -> None:
    g = torch.Generator().manual_seed(3)
    layout = segment_layout(SIZES, bucket)
    s = 16
    sums = torch.randint(0, 2 * s * count + 1, (layout.total,), generator=g, dtype=torch.int32)
    steps = torch.rand(layout.scale_count, generator=g)
    got = rescale_segments(sums, count * s, steps, layout)
    expected = []
    for i, n in enumerate(SIZES):
        if not n:
            continue
        a, b = layout.segment(i)
        lo, hi = int(layout.scale_starts[i]), int(layout.scale_starts[i + 1])
        expected.append(mean_from_sums(sums[a:b], count * s, [], steps[lo:hi].clone(), bucket))
    assert got.numpy().tobytes() == torch.cat(expected).numpy().tobytes()


def test_the_layout_of_a_batch() -> None:
    layout = segment_layout((5, 0, 12), 4)
    assert layout.starts.tolist() == [0, 5, 5, 17]
    assert layout.scale_starts.tolist() == [0, 2, 2, 5]
    assert layout.bucket_sizes.tolist() == [4, 0, 4]
    assert layout.count == 3
    assert list(zip(layout.bucket_lo.tolist(), layout.bucket_hi.tolist(), strict=True)) == [
        (0, 4),
        (4, 5),
        (5, 9),
        (9, 13),
        (13, 17),
    ]
    # a segment of one bucket (bucket size 0): one scale over its whole length
    single = segment_layout((10,), 0)
    assert single.bucket_sizes.tolist() == [0] and single.scale_count == 1
    assert list(zip(single.bucket_lo.tolist(), single.bucket_hi.tolist(), strict=True)) == [(0, 10)]
    assert segment_layout((), 8).total == 0
    with pytest.raises(ValueError, match=">= 0"):
        segment_layout((3, -1), 8)


def test_wrong_inputs_are_refused_by_name() -> None:
    layout = segment_layout((10, 6), 4)
    x = torch.randn(16)
    with pytest.raises(ValueError, match="16 float32 values"):
        segment_absmax(x.double(), layout)
    with pytest.raises(ValueError, match="16 float32 values"):
        segment_absmax(x[:15], layout)
    scales = segment_absmax(x, layout)
    with pytest.raises(ValueError, match="5 scales and 2 seeds"):
        encode_segments(x, scales[:4], layout, 4, 4, False, [1, 2])
    with pytest.raises(ValueError, match="5 scales and 2 seeds"):
        encode_segments(x, scales, layout, 4, 4, False, [1])
    sums = torch.zeros(16, dtype=torch.int32)
    with pytest.raises(ValueError, match="16 int32 sums"):
        rescale_segments(sums.float(), 0, scales, layout)
    with pytest.raises(ValueError, match="5 float32 steps"):
        rescale_segments(sums, 0, scales.double(), layout)
    assert np.all(rescale_segments(sums, 0, scales, layout).numpy() == 0)
