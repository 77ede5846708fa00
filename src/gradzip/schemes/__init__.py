"""Aggregation schemes: how the ranks' payloads become one averaged tensor.

Every scheme is a :class:`~gradzip.schemes.base.Scheme`, built from its class with keyword
arguments (``PowerSGD(compressor, rank=1, error_feedback=True)``). :data:`SCHEMES` maps the
names that the command line and the benchmarks use to the classes, and :func:`make_scheme`
builds one from its text (``"powersgd[r1,start2]"``: the grammar of
:mod:`gradzip.schemes.spec`). Error feedback is the scheme's ``error_feedback=`` flag, off by
default for every scheme.
"""

from __future__ import annotations

from typing import Any

from gradzip.compressors.base import Compressor
from gradzip.schemes.allgather_decode import AllGatherDecode
from gradzip.schemes.base import Scheme
from gradzip.schemes.hierarchical import Hierarchical
from gradzip.schemes.integer_allreduce import IntegerAllreduce
from gradzip.schemes.nested import NestedScheme
from gradzip.schemes.parameter_server import ParameterServer
from gradzip.schemes.powersgd import PowerSGD
from gradzip.schemes.registry import SCHEMES
from gradzip.schemes.ring_allreduce import RingAllreduce
from gradzip.schemes.ring_requantize import RingRequantize
from gradzip.schemes.server_integer_sum import ServerIntegerSum
from gradzip.schemes.spec import ExchangeSpec, SchemeSpec

#: Named configurations worth comparing, as scheme specs (:class:`~gradzip.schemes.spec.SchemeSpec`;
#: any other spec, such as ``ps`` or ``powersgd[r2]``, builds as well)
VARIANTS: tuple[str, ...] = (
    "allgather",
    "ps[fp32]",
    "ps[requantize]",
    "ps_intsum[sum]",
    "ps_intsum[requantize]",
    "allreduce",
    "ring",
    "ring_allreduce",
    "hierarchical[ranks_per_node=1]",
    "nested[allgather]",
    "nested[server]",
    "nested[server,dqsg-downlink]",
    "powersgd[r1]",
    "powersgd[r4]",
    "powersgd[r1,allreduce]",
    # as PyTorch's hook is usually run (and in gradzip bench cluster): two uncompressed steps
    "powersgd[r1,start2]",
    "powersgd[r1,allreduce,start2]",
)


def make_scheme(spec: str | SchemeSpec, compressor: Compressor, **options: Any) -> Scheme:
    """The scheme ``spec`` names (``"ring"``, ``"ps[requantize]"``, ``"powersgd[r1,start2]"``:
    :mod:`gradzip.schemes.spec`) around ``compressor``. ``options``: ``run_seed``,
    ``error_feedback`` (off unless given, for every scheme) and the scheme's own keyword
    arguments, which add to or replace the spec's. The typed way is the class itself
    (``PowerSGD(compressor, rank=1, error_feedback=True)``); this reads the text."""
    parsed = spec if isinstance(spec, SchemeSpec) else SchemeSpec.parse(spec)
    return parsed.build(compressor, **options)


def scheme_accepts(spec: str | SchemeSpec, compressor: Compressor) -> bool:
    """Whether :func:`make_scheme` builds ``spec`` around ``compressor`` (its options included:
    PowerSGD's integer-sum factors need a quantizer on a shared grid)."""
    try:
        make_scheme(spec, compressor)
    except ValueError:
        return False
    return True


__all__ = [
    "SCHEMES",
    "VARIANTS",
    "AllGatherDecode",
    "ExchangeSpec",
    "Hierarchical",
    "IntegerAllreduce",
    "NestedScheme",
    "ParameterServer",
    "PowerSGD",
    "RingAllreduce",
    "RingRequantize",
    "Scheme",
    "SchemeSpec",
    "ServerIntegerSum",
    "make_scheme",
    "scheme_accepts",
]
