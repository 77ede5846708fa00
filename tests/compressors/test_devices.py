"""Payloads do not depend on the device the tensor lives on: a device-resident codec's device
payload (a uint8 tensor on the GPU) holds the CPU payload's bytes, and a host codec's payload is
the same bytes. Runs where a CUDA device exists; skipped elsewhere (CI has none: there the same
property is checked on CPU tensors through the device path, tests/compressors/test_device_path.py,
and on fake CUDA tensors)."""

from __future__ import annotations

import pytest
import torch

from gradzip.compressors import get, names
from gradzip.keys import StreamKey

KEY = StreamKey(run_seed=4, rank=1, step=3, tensor_index=0)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("name", names())
def test_cuda_and_cpu_tensors_give_the_same_payload(name: str) -> None:
    cls = get(name)
    comp = cls(**cls.example_params)
    x = torch.randn(4097, generator=torch.Generator().manual_seed(0))
    on_cpu = comp.encode(x, KEY).payload
    on_gpu = comp.encode(x.cuda(), KEY).payload
    if isinstance(on_gpu, torch.Tensor):
        assert on_gpu.device.type == "cuda" and comp.device_resident
        assert bytes(on_gpu.cpu().numpy()) == bytes(on_cpu)
    else:
        assert bytes(on_gpu) == bytes(on_cpu)
    side = x.cuda() if comp.needs_side_information else None
    out = comp.decode(on_gpu, expected_key=KEY, side=side, device="cuda")
    assert out.device.type == "cuda"
    side_cpu = x if comp.needs_side_information else None
    assert torch.equal(out.cpu(), comp.decode(on_cpu, expected_key=KEY, side=side_cpu))
