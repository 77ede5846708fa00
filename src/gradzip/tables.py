"""Deprecated: Table 1 of the DQSG paper moved to
``gradzip.experiments.reproduce.dqsg.bit_counts``; run it as ``gradzip reproduce dqsg-table1``.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. ``python -m gradzip.tables`` is gone.
"""

from __future__ import annotations

import warnings

from gradzip.experiments.reproduce.dqsg.bit_counts import (
    DQSG_M2,
    PAPER_TABLE1,
    TABLE1_METHODS,
    Method,
    Table1Row,
    format_table1,
    model_paper_bits,
    table1,
    table1_cell,
    table1_cells,
)

__all__ = [
    "DQSG_M2",
    "PAPER_TABLE1",
    "TABLE1_METHODS",
    "Method",
    "Table1Row",
    "format_table1",
    "model_paper_bits",
    "table1",
    "table1_cell",
    "table1_cells",
]

warnings.warn(
    "gradzip.tables is deprecated; import from gradzip.experiments.reproduce.dqsg.bit_counts",
    DeprecationWarning,
    stacklevel=2,
)
