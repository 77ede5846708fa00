"""Deprecated: moved to :mod:`gradzip.models.resnet`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.models.resnet` instead.
"""

from __future__ import annotations

import warnings

from gradzip.models.resnet import (
    DEPTHS,
    BasicBlock,
    CifarResNet,
    resnet,
)

__all__ = [
    "DEPTHS",
    "BasicBlock",
    "CifarResNet",
    "resnet",
]

warnings.warn(
    "gradzip.experiments.resnet is deprecated; import from gradzip.models.resnet",
    DeprecationWarning,
    stacklevel=2,
)
