"""Exact parameter shapes of the DQSG paper's three models (spec 1.10).

The shapes are those of the authors' TensorFlow code [CODE: afshinabdi/DistributedTraining-CEO,
``models/FullyConnected.py``, ``Lenet.py``, ``CifarNet.py``]: dense weights are stored
``[in, out]``, convolution kernels ``[kh, kw, cin, cout]``, each followed by its bias vector, in
the order the layers create their variables. The layout matters for the grouped codecs: One-bit
gives one ``(mu+, mu-)`` pair per slice along the *first* dimension (spec 1.9), so a
PyTorch ``[out, in]`` weight would give a different bit count than the authors' ``[in, out]``.

The parameter counts reproduce the Baseline column of Table 1 exactly (``32 n`` bits):
FC-300-100 266,610; LeNet 1,663,370; CifarNet 1,068,298.
"""

from __future__ import annotations

import math

Shape = tuple[int, ...]

#: MNIST 784-300-100-10 multilayer perceptron.
FC_300_100: tuple[Shape, ...] = (
    (784, 300),
    (300,),
    (300, 100),
    (100,),
    (100, 10),
    (10,),
)

#: LeNet-5-like MNIST net: two 5x5 SAME convolutions with 2x2 pooling (28 -> 7), then fc 512.
LENET: tuple[Shape, ...] = (
    (5, 5, 1, 32),
    (32,),
    (5, 5, 32, 64),
    (64,),
    (7 * 7 * 64, 512),
    (512,),
    (512, 10),
    (10,),
)

#: CifarNet on 24x24x3 crops: two 5x5 convolutions, two stride-2 pools (24 -> 6), fc 384-192-10.
CIFARNET: tuple[Shape, ...] = (
    (5, 5, 3, 64),
    (64,),
    (5, 5, 64, 64),
    (64,),
    (6 * 6 * 64, 384),
    (384,),
    (384, 192),
    (192,),
    (192, 10),
    (10,),
)

#: The three models of Table 1, by the names the paper uses, in the table's row order.
MODEL_SHAPES: dict[str, tuple[Shape, ...]] = {
    "FC-300-100": FC_300_100,
    "LeNet": LENET,
    "CifarNet": CIFARNET,
}


def parameter_count(shapes: tuple[Shape, ...]) -> int:
    """Total number of parameters of a model given its tensor shapes."""
    return sum(math.prod(shape) for shape in shapes)
