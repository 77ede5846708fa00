"""Error feedback (spec 0.6): a stateful wrapper that re-sends what compression dropped.

The compressors are stateless; this wrapper holds one residual per ``(tensor_index, chunk)`` of
one sender and implements ``v = g + e``, ``c = encode(v)``, ``v_hat = decode(c)``,
``e = v - v_hat``.

It is the mechanism the schemes use (one per error-feedback role); error feedback is asked for
one way, the scheme's ``error_feedback=True`` (off by default for every scheme), so it is not
exported from :mod:`gradzip`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

import torch

from gradzip.accounting import Encoded
from gradzip.compressors.base import Compressor, empty_output
from gradzip.device.mode import device_path
from gradzip.device.ops import on_device
from gradzip.errors import CheckpointError
from gradzip.keys import StreamKey

_STATE_VERSION = 1
Slot = tuple[int, int]
T = TypeVar("T")


def is_count(value: object) -> bool:
    """An int >= 0 (not a bool): a slot number or a counter in a checkpoint."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype residuals and averages work in: float64 for float64 tensors, float32 for every
    other dtype (the schemes' averages use it too)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@runtime_checkable
class FusedFeedback(Protocol):
    """A compressor that computes error feedback's residual in its own encode pass.

    ``encode_with_feedback(v, key, reconstruct=...)`` encodes ``v`` (the working-dtype CPU
    tensor ``g + e``, owned by the caller) into the payload :meth:`Compressor.encode` gives,
    and turns ``v``, in place, into ``v - v_hat`` where ``v_hat`` is bitwise what the
    compressor's ``decode`` returns for that payload (with the key, shape and dtype of ``v``);
    it returns ``(encoded, v_hat if reconstruct else None)``. It returns None, leaving ``v``
    untouched, for an input it does not serve (then the generic path runs), and raises (with
    ``v`` untouched) where ``encode`` would, e.g. on non-finite input.
    """

    def encode_with_feedback(
        self, v: torch.Tensor, key: StreamKey, *, reconstruct: bool = False
    ) -> tuple[Encoded, torch.Tensor | None] | None: ...


@functools.cache
def _fuses(cls: type) -> bool:
    """Whether instances of compressor class ``cls`` offer :class:`FusedFeedback` (a class
    setting ``encode_with_feedback = None`` does not). Asked per class and remembered: the
    runtime protocol check costs microseconds, once per tensor and step otherwise."""
    return issubclass(cls, FusedFeedback)


class ErrorFeedback:
    """Error feedback around any compressor, for one sender (spec 0.6).

    Each call ``encode(g, key)`` compresses ``v = g + e`` with the inner compressor, decodes the
    payload with the inner *decoder* (so the sender's ``v_hat`` is bitwise identical to what
    every receiver reconstructs) and keeps ``e = v - v_hat`` for the next call with the same
    ``(key.tensor_index, key.chunk)``. Residuals start as zeros on first use.

    Telescoping identity (exact up to float rounding): ``sum_{t<T} v_hat_t = sum_{t<T} g_t + e_0 -
    e_T``, so nothing the compressor drops is lost, only delayed. For a delta-approximate inner
    compressor with ``E||g||^2 <= G^2``, ``E||e_t||^2 <= 4 (1 - delta) / delta^2 * G^2``
    (Karimireddy et al., Lemma 3; spec 4.5 [RECON]); with ``delta = 1`` (identity) ``e = 0``.

    [CHOICE] Residuals are kept on the CPU (on the gradient's device for a device-resident
    compressor given tensors that are not on the CPU: see :mod:`gradzip.device`) in float32, or in float64 for float64 gradients, and
    ``v`` is encoded in that dtype: a float16/bfloat16 gradient is therefore sent as a float32
    tensor (the receiver gets float32 and casts as it needs), so that ``g + e`` is neither
    rounded to half precision nor overflows it.

    [CHOICE] A compressor offering :class:`FusedFeedback` computes ``e`` (and ``v_hat``) in its
    own encode pass instead of the decode and subtraction above, bitwise the same residual and
    payload; the generic path serves every other compressor and nested codecs (``side``).

    The state changes only when an encode succeeds: non-finite ``g + e`` raises the inner
    compressor's :class:`~gradzip.errors.NonFiniteInputError` and a gradient whose shape differs
    from the stored residual raises ``ValueError``; both leave every residual untouched.

    Parameters: ``inner``, any compressor. Stronger compression (smaller delta) leaves larger
    residuals, which EF delivers later; unbiased compressors (DQSG, QSGD) do not need EF.

    References: Seide et al., "1-Bit Stochastic Gradient Descent" (Interspeech 2014);
    Karimireddy et al., "Error Feedback Fixes SignSGD" (ICML 2019); Stich et al. (NeurIPS 2018).
    """

    def __init__(self, inner: Compressor) -> None:
        if not isinstance(inner, Compressor):
            raise TypeError(f"ErrorFeedback wraps a Compressor, got {type(inner).__name__}")
        self.inner = inner
        self._residuals: dict[Slot, torch.Tensor] = {}

    def encode(
        self,
        tensor: torch.Tensor,
        key: StreamKey | None = None,
        *,
        side: torch.Tensor | None = None,
    ) -> Encoded:
        """Compress ``tensor + residual``; update the residual only if this succeeds.

        ``side`` is the side information of a nested codec, passed to the sender-side decode.
        """
        return self._encode(tensor, key, side, reconstruct=False)[0]

    def round_trip(
        self,
        tensor: torch.Tensor,
        key: StreamKey | None = None,
        *,
        side: torch.Tensor | None = None,
    ) -> tuple[Encoded, torch.Tensor]:
        """:meth:`encode`, also returning the sender's ``v_hat`` (float32 or float64, on the CPU).

        ``v_hat`` is bitwise what a receiver decodes from the payload, so a simulation (or a
        scheme that needs its own reconstruction) can use it instead of decoding again.
        """
        encoded, v_hat = self._encode(tensor, key, side, reconstruct=True)
        assert v_hat is not None
        return encoded, v_hat

    def _encode(
        self,
        tensor: torch.Tensor,
        key: StreamKey | None,
        side: torch.Tensor | None,
        *,
        reconstruct: bool,
    ) -> tuple[Encoded, torch.Tensor | None]:
        key = key if key is not None else StreamKey()
        inner = self.inner
        if side is None and _fuses(type(inner)):
            slot, v = self._compensated(tensor, key)
            fused = cast(FusedFeedback, inner).encode_with_feedback(v, key, reconstruct=reconstruct)
            if fused is not None:
                fused[0].verify()  # a device payload's flag: raises before the residual changes
                self._residuals[slot] = v  # now v - v_hat, computed by the encode pass
                return fused

        def quantize(v: torch.Tensor) -> tuple[tuple[Encoded, torch.Tensor], torch.Tensor]:
            encoded = inner.encode(v, key)  # raises on non-finite v before any change
            encoded.verify()  # (a device payload's encoder does not raise: its flag, read once)
            v_hat = inner.decode(
                encoded.payload, expected_key=key, shape=v.shape, dtype=v.dtype, side=side
            )
            return (encoded, v_hat), v_hat

        return self.compensate(tensor, key, quantize)

    def compensate(
        self,
        tensor: torch.Tensor,
        key: StreamKey,
        quantize: Callable[[torch.Tensor], tuple[T, torch.Tensor]],
    ) -> T:
        """Error feedback around any quantization step (for schemes that quantize in their own
        way, e.g. on a scale agreed between ranks): ``v = tensor + e``; ``(result, v_hat) =
        quantize(v)``; ``e = v - v_hat``; returns ``result``. The residual is replaced only if
        ``quantize`` returns; ``v`` is in the working dtype (float32, or float64)."""
        slot, v = self._compensated(tensor, key)
        result, v_hat = quantize(v)
        self.commit(slot, v, v_hat)
        return result

    def compensated(
        self, tensor: torch.Tensor, key: StreamKey, out: torch.Tensor | None = None
    ) -> tuple[Slot, torch.Tensor]:
        """Phase one of :meth:`compensate` split in two, for a scheme that quantizes several
        tensors before it knows whether the step succeeds (one agreement for a batch): the slot
        of ``key`` and ``v = tensor + e``, a new tensor of the working dtype the caller owns.
        Nothing changes until :meth:`commit`; a step that fails simply never commits.

        ``out``: where to write ``v`` on the host path (a contiguous CPU tensor of the working
        dtype and ``tensor.numel()`` elements, e.g. a view of a batch's concatenation, so the
        batch needs no copy of its own); ``v`` is then ``out`` in ``tensor``'s shape."""
        return self._compensated(tensor, key, out)

    def commit(self, slot: Slot, v: torch.Tensor, v_hat: torch.Tensor) -> None:
        """Phase two: keep ``e = v - v_hat`` for ``slot`` (``v`` from :meth:`compensated`,
        turned into the residual in place; ``v_hat`` this sender's reconstruction of it)."""
        self._residuals[slot] = v.sub_(v_hat.to(v.dtype))

    def _compensated(
        self, tensor: torch.Tensor, key: StreamKey, out: torch.Tensor | None = None
    ) -> tuple[Slot, torch.Tensor]:
        """The slot of ``key`` and ``v = tensor + e`` as a new contiguous CPU tensor of the
        working dtype, or in ``out`` (one pass: the cast and the addition write ``v``
        together)."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        slot = (key.tensor_index, key.chunk)
        residual = self._residuals.get(slot)
        if residual is not None and residual.shape != tensor.shape:
            raise ValueError(
                f"error feedback for tensor_index {slot[0]}, chunk {slot[1]}: gradient shape "
                f"{tuple(tensor.shape)} differs from the stored residual's shape "
                f"{tuple(residual.shape)}; call reset() if the model changed"
            )
        dtype = working_dtype(tensor.dtype)
        if self.inner.device_resident and device_path(tensor):
            # the device path: the residual lives where the gradient does, nothing crosses
            g = tensor.detach().to(dtype)
            if residual is None:
                return slot, g.clone(memory_format=torch.contiguous_format)
            return slot, torch.add(g, on_device(residual, g.device).to(dtype))
        g = tensor.detach().to(device="cpu", dtype=dtype)
        if out is not None and (
            out.numel() != tensor.numel()
            or out.dtype != dtype
            or out.device.type != "cpu"
            or not out.is_contiguous()
        ):
            raise ValueError(
                f"error feedback's out must be {tensor.numel()} contiguous {dtype} values on the "
                f"CPU, got {out.numel()} {out.dtype} on {out.device}"
            )
        # recycled memory (gradzip.buffers): a fresh tensor of a large gradient costs more in
        # page faults than the addition that fills it
        v = (out if out is not None else empty_output(tensor.numel(), dtype)).view(tensor.shape)
        if residual is None:
            v.copy_(g)
        else:
            torch.add(g, residual.to(dtype), out=v)  # bitwise the cast, then the addition
        return slot, v

    def decode(self, payload: bytes | bytearray | memoryview, **kwargs: Any) -> torch.Tensor:
        """The receiver's side: exactly the inner compressor's ``decode``."""
        return self.inner.decode(payload, **kwargs)

    def residual(self, tensor_index: int, chunk: int = 0) -> torch.Tensor:
        """A copy of the residual of ``(tensor_index, chunk)``; KeyError if never encoded."""
        try:
            return self._residuals[(tensor_index, chunk)].clone()
        except KeyError:
            raise KeyError(
                f"no residual for tensor_index {tensor_index}, chunk {chunk}: nothing encoded yet"
            ) from None

    def snapshot(self) -> dict[Slot, torch.Tensor]:
        """A cheap restore point: encode replaces residual tensors instead of mutating them,
        so holding the current references is enough (no copies)."""
        return dict(self._residuals)

    def restore(self, snapshot: dict[Slot, torch.Tensor]) -> None:
        """Return to a :meth:`snapshot` (e.g. when a multi-tensor step fails half way)."""
        self._residuals = dict(snapshot)

    def reset(self) -> None:
        """Forget every residual (they restart as zeros)."""
        self._residuals.clear()

    def state_dict(self) -> dict[str, Any]:
        """Plain, ``torch.save``-able state: ints, lists and CPU tensors only (copies)."""
        slots = sorted(self._residuals)
        return {
            "version": _STATE_VERSION,
            "tensor_index": [s[0] for s in slots],
            "chunk": [s[1] for s in slots],
            "residual": [self._residuals[s].clone() for s in slots],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the state with ``state`` (from :meth:`state_dict`), validating it first.

        Raises :class:`~gradzip.errors.CheckpointError` naming the problem (a missing entry, a
        negative or non-integer slot, a slot listed twice, a residual that is not a finite
        float tensor, or whose shape differs from the one held for the same slot); on any error
        the current state is kept.
        """
        self._residuals = self.parse_state(state)

    def parse_state(self, state: Mapping[str, Any]) -> dict[Slot, torch.Tensor]:
        """The residuals :meth:`load_state_dict` would install, after every check; changes
        nothing (so that a front end can validate all its parts before loading any)."""
        if not isinstance(state, Mapping) or state.get("version") != _STATE_VERSION:
            found = state.get("version") if isinstance(state, Mapping) else type(state).__name__
            raise CheckpointError(
                f"error-feedback state has version {found!r}; expected {_STATE_VERSION}"
            )
        try:
            indices, chunks = list(state["tensor_index"]), list(state["chunk"])
            residuals = list(state["residual"])
        except (KeyError, TypeError) as err:
            raise CheckpointError(f"error-feedback state lacks its slot lists: {err!r}") from err
        if not len(indices) == len(chunks) == len(residuals):
            raise CheckpointError(
                "error-feedback state lists tensor_index, chunk, residual differ in length"
            )
        loaded: dict[Slot, torch.Tensor] = {}
        for ti, chunk, res in zip(indices, chunks, residuals, strict=True):
            if not all(is_count(v) for v in (ti, chunk)):
                raise CheckpointError(
                    f"error-feedback state has slot ({ti!r}, {chunk!r}): tensor_index and "
                    "chunk must be ints >= 0"
                )
            slot = (int(ti), int(chunk))
            if slot in loaded:
                raise CheckpointError(f"error-feedback state lists slot {slot} twice")
            if not isinstance(res, torch.Tensor) or res.dtype not in (torch.float32, torch.float64):
                raise CheckpointError(f"residual of slot {slot} must be a float32/float64 tensor")
            current = self._residuals.get(slot)
            if current is not None and current.shape != res.shape:
                raise CheckpointError(
                    f"residual of tensor_index {slot[0]}, chunk {slot[1]} has shape "
                    f"{tuple(res.shape)} in the state but {tuple(current.shape)} here"
                )
            if not bool(torch.isfinite(res).all()):
                raise CheckpointError(f"residual of slot {slot} holds NaN or Inf")
            loaded[slot] = res.detach().to("cpu", copy=True)
        return loaded
