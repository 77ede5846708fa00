"""Training methods as a registry (:mod:`gradzip.experiments.methods`): a method registered in
one place is offered by ``gradzip train --method``, its options typed by ``--method-param``;
configs and checkpoints of the former ``algorithm``/``qesgd_*`` keys still load and resume;
the deprecated ``--algorithm``/``--qesgd-*`` options map onto the new ones."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gradzip import state_file
from gradzip.cli import build_parser, main
from gradzip.cli.train import config_from_args
from gradzip.comm.pool import RankPool
from gradzip.comm.transport import Transport
from gradzip.experiments.config import ConfigError, TrainConfig
from gradzip.experiments.exchange import Exchanged
from gradzip.experiments.methods import METHODS, RankSetup, TrainingMethod, get_method, register
from gradzip.experiments.resolved_config import resolved_out, validate
from gradzip.experiments.stopping import StopRequest
from gradzip.experiments.traffic import step_traffic
from gradzip.experiments.trainer import Trainer
from gradzip.simulation.workers import WorkerStep

TINY = ["--max-steps", "3", "--eval-every", "3", "--workers", "2", "--no-progress"]


@dataclass(frozen=True)
class ToyOptions:
    scale: float = field(default=1.0, metadata={"help": "multiplies the mean gradient"})


class LocalMean(TrainingMethod):
    """Every simulated rank averages all workers' gradients itself: nothing is sent."""

    name = "toy-local-mean"
    summary = "the mean gradient without communication (a test's toy)"
    options = ToyOptions

    def simulated(
        self, trainer: Trainer, pool: RankPool, states: list[Any] | None, stop: StopRequest
    ) -> RankSetup:
        scale = self.options_of(trainer.config).scale

        def exchange(step: int, out: WorkerStep) -> Exchanged:
            def bits(transport: Transport) -> dict[str, float | None]:
                none: dict[str, float | None] = dict.fromkeys(("wire", "paper", "entropy"))
                return {f"{k}_bits": v for k, v in none.items()} | step_traffic(
                    transport.meter, step
                )

            means = [scale * g.mean(dim=0) for g in out.grads]
            return Exchanged(
                means,
                pool.run(bits),
                [float(v) for v in out.loss],
                int(out.correct.sum()),
                stop=stop.requested,
            )

        return RankSetup(exchange, lambda: [None] * trainer.config.workers)

    def process(
        self, trainer: Trainer, transport: Transport, state: Any | None, stop: StopRequest
    ) -> RankSetup:
        raise ConfigError("toy-local-mean runs on simulated ranks only")


@pytest.fixture
def toy() -> Iterator[TrainingMethod]:
    method = register(LocalMean())
    try:
        yield method
    finally:
        del METHODS[method.name]


def test_a_registered_method_is_offered_by_gradzip_train(
    toy: TrainingMethod,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # the help unwrapped
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = capsys.readouterr().out
    assert "toy-local-mean: the mean gradient without communication" in help_text
    assert "scale=1.0 (float): multiplies the mean gradient" in help_text
    out = tmp_path / "toy"
    argv = ["train", *TINY, "--optimizer", "sgd", "--method", "toy-local-mean"]
    assert main([*argv, "--method-param", "scale=0.5", "--out", str(out)]) == 0
    assert "3 steps" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["method"] == "toy-local-mean" and config["method_options"] == {"scale": 0.5}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["sent_bits"] == 0 for r in rows)
    assert main([*argv, "--method-param", "scale=big", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "gradzip train: --method-param: method 'toy-local-mean' parameter scale expects float, "
        "got 'big'"
    )
    label = resolved_out(TrainConfig(method="toy-local-mean"))
    assert label.startswith("runs/fc-300-100-toy-local-mean-8w-s0-")


def test_unknown_methods_and_options_are_refused_naming_the_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(ConfigError, match="unknown method 'adamw'; choose one of"):
        validate(TrainConfig(method="adamw"))
    with pytest.raises(ConfigError, match="has no parameter 'bits'; its parameters"):
        validate(TrainConfig(method_options={"bits": 4}))
    assert main(["train", "--method-param", "bits=4", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "method 'compressed-gradients' has no parameter 'bits'; choices: none" in err
    assert get_method("qesgd").name == "qesgd"


def _old_style(config: TrainConfig, algorithm: str, **qesgd: Any) -> dict[str, Any]:
    """``config`` as a checkpoint written before methods were a registry stored it."""
    values = asdict(config)
    del values["method"], values["method_options"]
    old = {"bits": 8, "c": 1.0, "output": "average", "bucket_size": 0, "norm_samples": None}
    values["algorithm"] = algorithm
    values.update({f"qesgd_{k}": v for k, v in {**old, **qesgd}.items()})
    return values


def test_from_dict_reads_the_old_algorithm_and_qesgd_keys() -> None:
    sgd = TrainConfig.from_dict(_old_style(TrainConfig(workers=4), "sgd"))
    assert sgd == TrainConfig(workers=4)
    qesgd = TrainConfig.from_dict(_old_style(TrainConfig(optimizer="sgd"), "qesgd", bits=4, c=2.0))
    assert qesgd.method == "qesgd" and qesgd.optimizer == "sgd"
    assert qesgd.method_options == {
        "bits": 4,
        "c": 2.0,
        "output": "average",
        "bucket_size": 0,
        "norm_samples": None,
    }
    assert TrainConfig.from_dict(asdict(qesgd)) == qesgd  # the new keys read back as they are
    with pytest.raises(ConfigError, match="unknown option"):
        TrainConfig.from_dict({**asdict(qesgd), "qesgd_step": 1})


def _rewrite_as_old(out: Path, algorithm: str, **qesgd: Any) -> None:
    """Give the checkpoint in ``out`` the config keys of the former ``algorithm``/``qesgd_*``."""
    state = state_file.read(out / "checkpoint.pt")
    options = TrainConfig.from_dict(state["config"]).method_options
    state["config"] = _old_style(
        TrainConfig.from_dict(state["config"]), algorithm, **{**options, **qesgd}
    )
    state_file.write(out / "checkpoint.pt", state)


def test_checkpoints_with_the_old_keys_resume(tmp_path: Path) -> None:
    def rows(out: Path) -> list[dict[str, Any]]:
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in lines]

    common = ["--workers", "2", "--no-progress", "--eval-every", "2", "--compressor", "qsgd"]
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert main(["train", *common, "--max-steps", "3", "--out", str(whole)]) == 0
    assert main(["train", *common, "--max-steps", "2", "--out", str(part)]) == 0
    _rewrite_as_old(part, "sgd")
    assert main(["train", "--resume", str(part), "--max-steps", "3"]) == 0
    assert rows(part) == rows(whole)
    # a finished qesgd run goes on from its closed epoch (see checkpoint.py): it resumes
    qesgd = ["--method", "qesgd", "--optimizer", "sgd", "--method-param", "norm_samples=256"]
    qesgd += ["bits=4"]
    old = tmp_path / "qesgd"
    assert main(["train", *common[:5], *qesgd, "--max-steps", "1", "--out", str(old)]) == 0
    _rewrite_as_old(old, "qesgd")
    assert main(["train", "--resume", str(old), "--max-steps", "2"]) == 0
    config = json.loads((old / "config.json").read_text())
    assert config["method"] == "qesgd" and config["method_options"]["bits"] == 4
    assert len(rows(old)) == 2


def test_the_deprecated_options_map_onto_method_and_method_param(
    capsys: pytest.CaptureFixture[str],
) -> None:
    old = ["train", "--algorithm", "qesgd", "--qesgd-bits", "4", "--qesgd-output", "last"]
    config = config_from_args(build_parser().parse_args([*old, "--method-param", "c=2"]))
    assert config.method == "qesgd"
    assert config.method_options == {"bits": 4, "output": "last", "c": 2.0}
    err = capsys.readouterr().err
    assert "--algorithm qesgd is deprecated; use --method qesgd" in err
    assert "--qesgd-bits 4 is deprecated; use --method-param bits=4" in err
    sgd = config_from_args(build_parser().parse_args(["train", "--algorithm", "sgd"]))
    assert sgd.method == "compressed-gradients"
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    train_help = capsys.readouterr().out
    assert "--method-param" in train_help  # the train subcommand's own help
    assert "--algorithm" not in train_help and "--qesgd" not in train_help  # hidden aliases


def test_the_default_method_is_registered() -> None:
    from gradzip.experiments.config import DEFAULT_METHOD
    from gradzip.experiments.methods import METHODS

    assert DEFAULT_METHOD in METHODS
