"""The finite-gradient agreement of the synchronisation front ends (gradzip.stepping): the scan
refuses exactly the tensors holding NaN or Inf, and on the allgather scheme the encoder's own
scan raises the flag, so every rank stops together at no message of its own."""

from __future__ import annotations

import pytest
import torch

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.errors import NonFiniteInputError
from gradzip.finite import all_finite
from gradzip.schemes import make_scheme
from gradzip.stepping import reduce_all_finite

BIG = 3.0e38  # finite float32 whose sums overflow
#: seconds a simulated rank waits for a peer's message: a rank that stops alone (no agreement)
#: leaves the others waiting, and this turns that hang into a prompt failure naming the peer
HANG = 10.0


@pytest.mark.parametrize(
    ("values", "dtype", "finite"),
    [
        ([BIG, BIG, -1.0], torch.float32, True),  # the sum overflows, the elements are finite
        ([60000.0, 60000.0], torch.float16, True),
        ([1.0, float("nan"), 2.0], torch.float32, False),
        ([1.0, float("inf")], torch.float32, False),
        ([float("-inf"), 1.0], torch.bfloat16, False),
        ([float("inf"), float("-inf")], torch.float32, False),  # the sum is NaN
        ([1e300, -1e300], torch.float64, True),
        ([], torch.float32, True),
    ],
)
def test_all_finite_refuses_exactly_nan_and_inf(
    values: list[float], dtype: torch.dtype, finite: bool
) -> None:
    assert all_finite([torch.tensor(values, dtype=dtype)]) is finite
    assert all_finite([torch.ones(4), torch.tensor(values, dtype=dtype)]) is finite


def _one_step(transport: Transport, bad: float, mode: str, variant: str) -> object:
    """A finite step, then one where rank 1's first tensor holds ``bad``."""
    scheme = make_scheme(variant, gradzip.create("dqsg"), run_seed=3, error_feedback=True)
    gen = torch.Generator().manual_seed(transport.rank)
    grads = [torch.randn(6, generator=gen, dtype=torch.float64) for _ in range(2)]
    assert reduce_all_finite(transport, scheme, grads, [0, 1], 0, mode, "") is not None
    if transport.rank == 1:
        grads[0][2] = bad
    try:
        result: object = reduce_all_finite(transport, scheme, grads, [0, 1], 1, mode, "")
    except NonFiniteInputError as err:
        result = str(err)
    traffic = {name: t.messages for (step, name), t in transport.meter.entries().items() if step}
    return result, traffic


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e300])
def test_the_allgather_encoder_raises_the_flag_for_every_rank(bad: float) -> None:
    # 1e300 is finite as float64 but beyond float32: the encoder refuses it, so every rank
    # must stop with rank 1 instead of rank 1 failing alone
    skipped = run_local(3, lambda t: _one_step(t, bad, "skip", "allgather"), timeout=HANG)
    for result, traffic in skipped:  # type: ignore[misc]
        assert result is None
        assert traffic == {"all_gather": 2}  # the first tensor's all-gather only, no flag round
    raised = run_local(3, lambda t: _one_step(t, bad, "raise", "allgather"), timeout=HANG)
    for result, traffic in raised:  # type: ignore[misc]
        assert "rank(s) [1]" in result and traffic == {"all_gather": 2}


def test_other_schemes_agree_on_a_flag_round_first() -> None:
    # a rank that skips while the others wait for its message is the failure to catch: the
    # short timeout makes it fail in seconds instead of hanging for run_local's default
    for result, traffic in run_local(  # type: ignore[misc]
        3, lambda t: _one_step(t, float("nan"), "skip", "ring"), timeout=HANG
    ):
        assert result is None and traffic == {"finite_check": 2}
