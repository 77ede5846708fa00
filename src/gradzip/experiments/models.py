"""Deprecated: moved to :mod:`gradzip.models.paper`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.models.paper` instead.
"""

from __future__ import annotations

import warnings

from gradzip.models.paper import (
    CIFARNET_LRN,
    FC300100,
    MODELS,
    CifarNet,
    DrydenMLP,
    LeNet,
    ModelInfo,
    PaperModel,
    build_model,
    model_info,
)

__all__ = [
    "CIFARNET_LRN",
    "FC300100",
    "MODELS",
    "CifarNet",
    "DrydenMLP",
    "LeNet",
    "ModelInfo",
    "PaperModel",
    "build_model",
    "model_info",
]

warnings.warn(
    "gradzip.experiments.models is deprecated; import from gradzip.models.paper",
    DeprecationWarning,
    stacklevel=2,
)
