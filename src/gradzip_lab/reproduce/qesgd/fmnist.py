"""``qesgd-fmnist``: the eight runs of the QESGD paper's Table 1 (SGD, whole-vector QSGD and
QESGD; weight decay 0 / 1e-4; 8 / 4 bits) on Fashion-MNIST, which is on this machine (Debian's
``dataset-fashion-mnist`` package, or the IDX files in ``$GRADZIP_FASHION_MNIST_DIR``; without
them the experiment fails in one line, as ``qesgd-table1`` does without CIFAR-10).

Scaled down for 2 CPU cores: ResNet-20 (the paper's smaller network; 269,434 parameters for
one input channel) on the first 10,240 training images (80 iterations of 128 per epoch), 5
epochs (lr 0.5, x0.1 after epochs 2 and 4), test accuracy on the first 5,000 test images.
On 2 shared cores the full mode takes hours (with other jobs running, two OpenMP threads wait
for each other: ``OMP_NUM_THREADS=1`` is faster). See :mod:`.table1` for everything shared with the CIFAR-10 version; inputs are not
augmented.
"""

from __future__ import annotations

from pathlib import Path

from gradzip.data import DatasetUnavailableError, datasets
from gradzip_lab.reproduce.outcome import Outcome
from gradzip_lab.reproduce.qesgd.table1 import Setting, run_table
from gradzip_lab.reproduce.seeds import Comparison
from gradzip_lab.reproduce.user_data import fashion_mnist_dir, fashion_mnist_hint

FULL = Setting(20, 10_240, 5_000, 5, 128, 1_280)
QUICK = Setting(20, 96, 200, 1, 32, 64)

#: what ``--seeds`` tests (paired over seeds): the paper's claims (a) and (c) and the gaps to SGD
COMPARISONS = (
    Comparison("QESGD - QSGD, wd 0, 8 bits", "QESGD (wd 0, 8 bits): test accuracy", "QSGD (wd 0, 8 bits): test accuracy", "points"),
    Comparison("QESGD - QSGD, wd 1e-4, 8 bits", "QESGD (wd 0.0001, 8 bits): test accuracy", "QSGD (wd 0.0001, 8 bits): test accuracy", "points"),
    Comparison("QESGD - QSGD, wd 1e-4, 4 bits", "QESGD (wd 0.0001, 4 bits): test accuracy", "QSGD (wd 0.0001, 4 bits): test accuracy", "points"),
    Comparison("QESGD - SGD, wd 1e-4, 8 bits", "QESGD (wd 0.0001, 8 bits): test accuracy", "SGD (wd 0.0001): test accuracy", "points"),
    Comparison("QSGD - SGD, wd 1e-4, 8 bits", "QSGD (wd 0.0001, 8 bits): test accuracy", "SGD (wd 0.0001): test accuracy", "points"),
)  # fmt: skip


def run(out: Path, quick: bool, seed: int = 0) -> Outcome:
    """The eight runs from ``seed`` (initial weights, batch order, stochastic rounding)."""
    data_dir = fashion_mnist_dir()
    try:
        return run_table(
            out,
            quick,
            experiment_id="qesgd-fmnist",
            dataset="fashion-mnist",
            data_dir=data_dir,
            setting=QUICK if quick else FULL,
            augment=False,
            seed=seed,
        )
    except DatasetUnavailableError as error:
        # the data are read before anything is written; say how to supply them for reproduce,
        # which has no --data-dir
        looked = data_dir or datasets.DEBIAN_FASHION_MNIST_DIR  # read now: tests move it
        raise DatasetUnavailableError(
            f"{fashion_mnist_hint('qesgd-fmnist')}; none found in {looked}"
        ) from error
