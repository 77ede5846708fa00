"""The seed papers' models as PyTorch modules with the authors' exact parameter shapes.

``build_model(name, seed)`` returns a freshly initialised model; :data:`MODELS` lists the names
with their dataset and per-example input shape (NCHW, without the batch dimension):

=============  ========  ==========  ===========  =======================================
name           dataset   input       parameters   layout
=============  ========  ==========  ===========  =======================================
fc-300-100     MNIST     1x28x28     266,610      TensorFlow (``shapes.FC_300_100``)
lenet          MNIST     1x28x28     1,663,370    TensorFlow (``shapes.LENET``)
cifarnet       CIFAR-10  3x24x24     1,068,298    TensorFlow (``shapes.CIFARNET``)
dryden-mlp     MNIST     1x28x28     36,818,954   PyTorch ``[out, in]``
=============  ========  ==========  ===========  =======================================

The first three are the DQSG paper's (spec 1.10) and store their parameters as the authors' code
does [CODE: afshinabdi/DistributedTraining-CEO, ``models/{FullyConnected,Lenet,CifarNet}.py``]:
``[p.shape for p in model.parameters()]`` equals ``shapes.MODEL_SHAPES[...]``, weight then bias
per layer. Feature maps are flattened in TensorFlow's NHWC order before the first dense layer, so
row ``i`` of that weight multiplies the same feature as in the authors' graph. The models return
logits; the loss is the mean softmax cross-entropy (``F.cross_entropy``).

* **lenet**: conv 5x5x1x32 (SAME) - ReLU - maxpool 2x2/2 - conv 5x5x32x64 - ReLU - maxpool -
  dropout - fc 3136x512 - ReLU - dropout - fc 512x10.
* **cifarnet**: conv 5x5x3x64 - ReLU - maxpool 3x3/2 SAME (24 -> 12) - LRN - conv 5x5x64x64 -
  ReLU - LRN - maxpool (12 -> 6) - dropout - fc 2304x384 - ReLU - dropout - fc 384x192 - ReLU -
  dropout - fc 192x10. LRN is ``tf.nn.lrn(depth_radius=4, bias=1, alpha=0.001/9, beta=0.75)``,
  i.e. ``F.local_response_norm(size=9, alpha=0.001, beta=0.75, k=1)`` (see
  :func:`~gradzip.models.layers.lrn` for the conversion).
* **fc-300-100**: dropout - fc 784x300 - ReLU - dropout - fc 300x100 - ReLU - dropout - fc 100x10.
* **dryden-mlp** (spec 5.7, Dryden et al.): 784-4096-4096-4096-10, ReLU, no dropout. Weights in
  PyTorch's ``[out, in]`` layout, so the Dryden codecs' default ``group="out"`` gives LBANN's one
  group per output neuron (spec 5).

Dropout [CODE]: the authors' graphs put dropout before every dense layer (at the positions above)
but feed ``keep_prob = 1.0`` to every gradient computation (``BaseModel.compute_gradients``) and,
by default, to ``train``; their published runs therefore used no dropout. The default rate here is
hence ``0.0``; ``build_model(..., dropout=p)`` switches it on (drop probability ``p``, active only
in ``train()`` mode). Dropout masks come from torch's global RNG (``F.dropout`` takes no
generator); under ``torch.func.vmap`` a model with ``p > 0`` in training mode needs
``randomness="different"`` (independent masks per worker, as real workers have; "same" also runs
but gives every worker the same mask). With ``p = 0`` or in ``eval()`` mode no randomness is drawn
and vmap's default ``randomness="error"`` works.

Initialisation [CODE]: truncated normal at +-2 sd (``sd`` is the untruncated parameter, so the
sample standard deviation is about ``0.880 sd``) and constant biases: FC-300-100 and LeNet sd 0.1,
bias 0.1; CifarNet sd ``[0.05, 0.05, 0.04, 0.04, 1/192]``, bias ``[0, 0.1, 0.1, 0.1, 0]``. (The
authors' ``compare_algorithms_cifar.py`` overrides the CifarNet initialisation with sd 0.1 / bias
0.1; we follow the model class, as the spec does.) Dryden's MLP [CHOICE, neither the slides nor
the spec give one]: the same truncated normal with He's ``sd = sqrt(2 / fan_in)``, bias 0. All
draws come from one ``torch.Generator`` seeded with ``seed``, in ``parameters()`` order; the global
RNG is never used.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)
from torch import nn

from gradzip.models.layers import ConvSame, Dense, lrn, max_pool_same, truncated_normal_
from gradzip.models.shapes import Shape


class PaperModel(nn.Module):
    """Base class: dropout before dense layers and the seeded initialisation."""

    #: per weighted layer, in order: (weight sd, bias value); ``None`` sd means He's sqrt(2/fan_in)
    init_table: Sequence[tuple[float | None, float]] = ()

    def __init__(self, dropout: float) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout!r}")
        self.dropout = float(dropout)

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        if self.dropout == 0.0:  # a configuration constant, not data: fine under vmap
            return x
        return F.dropout(x, self.dropout, self.training)

    def weighted_layers(self) -> list[Dense | ConvSame]:
        """The layers holding parameters, in ``parameters()`` order."""
        return [m for m in self.children() if isinstance(m, Dense | ConvSame)]

    def reset_parameters(self, generator: torch.Generator) -> None:
        """Draw every parameter from ``generator`` per :attr:`init_table`."""
        layers = self.weighted_layers()
        if len(layers) != len(self.init_table):
            raise RuntimeError(f"{type(self).__name__}: init table does not match the layers")
        with torch.no_grad():
            for layer, (sd, bias) in zip(layers, self.init_table, strict=True):
                if sd is None:
                    sd = math.sqrt(2.0 / layer.fan_in)
                truncated_normal_(layer.weight, sd, generator)
                layer.bias.fill_(bias)


class FC300100(PaperModel):
    """MNIST 784-300-100-10 perceptron, ReLU (266,610 parameters)."""

    init_table = ((0.1, 0.1),) * 3

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__(dropout)
        self.fc1, self.fc2, self.fc3 = Dense(784, 300), Dense(300, 100), Dense(100, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(self._drop(x.flatten(1))))
        x = F.relu(self.fc2(self._drop(x)))
        logits: torch.Tensor = self.fc3(self._drop(x))
        return logits


def _flatten_nhwc(x: torch.Tensor) -> torch.Tensor:
    """Flatten NCHW feature maps in TensorFlow's NHWC order."""
    return x.permute(0, 2, 3, 1).flatten(1)


class LeNet(PaperModel):
    """MNIST LeNet-like net of the DQSG authors (1,663,370 parameters)."""

    init_table = ((0.1, 0.1),) * 4

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__(dropout)
        self.conv1, self.conv2 = ConvSame(5, 5, 1, 32), ConvSame(5, 5, 32, 64)
        self.fc1, self.fc2 = Dense(7 * 7 * 64, 512), Dense(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = max_pool_same(F.relu(self.conv1(x)), 2, 2)
        x = max_pool_same(F.relu(self.conv2(x)), 2, 2)
        x = F.relu(self.fc1(self._drop(_flatten_nhwc(x))))
        logits: torch.Tensor = self.fc2(self._drop(x))
        return logits


#: CifarNet's local response normalisation as TensorFlow parameters [CODE]:
#: (depth_radius, bias, alpha, beta) of ``tf.nn.lrn``.
CIFARNET_LRN: tuple[int, float, float, float] = (4, 1.0, 0.001 / 9.0, 0.75)


class CifarNet(PaperModel):
    """CIFAR-10 net on 24x24x3 crops with LRN (1,068,298 parameters)."""

    init_table = ((0.05, 0.0), (0.05, 0.1), (0.04, 0.1), (0.04, 0.1), (1 / 192.0, 0.0))

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__(dropout)
        self.conv1, self.conv2 = ConvSame(5, 5, 3, 64), ConvSame(5, 5, 64, 64)
        self.fc1, self.fc2, self.fc3 = Dense(6 * 6 * 64, 384), Dense(384, 192), Dense(192, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = lrn(max_pool_same(F.relu(self.conv1(x)), 3, 2), *CIFARNET_LRN)
        x = max_pool_same(lrn(F.relu(self.conv2(x)), *CIFARNET_LRN), 3, 2)
        x = F.relu(self.fc1(self._drop(_flatten_nhwc(x))))
        x = F.relu(self.fc2(self._drop(x)))
        logits: torch.Tensor = self.fc3(self._drop(x))
        return logits


class DrydenMLP(PaperModel):
    """Dryden et al.'s MNIST MLP: 3 hidden layers of 4096, ReLU; PyTorch ``[out, in]`` weights."""

    init_table = ((None, 0.0),) * 4

    def __init__(self, dropout: float = 0.0) -> None:
        if dropout:
            raise ValueError("dryden-mlp has no dropout layers (spec 5.7 describes none)")
        super().__init__(0.0)
        self.fc1 = Dense(784, 4096, layout="out_in")
        self.fc2 = Dense(4096, 4096, layout="out_in")
        self.fc3 = Dense(4096, 4096, layout="out_in")
        self.fc4 = Dense(4096, 10, layout="out_in")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.relu(self.fc2(x))
        logits: torch.Tensor = self.fc4(F.relu(self.fc3(x)))
        return logits


@dataclass(frozen=True)
class ModelInfo:
    """One entry of :data:`MODELS`."""

    name: str
    dataset: str
    #: per-example input shape, NCHW without the batch dimension
    input_shape: Shape
    num_classes: int
    #: "tensorflow" (dense ``[in, out]``, conv ``[kh, kw, cin, cout]``) or "pytorch" (``[out, in]``)
    layout: str
    #: key of :data:`gradzip.models.shapes.MODEL_SHAPES`, or None when the paper has none
    paper_name: str | None
    factory: Callable[[float], PaperModel]


MODELS: dict[str, ModelInfo] = {
    info.name: info
    for info in (
        ModelInfo("fc-300-100", "MNIST", (1, 28, 28), 10, "tensorflow", "FC-300-100", FC300100),
        ModelInfo("lenet", "MNIST", (1, 28, 28), 10, "tensorflow", "LeNet", LeNet),
        ModelInfo("cifarnet", "CIFAR-10", (3, 24, 24), 10, "tensorflow", "CifarNet", CifarNet),
        ModelInfo("dryden-mlp", "MNIST", (1, 28, 28), 10, "pytorch", None, DrydenMLP),
    )
}


def model_info(name: str) -> ModelInfo:
    """The :data:`MODELS` entry of ``name``; ``ValueError`` naming the choices otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choices: {', '.join(MODELS)}") from None


def build_model(name: str, seed: int, *, dropout: float = 0.0) -> nn.Module:
    """A freshly initialised model ``name``, every draw from ``torch.Generator().manual_seed(seed)``.

    ``dropout`` is the drop probability at the authors' dropout positions (default 0.0: the
    authors fed ``keep_prob = 1.0``); the model starts in training mode, as ``nn.Module`` does.
    """
    model = model_info(name).factory(dropout)
    model.reset_parameters(torch.Generator().manual_seed(seed))
    return model
