"""The character transformer: shapes, the causal mask, seeded initialisation, and that SGD
learns a tiny corpus."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)

from gradzip.models import char_transformer


def test_logits_shape_and_parameter_count() -> None:
    model = char_transformer(vocab=100, seed=0)
    x = torch.randint(0, 100, (3, 17), generator=torch.Generator().manual_seed(1))
    assert model(x).shape == (3, 17, 100)
    # 2 blocks of 12 d^2 + 13 d, embeddings (100 + 64) d, final norm 2 d, decoder 100 d + 100
    d = 128
    expected = 2 * (12 * d * d + 13 * d) + (100 + 64) * d + 2 * d + 100 * d + 100
    assert sum(p.numel() for p in model.parameters()) == expected


def test_a_later_token_never_changes_an_earlier_positions_output() -> None:
    model = char_transformer(vocab=50, seed=3, d_model=32, heads=4, context=16)
    gen = torch.Generator().manual_seed(2)
    x = torch.randint(0, 50, (2, 16), generator=gen)
    changed = x.clone()
    changed[:, 9:] = torch.randint(0, 50, (2, 7), generator=gen)
    assert not torch.equal(x, changed)
    before, after = model(x), model(changed)
    torch.testing.assert_close(before[:, :9], after[:, :9], rtol=0, atol=1e-6)
    assert (before[:, 9:] - after[:, 9:]).abs().max() > 1e-3  # the mask is not hiding everything


def test_the_seed_fixes_the_weights() -> None:
    a, b, c = char_transformer(20, seed=5), char_transformer(20, seed=5), char_transformer(20, 6)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert not torch.equal(a.embed.weight, c.embed.weight)


def test_bad_shapes_raise() -> None:
    with pytest.raises(ValueError, match="multiple of heads"):
        char_transformer(10, d_model=30, heads=4)
    with pytest.raises(ValueError, match="exceeds the context"):
        char_transformer(10, context=8)(torch.zeros(1, 9, dtype=torch.int64))


def test_a_few_sgd_steps_learn_a_tiny_corpus() -> None:
    text = "the cat sat on the mat. " * 20
    vocab = sorted(set(text))
    codes = torch.tensor([vocab.index(ch) for ch in text])
    x, y = codes[:-1].unfold(0, 16, 16), codes[1:].unfold(0, 16, 16)
    model = char_transformer(len(vocab), seed=0, d_model=32, heads=2, context=16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def loss() -> torch.Tensor:
        return F.cross_entropy(model(x).reshape(-1, len(vocab)), y.reshape(-1))

    first = float(loss().detach())
    for _ in range(30):
        opt.zero_grad()
        value = loss()
        torch.autograd.backward(value)
        opt.step()
    # from about ln(10) = 2.3 nats (uniform over the alphabet) to well under it
    assert first == pytest.approx(2.3, abs=0.2)
    assert float(loss().detach()) < 0.5 * first
