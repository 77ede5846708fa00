"""Shared test settings: one thread (as the benchmarks use) and deterministic Hypothesis."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings

torch.set_num_threads(1)

settings.register_profile(
    "gradzip",
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("gradzip")
