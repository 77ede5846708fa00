"""``Compressor.fixed_payload_size``: where it gives a size, every payload has exactly that
many bytes (host and device payloads, any values), so ranks may size a collective's slots by
it (see ``gradzip.comm.transport.Transport.all_gather_flagged``)."""

from __future__ import annotations

import inspect

import pytest
import torch

from gradzip.compressors import Compressor, get, names
from gradzip.device.mode import forced_device_payloads
from gradzip.keys import StreamKey

SHAPES = [(7,), (33, 5), (4, 3, 65), (2049,)]
KEYS = [StreamKey(3, 1, 12345, 2, 0), StreamKey(2**40, 300, 9, 7, 3)]


def configs() -> list[tuple[str, dict[str, object]]]:
    """Every codec's ``example_params``, and each of its packings where it has several."""
    out: list[tuple[str, dict[str, object]]] = []
    for name in names():
        cls = get(name)
        out.append((name, dict(cls.example_params)))
        if "packing" in inspect.signature(cls.__init__).parameters:
            for packing in ("fixed", "dense", "entropy"):
                out.append((name, {**cls.example_params, "packing": packing}))
    return out


def _values(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    # two scales and a tensor with zeros: a size that moved with the values would show
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 10.0**seed
    if seed == 2:
        x.view(-1)[::3] = 0.0
    return x


@pytest.mark.parametrize(("name", "params"), configs(), ids=str)
def test_predicted_size_is_every_payloads_size(name: str, params: dict[str, object]) -> None:
    comp: Compressor = get(name)(**params)
    predicted_any = False
    for shape in SHAPES:
        for key in KEYS:
            predicted = comp.fixed_payload_size(shape, torch.float32, key)
            if predicted is None:
                continue
            predicted_any = True
            for seed in range(3):
                x = _values(shape, seed)
                assert len(comp.encode(x, key).payload) == predicted, (name, params, shape, seed)
                if comp.device_resident:
                    with forced_device_payloads():
                        payload = comp.encode(x, key).payload
                    assert isinstance(payload, torch.Tensor)
                    assert payload.numel() == predicted, (name, params, shape, seed)
    if params.get("packing") == "entropy":
        assert not predicted_any, f"{name}: an entropy-coded size cannot be known in advance"


def test_value_dependent_codecs_give_no_size() -> None:
    for name in ("threshold", "adaptive"):
        assert get(name)(**get(name).example_params).fixed_payload_size((64, 8)) is None
    assert get("qsgd")(coding="elias").fixed_payload_size((64, 8)) is None


def test_fixed_width_codecs_give_a_size() -> None:
    for name in ("fp16", "bf16", "dqsg", "qsgd", "terngrad", "onebit", "topk", "identity"):
        assert get(name)(**get(name).example_params).fixed_payload_size((64, 8)) is not None


def test_empty_tensor_payload_is_empty() -> None:
    assert get("fp16")().fixed_payload_size((0, 5)) == 0
    assert len(get("fp16")().encode(torch.empty(0, 5)).payload) == 0


def test_a_later_rank_or_step_never_has_a_smaller_payload() -> None:
    """The bound a group uses: the key of its last rank covers every rank's payload."""
    comp = get("dqsg")(**get("dqsg").example_params)
    sizes = [comp.fixed_payload_size((100,), key=StreamKey(0, r, 5)) for r in (0, 127, 128, 999)]
    assert sizes == sorted(sizes) and sizes[0] != sizes[-1]
