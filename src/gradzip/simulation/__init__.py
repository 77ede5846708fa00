"""Simulated data-parallel workers in one process: every worker's gradient of a step
(:mod:`gradzip.simulation.workers`), bit-exact with a real rank's or vectorized."""

from __future__ import annotations

from gradzip.simulation.workers import (
    PerWorkerGradients,
    WorkerGradients,
    WorkerStep,
    per_worker_gradients,
)

__all__ = ["PerWorkerGradients", "WorkerGradients", "WorkerStep", "per_worker_gradients"]
