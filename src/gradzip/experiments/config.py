"""The configuration of a training run: typed, validated, serialisable.

[CHOICE] The options alone: what depends on the run's training method (its default directory,
its hash, its record, the method's own checks) is :mod:`gradzip.experiments.resolved_config`,
above the methods, so the configuration never looks up its own consumers.

Defaults reproduce the NDQSG experiment of the DQSG paper (spec 1.10, Figure 5) at a size that
finishes in minutes on two cores: FC-300-100 on MNIST, 8 simulated workers, half of them sending
DQSG with Delta = 1/2 (M = 2) and half nested NDQSG with Delta1 = 1/3, Delta2 = 1 (L1 = 3,
k = 3), decoded at a parameter server in rank order with the running mean as side information
(Alg. 2), which returns the mean as a 5-bit DQSG payload instead of fp32 [CHOICE; ``--scheme
nested[server]`` is Alg. 2 as written], Adam
with lr 1e-3, total batch 256, one epoch, learning rate x0.98 per epoch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from gradzip.choices import choices_of
from gradzip.errors import ConfigError as ConfigError  # its home before gradzip.errors

#: the optimizer a run steps with (``torch.optim``'s SGD, Adam, Adagrad)
Optimizer = Literal["sgd", "adam", "adagrad"]
OPTIMIZERS: tuple[Optimizer, ...] = choices_of(Optimizer)
#: where the ranks run: simulated in this process, spawned gloo processes, or under torchrun
Backend = Literal["local", "gloo", "env"]
BACKENDS: tuple[Backend, ...] = choices_of(Backend)
#: the training method of a run that names none (:mod:`gradzip.experiments.methods`)
DEFAULT_METHOD = "compressed-gradients"
#: learning rates of spec 1.10 (SGD, Adam) and a common Adagrad default
DEFAULT_LR = {"sgd": 0.01, "adam": 0.001, "adagrad": 0.01}
#: options that do not change what a run computes: left out of the default directory's hash,
#: and free to change when a run is resumed (with ``epochs`` and ``max_steps``)
RUN_NEUTRAL = ("out", "progress", "timeout")


@dataclass
class TrainConfig:
    """Every option of ``gradzip train``; see the field comments."""

    model: str = "fc-300-100"  # gradzip.models.paper.MODELS
    dataset: str | None = None  # default: the model's dataset
    data_dir: str | None = None  # a directory with the dataset's files (else the defaults)
    compressor: str = "ndqsg"  # any registered compressor (`gradzip list`)
    compressor_params: dict[str, Any] = field(default_factory=dict)  # ndqsg: L1=3, k=3
    scheme: str | None = (
        None  # a scheme spec (gradzip.schemes.spec); default: nested[server,dqsg-downlink] for ndqsg, else ps[fp32]
    )
    scheme_params: dict[str, Any] = field(default_factory=dict)
    error_feedback: bool = False
    workers: int = 8
    backend: Backend = "local"  # local: simulated ranks; gloo: spawned processes; env: torchrun
    optimizer: Optimizer = "adam"
    lr: float | None = None  # default per optimizer (DEFAULT_LR)
    lr_decay: float = 0.98  # multiplied in after every epoch
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_size: int = 256  # total over the workers
    epochs: int = 1
    max_steps: int | None = None  # stop early (quick runs, tests)
    seed: int = 0
    out: str | None = None  # run directory; default runs/<model>-<method>-<P>w-s<seed>-<hash>
    entropy: bool = False  # entropy-code the symbols (real ANS payloads)
    eval_every: int = 50  # steps between test-accuracy evaluations (and at the end)
    eval_images: int | None = None  # evaluate on the first N test images only (quick runs)
    progress: bool = True
    # one vectorized gradient pass over the simulated workers (torch.func.vmap): faster, but
    # not bit-exact with process ranks (the default computes each worker's gradient as a rank does)
    vectorized_gradients: bool = False
    timeout: float = 60.0  # seconds a process rank waits for a peer before it gives up
    # what the ranks exchange and how the parameters follow (gradzip.experiments.methods);
    # qesgd ignores compressor and scheme
    method: str = DEFAULT_METHOD
    method_options: dict[str, Any] = field(default_factory=dict)  # the method's, by name

    def resolved_scheme(self) -> str:
        if self.scheme is not None:
            return self.scheme
        # [CHOICE] the paper's server, but returning a 5-bit DQSG mean instead of fp32, so the
        # busiest rank's traffic stays below fp32 ring all-reduce's; `--scheme nested[server]`
        # is Alg. 2 as written (what `gradzip reproduce dqsg-fig5` runs)
        return "nested[server,dqsg-downlink]" if self.compressor == "ndqsg" else "ps[fp32]"

    def resolved_lr(self) -> float:
        return self.lr if self.lr is not None else DEFAULT_LR[self.optimizer]

    def resolved_dataset(self) -> str:
        """The dataset's name: the one given, or the model's own (as ``load_dataset`` reads)."""
        if self.dataset is not None:
            return self.dataset
        from gradzip.models.paper import model_info

        name = model_info(self.model).dataset.lower()
        return {"cifar-10": "cifar10"}.get(name, name)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """The config of a checkpoint's ``config`` entry (the fields, as ``asdict`` gives
        them); an unknown key is refused."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**values)

    def check_names(
        self, models: Iterable[str], compressors: Iterable[str], schemes: Iterable[str]
    ) -> None:
        """``ConfigError`` unless the model, compressor and scheme are among those named (the
        registries; the command line passes its light copies, :mod:`gradzip.cli.catalog`).
        The scheme is checked by its name here; :meth:`validate` reads its options."""
        models, compressors, schemes = list(models), list(compressors), list(schemes)
        if self.model not in models:
            raise ConfigError(f"unknown model {self.model!r}; choose one of {', '.join(models)}")
        if self.compressor not in compressors:
            raise ConfigError(
                f"unknown compressor {self.compressor!r}; `gradzip list` shows them all"
            )
        if self.resolved_scheme().partition("[")[0].strip() not in schemes:
            raise ConfigError(
                f"unknown scheme {self.resolved_scheme()!r}; choose one of {', '.join(schemes)}, "
                "with options in brackets (`gradzip list schemes`)"
            )

    def check_values(self) -> None:
        """``ConfigError`` unless the optimizer and backend are known and every number is in
        range (all that needs no registry, so nothing heavy is imported)."""
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(
                f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}"
            )
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}"
            )
        lr = self.resolved_lr()
        if not (math.isfinite(lr) and lr > 0):
            raise ConfigError(f"--lr must be a positive number, got {lr}")
        for name in ("lr_decay", "momentum", "weight_decay"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, got {value}")
        for name in ("workers", "batch_size", "epochs", "eval_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ConfigError(f"--timeout must be a positive number of seconds, got {self.timeout}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError("--max-steps must be >= 1")
        if self.eval_images is not None and self.eval_images < 1:
            raise ConfigError("--eval-images must be >= 1 (or left out: the whole test set)")
        if self.batch_size % self.workers:
            raise ConfigError(
                f"--batch-size {self.batch_size} must be divisible by --workers {self.workers} "
                "(the total batch is split evenly)"
            )
