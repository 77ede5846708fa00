"""Models for training and the reproductions.

* :mod:`gradzip.models.paper`: the DQSG and Dryden papers' models with the authors' parameter
  shapes, by name (:data:`MODELS`, :func:`build_model`).
* :mod:`gradzip.models.shapes`: those exact parameter shapes, without torch modules.
* :mod:`gradzip.models.layers`: the TensorFlow-compatible layers they are built from.
* :mod:`gradzip.models.resnet`: the CIFAR ResNets of the QESGD paper.
* :mod:`gradzip.models.charlstm`: the QESGD paper's character LSTM.
* :mod:`gradzip.models.transformer`: a small character-level transformer language model.
"""

from __future__ import annotations

from gradzip.models.charlstm import CharLSTM, char_lstm
from gradzip.models.paper import MODELS, ModelInfo, PaperModel, build_model, model_info
from gradzip.models.resnet import CifarResNet, resnet
from gradzip.models.shapes import MODEL_SHAPES, Shape, parameter_count
from gradzip.models.transformer import CharTransformer, char_transformer

__all__ = [
    "MODELS",
    "MODEL_SHAPES",
    "CharLSTM",
    "CharTransformer",
    "CifarResNet",
    "ModelInfo",
    "PaperModel",
    "Shape",
    "build_model",
    "char_lstm",
    "char_transformer",
    "model_info",
    "parameter_count",
    "resnet",
]
