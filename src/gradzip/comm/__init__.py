"""Moving payload bytes between ranks: one transport interface, two implementations.

* :class:`~gradzip.comm.distributed.DistributedTransport`: ranks are processes joined by a
  ``torch.distributed`` process group (the only module that imports ``torch.distributed``).
* :class:`~gradzip.comm.local.LocalTransport`: P ranks simulated in one process, one thread each.

Collectives are written once, on top of two point-to-point primitives, so the simulation runs
exactly the code a real run does and gives bit-identical results; the bytes each rank sends and
receives are counted from the payload sizes (:class:`~gradzip.comm.meter.ByteMeter`).
"""

from gradzip.comm.meter import ByteMeter, Traffic
from gradzip.comm.transport import Transport

__all__ = ["ByteMeter", "Traffic", "Transport"]
