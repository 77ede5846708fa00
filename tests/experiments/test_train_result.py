"""The programmatic ``train()``: a typed config in, a typed result out."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gradzip.experiments.backends import train
from gradzip.experiments.config import TrainConfig
from gradzip.experiments.result import TrainResult


def test_train_returns_a_typed_result_like_its_summary(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = TrainConfig(
        compressor="qsgd",
        scheme="ps",  # the README's name of the parameter server
        workers=2,
        max_steps=2,
        eval_every=2,
        progress=False,
        out=str(out),
    )
    result = train(config)
    assert isinstance(result, TrainResult)
    assert (result.complete, result.steps, result.total_steps) == (True, 2, result.total_steps)
    assert result.run_dir == str(out) and result.interrupted_by is None and result.rank == 0
    assert isinstance(result.loss, float) and result.wire_bits is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.steps = 3  # type: ignore[misc]
    written = json.loads((out / "summary.json").read_text())
    as_dict = result.to_dict()
    assert {k: as_dict[k] for k in written} == written  # summary.json: the same figures
    assert TrainResult.from_summary(as_dict) == result


def test_a_summary_key_without_a_field_is_not_dropped_unseen() -> None:
    with pytest.raises(KeyError, match="no field for extra"):
        TrainResult.from_summary({"complete": True, "steps": 1, "extra": 2})
