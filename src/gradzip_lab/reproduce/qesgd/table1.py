"""``qesgd-table1``: Table 1 of the QESGD paper, SGD vs whole-vector QSGD vs QESGD with weight
decay 0 / 1e-4 and 8 / 4 bits, on CIFAR-10 with a CIFAR ResNet (the paper: ResNet-56, 92.61% for
SGD and 8-bit QESGD with weight decay 1e-4). The same eight runs on Fashion-MNIST, which runs
here, are ``qesgd-fmnist`` (:mod:`.fmnist`); both use :func:`run_table`.

CIFAR-10 cannot be downloaded here: it is read from ``$GRADZIP_CIFAR10_DIR`` (the extracted
``cifar-10-batches-py`` of the python version); without it :func:`run` raises
:class:`~gradzip.data.datasets.DatasetUnavailableError` before anything is trained or
written.

The runs are single-machine, as in the paper (Algorithm 2 for QESGD), with batch 128, initial
rate 0.5 and no momentum (the seed's Figure 1 settings), the rate divided by 10 at 50% and 75% of
the epochs [CHOICE], QESGD's ``delta_t = ||grad F(w_0)|| / (c sqrt(t+1) 2^(b-1))`` with the full
gradient at ``w_0`` estimated once on a subset [CHOICE] and the last iterate as each epoch's
output [CHOICE, spec 2.2: for deep networks]. Inputs are standardised per channel with the
training subset's mean and std; CIFAR-10 training images get He et al.'s augmentation (4-pixel
zero padding, a random 32x32 crop, a random horizontal flip) [CHOICE, the seed does not say].
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)

from gradzip.algorithms.qesgd.schedule import flatten, full_gradient
from gradzip.algorithms.qesgd.state import QesgdOutput
from gradzip.data.datasets import load_dataset
from gradzip.models.resnet import resnet
from gradzip_lab.reproduce.outcome import Outcome, Row
from gradzip_lab.reproduce.qesgd.runs import (
    Method,
    Result,
    Schedule,
    plot_results,
    traffic_rows,
    train_classifier,
)
from gradzip_lab.reproduce.user_data import cifar10_dir as user_cifar10_dir

#: Table 1 of the seed (ResNet-56 on CIFAR-10, test accuracy %), row by row.
METHODS = (
    Method("SGD", "sgd", 0.0, None, 90.87),
    Method("SGD", "sgd", 1e-4, None, 92.61),
    Method("QSGD", "qsgd", 0.0, 8, 89.91),
    Method("QSGD", "qsgd", 1e-4, 8, 91.15),
    Method("QSGD", "qsgd", 1e-4, 4, 80.29),
    Method("QESGD", "qesgd", 0.0, 8, 90.64),
    Method("QESGD", "qesgd", 1e-4, 8, 92.61),
    Method("QESGD", "qesgd", 1e-4, 4, 87.72),
)


@dataclass(frozen=True)
class Setting:
    """How far one experiment is scaled down (see the reports' "What was scaled down")."""

    depth: int  # ResNet-(6n+2)
    train_images: int  # the first N training images
    test_images: int  # the first N test images
    epochs: int
    batch: int
    calibration_images: int  # samples of the full gradient at w_0
    lr0: float = 0.5
    c: float = 10.0  # from the seed's {1, 2, 3, 4, 5, 10}: see docs/qesgd.md
    output: QesgdOutput = "last"
    evals_per_epoch: int = 1

    @property
    def steps_per_epoch(self) -> int:
        return self.train_images // self.batch

    def schedule(self) -> Schedule:
        half, three_quarters = round(self.epochs * 0.5), round(self.epochs * 0.75)
        milestones = tuple(sorted({m for m in (half, three_quarters) if 0 < m < self.epochs}))
        return Schedule(self.epochs, self.steps_per_epoch, self.lr0, milestones)

    def describe(self) -> str:
        return (
            f"ResNet-{self.depth}, {self.train_images:,} training images ({self.steps_per_epoch} "
            f"iterations of {self.batch} per epoch), {self.epochs} epoch(s), test accuracy on the "
            f"first {self.test_images:,} test images, full gradient at w_0 on "
            f"{self.calibration_images:,} images"
        )


# CIFAR-10 (not run here): the same budget as qesgd-fmnist's full mode, with augmentation
FULL_CIFAR = Setting(20, 10_240, 5_000, 5, 128, 1_280)
QUICK_CIFAR = Setting(20, 96, 200, 1, 32, 64)


def cifar10_dir() -> str:
    """``$GRADZIP_CIFAR10_DIR``, checked to hold the batches; a one-line
    :class:`DatasetUnavailableError` saying how to supply it otherwise."""
    return user_cifar10_dir(
        "qesgd-table1", "`gradzip reproduce qesgd-fmnist` runs the same comparison on Fashion-MNIST"
    )


Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def prepare(name: str, data_dir: str | None, setting: Setting) -> tuple[Tensors, str, Setting]:
    """The training and test subsets, standardised with the training subset's statistics, and
    the setting cut to the data at hand (a smaller data set than the setting asks for)."""
    data = load_dataset(name, data_dir)
    if len(data.train_y) < setting.train_images:
        fits = len(data.train_y) // setting.batch * setting.batch
        if fits == 0:
            raise ValueError(f"{name} has fewer than one batch of {setting.batch} images")
        setting = replace(setting, train_images=fits)
    train_x = data.train_x[: setting.train_images]
    mean = train_x.mean(dim=(0, 2, 3), keepdim=True)
    std = train_x.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    tensors = (
        (train_x - mean) / std,
        data.train_y[: setting.train_images],
        (data.test_x[: setting.test_images] - mean) / std,
        data.test_y[: setting.test_images],
    )
    return tensors, data.source, setting


class Augmented(torch.nn.Module):
    """He et al.'s CIFAR augmentation in front of a model, in training mode only: zero-pad 4,
    random 32x32 crop, random flip; draws from a generator seeded once (no global RNG)."""

    def __init__(self, model: torch.nn.Module, seed: int) -> None:
        super().__init__()
        self.model = model
        self.generator = torch.Generator().manual_seed(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            from gradzip.data.datasets import random_crop_flip

            x = random_crop_flip(F.pad(x, (4, 4, 4, 4)), self.generator, x.shape[-1])
        out: torch.Tensor = self.model(x)
        return out


def run_table(
    out: Path,
    quick: bool,
    *,
    experiment_id: str,
    dataset: str,
    data_dir: str | None,
    setting: Setting,
    augment: bool,
    seed: int = 0,
) -> Outcome:
    """The eight runs of Table 1 on ``dataset``; the comparison rows and the curves."""
    started = time.perf_counter()
    data, source, setting = prepare(dataset, data_dir, setting)
    channels = int(data[0].shape[1])

    def build() -> torch.nn.Module:
        model = resnet(setting.depth, channels, seed)
        return Augmented(model, seed + 1) if augment else model

    # ||grad F(w_0)|| once: w_0 is the same for every run (the same seed); BN statistics of this
    # throw-away copy move, the runs' models are fresh
    probe = build()
    n = setting.calibration_images
    loader = [
        (data[0][i : i + 256], data[1][i : i + 256]) for i in range(0, min(n, len(data[1])), 256)
    ]
    norm0 = float(flatten(full_gradient(probe, F.cross_entropy, loader)).double().norm())
    results: list[Result] = []
    for method in METHODS:
        results.append(
            train_classifier(
                method,
                build,
                data,
                setting.schedule(),
                batch=setting.batch,
                c=setting.c,
                output=setting.output,
                norms=(norm0,),
                seed=seed,
                evals_per_epoch=setting.evals_per_epoch,
            )
        )
    plot_results(results, out / "accuracy.png", f"{dataset}: Table 1 methods", "test accuracy (%)")
    d = sum(p.numel() for p in probe.parameters())
    return outcome(experiment_id, quick, dataset, source, setting, results, norm0, d, started)


def outcome(
    experiment_id: str,
    quick: bool,
    dataset: str,
    source: str,
    setting: Setting,
    results: list[Result],
    norm0: float,
    d: int,
    started: float,
) -> Outcome:
    """Rows: every method's accuracy beside the paper's, the gaps the paper's claims are
    about, and the measured bits per iteration."""
    by = {(r.method.kind, r.method.weight_decay, r.method.bits): r for r in results}
    acc = {key: r.final or 0.0 for key, r in by.items()}
    rows = [Row(f"{r.method.name}: test accuracy", r.method.paper, r.final, "%") for r in results]
    claims = (
        ("QESGD minus QSGD, wd 0, 8 bits (a)", ("qesgd", 0.0, 8), ("qsgd", 0.0, 8)),
        ("QESGD minus QSGD, wd 1e-4, 8 bits (a)", ("qesgd", 1e-4, 8), ("qsgd", 1e-4, 8)),
        ("QESGD minus QSGD, wd 1e-4, 4 bits (a, c)", ("qesgd", 1e-4, 4), ("qsgd", 1e-4, 4)),
        ("QESGD minus SGD, wd 1e-4, 8 bits", ("qesgd", 1e-4, 8), ("sgd", 1e-4, None)),
        ("QSGD minus SGD, wd 1e-4, 8 bits", ("qsgd", 1e-4, 8), ("sgd", 1e-4, None)),
    )
    paper = {(m.kind, m.weight_decay, m.bits): m.paper for m in METHODS}
    for label, a, b in claims:
        pa, pb = paper[a], paper[b]
        rows.append(
            Row(label, None if pa is None or pb is None else pa - pb, acc[a] - acc[b], "points")
        )
    rows += traffic_rows(results)
    scaled = [
        f"Scaled to 2 CPU cores: {setting.describe()}; the paper trains ResNet-56 on all 50,000 "
        "CIFAR-10 images for many epochs (its schedule is not given). Accuracies are therefore "
        "far below the paper's; the differences between methods are the comparable part.",
        "Single machine, as in the paper (its synchronous distributed runs are equivalent); "
        "every QSGD and QESGD message is a real payload, encoded and decoded.",
    ]
    if quick:
        scaled.append(
            "--quick: a pipeline check only (a few iterations per run); its accuracies say "
            "nothing about the methods."
        )
    diverged = [r.method.name for r in results if r.diverged]
    notes = [
        f"Data: {dataset} from {source}. QESGD: c = {setting.c:g}, output = {setting.output}, "
        f"||grad F(w_0)||_2 = {norm0:.4g} (float32 once). QSGD: qsgd_l2, delta = ||g||_2 / "
        "2^(b-1) over the whole gradient vector (spec 2.3). Learning rate "
        f"{setting.lr0:g}, x0.1 at epochs {setting.schedule().milestones}; batch {setting.batch};"
        " no momentum.",
        f"Measured bits per iteration are the payload sizes (header included) for d = {d:,} "
        "parameters: 32 d for SGD's fp32 gradient, b d + 32 for QSGD (its scale), b d for "
        "QESGD's offset.",
        f"Wall time of the {len(results)} runs and the calibration: "
        f"{time.perf_counter() - started:.1f} s.",
    ]
    if diverged:
        notes.append(f"Diverged (non-finite loss; counted as 10%, chance): {', '.join(diverged)}.")
    return Outcome(
        id=experiment_id,
        title=f"QESGD paper, Table 1 setting on {dataset}: SGD vs QSGD vs QESGD",
        quick=quick,
        rows=rows,
        scaled_down=scaled,
        notes=notes,
        plots=["accuracy.png"],
        extra={
            "setting": setting.__dict__,
            "curves": {r.method.name: r.curve for r in results},
            "train_loss": {r.method.name: r.train_loss for r in results},
            "seconds_per_method": {r.method.name: r.seconds for r in results},
            "norm0": norm0,
        },
    )


def run(out: Path, quick: bool) -> Outcome:
    data_dir = cifar10_dir()  # first: a missing data set stops before anything is written
    return run_table(
        out,
        quick,
        experiment_id="qesgd-table1",
        dataset="cifar10",
        data_dir=data_dir,
        setting=QUICK_CIFAR if quick else FULL_CIFAR,
        augment=True,
    )
