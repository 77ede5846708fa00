"""Every Triton kernel compiles (Triton's compiler path, which the interpreter tests do not
take) and contains no fused multiply-add: compiled for an H100 (sm_90) to PTX, which needs no
GPU and no process (the PTX assembler's stage is skipped and its version
mocked: only the PTX text is read), with the launch option the entry points pass
(``enable_fp_fusion=False``); with fusion allowed the kernels with products do contract (so
the check is not vacuous). A fused multiply-add rounds once where the numba kernels round twice, and would
change bytes on the device that the interpreter tests cannot see."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tests.kernels.triton_modes import load_kernels

_FLOAT_FMA = re.compile(r"\b(?:fma|mad)\.rn[\w.]*f(?:32|64)\b")


def _stop_at_ptx(*args: Any) -> tuple[str, str] | None:
    """Triton's stage hook: called without arguments for a cache key, then with the backend and
    its stages, whose PTX assembler's stage (it runs in a process of its own) it replaces with
    an empty binary: the kernel is never loaded, only its PTX text read."""
    if not args:
        return "gradzip-ptx-only", "gradzip-ptx-only"
    args[1]["cubin"] = lambda src, metadata: b""
    return None


def ptx(fn: Any, signature: dict[str, str], constants: dict[str, Any], fusion: bool) -> str:
    src = ASTSource(fn=fn, signature=signature, constexprs=constants)
    options = {"enable_fp_fusion": fusion, "ptx_version": 87}  # PTX ISA 8.7 (CUDA 12.8)
    return str(triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"])


@pytest.fixture(autouse=True)
def _ptx_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(knobs.nvidia, "mock_ptx_version", "12.8")
    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", _stop_at_ptx)
    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path))  # compiled afresh, not from a cache


_ENCODE = {"x_ptr": "*fp32", "fac_ptr": "*fp64", "consts_ptr": "*fp64", "packed_ptr": "*u8",
           "n": "i32", "nbytes": "i32", "bucket_size": "i32", "k0": "u32", "k1": "i32",
           "stream": "i32", "top": "i32", "modk": "i32", "NSUM": "constexpr",
           "ALIGNED": "constexpr", "FAST_OK": "constexpr", "MOD": "constexpr",
           "BITS": "constexpr", "BLOCK": "constexpr"}  # fmt: skip
_AFFINE = {"packed_ptr": "*u8", "scales_ptr": "*fp32", "steps_ptr": "*fp64",
           "consts_ptr": "*fp64", "out_ptr": "*fp32", "tops_ptr": "*i64", "n": "i32",
           "nbytes": "i32", "bucket_size": "i32", "k0": "u32", "k1": "i32", "stream": "i32",
           "DITHERED": "constexpr", "WIDE": "constexpr", "WRITE": "constexpr",
           "ADD": "constexpr", "BITS": "constexpr", "BLOCK": "constexpr"}  # fmt: skip
_SYMMETRIC = {"x_ptr": "*fp32", "fac_ptr": "*fp64", "sym_ptr": "*u8", "packed_ptr": "*u8",
              "n": "i32", "nbytes": "i32", "bucket_size": "i32", "k0": "u32", "k1": "i32",
              "S": "constexpr", "CLIP": "constexpr", "BITS": "constexpr",
              "BLOCK": "constexpr"}  # fmt: skip
_DECODE = {"packed_ptr": "*u8", "mults_ptr": "*fp32", "out_ptr": "*fp32", "tops_ptr": "*i64",
           "n": "i32", "nbytes": "i32", "bucket_size": "i32", "s": "i32",
           "WRITE": "constexpr", "ADD": "constexpr", "BITS": "constexpr",
           "BLOCK": "constexpr"}  # fmt: skip
_UNIFORM = {"out_ptr": "*fp32", "offset": "i64", "n": "i32", "k0": "u32", "k1": "i32",
            "stream": "i32", "RUN": "constexpr", "BLOCK": "constexpr"}  # fmt: skip
_PACK = {"m_ptr": "*fp32", "packed_ptr": "*u8", "counts_ptr": "*i64", "sums_ptr": "*fp64",
         "rows": "i32", "words": "i32", "nprog": "i32", "WORDS": "constexpr"}  # fmt: skip
_EXPAND = {"packed_ptr": "*u8", "means_ptr": "*fp32", "out_ptr": "*fp32", "rows": "i32",
           "words": "i32", "ADD": "constexpr", "BLOCK": "constexpr"}  # fmt: skip
_RESIDUAL = {"m_ptr": "*fp32", "means_ptr": "*fp32", "vhat_ptr": "*fp32", "rows": "i32",
             "KEEP": "constexpr", "BLOCK": "constexpr"}  # fmt: skip


def _enc(nsum: int, aligned: bool, fast: bool, mod: bool, bits: int) -> dict[str, Any]:
    return {"NSUM": nsum, "ALIGNED": aligned, "FAST_OK": fast, "MOD": mod, "BITS": bits,
            "BLOCK": 1024}  # fmt: skip


#: (name, module, kernel, signature, constants): every kernel, in the variants the entry points
#: launch (float32 and float64 paths, 1 to 32 bits, with and without adding into)
KERNELS = [
    ("uniform-run", "philox", "_uniform_kernel", _UNIFORM, {"RUN": True, "BLOCK": 1024}),
    ("uniform-at", "philox", "_uniform_kernel", _UNIFORM, {"RUN": False, "BLOCK": 1024}),
    ("dqsg-encode", "dithered", "_encode_kernel", _ENCODE, _enc(0, True, True, False, 2)),
    ("ndqsg-encode", "dithered", "_encode_kernel", _ENCODE, _enc(0, True, True, True, 3)),
    ("half-encode", "dithered", "_encode_kernel", _ENCODE, _enc(3, False, False, False, 9)),
    ("one-bit-encode", "dithered", "_encode_kernel", _ENCODE, _enc(2, True, True, False, 1)),
    ("wide-encode-32", "dithered", "_encode_kernel", _ENCODE, _enc(0, True, False, False, 32)),
    ("affine-check", "dithered", "_decode_affine_kernel", _AFFINE,
     {"DITHERED": True, "WIDE": False, "WRITE": False, "ADD": False, "BITS": 2, "BLOCK": 1024}),
    ("affine-add", "dithered", "_decode_affine_kernel", _AFFINE,
     {"DITHERED": True, "WIDE": False, "WRITE": True, "ADD": True, "BITS": 3, "BLOCK": 1024}),
    ("affine-wide", "dithered", "_decode_affine_kernel", _AFFINE,
     {"DITHERED": True, "WIDE": True, "WRITE": True, "ADD": False, "BITS": 9, "BLOCK": 1024}),
    ("affine-plain", "dithered", "_decode_affine_kernel", _AFFINE,
     {"DITHERED": False, "WIDE": False, "WRITE": True, "ADD": False, "BITS": 3, "BLOCK": 1024}),
    ("terngrad-encode", "stochastic", "_symmetric_encode_kernel", _SYMMETRIC,
     {"S": 1, "CLIP": False, "BITS": 2, "BLOCK": 1024}),
    ("qsgd-encode-clip", "stochastic", "_symmetric_encode_kernel", _SYMMETRIC,
     {"S": 7, "CLIP": True, "BITS": 4, "BLOCK": 1024}),
    ("qsgd-symbols", "stochastic", "_symmetric_encode_kernel", _SYMMETRIC,
     {"S": 3, "CLIP": False, "BITS": 0, "BLOCK": 1024}),
    ("qsgd-encode-wide", "stochastic", "_symmetric_encode_kernel", {**_SYMMETRIC, "sym_ptr": "*i32"},
     {"S": 200, "CLIP": False, "BITS": 9, "BLOCK": 1024}),
    ("qsgd-decode-add", "stochastic", "_symmetric_decode_kernel", _DECODE,
     {"WRITE": True, "ADD": True, "BITS": 2, "BLOCK": 1024}),
    ("signs-pack", "signs", "_pack_kernel", _PACK, {"WORDS": 32}),
    ("signs-expand-add", "signs", "_expand_kernel", _EXPAND, {"ADD": True, "BLOCK": 1024}),
    ("signs-residual", "signs", "_residual_kernel", _RESIDUAL, {"KEEP": True, "BLOCK": 1024}),
]  # fmt: skip

#: kernels with a product next to a sum, which a compiler allowed to would contract
CONTRACTIBLE = [
    "dqsg-encode",
    "half-encode",
    "qsgd-encode-clip",
    "qsgd-encode-wide",
    "qsgd-decode-add",
]


@pytest.mark.parametrize("case", KERNELS, ids=[k[0] for k in KERNELS])
def test_compiled_kernels_hold_no_fused_multiply_add(case: tuple[Any, ...]) -> None:
    name, module, kernel, signature, constants = case
    fn = getattr(getattr(load_kernels(interpret=False), module), kernel)
    assert not _FLOAT_FMA.search(ptx(fn, signature, constants, fusion=False))
    if name in CONTRACTIBLE:  # the check is not vacuous: allowed to, the compiler contracts
        assert _FLOAT_FMA.search(ptx(fn, signature, constants, fusion=True))
