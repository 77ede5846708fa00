"""A character corpus that ships with Python, and char-rnn style mini-batches over it.

The QESGD paper trains a character LSTM on TinyShakespeare (karpathy/char-rnn), which cannot be
downloaded here. :func:`pydoc_corpus` uses instead the English text of the Python reference
documentation bundled with every CPython installation (``pydoc_data.topics.topics``: the help
topics of ``help("if")`` and friends, about 465 kB and about 100 distinct characters in Python
3.11, against TinyShakespeare's 1.1 MB and 65). The topics are joined in sorted key order with a
newline between them; the text (and so the numbers) depends on the Python version, which is why
:class:`Corpus` carries its SHA-256.

Splits [CHOICE, char-rnn splits by batches]: the first 95% of the characters train, the last 5%
validate (char-rnn's ``val_frac = 0.05``).

:class:`CharBatches` follows char-rnn's loader [RECON from karpathy/char-rnn
``CharSplitLMMinibatchLoader``]: the split is cut to a whole number of ``batch * seq`` characters
and laid out as ``batch`` parallel streams; batch ``i`` holds characters ``i*seq .. (i+1)*seq - 1``
of every stream and its targets are the same positions shifted by one, so a model that carries
its hidden state from one batch to the next reads each stream in order.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, eq=False)
class Corpus:
    """A character corpus: its alphabet, the train and validation splits as int64 codes."""

    vocab: str
    train: torch.Tensor = field(repr=False)
    val: torch.Tensor = field(repr=False)
    source: str
    sha256: str

    @property
    def size(self) -> int:
        """Characters in both splits."""
        return int(self.train.numel() + self.val.numel())


def encode_text(text: str, val_fraction: float = 0.05, source: str = "text") -> Corpus:
    """``text`` as a :class:`Corpus` (alphabet sorted by code point)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}")
    vocab = "".join(sorted(set(text)))
    if len(text) < 100 or len(vocab) < 2:
        raise ValueError("the corpus needs at least 100 characters and 2 distinct ones")
    index = {ch: i for i, ch in enumerate(vocab)}
    codes = torch.tensor([index[ch] for ch in text], dtype=torch.int64)
    cut = round(len(text) * (1 - val_fraction))
    digest = hashlib.sha256(text.encode()).hexdigest()
    return Corpus(vocab, codes[:cut], codes[cut:], source, digest)


def pydoc_corpus(val_fraction: float = 0.05) -> Corpus:
    """The English text of ``pydoc_data.topics.topics`` (ships with Python; nothing is
    downloaded)."""
    from pydoc_data.topics import topics

    text = "\n".join(topics[key] for key in sorted(topics))
    version = ".".join(str(v) for v in sys.version_info[:3])
    return encode_text(text, val_fraction, f"pydoc_data.topics.topics of Python {version}")


class CharBatches:
    """``batch`` parallel streams of a split, cut into ``seq``-character windows (char-rnn)."""

    def __init__(self, codes: torch.Tensor, batch: int, seq: int) -> None:
        if batch < 1 or seq < 1:
            raise ValueError(f"batch and seq must be >= 1, got {batch}, {seq}")
        per_batch = batch * seq
        usable = ((codes.numel() - 1) // per_batch) * per_batch
        if usable == 0:
            raise ValueError(
                f"a split of {codes.numel()} characters holds no batch of {batch} x {seq}"
            )
        self.x = codes[:usable].view(batch, -1)
        self.y = codes[1 : usable + 1].view(batch, -1)
        self.batch, self.seq = batch, seq

    def __len__(self) -> int:
        return self.x.shape[1] // self.seq

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of window ``i``, each ``(batch, seq)``."""
        if not 0 <= i < len(self):
            raise IndexError(f"window {i} outside 0..{len(self) - 1}")
        cols = slice(i * self.seq, (i + 1) * self.seq)
        return self.x[:, cols], self.y[:, cols]
