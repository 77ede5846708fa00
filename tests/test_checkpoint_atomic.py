"""Every ``load_state_dict`` is all or nothing: a refused checkpoint raises a CheckpointError
and leaves the object's whole state bitwise unchanged; malformed counters and slots are refused."""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from typing import Any

import pytest
import torch

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.errors import CheckpointError, GradzipError
from gradzip.feedback import ErrorFeedback
from gradzip.integrations.ddp import GradzipHookState
from gradzip.keys import StreamKey
from gradzip.optim import CompressedOptimizer
from gradzip.schemes import make_scheme
from gradzip.sync import GradientSync

RUN_SEED = 9


def saved(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj.state_dict(), buf)
    return buf.getvalue()


def assert_refused_unchanged(obj: Any, bad: Any, match: str | None = None) -> None:
    before = saved(obj)
    with pytest.raises(CheckpointError, match=match):
        obj.load_state_dict(bad)
    assert saved(obj) == before, "a refused load changed the state"


def net() -> torch.nn.Module:
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


def trained_optimizer(transport: Transport, variant: str = "allgather") -> CompressedOptimizer:
    """Two steps of top-k with error feedback and momentum: every part of the state is set."""
    model = net()
    scheme = make_scheme(variant, gradzip.create("topk", ratio=0.3), error_feedback=True,
                          run_seed=RUN_SEED)  # fmt: skip
    opt = CompressedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        GradientSync(transport, scheme=scheme),
    )
    gen = torch.Generator().manual_seed(transport.rank)
    for _ in range(2):
        opt.zero_grad()
        x = torch.randn(8, 6, generator=gen)
        torch.nn.functional.mse_loss(model(x), x[:, :1]).backward()
        opt.step()
    return opt


def on_ranks(fn: Callable[[Transport], None], world: int = 2) -> None:
    run_local(world, lambda t: fn(t))


def _other_residuals(state: dict[str, Any]) -> dict[str, Any]:
    bad = copy.deepcopy(state)
    for role in bad["scheme"]["feedback"].values():
        role["residual"] = [r * 2 + 1 for r in role["residual"]]
    return bad


def test_compressed_optimizer_with_a_broken_optimizer_part_changes_nothing() -> None:
    def body(transport: Transport) -> None:
        opt = trained_optimizer(transport)
        bad = {"optimizer": {"state": {}}, "sync": _other_residuals(opt.sync.state_dict())}
        bad["sync"]["step"] = 7
        # used to raise KeyError('param_groups') after sync.step went to 7 and the residuals
        # had been replaced
        assert_refused_unchanged(opt, bad, "param_groups")
        assert opt.sync.step == 2
        wrong_groups = copy.deepcopy(opt.state_dict())
        wrong_groups["optimizer"]["param_groups"].append(
            wrong_groups["optimizer"]["param_groups"][0]
        )
        assert_refused_unchanged(opt, wrong_groups, "parameter groups")
        assert_refused_unchanged(opt, {"sync": opt.sync.state_dict()}, "'optimizer'")

    on_ranks(body)


def test_compressed_optimizer_still_resumes_from_a_good_state() -> None:
    def body(transport: Transport) -> None:
        opt = trained_optimizer(transport)
        good = opt.state_dict()
        fresh = trained_optimizer(transport)
        fresh.sync.step = 0
        fresh.load_state_dict(good)
        assert saved(fresh) == saved(opt)

    on_ranks(body)


@pytest.mark.parametrize(
    ("field", "value"),
    [("step", -1), ("skipped_steps", -3), ("step", True), ("step", 2.5), ("skipped_steps", "1")],
)
def test_negative_or_non_integer_counters_are_refused(field: str, value: object) -> None:
    def body(transport: Transport) -> None:
        opt = trained_optimizer(transport)
        bad = _other_residuals(opt.sync.state_dict())
        bad[field] = value
        assert_refused_unchanged(opt.sync, bad, "ints >= 0")

    on_ranks(body)


def test_a_slot_listed_twice_is_refused_everywhere() -> None:
    def body(transport: Transport) -> None:
        opt = trained_optimizer(transport)
        bad = _other_residuals(opt.sync.state_dict())
        worker = bad["scheme"]["feedback"]["worker"]
        for name in ("tensor_index", "chunk", "residual"):
            worker[name] = [*worker[name], worker[name][0]]
        assert_refused_unchanged(opt.sync, bad, "twice")
        assert_refused_unchanged(opt, {"optimizer": opt.optimizer.state_dict(), "sync": bad})

    on_ranks(body)


def test_two_feedback_roles_load_all_or_nothing() -> None:
    """ring-requantize keeps two roles: the first loads fine, the second is broken; nothing of
    the first may stay loaded."""

    def body(transport: Transport) -> None:
        opt = trained_optimizer(transport, "ring")
        scheme = opt.sync.scheme
        assert len(scheme.feedback) == 2
        bad = _other_residuals(opt.sync.state_dict())["scheme"]
        last = bad["feedback"][sorted(bad["feedback"])[-1]]
        last["residual"][0] = last["residual"][0][:1]  # a wrong shape in the second role only
        assert_refused_unchanged(scheme, bad, "shape")

    on_ranks(body)


def test_hook_state_loads_all_or_nothing() -> None:
    def body(transport: Transport) -> None:
        trained = trained_optimizer(transport).sync.state_dict()
        scheme = make_scheme("allgather", gradzip.create("topk", ratio=0.3),
                              error_feedback=True, run_seed=RUN_SEED)  # fmt: skip
        hook = GradzipHookState(scheme, net(), transport=transport)
        # the hook keeps the scheme's buffers as GradientSync does (slots keyed by parameter
        # and piece): a GradientSync run's buffers, with the counters of a trained run
        good = {**hook.state_dict(), "step": 2, "scheme": trained["scheme"]}
        hook.load_state_dict(good)
        assert (hook.step, hook.skipped_steps) == (2, 0)
        for field, value in (("step", -1), ("skipped_steps", -1), ("world_size", 3)):
            bad = copy.deepcopy(good)
            for role in bad["scheme"]["feedback"].values():
                role["residual"] = [r * 2 + 1 for r in role["residual"]]
            bad[field] = value
            assert_refused_unchanged(hook, bad)
        # a residual of another shape than its parameter's piece
        flat = copy.deepcopy(good)
        for role in flat["scheme"]["feedback"].values():
            role["residual"] = [r.reshape(-1) for r in role["residual"]]
        assert_refused_unchanged(hook, flat, "shape")
        hook.close()

    on_ranks(body)


def test_error_feedback_refuses_malformed_states_unchanged() -> None:
    ef = ErrorFeedback(gradzip.create("topk", ratio=0.5))
    for index in range(2):
        ef.encode(torch.randn(6), StreamKey(tensor_index=index))
    good = ef.state_dict()
    twice = copy.deepcopy(good)
    twice["tensor_index"] = [0, 0]
    negative = copy.deepcopy(good)
    negative["tensor_index"] = [-1, 1]
    missing = {k: v for k, v in good.items() if k != "chunk"}
    non_finite = copy.deepcopy(good)
    non_finite["residual"][1][0] = float("nan")
    for bad, match in (
        (twice, "twice"),
        (negative, "ints >= 0"),
        (missing, "slot lists"),
        (non_finite, "NaN"),
        ([1, 2], "version"),
    ):
        assert_refused_unchanged(ef, bad, match)


def test_checkpoint_errors_are_gradzip_and_value_errors() -> None:
    assert issubclass(CheckpointError, GradzipError)
    assert issubclass(CheckpointError, ValueError)


# -- the algorithms' own checkpoints ----------------------------------------------------------
def test_qesgd_optimizer_loads_all_or_nothing() -> None:
    from gradzip.algorithms.qesgd import QESGDOptimizer
    from gradzip.algorithms.qesgd.schedule import DeltaSchedule

    model = net()
    opt = QESGDOptimizer(model.parameters(), 0.1, steps_per_epoch=2,
                         schedule=DeltaSchedule((1.0,), bits=8, c=3.0))  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        opt.zero_grad()
        x = torch.randn(8, 6, generator=gen)
        torch.nn.functional.mse_loss(model(x), x[:, :1]).backward()
        opt.step()
    good = opt.state_dict()
    # a schedule that does not fit used to be noticed only after torch had loaded its part
    wrong_schedule = copy.deepcopy(good)
    wrong_schedule["state"] = {}
    wrong_schedule["qesgd"]["schedule"]["norms"] = [1.0, 2.0, 3.0]
    assert_refused_unchanged(opt, wrong_schedule, "schedule")
    negative = copy.deepcopy(good)
    negative["qesgd"]["encoded_bits"] = -5
    assert_refused_unchanged(opt, negative, "ints >= 0")
    no_groups = {k: v for k, v in copy.deepcopy(good).items() if k != "param_groups"}
    assert_refused_unchanged(opt, no_groups, "param_groups")


def test_game_optimizers_refuse_negative_counters_unchanged() -> None:
    from gradzip.algorithms.dqgan import BilinearGame, OptimisticAdam, OptimisticMirrorDescent

    omd = OptimisticMirrorDescent(BilinearGame(6), 0.1)
    omd.step()
    bad = {**omd.state_dict(), "step": -1}
    assert_refused_unchanged(omd, bad, "int >= 0")
    game = BilinearGame(6)
    adam = OptimisticAdam(list(game.parameters()))
    bad = {**adam.state_dict(), "t": -2}
    assert_refused_unchanged(adam, bad, "int >= 0")


def test_dqgan_loads_all_or_nothing() -> None:
    from gradzip.algorithms.dqgan import DQGAN, BilinearGame

    def body(transport: Transport) -> None:
        def build() -> DQGAN:
            game = BilinearGame(d=8, workers=transport.world_size)
            return DQGAN(game, transport, gradzip.create("topk", ratio=0.3), lr=0.1,
                         optimizer="optimistic_adam")  # fmt: skip

        trained, fresh = build(), build()
        for _ in range(2):
            trained.step()
        bad = copy.deepcopy(trained.state_dict())
        bad["adam"]["t"] = -1  # the sync part is valid and differs from fresh's
        assert_refused_unchanged(fresh, bad, "int >= 0")
        fresh.load_state_dict(trained.state_dict())
        assert saved(fresh) == saved(trained)

    on_ranks(body)
