"""``python -m gradzip.warmup`` (run before ``make test``): every warm-up call runs the
library's real encode, decode and reduction paths, and every parameter set it names builds."""

from __future__ import annotations

import pytest

from gradzip.compressors import names
from gradzip.warmup import WIDE_PARAMS, warm_compressor, warm_scheme


@pytest.mark.parametrize("name", ["qsgd", "onebit"])
def test_a_compressor_warms_in_every_dtype(name: str) -> None:
    assert name in names()
    assert warm_compressor(name) == name


def test_every_wide_parameter_set_builds_its_compressor() -> None:
    import gradzip

    for name, sets in WIDE_PARAMS.items():
        for params in sets:
            gradzip.create(name, **params)  # a renamed parameter fails here, not at set-up


def test_a_variant_runs_a_step_around_every_compressor_it_accepts() -> None:
    assert warm_scheme("allreduce") == "every compressor through allreduce"
