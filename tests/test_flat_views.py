"""``adjacent_flat``: tensors laid end to end in one storage seen as one flat view (a DDP
bucket's gradients), and None wherever a view would not be their concatenation."""

from __future__ import annotations

import torch

from gradzip.flat_views import adjacent_flat


def views(flat: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    out, at = [], 0
    for n in sizes:
        out.append(flat.narrow(0, at, n))
        at += n
    return out


def test_a_buckets_views_are_the_bucket() -> None:
    flat = torch.arange(20, dtype=torch.float32)
    parts = [v.view(2, 3) if v.numel() == 6 else v for v in views(flat, [6, 4, 0, 10])]
    joined = adjacent_flat(parts)
    assert joined is not None
    assert torch.equal(joined, torch.cat([p.reshape(-1) for p in parts]))
    assert joined.data_ptr() == flat.data_ptr()  # no copy: the bucket's own memory


def test_a_run_that_starts_inside_its_storage_keeps_its_offset() -> None:
    flat = torch.arange(20, dtype=torch.float32)
    parts = views(flat, [3, 5, 7, 5])[1:3]
    joined = adjacent_flat(parts)
    assert joined is not None and joined.tolist() == list(range(3, 15))


def test_anything_but_end_to_end_is_refused() -> None:
    flat = torch.arange(20, dtype=torch.float32)
    a, b, c = views(flat, [5, 5, 10])
    assert adjacent_flat([a, c]) is None  # a gap
    assert adjacent_flat([b, a]) is None  # out of order
    assert adjacent_flat([a, b.clone()]) is None  # another storage
    assert adjacent_flat([a, torch.arange(5, 10, dtype=torch.float64)]) is None  # dtypes
    grid = torch.arange(16, dtype=torch.float32).view(4, 4)
    assert adjacent_flat([grid[:, :2]]) is None  # not contiguous
    assert adjacent_flat([]) is None and adjacent_flat([flat[:0]]) is None
