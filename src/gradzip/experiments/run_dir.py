"""Choosing a training run's directory so that it never mixes two runs.

* Default names (no ``--out``) are ``runs/<model>-<method>-<P>w-s<seed>-<hash>``, the hash
  covering every option that changes the run (:meth:`TrainConfig.run_hash`), so different
  runs never share one. A repeat of the same run takes the first free ``<name>-2``, ``-3``, ...:
  the directory is created exclusively, so two runs started at once cannot take the same one.
* An explicit ``--out`` that already holds a run (any of :data:`RUN_FILES`) is refused unless
  ``force``, which first deletes exactly those files (nothing else in the directory).
* ``--resume DIR`` continues the run in ``DIR`` (:mod:`gradzip.experiments.checkpoint`).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

from gradzip.experiments.config import ConfigError, TrainConfig
from gradzip.experiments.resolved_config import resolved_out

#: every file a run writes into its directory (the checkpoint's temporary file included)
RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "summary.json",
    "report.md",
    "accuracy.png",
    "loss.png",
    "bits.png",
    "checkpoint.pt",
    "checkpoint.pt.tmp",
    "metrics.jsonl.tmp",
)

#: the files that describe a finished (or stopped) run; a resumed run deletes them first, so a
#: directory never shows an old summary beside newer metrics
RESULT_FILES = ("summary.json", "report.md", "accuracy.png", "loss.png", "bits.png")


def run_files(directory: str | Path) -> list[str]:
    """The names of :data:`RUN_FILES` present in ``directory`` (none if it does not exist)."""
    folder = Path(directory)
    return [name for name in RUN_FILES if (folder / name).exists()]


def remove(directory: str | Path, names: tuple[str, ...] = RUN_FILES) -> None:
    """Delete the files ``names`` (default: all of a run's) from ``directory``, if present."""
    for name in names:
        (Path(directory) / name).unlink(missing_ok=True)


def claim_run_dir(config: TrainConfig, force: bool = False) -> TrainConfig:
    """``config`` with ``out`` set to a directory that holds no other run: an explicit one
    (emptied of a run's files with ``force``), or a default name, created now (exclusively).

    Idempotent for a directory it chose (still empty). Raises :class:`ConfigError` when an
    explicit ``out`` holds a run and ``force`` is off."""
    if config.out is not None:
        held = run_files(config.out)
        if held and not force:
            raise ConfigError(
                f"--out {config.out} already holds a run ({', '.join(held)}); pass --force to "
                f"replace it, --resume {config.out} to continue it, or choose another --out"
            )
        remove(config.out)
        return config  # created by the run's writer, once the run has started
    base = resolved_out(config)
    for count in itertools.count(1):
        candidate = base if count == 1 else f"{base}-{count}"
        try:
            Path(candidate).mkdir(parents=True)
        except FileExistsError:
            continue
        return replace(config, out=candidate)
    raise AssertionError("unreachable")  # pragma: no cover


def drop_if_empty(directory: str | Path) -> None:
    """Remove ``directory`` if it exists and is empty (a run that failed before writing)."""
    folder = Path(directory)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
