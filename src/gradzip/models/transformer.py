"""A small character-level transformer language model (decoder only, causal self-attention).

Characters are embedded (``d_model``) and a learned position embedding added; ``layers`` pre-norm
blocks follow, each ``x + attention(norm(x))`` then ``x + mlp(norm(x))``, the attention with
``heads`` heads and a causal mask (position ``t`` attends to positions ``<= t`` only), the MLP
``d_model -> 4 d_model -> d_model`` with GELU; a final layer norm and a linear decoder to logits
over the alphabet. Defaults: 2 layers, ``d_model`` 128, 4 heads, context 64: 431,463 parameters
for the 103 characters of Python 3.11's reference text, small enough to train on two CPU cores.

[CHOICE] Pre-norm (GPT-2's layout, Radford et al. 2019) rather than the post-norm of Vaswani et
al. (2017): it trains with SGD at a fixed learning rate without warm-up, which
``gradzip bench cluster`` uses. No dropout: the runs are short and the comparison between
communication variants should not depend on dropout's draws.

Initialisation [CHOICE, GPT-2's]: linear and embedding weights normal with sd 0.02, the
residual projections' (attention output, MLP output) scaled by ``1/sqrt(2 layers)``, biases 0,
layer norms 1 and 0; every draw from one ``torch.Generator`` (the global RNG is never touched).

References: Vaswani et al., "Attention Is All You Need" (NeurIPS 2017); Radford et al.,
"Language Models are Unsupervised Multitask Learners" (2019), section 2.3.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)
from torch import nn


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which position ``t`` sees positions ``0..t`` only."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not a multiple of heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        shape = (batch, seq, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        result: torch.Tensor = self.out(mixed.transpose(1, 2).reshape(batch, seq, width))
        return result


class Block(nn.Module):
    """One pre-norm transformer block: attention then MLP, each around a residual."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        result: torch.Tensor = x + self.proj(F.gelu(self.fc(self.norm2(x))))
        return result


class CharTransformer(nn.Module):
    """A decoder-only transformer over an alphabet of ``vocab`` characters, ``context`` long."""

    def __init__(
        self, vocab: int, d_model: int = 128, layers: int = 2, heads: int = 4, context: int = 64
    ) -> None:
        super().__init__()
        if vocab < 2 or layers < 1 or context < 1:
            raise ValueError(
                f"need vocab >= 2, layers >= 1, context >= 1; got {vocab}, {layers}, {context}"
            )
        self.vocab, self.context = vocab, context
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Embedding(context, d_model)
        self.blocks = nn.Sequential(*(Block(d_model, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(d_model)
        self.decoder = nn.Linear(d_model, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, seq, vocab)`` for codes ``x`` ``(batch, seq)``, ``seq <= context``."""
        seq = x.shape[1]
        if seq > self.context:
            raise ValueError(f"sequence of {seq} characters exceeds the context of {self.context}")
        positions = torch.arange(seq, device=x.device)
        hidden = self.blocks(self.embed(x) + self.position(positions))
        logits: torch.Tensor = self.decoder(self.norm(hidden))
        return logits

    def reset_parameters(self, generator: torch.Generator) -> None:
        """GPT-2's initialisation (module docstring), every draw from ``generator``."""
        residual_sd = 0.02 / math.sqrt(2 * len(self.blocks))
        with torch.no_grad():
            for name, module in self.named_modules():
                if isinstance(module, nn.Linear | nn.Embedding):
                    sd = residual_sd if name.endswith(("attn.out", "proj")) else 0.02
                    module.weight.normal_(0.0, sd, generator=generator)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.zero_()
                if isinstance(module, nn.LayerNorm):
                    module.weight.fill_(1.0)
                    module.bias.zero_()


def char_transformer(
    vocab: int,
    seed: int = 0,
    d_model: int = 128,
    layers: int = 2,
    heads: int = 4,
    context: int = 64,
) -> CharTransformer:
    """A freshly initialised :class:`CharTransformer` (draws from
    ``torch.Generator().manual_seed(seed)``)."""
    model = CharTransformer(vocab, d_model, layers, heads, context)
    model.reset_parameters(torch.Generator().manual_seed(seed))
    return model
