"""Host arrays onto a device (:func:`gradzip.device.ops.host_array`): one buffer copy where the
device is reachable, the list construction only for fake CUDA tensors on a CPU build."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gradzip.device.host_reads import count_host_reads
from gradzip.device.ops import host_array


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float32])
def test_on_the_cpu_the_values_arrive_without_a_list(dtype: type) -> None:
    values = np.arange(-5, 1000, 3).astype(dtype)
    got = host_array(values, torch.device("cpu"))
    assert got.dtype == torch.from_numpy(values).dtype
    assert got.data_ptr() == values.ctypes.data  # the array's own buffer: no list in between
    assert np.array_equal(got.numpy(), values)


def test_a_strided_array_is_made_contiguous() -> None:
    values = np.arange(20, dtype=np.int64)[::3]
    assert host_array(values, torch.device("cpu")).tolist() == values.tolist()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fake path is for CPU builds")
def test_fake_cuda_tensors_get_the_list_path_without_reads() -> None:
    values = np.arange(7, dtype=np.int64)
    with FakeTensorMode(allow_non_fake_inputs=True), count_host_reads() as reads:
        got = host_array(values, torch.device("cuda"))
        assert got.device.type == "cuda" and got.shape == (7,) and got.dtype == torch.int64
    assert reads.count == 0
