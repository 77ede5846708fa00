"""``decode_into_``/``decode_add_`` into a narrower ``out`` (issue 26, item 5).

A float64 payload's ``1e300`` written into a float32 ``out`` (or a float32 payload's ``1e6``
into a float16 one) would become Inf: it is refused with a PayloadMismatchError naming both
dtypes, as ``decode`` refuses a non-finite output, and ``out`` is left untouched. Values that
fit are written exactly as ``decode`` then a cast (or an add) would write them.
"""

from __future__ import annotations

import pytest
import torch

import gradzip
from gradzip.compressors import Compressor, get, names
from gradzip.errors import PayloadMismatchError
from gradzip.keys import StreamKey

KEY = StreamKey(run_seed=4, rank=0, step=1, tensor_index=3)


def _base(n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(1)).to(dtype)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("method", ["decode_into_", "decode_add_"])
def test_a_float64_value_beyond_float32_is_refused_and_out_untouched(method: str) -> None:
    comp = gradzip.create("identity")
    payload = comp.encode(torch.tensor([1e300, 1.0], dtype=torch.float64), KEY).payload
    out = torch.tensor([3.0, -0.0])
    before = out.clone()
    with pytest.raises(PayloadMismatchError, match=r"float64.*beyond the range.*float32.*Inf"):
        getattr(comp, method)(payload, out)
    assert _same_bits(out, before)
    # a float64 out holds it
    wide = torch.zeros(2, dtype=torch.float64)
    comp.decode_into_(payload, wide)
    assert wide.tolist() == [1e300, 1.0]


#: where ``example_params`` decode only small values (a grid of +-0.128, +-tau = 1e-3)
_LARGE_VALUES = {"qesgd": {"delta": 1e4}, "threshold": {"tau": 1e5}}


def _compressor(name: str) -> Compressor:
    cls = get(name)
    return cls(**_LARGE_VALUES.get(name, cls.example_params))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("method", ["decode_into_", "decode_add_"])
@pytest.mark.parametrize("name", names())
def test_every_codec_writes_a_float64_payload_exactly_or_refuses(
    name: str, method: str, out_dtype: torch.dtype
) -> None:
    """Every compressor carries float64 tensors: values of ~1e6 fit float32 (written as decode
    then cast would write them) but not float16 (refused, ``out`` untouched)."""
    comp = _compressor(name)
    x = _base(256, torch.float64) * 1e6
    side = x.to(torch.float32) if comp.needs_side_information else None
    payload = comp.encode(x, KEY).payload
    decoded = comp.decode(payload, expected_key=KEY, shape=x.shape, side=side)
    assert decoded.dtype == torch.float64
    out = _base(256, out_dtype)
    before = out.clone()
    fits = bool(torch.isfinite(decoded.to(out_dtype)).all())
    assert fits == (out_dtype == torch.float32)  # every codec decodes values of ~1e6
    if not fits:
        with pytest.raises(PayloadMismatchError, match=f"beyond the range.*{out_dtype}"):
            getattr(comp, method)(payload, out, expected_key=KEY, side=side)
        assert _same_bits(out, before), "a refused payload changed out"
        return
    getattr(comp, method)(payload, out, expected_key=KEY, side=side)
    expected = decoded.to(out_dtype) if method == "decode_into_" else before.add_(decoded)
    assert _same_bits(out, expected)


def test_a_float16_out_refuses_top_k_values_it_cannot_hold() -> None:
    # top-k adds its kept values into out without a dense decode: the same refusal
    comp = gradzip.create("topk", k=2)
    payload = comp.encode(torch.tensor([1e6, 1.0, 3.0]), KEY).payload
    out = torch.zeros(3, dtype=torch.float16)
    with pytest.raises(PayloadMismatchError, match="float16"):
        comp.decode_add_(payload, out)
    assert _same_bits(out, torch.zeros(3, dtype=torch.float16))
