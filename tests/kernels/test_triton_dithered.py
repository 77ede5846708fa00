"""The Triton kernels of the dithered quantizers equal the numba kernels bit for bit, run on CPU
tensors by Triton's interpreter (``TRITON_INTERPRET=1``; see :mod:`tests.kernels.triton_modes`
for why the kernel modules are loaded by :func:`load_kernels`)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from gradzip.errors import CorruptPayloadError
from gradzip.kernels.dithered import fused_decode_affine
from gradzip.kernels.philox import LOCAL_UNIFORM, SHARED_UNIFORM
from gradzip.kernels.triton_dispatch import forced_triton
from tests.cuda_division_rule import cuda_scalar_division
from tests.kernels.triton_modes import load_kernels
from tests.kernels.triton_reference import (
    SEED,
    SIZES,
    gradient,
    numba_dithered_encode,
    same_bits,
    scales_of,
)


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """The interpreted kernel modules, with CPU tensors let through."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with forced_triton():
        yield load_kernels(interpret=True)


def dqsg(M: int, seed: int = SEED) -> dict[str, object]:
    """DQSG's encode arguments (:func:`gradzip.compressors.dqsg._encode_args`)."""
    return {"numer": float(M), "seed": seed, "stream": SHARED_UNIFORM, "nsum": 0,
            "c": float(M - 1), "top": 2 * M, "modk": 0, "fast_ok": M <= 127}  # fmt: skip


#: (name, encode arguments, bits): DQSG at 2, 3, 4 and 8 bits and in float64 (M > 127, 9 bits),
#: NDQSG (nested: mod k), half dithering (sums of uniforms), and a 1-bit grid
CASES = [
    ("dqsg-M1", dqsg(1), 2),
    ("dqsg-M2", dqsg(2), 3),
    ("dqsg-M7", dqsg(7), 4),
    ("dqsg-M127", dqsg(127), 8),
    ("dqsg-M200-wide", dqsg(200), 9),
    ("ndqsg", {**dqsg(3), "numer": 2.7, "c": 6.0, "top": 11, "modk": 5}, 3),
    ("ndqsg-wide", {**dqsg(3), "numer": 2.7, "c": 6.0, "top": 11, "modk": 5, "fast_ok": False}, 3),
    ("half-dither-2", {**dqsg(2), "stream": LOCAL_UNIFORM, "nsum": 2, "c": 1.5, "top": 4}, 3),
    (
        "half-dither-3",
        {**dqsg(2), "stream": LOCAL_UNIFORM, "nsum": 3, "c": 1.0, "fast_ok": False},
        3,
    ),
    ("one-bit", {**dqsg(1), "numer": 0.5, "c": -0.5, "top": 1}, 1),
]


@pytest.mark.parametrize("n", SIZES[:-1])
@pytest.mark.parametrize("bucket_size", [0, 512])
@pytest.mark.parametrize(("name", "args", "bits"), CASES, ids=[c[0] for c in CASES])
def test_encode_equals_numba(
    kernels: SimpleNamespace, n: int, bucket_size: int, name: str, args: dict[str, object],
    bits: int,
) -> None:  # fmt: skip
    x = gradient(n, seed=n, tiny_bucket=bucket_size or None)
    scales = scales_of(x, bucket_size)
    expected = numba_dithered_encode(x, scales, bucket_size, bits, **args)
    packed = kernels.dithered.triton_dithered_encode(x, scales, bucket_size, bits=bits, **args)
    assert same_bits(packed, expected)


@pytest.mark.parametrize(("name", "args", "bits"), [CASES[1], CASES[7]], ids=["dqsg", "half"])
def test_encode_equals_numba_on_100k_elements(
    kernels: SimpleNamespace, name: str, args: dict[str, object], bits: int
) -> None:
    n = SIZES[-1]
    x = gradient(n, tiny_bucket=512)
    scales = scales_of(x, 512)
    expected = numba_dithered_encode(x, scales, 512, bits, **args)
    packed = kernels.dithered.triton_dithered_encode(x, scales, 512, bits=bits, **args)
    assert same_bits(packed, expected)


def test_encode_depends_on_the_seed(kernels: SimpleNamespace) -> None:
    # the comparison can fail: another seed (or stream) gives other bytes
    x = gradient(4099)
    scales = scales_of(x, 512)
    expected = numba_dithered_encode(x, scales, 512, 3, **dqsg(2))
    for args in (dqsg(2, seed=SEED + 1), {**dqsg(2), "stream": LOCAL_UNIFORM}):
        packed = kernels.dithered.triton_dithered_encode(x, scales, 512, bits=3, **args)
        assert not same_bits(packed, expected)


#: (name, alphabet, divisor, c, dithered, wide): DQSG's decode (M = 1, 3, 127, and 200 in
#: float64) and the undithered affine decode
DECODES = [
    ("dqsg-M1", 3, 1.0, -0.5, True, False),
    ("dqsg-M3", 7, 3.0, -1.5, True, False),
    ("dqsg-M127", 255, 127.0, -125.5, True, False),
    ("dqsg-M200-wide", 401, 200.0, -198.5, True, True),
    ("plain", 5, 2.0, -2.0, False, False),
    ("plain-wide", 5, 2.0, -2.0, False, True),
]


def encoded(n: int, bucket_size: int, alphabet: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(packed, scales, bits)``: a DQSG-like encoding with that alphabet."""
    M = (alphabet - 1) // 2
    x = gradient(n, seed=n + 1, tiny_bucket=bucket_size or None)
    scales = scales_of(x, bucket_size)
    bits = (alphabet - 1).bit_length()
    return numba_dithered_encode(x, scales, bucket_size, bits, **dqsg(M)), scales, bits


@pytest.mark.parametrize("n", [1, 1031, 4099])
@pytest.mark.parametrize("bucket_size", [0, 512])
@pytest.mark.parametrize("case", DECODES, ids=[d[0] for d in DECODES])
def test_decode_affine_equals_numba(
    kernels: SimpleNamespace, n: int, bucket_size: int, case: tuple[object, ...]
) -> None:
    _, alphabet, divisor, c, dithered, wide = case
    packed, scales, _ = encoded(n, bucket_size, int(alphabet))  # type: ignore[call-overload]
    args = (alphabet, scales, bucket_size, divisor, c, dithered, SEED, SHARED_UNIFORM, wide, "t")
    expected = fused_decode_affine(packed, n, *args)  # type: ignore[arg-type]
    values = kernels.dithered.triton_decode_affine(packed, n, *args)
    assert same_bits(values, expected)
    # the add-into variant: out[i] + v, one float32 add, as numba's
    start = gradient(n, seed=7)
    out, ref = start.clone(), start.clone()
    fused_decode_affine(packed, n, *args, out=ref)  # type: ignore[arg-type]
    assert kernels.dithered.triton_decode_affine(packed, n, *args, out=out) is out
    assert same_bits(out, ref)
    # written into out (add=False)
    kernels.dithered.triton_decode_affine(packed, n, *args, out=out, add=False)
    assert same_bits(out, expected)


def test_decode_affine_equals_numba_on_100k_elements(kernels: SimpleNamespace) -> None:
    n = SIZES[-1]
    packed, scales, _ = encoded(n, 512, 7)
    args = (7, scales, 512, 3.0, -1.5, True, SEED, SHARED_UNIFORM, False, "t")
    expected = fused_decode_affine(packed, n, *args)
    assert same_bits(kernels.dithered.triton_decode_affine(packed, n, *args), expected)
    wrong = (7, scales, 512, 3.0, -1.5, True, SEED ^ 1, SHARED_UNIFORM, False, "t")
    assert not same_bits(kernels.dithered.triton_decode_affine(packed, n, *wrong), expected)


@pytest.mark.parametrize("wide", [False, True])
def test_decode_affine_steps_are_true_divisions_under_cuda_rules(
    kernels: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, wide: bool
) -> None:
    """The wrapper's per-bucket steps ``f64(sigma) / divisor`` are true divisions also where a
    division by a Python number is a reciprocal product (CUDA's rule, emulated): computed by
    ``/ float(divisor)`` they were one float64 ulp off in 676 of 2,048 buckets on an H200, and 9
    of 2^20 wide-mode values decoded differently from numba. One-value buckets here: about a
    third of the reciprocal products differ, so the check never depends on a lucky value."""
    n, bucket = 4099, 1
    packed, scales, _ = encoded(n, bucket, 7)
    args = (7, scales, bucket, 3.0, -1.5, True, SEED, SHARED_UNIFORM, wide, "t")
    launcher = kernels.dithered.affine_decode_launcher
    seen: list[torch.Tensor] = []

    def recording(*launch_args: object) -> object:
        seen.append(launch_args[4])  # type: ignore[arg-type]  # the steps
        return launcher(*launch_args)

    monkeypatch.setattr(kernels.dithered, "affine_decode_launcher", recording)
    with cuda_scalar_division():
        got = kernels.dithered.triton_decode_affine(packed, n, *args)
    true_steps = torch.from_numpy(scales.to(torch.float64).numpy() / 3.0)
    assert not torch.equal(scales.to(torch.float64) * (1.0 / 3.0), true_steps)  # the rule bites
    assert torch.equal(seen[0], true_steps)
    assert same_bits(got, fused_decode_affine(packed, n, *args))


def test_decode_affine_rejects_symbols_outside_the_alphabet_before_adding(
    kernels: SimpleNamespace,
) -> None:
    n = 1031
    packed, scales, _ = encoded(n, 0, 3)  # 2-bit symbols of a 3-symbol alphabet
    packed = packed.clone()
    packed[200] = 0xFF  # four symbols 3
    args = (3, scales, 0, 1.0, -0.5, True, SEED, SHARED_UNIFORM, False, "t")
    with pytest.raises(CorruptPayloadError, match="alphabet"):
        kernels.dithered.triton_decode_affine(packed, n, *args)
    out = gradient(n)
    before = out.clone()
    with pytest.raises(CorruptPayloadError, match="alphabet"):
        kernels.dithered.triton_decode_affine(packed, n, *args, out=out)
    assert same_bits(out, before)  # untouched
