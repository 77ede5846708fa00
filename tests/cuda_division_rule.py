"""CUDA's rule for dividing a floating tensor by a Python number, emulated on CPU tensors.

On a CUDA tensor, ``t / k`` with ``k`` a Python number (or a 0-d CPU tensor) is not a division:
ATen's true-division kernel computes the reciprocal ``1 / k`` once in the operation's math type
(float32 for float32, float16 and bfloat16; float64 for float64) and multiplies every element by
it, two roundings where the CPU does one. gradzip's device path therefore divides by a 0-d tensor
on the dividend's device (:mod:`gradzip.kernels.device_division`); a Python-number divisor left on
that path gives a GPU's bytes that differ from the CPU's (the first ``make gpu-check`` on an H200
found one: the Triton affine decode's per-bucket steps).

:func:`cuda_scalar_division` makes CPU tensors follow CUDA's rule while it is active, so that a
test running the device path on CPU tensors sees what a GPU would compute. A 0-d tensor divisor
keeps a true division: on the device path it lives on the dividend's device, where CUDA divides.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

#: the division entry points with the divisor second (CUDA rewrites only those)
_OUT_OF_PLACE = {torch.Tensor.__truediv__, torch.Tensor.div, torch.div, torch.true_divide,
                 torch.Tensor.true_divide}  # fmt: skip
_IN_PLACE = {torch.Tensor.__itruediv__, torch.Tensor.div_, torch.Tensor.true_divide_}


def _math_type(dtype: torch.dtype) -> torch.dtype:
    """ATen's ``opmath_type``: float32 arithmetic for the half-precision types."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def reciprocal_product(t: torch.Tensor, k: float) -> torch.Tensor:
    """``t / k`` as CUDA computes it: ``t * (1 / k)``, the reciprocal rounded in the math type."""
    math = _math_type(t.dtype)
    inverse = torch.ones((), dtype=math) / torch.tensor(k, dtype=math)
    return (t.to(math) * inverse).to(t.dtype)


class _CudaScalarDivision(TorchFunctionMode):
    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if (
            (func in _OUT_OF_PLACE or func in _IN_PLACE)
            and len(args) == 2
            and kwargs.get("rounding_mode") is None
            and "out" not in kwargs
            and isinstance(args[0], torch.Tensor)
            and args[0].is_floating_point()
            and isinstance(args[1], (int, float))
            and not isinstance(args[1], bool)
        ):
            result = reciprocal_product(args[0], float(args[1]))
            if func in _IN_PLACE:
                return args[0].copy_(result)
            return result
        return func(*args, **kwargs)


@contextmanager
def cuda_scalar_division() -> Iterator[None]:
    """While active, a floating tensor divided by a Python number is computed as CUDA computes it
    (:func:`reciprocal_product`); every other operation is unchanged."""
    with _CudaScalarDivision():
        yield
