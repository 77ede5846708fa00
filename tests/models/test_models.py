"""The experiment models: the authors' exact shapes and layout, initialisation, LRN, vmap."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch.func import functional_call, grad, vmap

from gradzip.models.layers import (
    TRUNCATED_STD_FACTOR,
    ConvSame,
    Dense,
    lrn,
    max_pool_same,
)
from gradzip.models.paper import MODELS, build_model, model_info
from gradzip.models.shapes import MODEL_SHAPES, parameter_count

PAPER_MODELS = ["fc-300-100", "lenet", "cifarnet"]
COUNTS = {"fc-300-100": 266_610, "lenet": 1_663_370, "cifarnet": 1_068_298}

#: (weight sd, bias) per layer [CODE]
INIT = {
    "fc-300-100": [(0.1, 0.1)] * 3,
    "lenet": [(0.1, 0.1)] * 4,
    "cifarnet": [(0.05, 0.0), (0.05, 0.1), (0.04, 0.1), (0.04, 0.1), (1 / 192, 0.0)],
}


@pytest.fixture(scope="module")
def dryden() -> torch.nn.Module:
    return build_model("dryden-mlp", 0)


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_shapes_are_the_authors_tensorflow_layout(name: str) -> None:
    model = build_model(name, 0)
    shapes = [tuple(p.shape) for p in model.parameters()]
    paper_name = model_info(name).paper_name
    assert paper_name is not None
    assert shapes == list(MODEL_SHAPES[paper_name])
    assert sum(p.numel() for p in model.parameters()) == COUNTS[name]
    assert parameter_count(MODEL_SHAPES[paper_name]) == COUNTS[name]


def test_dryden_mlp_is_784_4096x3_10_in_pytorch_layout(dryden: torch.nn.Module) -> None:
    shapes = [tuple(p.shape) for p in dryden.parameters()]
    params = [p.detach() for p in dryden.parameters()]
    hidden = [(4096, 4096), (4096,)]
    assert shapes == [(4096, 784), (4096,), *hidden, *hidden, (10, 4096), (10,)]
    assert sum(p.numel() for p in dryden.parameters()) == 36_818_954
    # He sd = sqrt(2/fan_in), truncated at 2 sd, biases 0 [CHOICE]
    for p, fan_in in zip(params[::2], (784, 4096, 4096, 4096), strict=True):
        sd = math.sqrt(2 / fan_in)
        assert float(p.abs().max()) <= 2 * sd * (1 + 1e-6)
        assert float(p.std()) == pytest.approx(TRUNCATED_STD_FACTOR * sd, rel=0.02)
    assert all(float(b.abs().max()) == 0.0 for b in params[1::2])
    assert dryden(torch.rand(2, 1, 28, 28)).shape == (2, 10)


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_forward_gives_logits_per_example(name: str) -> None:
    info = MODELS[name]
    model = build_model(name, 1)
    out = model(torch.rand(5, *info.input_shape))
    assert out.shape == (5, info.num_classes)
    assert torch.isfinite(out).all()


def test_fc_accepts_flat_input() -> None:
    model = build_model("fc-300-100", 0)
    x = torch.rand(4, 1, 28, 28)
    torch.testing.assert_close(model(x), model(x.reshape(4, 784)))


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_initialisation_statistics(name: str) -> None:
    params = [p.detach() for p in build_model(name, 3).parameters()]
    for (sd, bias), w, b in zip(INIT[name], params[::2], params[1::2], strict=True):
        n = w.numel()
        assert float(w.abs().max()) <= 2 * sd * (1 + 1e-6)  # truncated at +-2 sd
        assert float(w.abs().max()) > 1.5 * sd  # ... and not narrower
        # std of a +-2 sd truncated normal is 0.880 sd; 5 standard errors of a sample std
        assert float(w.std()) == pytest.approx(TRUNCATED_STD_FACTOR * sd, rel=5 / math.sqrt(n))
        assert abs(float(w.mean())) < 5 * sd / math.sqrt(n)
        assert torch.equal(b, torch.full_like(b, bias))


def test_truncated_std_factor() -> None:
    # closed form checked against a large sample of torch's truncated normal
    sample = torch.empty(1_000_000)
    torch.nn.init.trunc_normal_(sample, 0, 1, -2, 2, generator=torch.Generator().manual_seed(0))
    assert float(sample.std()) == pytest.approx(TRUNCATED_STD_FACTOR, abs=0.002)
    assert abs(TRUNCATED_STD_FACTOR - 0.8796) < 1e-4


def test_seeded_and_never_touches_the_global_rng() -> None:
    state = torch.get_rng_state()
    a, b, c = (build_model("lenet", s) for s in (7, 7, 8))
    assert torch.equal(torch.get_rng_state(), state)
    pa, pb, pc = (list(m.parameters()) for m in (a, b, c))
    assert all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True))
    assert not torch.equal(pa[0], pc[0])


def test_unknown_model_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'vgg'.*fc-300-100, lenet, cifarnet"):
        build_model("vgg", 0)


def test_dropout_rate_is_checked() -> None:
    with pytest.raises(ValueError, match="dropout"):
        build_model("lenet", 0, dropout=1.0)
    with pytest.raises(ValueError, match="no dropout"):
        MODELS["dryden-mlp"].factory(0.5)


def tf_lrn(x: torch.Tensor, r: int, bias: float, alpha: float, beta: float) -> torch.Tensor:
    """tf.nn.lrn written out: sum of squares over channels c-r..c+r, times alpha (NCHW)."""
    out = torch.empty_like(x)
    channels = x.shape[1]
    for c in range(channels):
        lo, hi = max(0, c - r), min(channels, c + r + 1)
        sqr_sum = (x[:, lo:hi] ** 2).sum(dim=1)
        out[:, c] = x[:, c] / (bias + alpha * sqr_sum) ** beta
    return out


@pytest.mark.parametrize("alpha", [0.001 / 9, 0.3])
def test_lrn_matches_tensorflow_semantics(alpha: float) -> None:
    x = 3 * torch.randn(
        2, 64, 5, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    torch.testing.assert_close(lrn(x, 4, 1.0, alpha, 0.75), tf_lrn(x, 4, 1.0, alpha, 0.75))
    # the naive use of PyTorch's LRN (size=radius, alpha as is) is different
    naive = F.local_response_norm(x, 4, alpha=alpha, beta=0.75, k=1.0)
    assert not torch.allclose(naive, tf_lrn(x, 4, 1.0, alpha, 0.75))


def test_max_pool_same_pads_at_the_end_only() -> None:
    x = torch.randn(2, 3, 24, 24, generator=torch.Generator().manual_seed(1))
    y = max_pool_same(x, 3, 2)
    assert y.shape == (2, 3, 12, 12)
    assert max_pool_same(y, 3, 2).shape == (2, 3, 6, 6)
    # TF SAME: windows start at 0, 2, ..., 22; the last one covers rows 22-23 only
    assert torch.equal(y[..., 0, 0], x[..., 0:3, 0:3].amax(dim=(-2, -1)))
    assert torch.equal(y[..., 11, 11], x[..., 22:24, 22:24].amax(dim=(-2, -1)))
    # negative inputs: the padding never wins
    assert torch.equal(max_pool_same(-x.abs() - 1, 3, 2).amax() < 0, torch.tensor(True))
    assert max_pool_same(torch.randn(1, 1, 28, 28), 2, 2).shape == (1, 1, 14, 14)


def test_conv_kernel_is_kh_kw_cin_cout() -> None:
    gen = torch.Generator().manual_seed(2)
    conv = ConvSame(5, 5, 3, 4)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(5, 5, 3, 4, generator=gen))
        conv.bias.copy_(torch.randn(4, generator=gen))
    x = torch.randn(2, 3, 7, 7, generator=gen)
    out = conv(x)
    assert out.shape == (2, 4, 7, 7)  # SAME
    xp = F.pad(x, (2, 2, 2, 2))
    i, j = 1, 6  # output position; window rows i..i+4 of the padded input
    window = xp[:, :, i : i + 5, j : j + 5]  # [n, cin, kh, kw]
    direct = torch.einsum("nchw,hwco->no", window, conv.weight) + conv.bias
    torch.testing.assert_close(out[:, :, i, j], direct)


def test_dense_weight_is_in_out() -> None:
    layer = Dense(5, 3)
    assert tuple(layer.weight.shape) == (5, 3)
    nn_init = torch.Generator().manual_seed(4)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(5, 3, generator=nn_init))
        layer.bias.copy_(torch.randn(3, generator=nn_init))
    x = torch.randn(2, 5, generator=nn_init)
    torch.testing.assert_close(layer(x), x @ layer.weight + layer.bias)


def test_dropout_only_in_training_mode() -> None:
    x = torch.rand(8, 3, 24, 24, generator=torch.Generator().manual_seed(5))
    plain = build_model("cifarnet", 9)
    dropped = build_model("cifarnet", 9, dropout=0.5)
    torch.manual_seed(0)
    assert not torch.allclose(dropped(x), plain(x))  # training mode: masks applied
    dropped.eval()
    torch.testing.assert_close(dropped(x), plain(x))


Loss = Callable[[dict[str, torch.Tensor], torch.Tensor, torch.Tensor], torch.Tensor]


def _loss(model: torch.nn.Module) -> Loss:
    def loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, params, (x,)), y)

    return loss


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_vmap_grad_over_stacked_workers_with_dropout(name: str) -> None:
    workers = 3
    info = MODELS[name]
    model = build_model(name, 0, dropout=0.5)
    params = {k: v.detach() for k, v in model.named_parameters()}
    stacked = {
        k: torch.stack([v * (1 + 0.05 * w) for w in range(workers)]) for k, v in params.items()
    }
    gen = torch.Generator().manual_seed(6)
    xs = torch.rand(workers, 4, *info.input_shape, generator=gen)
    ys = torch.randint(0, 10, (workers, 4), generator=gen)
    # training mode, dropout on: needs randomness="different" (or "same")
    torch.manual_seed(0)
    grads = vmap(grad(_loss(model)), randomness="different")(stacked, xs, ys)
    for k, v in params.items():
        assert grads[k].shape == (workers, *v.shape)
        assert torch.isfinite(grads[k]).all()
    # the same parameters and data on every worker still give different masks, hence gradients
    same = {k: torch.stack([v] * workers) for k, v in params.items()}
    xs1, ys1 = xs[:1].expand_as(xs), ys[:1].expand_as(ys)
    g_same = vmap(grad(_loss(model)), randomness="different")(same, xs1, ys1)
    last = next(reversed(g_same))
    assert not torch.allclose(g_same[last][0], g_same[last][1])
    # eval mode: no randomness; vmap equals one autograd pass per worker
    model.eval()
    g_eval = vmap(grad(_loss(model)))(stacked, xs, ys)
    for w in range(workers):
        mine = {k: v[w].clone().requires_grad_(True) for k, v in stacked.items()}
        ref = torch.autograd.grad(_loss(model)(mine, xs[w], ys[w]), list(mine.values()))
        for k, r in zip(mine, ref, strict=True):
            torch.testing.assert_close(g_eval[k][w], r, rtol=1e-4, atol=1e-5)
