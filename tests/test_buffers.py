"""The pool of large output arrays: an array is handed out again only once nothing but the
pool refers to it (no tensor, view or array of a caller), and idle arrays are bounded."""

from __future__ import annotations

import gc

import numpy as np
import torch

from gradzip import buffers

N = buffers.MIN_POOLED_BYTES // 4  # the smallest pooled float32 length


def test_an_array_in_use_is_never_handed_out_again() -> None:
    first = buffers.fresh_array(N, np.float32)
    tensor = torch.from_numpy(first)
    view = tensor[10:20]
    del first, tensor
    second = buffers.fresh_array(N, np.float32)
    assert second.ctypes.data != view.data_ptr() - 40  # the view keeps the first one busy
    del view
    gc.collect()
    third = buffers.fresh_array(N, np.float32)
    fourth = buffers.fresh_array(N, np.float32)
    assert len({second.ctypes.data, third.ctypes.data, fourth.ctypes.data}) == 3


def test_a_released_array_is_recycled() -> None:
    first = buffers.fresh_array(N + 1, np.float32)
    address = first.ctypes.data
    numpy_view = torch.from_numpy(first).numpy()[5:]
    del first
    assert buffers.fresh_array(N + 1, np.float32).ctypes.data != address  # still viewed
    del numpy_view
    assert buffers.fresh_array(N + 1, np.float32).ctypes.data == address


def test_small_and_differently_typed_arrays_are_not_shared() -> None:
    small = buffers.fresh_array(16, np.float32)
    assert small.shape == (16,) and small.dtype == np.float32
    floats = buffers.fresh_array(N + 2, np.float32)
    address = floats.ctypes.data
    del floats
    ints = buffers.fresh_array(N + 2, np.int32)
    assert ints.dtype == np.int32 and ints.ctypes.data != address


def test_idle_arrays_are_bounded() -> None:
    arrays = [buffers.fresh_array(N + 3, np.float32) for _ in range(4)]
    del arrays
    assert buffers.idle_bytes() >= 4 * (N + 3) * 4
    buffers.release_idle(keep=(N + 3) * 4)
    assert buffers.idle_bytes() <= (N + 3) * 4
    buffers.release_idle()
    assert buffers.idle_bytes() == 0
