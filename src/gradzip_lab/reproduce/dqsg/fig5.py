"""``dqsg-fig5``: the NDQSG experiment of the DQSG paper (Figure 5, FC-300-100 panel).

Three runs of :func:`~gradzip.experiments.backends.train` on MNIST with 8 simulated workers and
Adam (lr 1e-3, total batch 256): the fp32 baseline (``identity``), DQSG with ``M = 2``, and NDQSG
(half the workers DQSG ``M = 2``, half nested ``Delta1 = 1/3, Delta2 = 1``). The paper plots
their test accuracy against the iteration (0-1000) and quotes the bits per worker: 619.2 Kbit
for a DQSG ``M = 2`` worker, 422.8 Kbit for an NDQSG worker.
"""

from __future__ import annotations

import time
from pathlib import Path

from gradzip_lab.reproduce.dqsg.nested_costs import group_bits, nested_failure_rate
from gradzip_lab.reproduce.outcome import Outcome, Row
from gradzip_lab.reproduce.runs import plot_curves, run_training
from gradzip_lab.reproduce.seeds import Comparison

PAPER_DQSG_M2_KBIT = 619.2
PAPER_NDQSG_KBIT = 422.8
FULL_STEPS, QUICK_STEPS = 1000, 60
MEAN_OF_GROUPS = "mean of the paper's 619.2 (DQSG M=2) and 422.8 (NDQSG) Kbit per worker"
SAVING_OF_GROUPS = "1 - 422.8 / 619.2 from the paper's bits per worker"
CURVES_COINCIDE = "the paper's claim that the accuracy curves almost coincide"

#: what ``--seeds`` tests (paired over seeds): the accuracies the paper says coincide, and the
#: entropy cost of nesting
COMPARISONS = (
    Comparison("NDQSG - DQSG M=2 test accuracy", "NDQSG test accuracy", "DQSG M=2 test accuracy", "points"),
    Comparison("NDQSG - baseline test accuracy", "NDQSG test accuracy", "baseline test accuracy", "points"),
    Comparison("DQSG M=2 - baseline test accuracy", "DQSG M=2 test accuracy", "baseline test accuracy", "points"),
    Comparison("NDQSG - DQSG M=2 entropy bits per worker", "NDQSG run, entropy bits", "DQSG run, entropy bits", "Kbit"),
)  # fmt: skip


#: what the rows above show about NDQSG's saving (issue 16), with the command measuring each
FINDINGS = [
    "The >= 30% saving holds for ONE nested worker under the raw log2-alphabet count "
    "(619.2 -> 422.8 Kbit); a run has half its workers nested, so the whole run saves 16% "
    "(619.2 -> 521.0 Kbit raw, 801.7 -> 668.6 Kbit on the wire): rows 'whole-run saving'; "
    "`gradzip reproduce dqsg-fig5 --quick` (the bit counts do not depend on the mode).",
    "Under entropy coding (Table 2's measure) NDQSG costs MORE than DQSG M=2: folding modulo k "
    "makes the nested symbols nearly uniform, while DQSG's are mostly zero. Rows 'entropy "
    "bits' and result.json's group_kbit (per-group entropy of one gradient); full runs of "
    "`gradzip reproduce dqsg-fig5 --seeds 3` measured 139.8 +- 1.4 against 122.5 +- 0.6 Kbit "
    "(+14.1 +- 1.2%, paired t-test p = 0.002) over seeds 0-2.",
    "With the authors' code setting (P1 workers at M=3, 7 levels) the raw whole-run saving "
    "falls to about 5%: row 'P1 at M=3' (result.json group_kbit 'DQSG M=3').",
    "Nested decoding fails undetected on a share of the P2 coordinates: rows 'decoded "
    "wrongly' replay Algorithm 2 on 8 workers' gradients at initialisation (result.json "
    "nested_failure_rates); during training 0.75-6% were measured (reported in issue 16; not re-measured here).",
]


def run(out: Path, quick: bool, seed: int = 0) -> Outcome:
    """The three runs from ``seed`` (initial weights, data order, dithers; ``gradzip reproduce
    --seeds`` repeats them over seeds) and the bit counts of one gradient at initialisation."""
    steps = QUICK_STEPS if quick else FULL_STEPS
    common = dict(
        model="fc-300-100",
        workers=8,
        optimizer="adam",
        batch_size=256,
        epochs=5,
        max_steps=steps,
        eval_every=10 if quick else 50,
        seed=seed,
    )
    started = time.perf_counter()
    runs = [
        run_training("baseline (fp32)", out / "runs" / "baseline", compressor="identity", **common),
        run_training(
            "DQSG M=2",
            out / "runs" / "dqsg",
            compressor="dqsg",
            compressor_params={"M": 2},
            **common,
        ),
        run_training(
            "NDQSG",
            out / "runs" / "ndqsg",
            compressor="ndqsg",
            compressor_params={"L1": 3, "k": 3},
            **common,
        ),
    ]
    train_seconds = time.perf_counter() - started
    plot_curves(runs, out / "accuracy.png", "FC-300-100, MNIST, 8 workers, Adam")
    # each group's bits from one real gradient (the raw and wire counts depend only on the
    # shapes; the paper's one scale per tensor, as the runs above)
    groups = group_bits(seed)
    p1, p2_kbit = groups["DQSG M=2"]["paper"], groups["nested (L1=3, k=3)"]["paper"]
    failures = nested_failure_rate(seed=seed)
    kbit = {r.label: (r.summary["paper_bits"] or 0.0) / 1000 for r in runs}
    wire = {r.label: (r.summary["wire_bits"] or 0.0) / 1000 for r in runs}
    entropy = {r.label: (r.summary["entropy_bits"] or 0.0) / 1000 for r in runs}
    acc = {r.label: 100 * (r.summary["test_acc"] or 0.0) for r in runs}
    authors_p1 = (groups["DQSG M=3"]["paper"] + p2_kbit) / 2
    rows = [
        Row(
            "DQSG M=2 worker, paper bits (dqsg run, mean over workers)",
            PAPER_DQSG_M2_KBIT,
            kbit["DQSG M=2"],
            "Kbit",
        ),
        Row("NDQSG run, P1 worker (DQSG Delta=1/2), paper bits", PAPER_DQSG_M2_KBIT, p1, "Kbit"),
        Row("NDQSG run, P2 worker (nested, k=3), paper bits", PAPER_NDQSG_KBIT, p2_kbit, "Kbit"),
        Row(
            "NDQSG run, mean over its 8 workers (4 P1 + 4 P2)",
            (PAPER_DQSG_M2_KBIT + PAPER_NDQSG_KBIT) / 2,
            kbit["NDQSG"],
            "Kbit",
            paper_derived=MEAN_OF_GROUPS,
        ),
        Row(
            "P2 saving vs a DQSG M=2 worker",
            100 * (1 - PAPER_NDQSG_KBIT / PAPER_DQSG_M2_KBIT),
            100 * (1 - p2_kbit / p1),
            "%",
            paper_derived=SAVING_OF_GROUPS,
        ),
        Row(
            "whole-run saving, paper bits (NDQSG run vs DQSG run)",
            None,
            100 * (1 - kbit["NDQSG"] / kbit["DQSG M=2"]),
            "%",
        ),
        Row(
            "whole-run saving, wire bits (NDQSG run vs DQSG run)",
            None,
            100 * (1 - wire["NDQSG"] / wire["DQSG M=2"]),
            "%",
        ),
        Row(
            "DQSG run, entropy bits (mean over workers and steps)",
            None,
            entropy["DQSG M=2"],
            "Kbit",
        ),
        Row(
            "NDQSG run, entropy bits (mean over workers and steps)", None, entropy["NDQSG"], "Kbit"
        ),
        Row(
            "NDQSG run's extra entropy bits over the DQSG run",
            None,
            100 * (entropy["NDQSG"] / entropy["DQSG M=2"] - 1),
            "%",
        ),
        Row(
            "whole-run saving, paper bits, P1 at M=3 (the authors' code)",
            None,
            100 * (1 - authors_p1 / p1),
            "%",
        ),
        Row(
            "nested coordinates decoded wrongly, lowest worker (at initialisation)",
            None,
            100 * min(failures),
            "%",
        ),
        Row(
            "nested coordinates decoded wrongly, highest worker (at initialisation)",
            None,
            100 * max(failures),
            "%",
        ),
        Row(f"baseline test accuracy at step {steps}", None, acc["baseline (fp32)"], "%"),
        Row(f"DQSG M=2 test accuracy at step {steps}", None, acc["DQSG M=2"], "%"),
        Row(f"NDQSG test accuracy at step {steps}", None, acc["NDQSG"], "%"),
        Row(
            "NDQSG minus baseline accuracy (paper: curves almost coincide)",
            0.0,
            acc["NDQSG"] - acc["baseline (fp32)"],
            "points",
            paper_derived=CURVES_COINCIDE,
        ),
        Row(
            "DQSG minus baseline accuracy (paper: curves almost coincide)",
            0.0,
            acc["DQSG M=2"] - acc["baseline (fp32)"],
            "points",
            paper_derived=CURVES_COINCIDE,
        ),
    ]
    scaled = [
        "Workers are simulated in one process (8 ranks on threads, real payloads and real "
        "synchronisation), not 8 machines: results are the same, only the wall time differs.",
    ]
    if quick:
        scaled.append(
            f"--quick stops every run after {QUICK_STEPS} of the paper's 1000 iterations (about "
            "a quarter of one epoch) so the three runs finish in well under a minute on 2 cores; "
            "accuracies are therefore far below the paper's end-of-curve values and only the "
            "relative ordering and the bit counts are comparable."
        )
    else:
        scaled.append(
            "None in the training itself: 1000 iterations (4.3 epochs of 234 steps), as in the "
            "paper's FC-300-100 panel."
        )
    return Outcome(
        id="dqsg-fig5",
        title="DQSG paper, Figure 5 (FC-300-100): NDQSG vs DQSG (M=2) vs baseline",
        quick=quick,
        rows=rows,
        scaled_down=scaled,
        notes=[
            "The paper gives no accuracy numbers for Figure 5, only the claim that the three "
            "curves almost coincide; the accuracy-gap rows compare against 0 and their % column "
            "is empty.",
            "Bits are the papers' raw count (paper_bits, spec 0.5). A run's paper_bits is the "
            "mean over its workers, so for the NDQSG run it mixes the two groups: half the "
            "workers send DQSG M=2 (619.2 Kbit) and half the nested code (422.8 Kbit), mean "
            "521.0 Kbit. The per-group figures come from gradzip.experiments.bits.measure_bits "
            "on one real FC-300-100 gradient with dqsg M=2 and ndqsg (L1=3, k=3).",
            *FINDINGS,
            f"Training wall time of the three runs: {train_seconds:.1f} s.",
        ],
        plots=["accuracy.png"],
        extra={
            "steps": steps,
            "curves": {r.label: r.curve() for r in runs},
            "summaries": {r.label: r.summary for r in runs},
            "group_kbit": groups,
            "nested_failure_rates": failures,
        },
    )
