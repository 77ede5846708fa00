"""One vectorized pass gives every simulated worker's gradient, as P separate backwards would."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.nn.functional import cross_entropy

from gradzip.simulation.workers import WorkerGradients, per_worker_gradients

# batched and separate matrix products may sum in different orders: equal up to rounding only
TOL = {torch.float32: (1e-5, 1e-6), torch.float64: (1e-12, 1e-14)}


def close(actual: Tensor, expected: Tensor, dtype: torch.dtype = torch.float32) -> None:
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


class InOutLinear(nn.Module):
    """A dense layer with its weight stored [in, out] and used as x @ W + b."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) / n_in**0.5)
        self.bias = nn.Parameter(0.1 * torch.randn(n_out))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight + self.bias


def mlp(dropout: float = 0.0, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(),
        InOutLinear(12, 16),
        nn.ReLU(),
        nn.Dropout(dropout),
        InOutLinear(16, 8),
        nn.Tanh(),
        nn.Linear(8, 5),
    ).to(dtype)


def convnet() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(6 * 2 * 2, 5),
    )


def bn_net() -> nn.Module:
    torch.manual_seed(2)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 5)
    )


def data(
    workers: int, batch: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(workers, batch, *shape, generator=gen, dtype=dtype)
    y = torch.randint(0, 5, (workers, batch), generator=gen)
    return x, y


def backward_each(model: nn.Module, x: Tensor, y: Tensor) -> tuple[list[list[Tensor]], Tensor]:
    """Each worker's gradients from its own ``loss.backward()``, and its losses."""
    grads, losses = [], []
    for w in range(x.shape[0]):
        model.zero_grad()
        loss = cross_entropy(model(x[w]), y[w])
        loss.backward()  # type: ignore[no-untyped-call]
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        losses.append(loss.detach())
    model.zero_grad()
    return grads, torch.stack(losses)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("train", [False, True])
def test_equals_one_backward_per_worker(dtype: torch.dtype, train: bool) -> None:
    model = mlp(dtype=dtype).train(train)
    x, y = data(6, 10, (3, 4), dtype)
    step = WorkerGradients(model)(x, y)
    expected, losses = backward_each(model, x, y)
    params = list(model.parameters())
    assert len(step.grads) == len(params)
    for i, (g, p) in enumerate(zip(step.grads, params, strict=True)):
        assert g.shape == (6, *p.shape) and g.dtype == dtype
        for w in range(6):
            close(g[w], expected[w][i], dtype)
    close(step.loss, losses, dtype)
    assert step.workers == 6
    assert all(a.equal(b) for a, b in zip(step.worker(2), [g[2] for g in step.grads], strict=True))


def test_losses_and_correct_counts() -> None:
    model = mlp().eval()
    x, y = data(4, 32, (12,))
    y[1] = model(x[1]).argmax(-1)  # worker 1 gets every sample right
    step = WorkerGradients(model)(x, y)
    for w in range(4):
        logits = model(x[w])
        assert step.correct[w].item() == (logits.argmax(-1) == y[w]).sum().item()
        torch.testing.assert_close(step.loss[w], cross_entropy(logits, y[w]).detach())
    assert step.correct[1].item() == 32
    assert step.correct.dtype == torch.int64


def test_dropout_differs_per_worker() -> None:
    model = mlp(dropout=0.5).train()
    x, y = data(1, 16, (12,))
    x, y = x.expand(5, -1, -1), y.expand(5, -1)  # every worker sees the same shard
    different = WorkerGradients(model)(x, y)
    first = different.grads[0]
    assert all(not torch.equal(first[0], first[w]) for w in range(1, 5))
    same = WorkerGradients(model, randomness="same")(x, y)
    assert all(torch.equal(same.grads[0][0], same.grads[0][w]) for w in range(1, 5))
    model.eval()  # no dropout: the workers agree whatever the randomness setting
    evaluated = WorkerGradients(model)(x, y)
    assert all(torch.equal(evaluated.loss[0], evaluated.loss[w]) for w in range(1, 5))


def test_conv_model() -> None:
    model = convnet()
    x, y = data(3, 8, (1, 8, 8))
    step = WorkerGradients(model)(x, y)
    expected, losses = backward_each(model, x, y)
    for i, g in enumerate(step.grads):
        for w in range(3):
            close(g[w], expected[w][i])
    close(step.loss, losses)


@pytest.mark.parametrize("train", [True, False])
def test_buffers_per_worker(train: bool) -> None:
    model = bn_net().train(train)
    reference = bn_net().train(train)
    x, y = data(4, 10, (12,))
    x = x + torch.arange(4.0).view(4, 1, 1)  # the workers' shards have different means
    step = WorkerGradients(model)(x, y)
    expected = per_worker_gradients(reference, x, y)
    for g, e in zip(step.grads, expected.grads, strict=True):
        close(g, e)
    close(step.loss, expected.loss)
    assert step.correct.equal(expected.correct)
    assert step.buffers.keys() == expected.buffers.keys()
    for name, b in step.buffers.items():
        close(b, expected.buffers[name])
    mean = step.buffers["2.running_mean"]
    assert not torch.equal(mean[0], mean[1]) if train else torch.equal(mean[0], mean[1])
    for name, b in model.named_buffers():  # the model keeps worker 0's buffers, as DDP does
        assert torch.equal(b, step.buffers[name][0])
        assert torch.equal(b, dict(reference.named_buffers())[name])


def test_frozen_parameters_and_grad_fields_untouched() -> None:
    model = mlp()
    frozen = model.get_submodule("1").get_parameter("weight")
    frozen.requires_grad_(False)
    x, y = data(2, 4, (12,))
    step = WorkerGradients(model)(x, y)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert [g.shape[1:] for g in step.grads] == [p.shape for p in trainable]
    assert all(p.grad is None for p in model.parameters())
    expected = per_worker_gradients(model, x, y)
    for g, e in zip(step.grads, expected.grads, strict=True):
        close(g, e)
    assert all(p.grad is None for p in model.parameters())


def test_rejects_unsharded_input() -> None:
    model = mlp()
    with pytest.raises(ValueError, match="workers, batch"):
        WorkerGradients(model)(torch.randn(8, 12), torch.zeros(8, dtype=torch.int64))


def test_same_result_under_no_grad() -> None:
    model = mlp()
    x, y = data(3, 4, (12,))
    step = WorkerGradients(model)(x, y)
    with torch.no_grad():
        again = WorkerGradients(model)(x, y)
    assert all(a.equal(b) for a, b in zip(step.grads, again.grads, strict=True))
    assert not any(g.requires_grad for g in step.grads) and not step.loss.requires_grad
