"""Training methods as a registry (:mod:`gradzip.experiments.methods`): a method registered in
one place is offered by ``gradzip train --method``, its options typed by ``--method-param``;
configs with keys of no field (such as the ``algorithm``/``qesgd_*`` of unreleased versions)
are refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gradzip.cli import main
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


def test_from_dict_refuses_keys_of_no_field() -> None:
    config = TrainConfig(method="qesgd", optimizer="sgd", method_options={"bits": 4})
    assert TrainConfig.from_dict(asdict(config)) == config
    values = {**asdict(config), "algorithm": "qesgd", "qesgd_bits": 4}
    with pytest.raises(ConfigError, match=r"unknown option\(s\) algorithm, qesgd_bits"):
        TrainConfig.from_dict(values)


def test_the_options_of_unreleased_versions_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for old in (["--algorithm", "qesgd"], ["--qesgd-bits", "4"]):
        with pytest.raises(SystemExit) as stop:
            main(["train", *old])
        assert stop.value.code == 2
        assert f"unrecognized arguments: {' '.join(old)}" in capsys.readouterr().err


def test_the_default_method_is_registered() -> None:
    from gradzip.experiments.config import DEFAULT_METHOD
    from gradzip.experiments.methods import METHODS

    assert DEFAULT_METHOD in METHODS
