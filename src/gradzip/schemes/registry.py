"""The scheme registry: the names the command line, the specs and the benchmarks use, mapped to
the scheme classes (a module of its own so that :mod:`gradzip.schemes.spec` reads it without
importing the package that re-exports the spec)."""

from __future__ import annotations

from gradzip.schemes.allgather_decode import AllGatherDecode
from gradzip.schemes.base import Scheme
from gradzip.schemes.hierarchical import Hierarchical
from gradzip.schemes.integer_allreduce import IntegerAllreduce
from gradzip.schemes.nested import NestedScheme
from gradzip.schemes.parameter_server import ParameterServer
from gradzip.schemes.powersgd import PowerSGD
from gradzip.schemes.ring_allreduce import RingAllreduce
from gradzip.schemes.ring_requantize import RingRequantize
from gradzip.schemes.server_integer_sum import ServerIntegerSum

SCHEMES: dict[str, type[Scheme]] = {
    cls.name: cls
    for cls in (
        AllGatherDecode,
        ParameterServer,
        ServerIntegerSum,
        IntegerAllreduce,
        RingRequantize,
        RingAllreduce,
        Hierarchical,
        NestedScheme,
        PowerSGD,
    )
}
