"""The QESGD paper's RNN: a character-level LSTM with two layers of 128 units (char-rnn).

One-hot characters in, two stacked LSTM layers of ``hidden`` units with dropout between them and
before the output layer (char-rnn puts dropout on the input of every layer above the first and on
the top hidden state), a linear decoder to logits over the alphabet. :meth:`CharLSTM.forward`
takes and returns the hidden state, so training can carry it across consecutive windows of the
same streams (truncated back-propagation, as char-rnn does).

Initialisation [RECON from karpathy/char-rnn ``train.lua``]: every parameter uniform in
``+-0.08``, then the forget-gate biases set to 1 "to encourage remembering in the beginning";
PyTorch's LSTM has two bias vectors per layer, so the forget-gate slice of each is set to 0.5
(summing to 1). Every draw comes from one ``torch.Generator``.

References: the QESGD paper, section 5 ("LSTM that contains two hidden layers, each layer
contains 128 units", dropout 0.25, gradient clipping); Karpathy, char-rnn (2015).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)
from torch import nn

State = tuple[torch.Tensor, torch.Tensor]


class CharLSTM(nn.Module):
    """``layers`` x ``hidden`` LSTM over one-hot characters of an alphabet of ``vocab``."""

    def __init__(
        self, vocab: int, hidden: int = 128, layers: int = 2, dropout: float = 0.25
    ) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        self.vocab, self.hidden, self.layers = vocab, hidden, layers
        self.lstm = nn.LSTM(vocab, hidden, layers, batch_first=True, dropout=dropout)
        self.drop = nn.Dropout(dropout)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        """Logits ``(batch, seq, vocab)`` for codes ``x`` ``(batch, seq)``, and the new state."""
        onehot = F.one_hot(x, self.vocab).to(torch.float32)
        out, (h, c) = self.lstm(onehot, state)
        logits: torch.Tensor = self.decoder(self.drop(out))
        return logits, (h, c)

    def reset_parameters(self, generator: torch.Generator) -> None:
        """char-rnn's initialisation, every draw from ``generator``."""
        with torch.no_grad():
            for p in self.parameters():
                p.uniform_(-0.08, 0.08, generator=generator)
            for name, p in self.lstm.named_parameters():
                if name.startswith("bias"):
                    p[self.hidden : 2 * self.hidden].fill_(0.5)  # gates i, f, g, o: f


def char_lstm(vocab: int, seed: int = 0, hidden: int = 128, dropout: float = 0.25) -> CharLSTM:
    """A freshly initialised :class:`CharLSTM` (draws from ``torch.Generator().manual_seed(seed)``)."""
    model = CharLSTM(vocab, hidden, 2, dropout)
    model.reset_parameters(torch.Generator().manual_seed(seed))
    return model
