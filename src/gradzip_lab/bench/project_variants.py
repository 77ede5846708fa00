"""Each variant's messages and codec work for one step, and the step time they predict.

A prediction is ``compute + exposed``, where ``exposed`` is the part of the exchange the step
waits for:

* fp32 (DDP's own all-reduce), ``fp16_hook``: a ring all-reduce per DDP bucket (4 or 2 bytes a
  value); the cast is timed. ``exposed = comm + cast``.
* torch's PowerSGD rank r (``powersgd_rN``): per bucket, ring all-reduces of the uncompressed
  tensors, of the P factors and of the Q factors (float32); its arithmetic is timed.
  ``exposed = comm + arithmetic`` (run waited, as the cluster benchmark runs it).
* gradzip ``allgather`` (and ``nested[...]``): every rank's payload to every other rank; the
  hook pipelines encode, transfer and decode (:mod:`gradzip.integrations.ddp`).
  ``codec`` = a rank's CPU seconds in a run of the scheme itself at ``min(P, 8)`` ranks (its
  encode, its ``min(P, 8)`` decodes, error feedback, framing; composing the codec's encode and
  decode speeds under-counted it 2-2.5x on mlp-4096 at P = 2 and 4), plus one decode of ``n``
  for each rank past 8: a rank decodes its own payload too (every rank must average the same
  values), and its encode and decode stages share the rank's core, so they add; then ``exposed = latency + max(transfer, codec) +
  min(transfer, codec) / B`` (B buckets: the pipeline's fill and drain; ``latency`` the
  messages' alpha, ``transfer`` their bytes' seconds: [CHOICE] the latency is not hidden, see
  :func:`~gradzip_lab.bench.project_rings.pipelined_seconds`).
* gradzip ``ring`` (re-quantizing): per parameter, ``2(P-1)`` hops of a chunk of ``n/P``
  values, one parameter after another, not pipelined; ``allreduce`` (integer sums): per chunk
  of ``chunk_values`` values of a DDP bucket (default 1 Mi; ``none``: the bucket), the codes'
  ``P - 1`` slices in one all-to-all and the sums' in one all-gather. ``exposed = comm +
  codec``, ``codec`` the rank's CPU seconds in a run of the scheme itself at ``min(P, 8)``
  ranks (:mod:`~gradzip_lab.bench.project_scheme_cpu`), for ``ring`` ``(P-1)`` encodes and
  ``2(P-1)`` decodes of a slice; with chunks, ``latency + max(transfer,
  codec) + min(transfer, codec) / C`` (``C`` chunks a step, as the all-gather's buckets).
  [RECON] the integer sums widen each code by ``ceil(log2 P)`` bits so that P codes add
  without overflow; the all-gather's chunk payload is scaled by that width.
* All-to-alls (gloo): the integer sums' reduce-scatter is one, and the transport sends
  all-gathers of equal slots as one too unless ``Network.ring_gather_from`` says otherwise
  (``DistributedTransport(ring_gather_from=...)``); their bytes move at the link's
  ``alltoall_efficiency`` of its rate (:class:`~gradzip_lab.bench.project_links.Link`).
* gradzip ``powersgd``: the factors as payloads of the variant's codec, all-gathered (``P-1``
  payloads each of P and Q); its own arithmetic (the scheme's numba kernels) timed on the
  model's shapes. ``exposed = comm + codec``.
* gradzip ``ring_allreduce`` (shared-scale codes, every hop at one code's width, chunked and
  pipelined) and ``hierarchical[ranks_per_node=K]`` (float32 to and from a node leader on the
  intra-node link, ``ring_allreduce`` among the ``P/K`` leaders on the inter-node link): see
  :mod:`gradzip_lab.bench.project_rings`. Unlike ``allreduce``, no ``ceil(log2 P)`` growth.
* ``hier[K]:<gradzip spec>``: ranks in nodes of K; a float32 ring reduce-scatter and all-gather
  among the K ranks at the intra-node link, and the compressed exchange of each rank's ``1/K``
  shard among the ``P/K`` nodes at the inter-node link (ZeRO++-style). A design the library
  does not implement, kept for comparison; not an alias of ``hierarchical[...]``, whose leader
  carries the node's whole tensor.

[CHOICE] Overlap with backward: none by default (``overlap = 0``). DDP starts a bucket's
collective while backward goes on, but on the measured cluster the ranks' codecs and backward
share the same cores and the fp32 rows fit ``compute + comm`` (P = 2, 1 Gbit/s: 1393 ms measured,
212 + 1181 ms). ``overlap = f`` hides up to ``f x`` two thirds of the compute (backward's share
[CHOICE]) behind ``exposed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from gradzip.comm.transport import LENGTH_PREFIX_BYTES as SLOT_HEADER_BYTES
from gradzip_lab.bench.project_codecs import (
    CodecMeasure,
    cast_s_per_coord,
    ddp_buckets,
    error_feedback_s_per_coord,
    gradzip_powersgd_seconds,
    matrix_shapes,
    powersgd_compresses,
    powersgd_seconds,
)
from gradzip_lab.bench.project_links import (
    NO_TRAFFIC,
    Link,
    Traffic,
    ring_allreduce,
)
from gradzip_lab.bench.project_rings import (
    Exchange,
    hierarchical_exchange,
    pipelined_seconds,
    ring_allreduce_exchange,
    ring_hop_seconds,
)
from gradzip_lab.bench.project_scheme_cpu import MAX_RANKS, scheme_cpu_s_per_coord

if TYPE_CHECKING:
    from gradzip.schemes.spec import ExchangeSpec

#: the variants the projection compares by default (the cluster benchmark's spellings)
DEFAULT_VARIANTS: tuple[str, ...] = (
    "fp32",
    "fp16_hook",
    "powersgd_r1",
    "gradzip:qsgd:allgather",
    "gradzip:dqsg[M=2]:allgather",
    "gradzip:terngrad:allgather",
    "gradzip:onebit+ef:allgather",
    "gradzip:topk[ratio=0.01]+ef:allgather",
    "gradzip:fp16+ef:powersgd[r1,start2]",
    "gradzip:qsgd:ring",
    "gradzip:qsgd:allreduce",
    "gradzip:qsgd:ring_allreduce",
    "gradzip:qsgd:hierarchical[ranks_per_node=8]",
    "hier[8]:gradzip:qsgd:allgather",
)
#: [CHOICE] backward's share of a forward and backward (about twice the forward's work)
BACKWARD_SHARE = 2 / 3


@dataclass
class Workload:
    """The model's parameters and the machine's timed figures the predictions share.

    ``cpu_share``: the part of a core each rank's codec gets (1: a core of its own; on
    ``gradzip bench cluster`` with P ranks on C cores, ``min(1, C / P)``).

    ``overlap_codec``: whether a pipelined exchange (the all-gather's buckets, the integer
    all-reduce's chunks, ``ring_allreduce``'s chunks) overlaps its codec work with its transfers;
    False: they add, as for the unpipelined schemes. [CHOICE] True in a projection (a rank with
    cores to spare: the codec on one, the thread that moves its bytes and the kernel's network
    stack on another); the validation sets it False where a row's rank had fewer than two cores
    of its own (:func:`~gradzip_lab.bench.project_validate.overlaps_codec`): on the emulated
    cluster, P = 2, 4 and 8 ranks on two cores, the chunked integer all-reduce at 1 Gbit/s took
    its codec plus its link time at every P (within 5%), the overlapped figure 23-32% less."""

    shapes: list[torch.Size]
    compute_s: float
    cpu_share: float = 1.0
    overlap_codec: bool = True
    codec_numel: int = 1 << 21
    #: codec speeds read from a file (:func:`~gradzip_lab.bench.project_speeds.load_speeds`):
    #: seconds a coordinate to encode and decode, by codec label or compressor name
    given_speeds: dict[str, tuple[float, float]] = field(default_factory=dict)
    _codecs: dict[str, CodecMeasure] = field(default_factory=dict)
    _timed: dict[str, float] = field(default_factory=dict)
    _hops: dict[int, tuple[float, float]] = field(default_factory=dict)

    @property
    def numels(self) -> list[int]:
        return [int(s.numel()) for s in self.shapes]

    @property
    def numel(self) -> int:
        return sum(self.numels)

    @property
    def buckets(self) -> list[int]:
        return ddp_buckets(self.numels)

    def codec(self, compressor: str, params: dict[str, Any]) -> CodecMeasure:
        """The measured codec (timed on first use, at ``codec_numel`` values or the model's)."""
        key = f"{compressor}{sorted(params.items())}"
        if key not in self._codecs:
            measure = CodecMeasure(compressor, dict(params))
            given = self.given_speeds.get(measure.label) or self.given_speeds.get(compressor)
            if given is None:
                measure.time_codec(min(self.codec_numel, max(self.numel, 4096)))
            else:
                measure.encode_s_per_coord, measure.decode_s_per_coord = given
            self._codecs[key] = measure
        return self._codecs[key]

    def ring_hop(self, bits: int) -> tuple[float, float]:
        """Seconds a coordinate of a ``ring_allreduce`` hop at ``bits`` bits: re-quantize and
        pack, unpack and add (``ring-hop`` in the given speeds, else timed once a width)."""
        given = self.given_speeds.get("ring-hop")
        if given is not None:
            return given
        if bits not in self._hops:
            self._hops[bits] = ring_hop_seconds(bits, min(self.codec_numel, max(self.numel, 4096)))
        return self._hops[bits]

    def timed(self, what: str) -> float:
        """Seconds a coordinate of ``ef`` or ``cast``, or of a rank's CPU in a scheme run at P
        ranks (``scheme-cpu:P:<spec>``, :mod:`~gradzip_lab.bench.project_scheme_cpu`), or a
        step of torch's ``powersgd-rN`` or of gradzip's ``gradzip-powersgd-rN`` arithmetic,
        timed once."""
        if what not in self._timed:
            n = min(self.codec_numel, max(self.numel, 4096))
            if what == "ef":
                self._timed[what] = error_feedback_s_per_coord(n)
            elif what == "cast":
                self._timed[what] = cast_s_per_coord(n)
            elif what.startswith(SCHEME_CPU):  # "scheme-cpu:P:<spec>"
                ranks, _, spec_text = what[len(SCHEME_CPU) :].partition(":")
                self._timed[what] = scheme_cpu_s_per_coord(spec_text, int(ranks), n)
            else:  # a PowerSGD step: torch's or gradzip's, at the rank after the last "r"
                rank = int(what.rsplit("r", 1)[1])
                gradzip = what.startswith("gradzip-")
                timer = gradzip_powersgd_seconds if gradzip else powersgd_seconds
                self._timed[what] = timer(self.shapes, rank)
        return self._timed[what]


#: the prefix of a scheme's timed CPU figure in :meth:`Workload.timed`
SCHEME_CPU = "scheme-cpu:"


@dataclass(frozen=True)
class Prediction:
    """One variant at one world size and link: seconds and bytes per rank and step."""

    variant: str
    world_size: int
    gbit_per_s: float
    step_s: float
    comm_s: float
    codec_s: float
    bytes_per_rank: float


@dataclass(frozen=True)
class Network:
    """The links: ``inter`` between ranks (between nodes for a hierarchical variant), ``intra``
    among the ranks of one node, and the overlap assumed (see the module docstring)."""

    inter: Link
    intra: Link
    overlap: float = 0.0
    #: the transport's ``ring_gather_from`` (gloo): all-gathers of slots of at least this many
    #: bytes (its 8-byte header included) go round gloo's ring, smaller ones (all, with None)
    #: as one all-to-all, whose bytes move at ``inter.alltoall_efficiency``
    ring_gather_from: int | None = None

    def gathers_as_alltoall(self, slot_bytes: float) -> bool:
        """Whether the transport sends an all-gather of ``slot_bytes``-byte slots (payload, no
        header) as an all-to-all."""
        limit = self.ring_gather_from
        return limit is None or slot_bytes + SLOT_HEADER_BYTES < limit


def predict(name: str, work: Workload, world_size: int, net: Network) -> Prediction:
    """The step time of variant ``name`` (see :data:`DEFAULT_VARIANTS` for the spellings) at
    ``world_size`` ranks on ``net``; ``ValueError`` naming an unknown variant."""
    if world_size < 2:
        raise ValueError(f"the world size must be >= 2, got {world_size}")
    ex = _exchange(name, work, world_size, net)
    hidden = net.overlap * BACKWARD_SHARE * work.compute_s
    step = work.compute_s + max(0.0, ex.exposed_s - hidden)
    return Prediction(
        name, world_size, net.inter.gbit_per_s, step, ex.comm_s, ex.codec_s, ex.nbytes
    )


def _exchange(name: str, work: Workload, p: int, net: Network) -> Exchange:
    """One step's link and codec seconds, bytes a rank sends and the seconds the step waits."""
    if name == "fp32" or name == "fp16_hook":
        width = 4 if name == "fp32" else 2
        traffic = _sum(ring_allreduce(width * b, p) for b in work.buckets)
        cast = 0.0 if name == "fp32" else work.timed("cast") * work.numel / work.cpu_share
        return _waited(net.inter.seconds(traffic.rounds, traffic.nbytes), cast, traffic.nbytes)
    if name.startswith("powersgd_r"):
        rank = _int_suffix(name, "powersgd_r")
        traffic = _torch_powersgd_traffic(work, p, rank)
        arithmetic = work.timed(f"powersgd-r{rank}") / work.cpu_share
        comm = net.inter.seconds(traffic.rounds, traffic.nbytes)
        return _waited(comm, arithmetic, traffic.nbytes)
    if name.startswith("hier["):
        return _sharded_hierarchical(name, work, p, net)
    if name.startswith("gradzip:"):
        return _gradzip(name, work, p, work.numels, net)
    raise ValueError(
        f"unknown variant {name!r}: write fp32, fp16_hook, powersgd_rN, "
        "gradzip:<compressor>[<params>][+ef]:<scheme> or hier[K]:gradzip:..."
    )


def _sharded_hierarchical(name: str, work: Workload, p: int, net: Network) -> Exchange:
    """``hier[K]:<gradzip spec>``: a ZeRO++-style design the library does not implement (a
    float32 ring inside the node, each rank's ``1/K`` shard exchanged between nodes); kept for
    comparison. Not an alias of ``gradzip:<codec>:hierarchical[ranks_per_node=K]``, the
    library's leader-based scheme (:mod:`~gradzip_lab.bench.project_rings`)."""
    inside, _, spec = name[len("hier[") :].partition("]:")
    try:
        k = int(inside)
    except ValueError:
        raise ValueError(f"{name!r}: write hier[K]:gradzip:... with K ranks a node") from None
    if k < 1 or not spec.startswith("gradzip:"):
        raise ValueError(f"{name!r}: K must be >= 1 and the exchange a gradzip:... spec")
    k = min(k, p)
    intra = _sum(ring_allreduce(4 * b, k) for b in work.buckets) if k > 1 else NO_TRAFFIC
    intra_s = net.intra.seconds(intra.rounds, intra.nbytes)
    nodes = p // k
    if nodes < 2:
        return Exchange(intra_s, 0.0, 0.0, intra_s)
    shards = [math.ceil(n / k) for n in work.numels]
    between = _gradzip(spec, work, nodes, shards, net)
    # [CHOICE] reported as comm = intra + the inter-node exchange as the step waits for it
    comm = intra_s + between.exposed_s
    return Exchange(comm, 0.0, between.nbytes + intra.nbytes, comm)


def _gradzip(spec_text: str, work: Workload, p: int, numels: list[int], net: Network) -> Exchange:
    """A gradzip exchange of tensors of ``numels`` among ``p`` ranks on ``net.inter`` (the
    hierarchical scheme's node links on ``net.intra``)."""
    from gradzip.schemes.spec import ExchangeSpec

    spec = ExchangeSpec.parse(spec_text)
    params = dict(spec.params)
    scheme = spec.scheme.name
    measure = work.codec(spec.compressor, params)
    ef = work.timed("ef") if spec.error_feedback else 0.0
    share = work.cpu_share
    if scheme == "ring_allreduce":
        return ring_allreduce_exchange(
            spec_text, measure, numels, p, net.inter, work.ring_hop, ef, share, work.overlap_codec
        )
    if scheme == "hierarchical":
        return hierarchical_exchange(
            spec_text,
            measure,
            numels,
            p,
            net.inter,
            net.intra,
            work.ring_hop,
            ef,
            share,
            work.overlap_codec,
        )
    traffic, codec, stages = _codec_traffic(spec, measure, ef, work, p, numels, net)
    comm = net.inter.traffic_seconds(traffic)
    if stages <= 1 or not work.overlap_codec:
        return _waited(comm, codec, traffic.nbytes)
    latency = net.inter.latency_seconds(traffic.rounds)
    exposed = pipelined_seconds(latency, comm - latency, codec, stages)
    return Exchange(comm, codec, traffic.nbytes, exposed)


def _waited(comm: float, codec: float, nbytes: float) -> Exchange:
    """An exchange whose codec and link work do not overlap."""
    return Exchange(comm, codec, nbytes, comm + codec)


def _codec_traffic(
    spec: ExchangeSpec,
    measure: CodecMeasure,
    ef: float,
    work: Workload,
    p: int,
    numels: list[int],
    net: Network,
) -> tuple[Traffic, float, int]:
    """(traffic, codec seconds, pipeline stages: 1 when the codec and the link do not overlap)
    of the schemes whose messages are codec payloads; the bytes of their all-to-alls (the
    integer sums' reduce-scatter always, the all-gathers where ``net`` sends them so) marked as
    such."""
    spec_text = str(spec)
    scheme = spec.scheme.name
    share = work.cpu_share
    n = sum(numels)
    buckets = max(1, len(work.buckets))
    if scheme in ("allgather", "nested"):
        gathered = measure.total_bytes(numels)
        traffic = _gathers(Traffic((p - 1) * buckets, (p - 1) * gathered), gathered / buckets, net)
        # a rank's CPU in a run of the scheme at min(P, 8) ranks (error feedback inside it),
        # plus one decode a coordinate for each rank past them ([CHOICE]: the decode's own
        # speed; the run's other work a rank, its framing and unpacking, is left out there)
        ranks = min(p, MAX_RANKS)
        run = work.timed(f"{SCHEME_CPU}{ranks}:{spec_text}")
        codec = n * (run + (p - ranks) * measure.decode_s_per_coord)
        return traffic, codec / share, buckets
    if scheme in ("ring", "allreduce"):
        chunks = [math.ceil(m / p) for m in numels]
        hop = float(measure.total_bytes(chunks))
        stages = 1
        if scheme == "allreduce":
            # a bucket's codes in one all-to-all at one code's width, then its sums (wider by
            # ceil(log2 P) bits) in one all-gather: P - 1 messages each way, a chunk
            bits = _code_bits(measure, chunks)
            widened = hop * (bits + math.ceil(math.log2(p))) / bits
            sums, chunked = _sum_chunks(spec, work.buckets or [n])
            scatter = Traffic((p - 1) * sums, (p - 1) * hop, alltoall_bytes=(p - 1) * hop)
            traffic = scatter + _gathers(
                Traffic((p - 1) * sums, (p - 1) * widened), widened / sums, net
            )
            stages = sums if chunked else 1
        else:
            traffic = Traffic(2 * (p - 1) * len(numels), 2 * (p - 1) * hop)
        if scheme == "allreduce":
            # the scheme run, not composed from the compressor's speeds (error feedback, where
            # the spec has it, is inside the run)
            ranks = min(p, MAX_RANKS)
            return traffic, n * work.timed(f"{SCHEME_CPU}{ranks}:{spec_text}") / share, stages
        coords = sum(chunks) * (p - 1)
        codec = coords * (measure.encode_s_per_coord + 2 * measure.decode_s_per_coord) + n * ef
        return traffic, codec / share, stages
    if scheme == "powersgd":
        options = dict(spec.scheme.options)
        rank = options.get("rank", 1)
        if not isinstance(rank, int):
            raise ValueError(f"{spec_text!r}: PowerSGD's rank must be an int")
        factors, whole, rounds = _factor_sizes(work, numels, rank)
        sent = measure.total_bytes(factors) + measure.total_bytes(whole)
        traffic = _gathers(Traffic((p - 1) * rounds, (p - 1) * sent), sent / rounds, net)
        coded = sum(factors) + sum(whole)
        # gradzip's own arithmetic (numba kernels), not torch's (BLAS): timed apart
        codec = work.timed(f"gradzip-powersgd-r{rank}") + coded * (
            measure.encode_s_per_coord + p * measure.decode_s_per_coord
        )
        return traffic, codec / share, 1
    raise ValueError(f"{spec_text!r}: the model has no cost for scheme {scheme!r}")


def _gathers(traffic: Traffic, slot_bytes: float, net: Network) -> Traffic:
    """``traffic`` of all-gathers of ``slot_bytes``-byte payloads, its bytes marked as an
    all-to-all's where the transport sends them so (:meth:`Network.gathers_as_alltoall`).
    [CHOICE] One slot size for a step's gathers, their mean: the buckets of a model are of one
    size but the last."""
    if not net.gathers_as_alltoall(slot_bytes):
        return traffic
    return replace(traffic, alltoall_bytes=traffic.nbytes)


def _sum_chunks(spec: ExchangeSpec, buckets: list[int]) -> tuple[int, bool]:
    """The chunks ``allreduce`` sums a step's ``buckets`` in (its ``chunk_values``, else the
    scheme's default; None: one a bucket), and whether it chunks. [CHOICE] chunks are modelled
    as a pipeline of that many stages, the codec's work overlapping the link's but for one
    stage (as the all-gather's buckets); one chunk a bucket: the codec and the link add."""
    from gradzip.schemes._ring_ints import DEFAULT_CHUNK_VALUES

    chunk = dict(spec.scheme.options).get("chunk_values", DEFAULT_CHUNK_VALUES)
    if chunk is None:
        return len(buckets), False
    if not isinstance(chunk, int) or isinstance(chunk, bool):
        raise ValueError(f"{spec}: chunk_values must be an int or none")
    return sum(max(1, math.ceil(b / chunk)) for b in buckets), True


def _factor_sizes(work: Workload, numels: list[int], rank: int) -> tuple[list[int], list[int], int]:
    """The element counts of the PowerSGD factors (P and Q of each compressed matrix), of the
    tensors sent whole, and the all-gathers a step takes (two a matrix, one for the rest)."""
    factors: list[int] = []
    whole = [m for s, m in zip(work.shapes, numels, strict=True) if len(s) < 2]
    for rows, cols in matrix_shapes(work.shapes):
        if powersgd_compresses(rows, cols, rank):
            factors += [rows * rank, cols * rank]
        else:
            whole.append(rows * cols)
    return factors, whole, len(factors) + 1


def _code_bits(measure: CodecMeasure, chunks: list[int]) -> float:
    """The measured bits a coordinate of the chunks' payloads (at least 1)."""
    return max(1.0, 8 * measure.total_bytes(chunks) / max(1, sum(chunks)))


def _torch_powersgd_traffic(work: Workload, p: int, rank: int) -> Traffic:
    factors: list[int] = []
    whole = [int(s.numel()) for s in work.shapes if len(s) < 2]
    for rows, cols in matrix_shapes(work.shapes):
        if powersgd_compresses(rows, cols, rank):
            factors += [rows * rank, cols * rank]
        else:
            whole.append(rows * cols)
    buckets = len(work.buckets)
    p_q = sum(factors)
    traffic = ring_allreduce(4 * (p_q + sum(whole)), p)
    # three all-reduces a bucket (the uncompressed tensors, P, Q), each 2(P-1) rounds
    return Traffic(3 * buckets * 2 * (p - 1), traffic.nbytes)


def _int_suffix(name: str, prefix: str) -> int:
    try:
        value = int(name[len(prefix) :])
    except ValueError:
        raise ValueError(f"{name!r}: write {prefix}N with N >= 1") from None
    if value < 1:
        raise ValueError(f"{name!r}: write {prefix}N with N >= 1")
    return value


def _sum(parts: Any) -> Traffic:
    total = NO_TRAFFIC
    for part in parts:
        total = total + part
    return total
