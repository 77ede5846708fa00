"""Column grouping and the sparse index+sign formats shared by the Dryden codecs (spec 5).

Grouping (spec 5, [CODE]: LBANN quantizes "each neuron"): the tensor is viewed as the 2-D matrix
``A = V.reshape(shape[0], -1)``; a *group* (the paper's "column", the unit owning its own
reconstruction values) is one row of ``A`` with ``group="out"`` (one group per output unit in
PyTorch layout) or one column of ``A`` with ``group="in"`` (the DQSG authors' grouping of spec
1.9). 0-d and 1-D tensors always form one group.

Sparse formats (spec 5.2, 5.5) for entries sorted by flat index:

* ``"uint32"``: one little-endian uint32 ``(flat_index << 1) | sign`` per entry (the slides'
  "31-bit index + 1-bit value"); ``32*nnz`` bits; flat indices must be ``< 2**31``.
* ``"golomb_rice"``: the delta + Golomb-Rice stream of :mod:`gradzip.codecs.golomb_rice`; with
  ``rice_k="auto"`` one leading uint32 word carries the chosen ``K`` ([CHOICE]: the spec leaves
  open how the receiver learns an adaptive ``K``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from gradzip.choices import check_choice, choices_of
from gradzip.codecs.golomb_rice import auto_k, check_k, rice_bits, rice_decode, rice_encode
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError

#: which axis a group runs along: one group per output row, or per input column
Group = Literal["out", "in"]
GROUPS: tuple[Group, ...] = choices_of(Group)
#: how the kept entries' indices travel: 32-bit words, or Golomb-Rice coded gaps
IndexCoding = Literal["uint32", "golomb_rice"]
CODINGS: tuple[IndexCoding, ...] = choices_of(IndexCoding)
INDEX_LIMIT = 2**31


def check_group(group: Group) -> Group:
    """Validate a ``group`` parameter."""
    return check_choice("group", group, GROUPS)


def check_coding(coding: IndexCoding, rice_k: int | str) -> tuple[IndexCoding, int | str]:
    """Validate a ``coding`` parameter and its ``rice_k``."""
    return check_choice("coding", coding, CODINGS), check_k(rice_k)


@dataclass(frozen=True)
class Grouping:
    """How a tensor of ``shape`` splits into groups: ``A`` is ``(a, b)``; groups lie along
    ``axis`` of ``A`` (1: each row of ``A`` is a group; 0: each column is)."""

    a: int
    b: int
    axis: int

    @classmethod
    def of(cls, shape: tuple[int, ...], group: str) -> Grouping:
        numel = 1
        for d in shape:
            numel *= d
        if len(shape) <= 1:
            return cls(1, numel, 1)
        a = shape[0]
        return cls(a, numel // a, 1 if group == "out" else 0)

    @property
    def groups(self) -> int:
        """Number of groups (the spec's ``cols``)."""
        return self.a if self.axis == 1 else self.b

    @property
    def size(self) -> int:
        """Entries per group (the spec's ``rows``)."""
        return self.b if self.axis == 1 else self.a

    def matrix(self, x: torch.Tensor) -> torch.Tensor:
        """``(groups, size)`` view of flat ``x``: one group per row (transposed for "in")."""
        view = x.view(self.a, self.b)
        return view if self.axis == 1 else view.t()

    def broadcast(self, per_group: torch.Tensor) -> torch.Tensor:
        """Shape one value per group so that it broadcasts against ``x.view(a, b)``."""
        return per_group.view(-1, 1) if self.axis == 1 else per_group.view(1, -1)

    def group_of(self, idx: torch.Tensor) -> torch.Tensor:
        """Group number of each flat index."""
        return torch.div(idx, self.b, rounding_mode="floor") if self.axis == 1 else idx % self.b


def sample_rows(m: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The sampled entries ``m[c, rows[c, j]]`` of a ``(groups, size)`` matrix."""
    return torch.gather(m, 1, rows)


def ternary_stream(n: int, n_neg: int, n_pos: int) -> torch.Tensor:
    """A uint8 stream with the histogram of a sparse message's ternary symbols (0: unsent,
    1: sent negative, 2: sent positive), for ``entropy_bits``.

    ``n*H`` depends only on the histogram, so the symbols are laid out sorted: the zeros come
    from a calloc'd buffer and only the ``nnz`` sent entries are written.
    """
    stream = torch.zeros(n, dtype=torch.uint8)
    stream[n - n_neg - n_pos : n - n_pos] = 1
    stream[n - n_pos :] = 2
    return stream


# -- sparse entry formats ---------------------------------------------------------------------
def _rice_values(idx: torch.Tensor, sign: torch.Tensor) -> np.ndarray:
    delta = idx.numpy().copy()
    if delta.size:
        delta[1:] -= idx.numpy()[:-1]
    values: np.ndarray = (delta << 1) | sign.numpy().astype(np.int64)
    return values


def _rice_k(values: np.ndarray, rice_k: int | str) -> int:
    return auto_k(values) if rice_k == "auto" else int(rice_k)


def encode_entries(
    idx: torch.Tensor, sign: torch.Tensor, coding: str, rice_k: int | str
) -> np.ndarray:
    """Sparse entries (int64 flat indices sorted ascending, bool signs) as a uint32 word array."""
    if coding == "uint32":
        if idx.numel() and int(idx[-1]) >= INDEX_LIMIT:
            raise ValueError(
                f"flat index {int(idx[-1])} does not fit the 31-bit index of the uint32 entry "
                f"format; use coding='golomb_rice' for tensors of 2**31 or more elements"
            )
        words: np.ndarray = ((idx.numpy() << 1) | sign.numpy()).astype(np.uint32)
        return words
    values = _rice_values(idx, sign)
    k = _rice_k(values, rice_k)
    stream = rice_encode(values, k)
    if rice_k != "auto":
        return stream
    return np.concatenate((np.array([k], dtype=np.uint32), stream))


def words_bytes(words: np.ndarray) -> memoryview:
    """Byte view of a contiguous little-endian uint32 word array (a Body piece)."""
    return np.ascontiguousarray(words).view(np.uint8).data


def entry_bits(idx: torch.Tensor, sign: torch.Tensor, coding: str, rice_k: int | str) -> int:
    """Size in bits of :func:`encode_entries`' output, by formula."""
    if coding == "uint32":
        return 32 * idx.numel()
    values = _rice_values(idx, sign)
    return rice_bits(values, _rice_k(values, rice_k)) + (32 if rice_k == "auto" else 0)


def decode_entries(
    body: memoryview, numel: int, coding: str, rice_k: int | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`encode_entries`: (int64 flat indices, bool signs), validated against
    ``numel`` (indices in range and strictly increasing)."""
    if len(body) % 4:
        raise TruncatedPayloadError(
            f"sparse entry stream has {len(body)} bytes, not a whole number of uint32 words"
        )
    words = np.frombuffer(body, dtype="<u4")
    if coding == "uint32":
        idx = (words >> 1).astype(np.int64)
        sign = (words & 1).astype(bool)
    else:
        if rice_k == "auto":
            if words.size == 0:
                raise TruncatedPayloadError("Golomb-Rice stream lacks its leading K word")
            k = int(words[0])
            if k > 31:
                raise CorruptPayloadError(f"Golomb-Rice parameter K={k} is out of range [0, 31]")
            words = words[1:]
        else:
            k = int(rice_k)
        values = rice_decode(words, k)
        delta = values >> 1
        sign = (values & 1).astype(bool)
        if delta.size > 1 and int(delta[1:].min()) < 1:
            raise CorruptPayloadError("Golomb-Rice stream repeats a flat index (a zero gap)")
        if delta.size and int(delta.max()) >= numel:
            raise CorruptPayloadError(f"Golomb-Rice gap exceeds the tensor size {numel}")
        idx = np.cumsum(delta)
    if idx.size:
        if idx.size > 1 and int(np.diff(idx).min()) < 1:
            raise CorruptPayloadError("sparse entries are not strictly increasing flat indices")
        if int(idx[-1]) >= numel:
            raise CorruptPayloadError(
                f"sparse entry index {int(idx[-1])} is outside the tensor of {numel} elements"
            )
    return torch.from_numpy(idx), torch.from_numpy(sign)
