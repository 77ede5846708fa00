"""What a caller may ask a scheme (the DDP hook, the finite agreement): each scheme declares its
capabilities itself, and the defaults of :class:`~gradzip.schemes.base.Scheme` hold for the
others."""

from __future__ import annotations

import pytest
import torch

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.schemes import SCHEMES, make_scheme
from gradzip.schemes.base import Outgoing, Scheme, row_pieces

#: the schemes that pipeline (encode, gather, average as separate stages) and whose finite flag
#: rides on the first payload; every other scheme keeps the defaults
PIPELINED = {"allgather"}


def _scheme(name: str) -> Scheme:
    for comp in ("identity", "dqsg", "ndqsg"):
        compressor = gradzip.create(comp, **gradzip.get(comp).example_params)
        if SCHEMES[name].compatible(compressor):
            return make_scheme(name, compressor, run_seed=5)
    raise AssertionError(f"no test compressor fits {name}")  # pragma: no cover


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_each_scheme_declares_its_capabilities(name: str) -> None:
    scheme = _scheme(name)
    shape = torch.Size((10, 6))
    assert scheme.pipelines == (name in PIPELINED)
    assert scheme.flag_rides_on_payload == (name in PIPELINED)
    if name in PIPELINED:
        assert scheme.parameter_pieces(shape, 12) == row_pieces(shape, 12)
        assert scheme.residual_shapes(shape, 12) == [p[2] for p in row_pieces(shape, 12)]
        return
    assert scheme.parameter_pieces(shape, 12) == [(0, 60, shape)]
    assert scheme.residual_shapes(shape, 12) is None
    with pytest.raises(NotImplementedError, match="does not pipeline"):
        scheme.encode_flagged(0, torch.zeros(shape), 0, 0)
    with pytest.raises(NotImplementedError, match="does not pipeline"):
        scheme.average([b""], 0, 0, shape, torch.float32)


def test_the_three_stages_make_the_reduction() -> None:
    """A pipelining scheme's stages give the bits of its own ``reduce``."""

    def body(transport: Transport) -> tuple[bytes, bytes]:
        scheme = _scheme("allgather")
        x = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (transport.rank + 1)
        whole = scheme.reduce(transport, x, 0, 2)
        outgoing = scheme.encode_flagged(transport.rank, x, 1, 2)
        assert isinstance(outgoing, Outgoing) and outgoing.finite
        payloads, down = scheme.gather_flagged(transport, outgoing, 1)
        assert down == []
        staged = scheme.average(payloads, 1, 2, x.shape, outgoing.dtype)
        again = scheme.reduce(transport, x, 1, 2)
        assert torch.equal(staged, again)
        return whole.numpy().tobytes(), staged.numpy().tobytes()

    first, second = run_local(2, body)
    assert first == second
