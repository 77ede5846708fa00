"""``dqsg-table2``: Table 2 of the DQSG paper, the entropy of one worker's message (Kbit per
worker per iteration) at 32 workers, from short training runs with entropy coding on.

With ``entropy=True`` every payload is ANS-coded, so a run's ``wire_bits`` are real coded sizes
and its ``entropy_bits`` the empirical entropy of the symbols plus side data; both are averaged
over the run's iterations and the 32 workers.

The training follows the authors' scripts [CODE: ``NDQSG/compare_algorithms_fc.py`` and
``compare_algorithms_lenet.py`` in their public repository]: plain gradient descent at learning
rate 0.01, multiplied by 0.9 after every epoch, a total batch of 200 split over the workers
(6 per worker at 32 workers; 192 here, since the batch must divide evenly), each worker's own
max-norm as the one scale per tensor (their QSG and dithered quantizers) and no clipping for
every ternary method. That is :data:`FAITHFUL`; the earlier Adam setting is kept as
:data:`ADAM` for comparison. The entropy is counted as theirs is [CODE]: per parameter tensor
(weights and biases) ``n * H`` of its symbols plus 32 bits per scale, summed over the tensors,
here averaged over the workers and iterations [CHOICE: their scripts save the per-iteration sum
over workers; the paper's figure is per worker]. Why the ternary cells still differ (no scale
rule in the authors' code fits both models) is measured by ``benchmarks/table2_scale_rules.py``
and explained in ``docs/reproduction.md`` (DQSG, Table 2).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gradzip_lab.reproduce.outcome import Outcome, Row
from gradzip_lab.reproduce.runs import run_training

#: Table 2, Kbit per worker per iteration at 32 workers.
PAPER_TABLE2: dict[tuple[str, str], float] = {
    ("FC-300-100", "DQSGD"): 38.6,
    ("FC-300-100", "QSGD"): 38.2,
    ("FC-300-100", "TernGrad"): 48.23,
    ("FC-300-100", "One-Bit"): 330.0,
    ("LeNet", "DQSGD"): 299.7,
    ("LeNet", "QSGD"): 307.3,
    ("LeNet", "TernGrad"): 438.2,
    ("LeNet", "One-Bit"): 1889.0,
    ("CifarNet", "DQSGD"): 192.7,
    ("CifarNet", "QSGD"): 197.0,
    ("CifarNet", "TernGrad"): 281.0,
    ("CifarNet", "One-Bit"): 1241.0,
}

#: (label, compressor, parameters, error feedback); the columns of Table 2. TernGrad is the
#: authors' ``quantizers/ternary_quantizer.py``: no clipping, one max-norm scale per tensor.
METHODS: tuple[tuple[str, str, dict[str, Any], bool], ...] = (
    ("DQSGD", "dqsg", {"M": 1}, False),
    ("QSGD", "qsgd", {"s": 1, "norm": "max"}, False),
    ("TernGrad", "terngrad", {"clip_sigma": None}, False),
    ("One-Bit", "onebit", {"group": "out"}, True),
)
MODELS = {"FC-300-100": "fc-300-100", "LeNet": "lenet"}
QUICK_STEPS, FULL_STEPS = {"FC-300-100": 4}, {"FC-300-100": 100, "LeNet": 30}

#: the authors' training setting (their compare_algorithms_*.py): plain SGD, lr 0.01 decayed
#: x0.9 per epoch, total batch 200 = 6 per worker at 32 workers (192: it must divide evenly)
FAITHFUL: dict[str, Any] = {"optimizer": "sgd", "lr": 0.01, "lr_decay": 0.9, "batch_size": 192}
#: the setting this reproduction used before issue 16 (Adam at its default rate, batch 256)
ADAM: dict[str, Any] = {"optimizer": "adam", "batch_size": 256}


def run(out: Path, quick: bool) -> Outcome:
    steps = QUICK_STEPS if quick else FULL_STEPS
    training = FAITHFUL
    rows: list[Row] = []
    measured: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    for paper_model, steps_for_model in steps.items():
        for label, codec, params, feedback in METHODS:
            r = run_training(
                f"{paper_model} {label}",
                out / "runs" / f"{MODELS[paper_model]}-{codec}",
                model=MODELS[paper_model],
                compressor=codec,
                compressor_params=params,
                error_feedback=feedback,
                workers=32,
                **training,
                max_steps=steps_for_model,
                eval_every=10_000,  # accuracy is not the point: evaluated once, at the end
                entropy=True,
            )
            paper = PAPER_TABLE2[paper_model, label]
            entropy = (r.mean("entropy_bits") or 0.0) / 1000
            wire = (r.mean("wire_bits") or 0.0) / 1000
            rows.append(Row(f"{paper_model} {label}: entropy", paper, entropy, "Kbit"))
            rows.append(Row(f"{paper_model} {label}: ANS-coded wire", paper, wire, "Kbit"))
            measured[r.label] = {
                "entropy_kbit": entropy,
                "wire_kbit": wire,
                "coded_over_entropy": wire / entropy if entropy else None,
                "steps": r.summary["steps"],
                "test_acc": r.summary["test_acc"],
            }
    seconds = time.perf_counter() - started
    scaled = [
        "32 workers are simulated in one process (real ANS payloads per worker). Setting "
        f"'faithful': {training} (the authors' scripts: plain SGD, lr 0.01 x0.9 per "
        "epoch, total batch 200, i.e. 6 examples per worker).",
        "Only FC-300-100"
        + (" and LeNet" if not quick else "")
        + " are run; CifarNet needs CIFAR-10, which the user must supply (no downloads).",
        "Runs are short: "
        + ", ".join(f"{m} {n} iterations" for m, n in steps.items())
        + " per method instead of the authors' 5 epochs (about 1560 iterations at 32 workers, "
        f"{seconds / sum(steps.values()) / len(METHODS):.2f} s each in this run). Their scripts record the entropy at every iteration, so the "
        "paper's figure is presumably the mean over the whole run; it falls as training goes on.",
    ]
    return Outcome(
        id="dqsg-table2",
        title="DQSG paper, Table 2: entropy, Kbit per worker per iteration, 32 workers",
        quick=quick,
        rows=rows,
        scaled_down=scaled,
        notes=[
            "Each method appears twice: the empirical entropy (the paper's measure) and the "
            "size of the real ANS-coded payload, both compared with the paper's entropy. The "
            "paper claims adaptive arithmetic coding comes within 5% of the entropy; the coded "
            "payloads here include headers and per-tensor side data.",
            "One-Bit runs with error feedback (Seide et al.'s method); the others without.",
            "Each worker here scales by its own max-norm, as the authors' QSG and dithered "
            "quantizers do. benchmarks/table2_scale_rules.py measures every scale rule of the "
            "authors' code on the same training: FC-300-100's DQSGD/QSGD cells fit only one "
            "scale shared by all workers, LeNet's only each worker's own, and TernGrad (equal "
            "to QSGD under one scale) fits a different rule on each model (docs/reproduction.md).",
            f"Wall time of the {len(measured)} runs: {seconds:.1f} s.",
        ],
        extra={"measured": measured},
    )
