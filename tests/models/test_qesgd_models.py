"""The QESGD experiments' models and corpus: CIFAR ResNets (sizes, option-A shortcuts, seeded
init), the character LSTM (state carried across windows), the pydoc corpus and its batches, and
the whole-vector QSGD baseline (qsgd_l2: step, unbiasedness, clipping, variance)."""

from __future__ import annotations

import math

import pytest
import torch

from gradzip.compressors.qsgd_l2 import QSGDL2
from gradzip.data.corpus import CharBatches, encode_text, pydoc_corpus
from gradzip.keys import StreamKey
from gradzip.models.charlstm import char_lstm
from gradzip.models.resnet import resnet
from gradzip.payload import parse_payload


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_resnet_sizes_shapes_and_seeded_init() -> None:
    # He et al.'s option-A ResNets: 0.27M and 0.85M (the QESGD paper's Table 2: 0.85M)
    assert count(resnet(20)) == 269_722 and count(resnet(56)) == 853_018
    assert count(resnet(20, in_channels=1)) == 269_722 - 16 * 2 * 9
    assert count(resnet(8, in_channels=1)) == 75_002
    x = torch.randn(3, 1, 28, 28)
    assert resnet(8, 1)(x).shape == (3, 10)
    assert resnet(20)(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    a, b, c = resnet(8, 1, seed=4), resnet(8, 1, seed=4), resnet(8, 1, seed=5)
    pa = torch.nn.utils.parameters_to_vector(a.parameters())
    assert torch.equal(pa, torch.nn.utils.parameters_to_vector(b.parameters()))
    assert not torch.equal(pa, torch.nn.utils.parameters_to_vector(c.parameters()))
    conv = a.conv.weight.detach()
    assert abs(float(conv.std()) - math.sqrt(2 / 9)) < 0.1  # He's fill for a 3x3x1 kernel
    with pytest.raises(ValueError, match="6n"):
        resnet(21)


def test_corpus_and_char_rnn_batches() -> None:
    corpus = pydoc_corpus()
    assert corpus.size > 300_000 and 60 < len(corpus.vocab) < 200
    assert corpus.val.numel() == pytest.approx(0.05 * corpus.size, rel=0.01)
    assert corpus.sha256 == pydoc_corpus().sha256  # deterministic
    small = encode_text("abcdefghij" * 30, 0.1)
    batches = CharBatches(small.train, batch=3, seq=4)
    x0, y0 = batches[0]
    x1, _ = batches[1]
    assert x0.shape == (3, 4)
    assert torch.equal(y0[:, :-1], x0[:, 1:])  # targets are the next characters
    assert torch.equal(y0[:, -1], x1[:, 0])  # and each stream continues in the next window
    text = "".join(small.vocab[i] for i in small.train.tolist())
    assert text.startswith("abcdefghij")
    with pytest.raises(IndexError):
        batches[len(batches)]
    with pytest.raises(ValueError):
        CharBatches(small.train[:5], batch=3, seq=4)


def test_char_lstm_carries_its_state_across_windows() -> None:
    model = char_lstm(vocab=11, seed=0, hidden=16).eval()
    x = torch.randint(0, 11, (2, 10), generator=torch.Generator().manual_seed(0))
    whole, _ = model(x)
    first, state = model(x[:, :6])
    second, _ = model(x[:, 6:], state)
    assert torch.allclose(torch.cat([first, second], 1), whole, atol=1e-6)
    assert whole.shape == (2, 10, 11)
    bias = model.lstm.bias_ih_l0.detach()
    assert bool((bias[16:32] == 0.5).all()) and float(bias[:16].abs().max()) <= 0.08
    assert count(char_lstm(103)) == 264_679  # 2 x 128 units over 103 symbols


KEY = StreamKey(run_seed=2, rank=0, step=0, tensor_index=0)


def test_qsgd_l2_step_wire_and_top_clipping() -> None:
    g = torch.tensor([3.0, -4.0, 0.0, 0.0])  # |g| = 5
    comp = QSGDL2(bits=4)
    step = float(comp.steps(g)[0])
    assert step == 5.0 / 8  # delta = |g|_2 / 2^(b-1)
    enc = comp.encode(g, KEY)
    _, body = parse_payload(enc.payload)
    assert len(body) == 4 + 2  # the float32 step, then 4 x 4-bit codes
    assert enc.paper_bits == 4 * 4 + 32
    # a 1-sparse vector sits at +|g| = 2^(b-1) delta, one step above the top code: clipped
    out = comp.round_trip(torch.tensor([0.0, 2.0, 0.0]), KEY)[1]
    assert out.tolist() == [0.0, 2.0 * 7 / 8, 0.0]


def test_qsgd_l2_is_unbiased_with_the_exact_variance() -> None:
    comp, trials = QSGDL2(bits=3), 400
    g = torch.randn(300, generator=torch.Generator().manual_seed(4))
    outs = torch.stack([comp.round_trip(g, KEY.with_step(t))[1].double() for t in range(trials)])
    err = outs - g.double()
    var = comp.variance_bound(g)
    delta = float(comp.steps(g)[0])
    assert var <= 300 * delta**2 / 4
    se_mean = math.sqrt(var / 300 / trials)  # the mean error over coordinates and trials
    assert abs(float(err.mean())) < 5 * se_mean
    total = (err**2).sum(1)
    assert abs(float(total.mean()) - var) < 5 * float(total.std()) / math.sqrt(trials)
    bucketed = QSGDL2(bits=3, bucket_size=64)
    assert bucketed.variance_bound(g) < var  # smaller buckets: smaller steps
