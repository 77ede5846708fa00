"""PowerSGD's bookkeeping edges: every factor payload of a step has a key of its own (a
dithered factor codec draws its dither from the key, so two payloads sharing one would reuse
it), and the rule that decides which tensors are approximated, at its exact boundary."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.keys import StreamKey
from gradzip.payload import parse_payload
from gradzip.schemes import PowerSGD

#: three groups reduced in one step, as GradientSync or the DDP hook hands them over: tensor
#: indices (0), (1) and (2, 3); every matrix here is approximated, so each group sends a P
#: payload and a Q payload
GROUPS = [[0], [1], [2, 3]]


def _record_sent(transport: Transport) -> list[bytes]:
    """Start keeping a copy of every message ``transport`` sends (its ``_transfer`` wrapped)."""
    sent: list[bytes] = []
    transfer: Callable[..., list[tuple[bytes, bool]]] = transport._transfer

    def recording(sends, sources):  # type: ignore[no-untyped-def]
        sent.extend(bytes(data) for _, data, _ in sends)
        return transfer(sends, sources)

    transport._transfer = recording  # type: ignore[method-assign]
    return sent


def _own_keys(transport: Transport, codec: str, step: int) -> list[StreamKey]:
    """The keys of the payloads this rank encoded at ``step`` (an all-gather also forwards the
    other ranks' payloads: those carry their sender's rank)."""
    sent = _record_sent(transport)
    scheme = PowerSGD(gradzip.create(codec), run_seed=5, rank=2)
    gen = torch.Generator().manual_seed(transport.rank)
    for group in GROUPS:
        tensors = [torch.randn(12, 10, generator=gen) for _ in group]
        assert all(scheme.compresses(t.shape) for t in tensors)
        _, down = scheme.reduce_many_if_all_finite(transport, tensors, group, step, True)
        assert not down
    keys = [parse_payload(payload)[0].key for payload in sent]
    return [key for key in keys if key.rank == transport.rank]


@pytest.mark.parametrize("codec", ["identity", "dqsg"])
def test_every_factor_payload_of_a_step_has_a_key_of_its_own(codec: str) -> None:
    """Keys ``2 * first index + message``: across groups and across the two factors of a group
    no key repeats (with ``first index + message``, group 0's Q and group 1's P would share
    key 1, and a dithered codec the same dither)."""
    for rank, keys in enumerate(run_local(2, lambda t: _own_keys(t, codec, 7), timeout=30.0)):
        assert len(keys) == 2 * len(GROUPS)
        assert len(set(keys)) == len(keys), keys
        assert {k.tensor_index for k in keys} == {0, 1, 2, 3, 4, 5}
        assert {(k.run_seed, k.rank, k.step, k.chunk) for k in keys} == {(5, rank, 7, 0)}


@pytest.mark.parametrize(
    ("shape", "rank", "rate", "approximated"),
    [
        ((4, 4), 1, 2.0, False),  # 1 * (4 + 4) * 2 = 16 = 4 * 4: on the boundary
        ((4, 2, 2), 1, 2.0, False),  # the same 4 x 4 matrix
        ((4, 3, 2), 1, 2.0, True),  # a 4 x 6 matrix: 20 < 24 (its 4 x 3 slice would not be)
        ((4, 5), 1, 2.0, True),  # 18 < 20
        ((5, 4), 1, 2.0, True),
        ((3, 4), 1, 2.0, False),  # 14 > 12
        ((6, 6), 2, 1.5, False),  # 2 * 12 * 1.5 = 36 = 6 * 6
        ((6, 7), 2, 1.5, True),  # 39 < 42
        ((12, 6), 4, 1.0, False),  # 4 * 18 = 72 = 12 * 6
        ((12, 6), 3, 1.0, True),  # 54 < 72
    ],
)
def test_compresses_only_strictly_below_the_boundary(
    shape: tuple[int, ...], rank: int, rate: float, approximated: bool
) -> None:
    """PyTorch's rule: a tensor is approximated when ``r (n + m) * rate < n m``, strictly; at
    equality it is sent whole, and one row or column more flips the answer."""
    scheme = PowerSGD(gradzip.create("identity"), rank=rank, min_compression_rate=rate)
    assert scheme.compresses(torch.Size(shape)) is approximated
