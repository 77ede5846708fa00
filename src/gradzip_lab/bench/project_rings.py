"""The scaling model of the two schemes built on the pipelined integer ring: ``ring_allreduce``
and ``hierarchical`` (:mod:`gradzip.schemes.ring_allreduce`, :mod:`gradzip.schemes.hierarchical`).

``ring_allreduce`` on one tensor of ``m`` values over ``P`` ranks, as
:func:`~gradzip.schemes._pipelined_ring.pipelined_ring_sum` sends it:

* **Scales.** A max ring of the compressor's scale statistics (``s`` floats): ``2(P-1)``
  float32 messages of at most ``ceil(s/P)`` values, before the codes (not pipelined).
* **Codes.** Each slice of ``ceil(m/P)`` values is cut into ``C = ceil(ceil(m/P) / chunk)``
  chunks; ``2(P-1) C`` messages, each a chunk packed at ``b = bits_for(top)`` bits, the width
  of ONE rank's code whatever the number of ranks its partial sum covers (no ``ceil(log2 P)``
  growth, unlike ``allreduce``): ``2(P-1)/P`` of one payload at ``b`` bits a value.
* **Codec.** The compressor's quantization of the ``m`` values and the decode of the sum (timed
  as its encode and decode [RECON: the grid scheme's own passes are of the same kind]), then per
  reduce-scatter hop an add of the received chunk and a re-quantize and pack of the next, and
  per allgather hop an unpack: ``m x (encode + decode) + (P-1) ceil(m/P) x (hop_pack + 2
  hop_add)``, the hop's two passes timed on this machine on the library's own
  :class:`~gradzip.schemes._pipelined_ring.HopCode` (:func:`ring_hop_seconds`).
* **Pipeline.** The transfers of chunk ``c`` overlap the codec work on chunk ``c + 1``, so
  ``exposed = scales + latency + max(codes, codec) + min(codes, codec) / C``, ``codes`` the code
  ring's bytes' seconds and ``latency`` its rounds' alpha (:func:`pipelined_seconds`: [CHOICE]
  the latency is not hidden); tensors run one after another (the DDP hook reduces a bucket's
  tensors in turn).

Every byte count is ``len()`` of a real message packed by the library's own functions
(:func:`~gradzip.schemes._messages.pack_ints`, ``pack_floats``) at the model's stream key;
[CHOICE] the meter's 8-byte length prefix a message is left out, as for every other variant.

``hierarchical[ranks_per_node=K]``: the scheme's own plan, not a ring inside the node: every
rank sends its float32 tensor to the node's leader, the ``P/K`` leaders run ``ring_allreduce``
on the node means at the inter-node link, and the leader sends the mean back. On the intra-node
link the leader receives, then sends, ``K-1`` float32 messages a tensor, one after another:
``2 (K-1) (alpha + 4m / beta)``; the three phases do not overlap. The bytes reported are the
leader's (the rank that sends most: ``(K-1)`` float32 copies plus its ring's bytes).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from gradzip.schemes._messages import bits_for, pack_floats, pack_ints
from gradzip.schemes._pipelined_ring import HopCode
from gradzip.schemes.base import Scheme
from gradzip.schemes.hierarchical import Hierarchical
from gradzip.schemes.ring_allreduce import RingAllreduce
from gradzip.schemes.spec import ExchangeSpec
from gradzip_lab.bench.project_codecs import KEY, CodecMeasure, seconds_best_of
from gradzip_lab.bench.project_links import NO_TRAFFIC, Link, Traffic

#: the scale ring's messages carry chunks from 2**40 (see ring_allreduce): a 6-byte varint
SCALE_KEY = replace(KEY, chunk=2**40)
#: the float32 messages inside a node carry chunk 2**40 or 2**40 + 1 (see hierarchical)
NODE_KEY = replace(KEY, chunk=2**40 + 1)


#: seconds a coordinate of a hop's (re-quantize and pack, unpack and add) at a code width in bits
HopSpeeds = Callable[[int], tuple[float, float]]


def ring_hop_seconds(bits: int, numel: int, repeat: int = 9) -> tuple[float, float]:
    """Seconds a coordinate to re-quantize and pack a partial sum of two ranks' codes at
    ``bits`` bits (the general hop: two codes' sum needs a bit more), and to unpack a message
    and add it into the running sums: the best of ``repeat`` runs on ``numel`` values."""
    top = (1 << bits) - 1
    code = HopCode(top, bits, 2)
    sums = torch.randint(0, 2 * top + 1, (numel,), generator=torch.Generator().manual_seed(3))
    sums = sums.to(torch.float32)
    message = code.encode(sums, KEY)
    acc = torch.zeros(numel)
    pack = seconds_best_of(lambda: code.encode(sums, KEY), repeat)
    add = seconds_best_of(lambda: code.add_into(acc, message, KEY, replace=False), repeat)
    return pack / numel, add / numel


@dataclass(frozen=True)
class Exchange:
    """One step's exchange on one rank: link seconds, codec seconds, the bytes the rank sends,
    and the seconds the step waits for (``exposed``, which knows what overlaps)."""

    comm_s: float
    codec_s: float
    nbytes: float
    exposed_s: float


def pipelined_seconds(latency_s: float, transfer_s: float, codec_s: float, stages: int) -> float:
    """The seconds a pipeline of ``stages`` chunks waits for: the transfers of one chunk
    overlap the codec work of the next, the fill and drain exposed (``max(transfer, codec) +
    min(transfer, codec) / stages``), and the collectives' latency (``rounds x alpha``) paid
    apart. [CHOICE] The latency does not hide behind the codec: on the measured cluster (ranks
    sharing cores) a small collective's ~1-6 ms is the wait for every rank to be scheduled,
    CPU time the ranks' codecs take, and a chunked integer all-reduce with the latency
    overlapped was predicted 28-32% too fast at P = 8, 1 Gbit/s (docs/performance.md)."""
    if stages < 1:
        raise ValueError(f"a pipeline has at least one stage, got {stages}")
    return latency_s + max(transfer_s, codec_s) + min(transfer_s, codec_s) / stages


@dataclass(frozen=True)
class RingTensor:
    """One tensor's ``ring_allreduce`` on one rank: the scale ring's and the code ring's
    traffic, the chunks per slice (the pipeline's stages) and the values coded."""

    scales: Traffic
    codes: Traffic
    chunks: int
    numel: int


class RingSizes:
    """Message sizes of ``ring_allreduce`` for one compressor, packed for real (cached)."""

    def __init__(self, scheme: RingAllreduce) -> None:
        self._grid = scheme.grid
        self.bits = bits_for(2 * scheme.grid.grid_levels())
        self.chunk_values = scheme.chunk_values
        self._code: dict[int, int] = {}
        self._scale: dict[int, int] = {}
        self._statistic: dict[int, int] = {}

    def code_message(self, values: int) -> int:
        """``len()`` of a chunk of ``values`` codes packed at :attr:`bits`."""
        if values not in self._code:
            ints = torch.zeros(values, dtype=torch.int32)
            self._code[values] = len(pack_ints(ints, self.bits, KEY))
        return self._code[values]

    def scale_message(self, values: int) -> int:
        """``len()`` of a float32 message of ``values`` scale statistics."""
        if values not in self._scale:
            self._scale[values] = len(pack_floats(torch.zeros(values), SCALE_KEY))
        return self._scale[values]

    def statistics(self, numel: int) -> int:
        """The number of scale statistics (buckets) of a tensor of ``numel`` values."""
        if numel not in self._statistic:
            prepared = self._grid.grid_prepare(torch.zeros(numel))
            self._statistic[numel] = int(self._grid.grid_statistic(prepared).numel())
        return self._statistic[numel]

    def tensor(self, numel: int, p: int) -> RingTensor:
        """One tensor of ``numel`` values over ``p`` ranks (every message at the size of the
        longest slice's: a rank sends at most that many bytes)."""
        slice_values = math.ceil(numel / p)
        chunks = max(1, math.ceil(slice_values / max(1, self.chunk_values)))
        per_chunk = math.ceil(slice_values / chunks)
        hops = 2 * (p - 1)
        codes = Traffic(hops * chunks, hops * chunks * self.code_message(per_chunk))
        scale_slice = math.ceil(self.statistics(numel) / p)
        scales = Traffic(hops, hops * self.scale_message(scale_slice))
        return RingTensor(scales, codes, chunks, numel)


def ring_allreduce_exchange(
    spec_text: str,
    measure: CodecMeasure,
    numels: Sequence[int],
    p: int,
    link: Link,
    hop_speeds: HopSpeeds,
    extra_s_per_coord: float = 0.0,
    cpu_share: float = 1.0,
    overlap_codec: bool = True,
) -> Exchange:
    """``ring_allreduce`` (``spec_text``: a ``gradzip:...:ring_allreduce[...]`` spelling) of
    tensors of ``numels`` over ``p`` ranks on ``link`` (see the module docstring);
    ``extra_s_per_coord``: error feedback's seconds a value; ``overlap_codec``: whether the
    chunks' codec work overlaps their transfers (False: they add)."""
    return _ring(
        ring_sizes(spec_text),
        measure,
        numels,
        p,
        link,
        hop_speeds,
        extra_s_per_coord,
        cpu_share,
        overlap_codec,
    )


def hierarchical_exchange(
    spec_text: str,
    measure: CodecMeasure,
    numels: Sequence[int],
    p: int,
    inter: Link,
    intra: Link,
    hop_speeds: HopSpeeds,
    extra_s_per_coord: float = 0.0,
    cpu_share: float = 1.0,
    overlap_codec: bool = True,
) -> Exchange:
    """``hierarchical[ranks_per_node=K]`` of tensors of ``numels`` over ``p`` ranks: float32 to
    and from the node's leader on ``intra``, ``ring_allreduce`` among the ``p/K`` leaders on
    ``inter``. ``ValueError`` when the spec leaves ``K`` out (the model does not read the
    environment) or ``K`` does not divide ``p``."""
    scheme = _build(spec_text)
    if not isinstance(scheme, Hierarchical):
        raise ValueError(f"{spec_text!r} is not a hierarchical exchange")
    k = scheme.ranks_per_node
    if k is None:
        raise ValueError(
            f"{spec_text!r}: the projection needs ranks_per_node=K in the spec "
            "(e.g. hierarchical[ranks_per_node=8])"
        )
    if p % k:
        raise ValueError(f"{spec_text!r}: ranks_per_node={k} does not divide the world size {p}")
    one_way = NO_TRAFFIC
    for m in numels:
        message = _node_message(m)
        one_way = one_way + Traffic(k - 1, (k - 1) * message)
    node_s = 2 * intra.seconds(one_way.rounds, one_way.nbytes)
    nodes = p // k
    if nodes < 2:
        return Exchange(node_s, 0.0, one_way.nbytes, node_s)
    ring = _ring(
        ring_sizes(spec_text),
        measure,
        numels,
        nodes,
        inter,
        hop_speeds,
        extra_s_per_coord,
        cpu_share,
        overlap_codec,
    )
    return Exchange(
        node_s + ring.comm_s, ring.codec_s, one_way.nbytes + ring.nbytes, node_s + ring.exposed_s
    )


def _ring(
    sizes: RingSizes,
    measure: CodecMeasure,
    numels: Sequence[int],
    p: int,
    link: Link,
    hop_speeds: HopSpeeds,
    extra_s_per_coord: float,
    cpu_share: float,
    overlap_codec: bool,
) -> Exchange:
    comm = codec = nbytes = exposed = 0.0
    enc, dec = measure.encode_s_per_coord, measure.decode_s_per_coord
    pack, add = hop_speeds(sizes.bits)
    for m in numels:
        t = sizes.tensor(m, p)
        scales_s = link.seconds(t.scales.rounds, t.scales.nbytes)
        codes_latency_s = link.latency_seconds(t.codes.rounds)
        codes_s = link.seconds(t.codes.rounds, t.codes.nbytes)
        work = m * (enc + dec + extra_s_per_coord) + (p - 1) * math.ceil(m / p) * (pack + 2 * add)
        work /= cpu_share
        comm += scales_s + codes_s
        codec += work
        nbytes += t.scales.nbytes + t.codes.nbytes
        stages = t.chunks if overlap_codec else 1
        exposed += scales_s + pipelined_seconds(
            codes_latency_s, codes_s - codes_latency_s, work, stages
        )
    return Exchange(comm, codec, nbytes, exposed)


@functools.lru_cache(maxsize=64)
def ring_sizes(spec_text: str) -> RingSizes:
    """The message sizes of the ``ring_allreduce`` that ``spec_text`` runs (itself, or the
    leaders' ring of a ``hierarchical`` spec), kept across predictions: a projection predicts
    each variant at many world sizes and rates."""
    scheme = _build(spec_text)
    if isinstance(scheme, Hierarchical):
        return RingSizes(scheme.inner)
    if isinstance(scheme, RingAllreduce):
        return RingSizes(scheme)
    raise ValueError(f"{spec_text!r} is neither a ring_allreduce nor a hierarchical exchange")


@functools.lru_cache(maxsize=64)
def _build(spec_text: str) -> Scheme:
    """The scheme ``spec_text`` names (read only: for its options and its compressor's grid)."""
    return ExchangeSpec.parse(spec_text).build(run_seed=0)


@functools.lru_cache(maxsize=4096)
def _node_message(numel: int) -> int:
    """``len()`` of the float32 message of a tensor of ``numel`` values inside a node."""
    return len(pack_floats(torch.zeros(numel), NODE_KEY))
