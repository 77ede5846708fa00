"""Held-out evaluation and targets of ``gradzip bench cluster``'s real workloads: the fixed
subset, the evaluation's determinism and agreement over ranks, the target logic on synthetic
curves, the table and curves, the options, and one end-to-end run (slow, root only)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from gradzip.cli import main
from gradzip.comm.spawn import run_processes
from gradzip.comm.transport import Transport
from gradzip.models import resnet
from gradzip_lab.bench import cluster_netns
from gradzip_lab.bench.cluster_heldout import (
    HeldoutTarget,
    eval_due,
    evaluate,
    first_reached,
    format_heldout,
    heldout_fields,
    item_losses,
    write_heldout_png,
)
from gradzip_lab.bench.cluster_workloads import WORKLOADS, build, heldout_shard, train_batches
from gradzip_lab.cli.bench import REAL_MODELS


def test_the_cli_names_every_workload() -> None:
    assert set(REAL_MODELS) == set(WORKLOADS)


def test_the_heldout_subset_is_fixed_and_split_over_the_ranks_without_overlap() -> None:
    whole_x, whole_y = heldout_shard("transformer-lm", "pydoc", None, 40, 0, 1)
    shards = [heldout_shard("transformer-lm", "pydoc", None, 40, r, 3) for r in range(3)]
    assert sum(len(x) for x, _ in shards) == 40
    for rank, (x, y) in enumerate(shards):
        torch.testing.assert_close(x, whole_x[rank::3], rtol=0, atol=0)
        torch.testing.assert_close(y, whole_y[rank::3], rtol=0, atol=0)
    # targets are the inputs shifted by one character
    assert torch.equal(whole_x[:, 1:], whole_y[:, :-1])
    with pytest.raises(ValueError, match="held-out subset"):
        heldout_shard("transformer-lm", "pydoc", None, 10**9, 0, 1)


def test_training_batches_follow_the_seed_and_never_hold_heldout_text() -> None:
    a = train_batches("transformer-lm", "pydoc", None, 0, 1, 2, 4, 3, 17)
    b = train_batches("transformer-lm", "pydoc", None, 0, 1, 2, 4, 3, 17)
    c = train_batches("transformer-lm", "pydoc", None, 1, 1, 2, 4, 3, 17)
    assert len(a) == 3 and a[0][0].shape == (4, 64)
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(a, b, strict=True))
    assert not torch.equal(a[0][0], c[0][0])


def test_data_a_workload_cannot_train_on_is_refused() -> None:
    with pytest.raises(ValueError, match="trains on fashion-mnist or cifar10"):
        build("resnet20", "pydoc", 0)


def test_item_losses_flatten_sequences() -> None:
    logits = torch.tensor([[[2.0, 0.0], [0.0, 2.0]]])  # (batch 1, seq 2, vocab 2)
    losses, right = item_losses(logits, torch.tensor([[0, 0]]))
    assert losses.shape == (2,) and right.tolist() == [True, False]


def _gloo_alone(tmp_path: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )


def test_evaluation_is_deterministic_and_the_whole_subsets_mean(tmp_path: Path) -> None:
    _gloo_alone(tmp_path)
    try:
        model = resnet(8, in_channels=1, seed=0)
        gen = torch.Generator().manual_seed(0)
        shard = (
            torch.rand(300, 1, 12, 12, generator=gen),
            torch.randint(0, 10, (300,), generator=gen),
        )
        first, again = evaluate(model, shard), evaluate(model, shard)
        assert first == again
        assert model.training  # the mode is put back
        model.eval()
        with torch.no_grad():
            losses, right = item_losses(model(shard[0]), shard[1])
        assert first[0] == pytest.approx(float(losses.double().mean()), rel=1e-9)
        assert first[1] == pytest.approx(100.0 * float(right.double().mean()))
    finally:
        dist.destroy_process_group()


def _evaluate_rank(transport: Transport) -> tuple[float, float]:
    rank = transport.rank
    model = resnet(8, in_channels=1, seed=0)
    # each rank's batch-norm statistics differ, as after training on its own batches
    model.bn.running_mean.fill_(0.1 * rank)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(90, 1, 12, 12, generator=gen), torch.randint(0, 10, (90,), generator=gen)
    return evaluate(model, (x[rank::3], y[rank::3]))


@pytest.mark.slow
@pytest.mark.distributed
def test_every_rank_gets_the_same_figures() -> None:
    results = run_processes(3, _evaluate_rank, timeout=120.0)
    assert results[0] == results[1] == results[2]
    # the figures are rank 0's model (its batch-norm statistics broadcast) on the whole subset
    model = resnet(8, in_channels=1, seed=0).eval()
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(90, 1, 12, 12, generator=gen), torch.randint(0, 10, (90,), generator=gen)
    with torch.no_grad():
        losses, right = item_losses(model(x), y)
    assert results[0][0] == pytest.approx(float(losses.double().mean()), rel=1e-6)
    assert results[0][1] == pytest.approx(100.0 * float(right.double().mean()))


def _row(
    variant: str, accuracy: list[float], seconds: list[float], seed: int = 0
) -> dict[str, Any]:
    steps = [20 * (i + 1) for i in range(len(accuracy))]
    curve = {"eval_steps": steps, "eval_elapsed_s": seconds, "eval_accuracy": accuracy,
             "eval_loss": [2.0 - a / 100 for a in accuracy]}  # fmt: skip
    row = {"model": "resnet20", "world_size": 4, "rate": "100mbit", "variant": variant,
           "seed": seed, **curve}  # fmt: skip
    row.update(first_reached(curve, TARGET))
    return row


TARGET = HeldoutTarget(eval_every=20, accuracy=70.0)


def test_the_target_is_the_first_evaluation_that_meets_it() -> None:
    row = _row("fp32", [50.0, 70.0, 65.0, 80.0], [10.0, 20.0, 30.0, 40.0])
    assert (row["steps_to_target"], row["time_to_target_s"]) == (40, 20.0)
    missed = _row("fp32", [50.0, 69.9], [10.0, 20.0])
    assert missed["steps_to_target"] is None and missed["time_to_target_s"] is None
    both = HeldoutTarget(accuracy=70.0, loss=1.25)  # loss 2 - a/100: a >= 75 meets it
    curve = _row("x", [70.0, 74.0, 76.0], [1.0, 2.0, 3.0])
    assert first_reached(curve, both) == {"steps_to_target": 60, "time_to_target_s": 3.0}
    assert not HeldoutTarget().met(0.0, 100.0)  # no target: never reached
    assert eval_due(19, 60, 20) and eval_due(59, 60, 20) and eval_due(4, 5, 20)
    assert not eval_due(20, 60, 20)


def test_bad_targets_are_refused() -> None:
    for kwargs, message in [({"accuracy": 0.0}, "percent"), ({"accuracy": 120.0}, "percent"),
                            ({"loss": -1.0}, "target-loss"), ({"eval_every": 0}, "eval-every"),
                            ({"seeds": 0}, "seeds")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            HeldoutTarget(**kwargs)  # type: ignore[arg-type]


def test_the_heldout_fields_come_from_the_slowest_rank_and_need_agreeing_ranks() -> None:
    ranks = [{"seconds": [1.0, 2.0, 1.0], "eval_steps": [2, 3], "eval_loss": [1.5, 1.0],
              "eval_accuracy": [60.0, 72.0]},
             {"seconds": [2.0, 1.0, 1.0], "eval_steps": [2, 3], "eval_loss": [1.5, 1.0],
              "eval_accuracy": [60.0, 72.0]}]  # fmt: skip
    fields = heldout_fields(ranks, TARGET)
    assert fields["eval_elapsed_s"] == [4.0, 5.0]
    assert (fields["steps_to_target"], fields["time_to_target_s"]) == (3, 5.0)
    ranks[1]["eval_accuracy"] = [60.0, 71.0]
    with pytest.raises(ValueError, match="disagree"):
        heldout_fields(ranks, TARGET)


def test_table_over_seeds_and_curves(tmp_path: Path) -> None:
    rows = [
        _row("fp32", [50.0, 70.0, 80.0], [10.0, 20.0, 30.0], seed=0),
        _row("fp32", [50.0, 60.0, 72.0], [12.0, 22.0, 32.0], seed=1),
        _row("gradzip:qsgd:allgather", [55.0, 71.0], [5.0, 10.0], seed=0),
        _row("gradzip:qsgd:allgather", [55.0, 73.0], [5.0, 10.0], seed=1),
    ]
    text = "\n".join(format_heldout(rows, TARGET))
    assert "held-out figures after 40 steps" in text  # the fewest steps any variant ran
    fp32 = next(line for line in text.splitlines() if line.startswith("fp32 "))
    # both seeds reached it: at 40 and 60 steps, 20 and 32 s; after 40 steps 70 and 60 %
    assert "2       2" in fp32 and "50 ± 14" in fp32 and "26.0 ± 8.5" in fp32
    assert "65.00 ± 7.07" in fp32
    gz = next(line for line in text.splitlines() if line.startswith("gradzip"))
    assert "40 ± 0" in gz and "72.00 ± 1.41" in gz
    png = tmp_path / "curves.png"
    write_heldout_png(str(png), rows, TARGET)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "resnet20", "--target-accuracy", "150"], "percent"),
        (["--model", "fc-300-100", "--target-accuracy", "50"], "resnet20 and transformer-lm"),
        # an MLP has no held-out set: --eval-every is refused, not ignored (even at its default)
        (["--model", "mlp-4096", "--eval-every", "20"], "--eval-every: --model mlp-4096 has no "),
        (
            ["--model", "fc-300-100", "--eval-every", "5", "--target-accuracy", "50"],
            "--eval-every, --target-accuracy: --model fc-300-100 has no held-out set; only "
            "resnet20 and transformer-lm evaluate one",
        ),
        (["--model", "fc-300-100", "--seeds", "3"], "--seeds: --model fc-300-100 has no"),
        (["--model", "resnet20", "--eval-every", "0"], "--eval-every and --seeds must be >= 1"),
        (["--model", "resnet20", "--data", "pydoc"], "trains on fashion-mnist or cifar10"),
        (["--model", "resnet20", "--data", "cifar10"], "CIFAR-10 cannot be downloaded here"),
    ],
)
def test_bad_options(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "cluster", "--world-sizes", "2", *argv]) == 2
    assert message in capsys.readouterr().err


def _cannot_build() -> str | None:
    from gradzip_lab.bench.cluster_netns import missing_privilege

    return missing_privilege()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("model", ["resnet20", "transformer-lm"])
def test_end_to_end_real_workload(model: str, tmp_path: Path) -> None:
    """P = 2, no rate limit, 3 steps: every variant evaluated after steps 2 and 3, the ranks
    agreeing, the table, JSON and curves written."""
    reason = _cannot_build()
    if reason:
        pytest.skip(reason)
    out, curves = tmp_path / "cluster.json", tmp_path / "curves.png"
    variants = ["fp32", "gradzip:qsgd:allgather"]
    code = main(
        ["bench", "cluster", "--model", model, "--world-sizes", "2", "--rates", "none",
         "--steps", "3", "--eval-every", "2", "--target-accuracy", "1", "--timeout", "600",
         "--variants", *variants, "--json", str(out), "--png", str(tmp_path / "b.png"),
         "--curves-png", str(curves)]
    )  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    assert result["eval_every"] == 2 and result["target_accuracy_percent"] == 1.0
    runs = {r["variant"]: r for r in result["runs"]}
    assert set(runs) == set(variants)
    for r in runs.values():
        assert r["eval_steps"] == [2, 3] and len(r["eval_elapsed_s"]) == 2
        assert all(0.0 <= a <= 100.0 for a in r["eval_accuracy"])
        assert all(loss > 0 for loss in r["eval_loss"])
        # a 1% accuracy is met at the first evaluation
        assert r["steps_to_target"] == 2 and r["time_to_target_s"] == r["eval_elapsed_s"][0]
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    mine = f"{cluster_netns.PREFIX}{os.getpid()}"
    assert not [n for n in cluster_netns.list_namespaces() if n.startswith(mine)]
