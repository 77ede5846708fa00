"""``dqgan-mnist``: DQGAN (Hou's 8-bit quantizer, error feedback, Optimistic Adam) vs CPOAdam
(fp32) vs CPOAdam-GQ (the same 8-bit quantizer without error feedback) training a DCGAN-style
WGAN on MNIST, scored like the seed's Figures 2-3 but with an MNIST classifier.

The seed trains DCGAN on CIFAR-10 and CelebA and reports the Inception Score and the FID
against epochs. Neither data set is available here, and both scores need Inception-v3 weights
that cannot be fetched, so this is the same comparison on MNIST [CHOICE]: the Fréchet distance
and the Inception Score's formula computed on a small MNIST classifier that this experiment
trains first (:mod:`gradzip_lab.reproduce.dqgan.mnist_features`, cached under the output
directory). These are **not** the FID or the Inception Score, and not comparable with
published numbers; only the methods' values relative to each other are.

Set-up [CHOICE, scaled to 2 CPU cores]: the generator and critic of
:mod:`gradzip_lab.reproduce.dqgan.dcgan` (64-d noise, width 32, no batch normalisation), WGAN loss
with weight clipping at 0.01, Optimistic Adam (betas 0.5/0.9) on every rank, simulated workers
with a parameter server (real payloads both ways), each drawing its own mini-batch of real
images (in ``[-1, 1]``) and noise from ``(seed, rank, step)``. The learning rate 5e-4 was
picked for CPOAdam from 2e-4, 5e-4 and 1e-3 (2 workers, 2,400 steps: Fréchet distance 549 after
600 steps at 2e-4, 74 at 5e-4, 241 at 1e-3) and used for all three methods, as the seed's grid
search chose one setting per data set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from gradzip.algorithms.dqgan.baselines import METHODS
from gradzip.algorithms.dqgan.frechet import frechet_distance
from gradzip.algorithms.dqgan.wgan import WGANGame
from gradzip.data.datasets import load_dataset
from gradzip_lab.reproduce.dqgan.class_score import classifier_score
from gradzip_lab.reproduce.dqgan.dcgan import mnist_dcgan
from gradzip_lab.reproduce.dqgan.gan_runs import (
    GanRun,
    bits_rows,
    eval_points,
    plot_scores,
    train_gan,
)
from gradzip_lab.reproduce.dqgan.mnist_features import FeatureNet, cached_feature_net, extract
from gradzip_lab.reproduce.outcome import Outcome, Row
from gradzip_lab.reproduce.seeds import Comparison

NZ, WIDTH, CLIP, LR = 64, 32, 0.01, 5e-4
GRID = 8  # the sample plot shows GRID x GRID digits per method

#: what ``--seeds`` tests (paired over seeds): Fréchet distances, means of the last half
COMPARISONS = (
    Comparison("DQGAN - CPOAdam Fréchet distance", "DQGAN 8-bit: Fréchet distance, mean", "CPOAdam: Fréchet distance, mean"),
    Comparison("CPOAdam-GQ - CPOAdam Fréchet distance", "CPOAdam-GQ 8-bit: Fréchet distance, mean", "CPOAdam: Fréchet distance, mean"),
    Comparison("DQGAN - CPOAdam-GQ Fréchet distance", "DQGAN 8-bit: Fréchet distance, mean", "CPOAdam-GQ 8-bit: Fréchet distance, mean"),
)  # fmt: skip


@dataclass(frozen=True)
class Setting:
    workers: int
    batch: int  # real images (and noise vectors) per worker per iteration
    steps: int
    eval_images: int  # generated samples scored, against as many real test images
    feature_images: int | None  # training images of the feature classifier (None: all)


FULL = Setting(workers=4, batch=32, steps=2000, eval_images=2000, feature_images=None)
QUICK = Setting(workers=2, batch=16, steps=20, eval_images=500, feature_images=10_000)


def _scores(net: FeatureNet, images: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """The Fréchet distance of ``images`` (in ``[0, 1]``) to the reference features, and their
    classifier score."""
    features, logits = extract(net, images)
    return {"frechet": frechet_distance(features, reference), "score": classifier_score(logits)}


def _evaluator(
    net: FeatureNet, reference: torch.Tensor, n: int, last: dict[str, torch.Tensor], method: str
) -> Callable[[WGANGame], dict[str, float]]:
    """Rank 0's scores of the live generator on ``n`` samples from a fixed noise seed; keeps
    the last images for the sample plot."""

    def evaluate(game: WGANGame) -> dict[str, float]:
        images = ((game.sample(n, seed=1) + 1) / 2).clamp(0, 1)
        last[method] = images[: GRID * GRID]
        return _scores(net, images, reference)

    return evaluate


def _plot_samples(runs: list[GanRun], last: dict[str, torch.Tensor], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(3.2 * len(runs), 3.4))
    for ax, r in zip(axes, runs, strict=True):
        images = last[r.method].reshape(GRID, GRID, 28, 28)
        grid = images.permute(0, 2, 1, 3).reshape(GRID * 28, GRID * 28)
        ax.imshow(grid.numpy(), cmap="gray")
        ax.set_title(r.label, fontsize=9)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run(out: Path, quick: bool, seed: int = 0) -> Outcome:
    """The three methods from ``seed`` (initial weights, each rank's images and noise,
    stochastic rounding); the feature classifier and the evaluation noise do not change with
    it, so every seed is scored alike."""
    torch.set_num_threads(1)  # the ranks are threads already; more only oversubscribes
    setting = QUICK if quick else FULL
    n = setting.eval_images
    data = load_dataset("mnist")
    net, net_accuracy = cached_feature_net(out / "cache", data, train_images=setting.feature_images)
    reference, _ = extract(net, data.test_x[:n])
    # the floor: real training images against the real test images, same n
    real = _scores(net, data.train_x[:n], reference)
    images = data.train_x * 2 - 1  # the generator's tanh range

    def build(world_size: int) -> WGANGame:
        generator, critic = mnist_dcgan(seed=seed, nz=NZ, width=WIDTH)
        return WGANGame(
            generator,
            critic,
            images,
            batch_size=setting.batch,
            noise_shape=(NZ,),
            clip=CLIP,
            seed=seed,
        )

    last: dict[str, torch.Tensor] = {}
    runs = [
        train_gan(
            method,
            build,
            workers=setting.workers,
            steps=setting.steps,
            lr=LR,
            eval_at=eval_points(setting.steps, 10),
            evaluate=_evaluator(net, reference, n, last, method),
            run_seed=seed,
        )
        for method in METHODS
    ]
    title = f"MNIST WGAN, {setting.workers} workers"
    plot_scores(runs, "frechet", "Fréchet distance (MNIST classifier)", out / "frechet.png", title)
    plot_scores(runs, "score", "classifier score (IS formula)", out / "score.png", title)
    _plot_samples(runs, last, out / "samples.png")
    return _outcome(runs, real, net_accuracy, quick, setting)


def _outcome(
    runs: list[GanRun],
    real: dict[str, float],
    net_accuracy: float,
    quick: bool,
    setting: Setting,
) -> Outcome:
    by = {r.method: r for r in runs}
    steps, n = setting.steps, setting.eval_images
    start = runs[0].curve[0][1]
    rows = [
        Row("MNIST classifier test accuracy (feature extractor)", None, 100 * net_accuracy, "%"),
        Row("real train vs test images: Fréchet distance (floor)", None, real["frechet"]),
        Row("real test images: classifier score (ceiling)", None, real["score"]),
        Row("untrained generator: Fréchet distance", None, start["frechet"]),
    ]
    for r in runs:
        rows += [
            Row(f"{r.label}: Fréchet distance at step {steps}", None, r.final("frechet")),
            Row(f"{r.label}: Fréchet distance, mean of the last half", None, r.late_mean("frechet")),
            Row(f"{r.label}: classifier score at step {steps}", None, r.final("score")),
            Row(f"{r.label}: classifier score, mean of the last half", None, r.late_mean("score")),
        ]  # fmt: skip
    rows += bits_rows(runs)
    rows += [
        Row(
            "DQGAN / CPOAdam Fréchet distance, means of the last half (paper: comparable)",
            1.0,
            by["dqgan"].late_mean("frechet") / by["cpoadam"].late_mean("frechet"),
            "ratio",
        ),
        Row(
            "CPOAdam-GQ / CPOAdam Fréchet distance, means of the last half",
            None,
            by["cpoadam-gq"].late_mean("frechet") / by["cpoadam"].late_mean("frechet"),
            "ratio",
        ),
    ]
    workers, batch = setting.workers, setting.batch
    return Outcome(
        id="dqgan-mnist",
        title="DQGAN on an MNIST DCGAN: DQGAN 8-bit vs CPOAdam vs CPOAdam-GQ",
        quick=quick,
        rows=rows,
        scaled_down=[
            "MNIST and a small DCGAN (237k generator and 37k critic parameters) instead of the "
            "seed's DCGAN on CIFAR-10 and CelebA (not available here).",
            f"{workers} simulated workers with {batch} real images each per iteration, "
            f"{steps} iterations per method"
            + (
                " (--quick: a pipeline check; the generators have barely moved, so the scores "
                "say nothing about the methods)"
                if quick
                else ""
            )
            + "; the seed trains for many epochs on up to 32 GPUs.",
            f"Scores from {n} generated samples against {n} real test images; the feature "
            "classifier was trained "
            + ("on the first 10,000 training images (--quick)" if quick else "for one epoch")
            + " by this experiment.",
        ],
        notes=[
            "The Fréchet distance and the classifier score (the Inception Score's formula) use "
            "the features and logits of gradzip's own MNIST classifier, not Inception-v3: they "
            "are not the FID or the IS and are comparable only between these runs. Lower "
            "Fréchet distance and higher score are better.",
            "The means of the last half average the evaluations after the run's midpoint (5 "
            "of the 10 evaluations), because one evaluation swings by about 25%.",
            "The seed's IS/FID numbers are lost (spec 4.6); its claim is that DQGAN is "
            "comparable to CPOAdam with at most a slight degradation, at a quarter of the bits.",
            "Wire bits include each payload's header and CRC (one payload per parameter "
            "tensor); paper bits are 8 per coordinate plus a 32-bit scale per tensor for Hou's "
            "quantizer (log2(255) per coordinate, spec 0.5) and 32 per coordinate for fp32.",
            "Seconds per method: " + ", ".join(f"{r.label} {r.seconds:.0f}" for r in runs) + ".",
        ],
        plots=["frechet.png", "score.png", "samples.png"],
        extra={"curves": {r.method: r.curve for r in runs}, "setting": asdict(setting)},
    )
