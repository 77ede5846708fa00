"""A run's configuration as its training method resolves it: the method, the default run
directory and its hash, every option with its defaults filled in (the run record), and the
full validation.

[CHOICE] These live above both :mod:`gradzip.experiments.config` (the options alone) and the
methods (:mod:`gradzip.experiments.methods`, which read the options): the configuration names
no method, so no import circle runs through it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any

import gradzip
from gradzip.errors import ConfigError
from gradzip.experiments.config import RUN_NEUTRAL, TrainConfig
from gradzip.experiments.methods import get_method
from gradzip.experiments.methods.base import TrainingMethod
from gradzip.models.paper import MODELS
from gradzip.schemes import SCHEMES, SchemeSpec


def training_method(config: TrainConfig) -> TrainingMethod:
    """The registered method ``config.method`` names."""
    return get_method(config.method)


def resolved_method_options(config: TrainConfig) -> dict[str, Any]:
    """Every option of the training method, its defaults filled in."""
    return training_method(config).resolved_options(config)


def run_hash(config: TrainConfig) -> str:
    """6 hex digits of a hash of the resolved options that change the run (all but ``out``,
    ``progress`` and ``timeout``)."""
    values = asdict(config)
    for neutral in RUN_NEUTRAL:
        values.pop(neutral)
    values.update(lr=config.resolved_lr(), scheme=config.resolved_scheme())
    values.update(method_options=resolved_method_options(config))
    text = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:6]


def resolved_out(config: TrainConfig) -> str:
    """``config.out``, or the default name: ``runs/<model>-<method>-<P>w-s<seed>-<hash>``,
    where ``<hash>`` (6 hex digits, :func:`run_hash`) identifies every option that changes the
    run, so two different runs never share a default directory (see
    :mod:`gradzip.experiments.run_dir` for repeats of the same run)."""
    if config.out is not None:
        return config.out
    label = training_method(config).run_label(config)
    return f"runs/{config.model}-{label}-{config.workers}w-s{config.seed}-{run_hash(config)}"


def run_record(config: TrainConfig) -> dict[str, Any]:
    """Every field, with the defaults that depend on others filled in (the run record)."""
    out = asdict(config)
    out.update(lr=config.resolved_lr(), out=resolved_out(config))
    out.update(scheme=config.resolved_scheme(), dataset=config.resolved_dataset())
    out["method_options"] = resolved_method_options(config)
    out.update(training_method(config).record(config))  # qesgd: no scheme
    return out


def validate(config: TrainConfig) -> TrainConfig:
    """Check every option of ``config`` (names against the registries, numbers in range, the
    training method's own options); returns ``config``."""
    config.check_names(MODELS, gradzip.names(), SCHEMES)
    try:
        SchemeSpec.parse(config.resolved_scheme())
    except ValueError as err:
        raise ConfigError(f"--scheme: {err}") from None
    config.check_values()
    method = training_method(config)
    method.validate(config, method.options_of(config))
    return config
