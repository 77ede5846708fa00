"""Quantized Epoch-SGD (Zhao, Gao & Li; spec 2): the offset from each epoch's anchor is kept on a
``b``-bit grid whose step shrinks from epoch to epoch.

* :mod:`~gradzip.algorithms.qesgd.algorithm`: one machine (Algorithm 2), :class:`QESGDOptimizer`.
* :mod:`~gradzip.algorithms.qesgd.server`: a parameter server and its workers (Algorithm 3),
  :class:`DistributedQESGD`; its messages in :mod:`~gradzip.algorithms.qesgd.messages`, its
  checkpoints in :mod:`~gradzip.algorithms.qesgd.checkpoint`.
* :mod:`~gradzip.algorithms.qesgd.schedule`: the grid steps ``delta_t`` (:class:`DeltaSchedule`)
  and the flat-vector helpers; :mod:`~gradzip.algorithms.qesgd.codec`: the offset's ``b``-bit
  codes on the wire (:class:`OffsetCodec`); :mod:`~gradzip.algorithms.qesgd.state`: one epoch's
  state (:class:`EpochState`), stepped by both algorithms.
"""

from __future__ import annotations

from gradzip.algorithms.qesgd.algorithm import QESGDOptimizer
from gradzip.algorithms.qesgd.codec import OffsetCodec
from gradzip.algorithms.qesgd.schedule import DeltaSchedule
from gradzip.algorithms.qesgd.server import DistributedQESGD
from gradzip.algorithms.qesgd.state import EpochState

__all__ = ["DeltaSchedule", "DistributedQESGD", "EpochState", "OffsetCodec", "QESGDOptimizer"]
