"""``lpc-fig3a``: Figure 3(a) of the LPC-SVRG paper, Syn-512 (10,000 x 512), 7 levels."""

from __future__ import annotations

from pathlib import Path

from gradzip_lab.reproduce.lpc.panels import Panel, run_panel
from gradzip_lab.reproduce.outcome import Outcome

PANEL = Panel(
    id="lpc-fig3a",
    dataset="syn-512",
    n_full=10_000,
    n_quick=10_000,
    rounds_full=600,
    rounds_quick=240,
    # the full mode's tuned values (`gradzip reproduce lpc-fig3a`, result.json "knobs")
    knobs={
        "SGD": 0.05,
        "SVRG": 0.1,
        "QSGD": 0.05,
        "ECQ-SGD": 0.05,
        "LPC-SVRG": 0.1,
        "ALPC-SVRG": 2.0,
    },
    scaled=["None in the data: Syn-512 at the paper's size (10,000 samples, d = 512)."],
)


def run(out: Path, quick: bool) -> Outcome:
    return run_panel(PANEL, out, quick)
