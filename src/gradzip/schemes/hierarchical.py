"""Two-level allreduce: full precision inside a node, the compressed ring between nodes."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from gradzip.comm.subgroup import SubgroupTransport
from gradzip.comm.transport import Transport, host_bytes, in_step_scope
from gradzip.compressors.base import Compressor
from gradzip.errors import NonFiniteInputError
from gradzip.feedback import working_dtype
from gradzip.finite import all_finite
from gradzip.keys import StreamKey
from gradzip.schemes._messages import abort_notice, abort_reason, pack_floats, unpack_floats
from gradzip.schemes._pipelined_ring import DEFAULT_CHUNK_VALUES
from gradzip.schemes.base import FINITE_CHECK, Scheme
from gradzip.schemes.ring_allreduce import RingAllreduce

#: the key chunks of the float32 messages inside a node (beyond any ring chunk of a tensor)
_TO_LEADER_CHUNK = 2**40
_FROM_LEADER_CHUNK = 2**40 + 1


def ranks_per_node_from_environment() -> int:
    """The ranks of one node when a spec does not say: torchrun's ``LOCAL_WORLD_SIZE`` where it
    is set (the processes it started on this machine), else 1, one rank per node, which makes
    the scheme the leaders' ``ring_allreduce`` over every rank [CHOICE: a spec without the
    option still runs, as every other scheme's does; ``gradzip bench cluster`` fills it in from
    ``--ranks-per-node``]."""
    text = os.environ.get("LOCAL_WORLD_SIZE", "")
    if not text:
        return 1
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"hierarchical: LOCAL_WORLD_SIZE={text!r} is not a positive int")
    return int(text)


class Hierarchical(Scheme):
    """Ranks ``[n K, (n+1) K)`` form node ``n`` (``K = ranks_per_node``); rank ``n K`` is its
    leader.

    1. **Inside the node, up.** Every other rank sends its tensor in float32 to the leader,
       which adds them in rank order and divides by ``K`` (the node mean).
    2. **Between nodes.** The ``N = P / K`` leaders run :class:`~gradzip.schemes.
       ring_allreduce.RingAllreduce` on their node means (its common scale, integer codes and
       pipelined ring at one code's width), over a :class:`~gradzip.comm.subgroup.
       SubgroupTransport` of the leaders: the mean of the node means is the mean of all ranks.
    3. **Inside the node, down.** The leader sends that mean in float32 to the other ranks.

    [CHOICE] one leader per node (not a reduce-scatter inside the node with every local rank
    handling its shard across nodes): simplest, and the intra-node links (NVLink, shared
    memory) are far faster than the inter-node one, which carries the same bytes either way.

    Bytes per rank and step: inside a node, a non-leader sends and receives ``4 n`` (plus a
    header each); the leader receives and sends ``(K-1) 4 n``. Between nodes, each leader sends
    about ``2 (N-1)/N`` of one compressed payload (``n b`` bits plus the scales; see
    ``ring_allreduce``); non-leaders send nothing between nodes.

    Variance: that of ``ring_allreduce`` over ``N`` ranks whose inputs are the node means (the
    intra-node steps are exact up to float32 rounding): for DQSG ``sigma^2 / (12 M^2 N)`` with
    ``sigma`` the largest node-mean entry, plus the partial-sum re-quantizations. Unbiased.

    Error feedback: role ``"worker"`` on the leaders (the residual of their node mean's
    quantization); the other ranks keep empty buffers.

    A rank whose tensor holds NaN or Inf raises :class:`~gradzip.errors.NonFiniteInputError`
    before sending; :meth:`reduce_if_all_finite` agrees on the flags first, so every rank
    learns which ranks were down and nothing is updated. Finite inputs whose node sum
    overflows float32: the leader raises the same error and sends its members an abort notice
    in place of the node mean, so they raise it too at once rather than at their timeout (in a
    batch every leader learns it from the leaders' flag all-gather; in :meth:`reduce` the
    other nodes' leaders, which learn nothing, still wait for the ring).

    Batches (:meth:`reduce_many_if_all_finite`, a DDP bucket's parameters): one flag
    all-gather, one float32 message up and one down inside the node for the whole batch, and
    between the leaders ``ring_allreduce``'s batch (one max ring, a code ring per tensor):
    bit-identical to one by one.
    """

    name = "hierarchical"
    feedback_roles = ("worker",)

    @classmethod
    def check_compatible(cls, compressor: Compressor) -> None:
        RingAllreduce.check_compatible(compressor)

    def __init__(
        self,
        compressor: Compressor,
        *,
        run_seed: int = 0,
        error_feedback: bool = False,
        ranks_per_node: int | None = None,
        chunk_values: int = DEFAULT_CHUNK_VALUES,
    ) -> None:
        super().__init__(compressor, run_seed=run_seed, error_feedback=False)
        if ranks_per_node is not None and (
            isinstance(ranks_per_node, bool)
            or not isinstance(ranks_per_node, int)
            or ranks_per_node < 1
        ):
            raise ValueError(
                f"hierarchical: ranks_per_node must be a positive int, got {ranks_per_node!r}"
            )
        self.ranks_per_node = ranks_per_node
        self.inner = RingAllreduce(
            compressor, run_seed=run_seed, error_feedback=error_feedback, chunk_values=chunk_values
        )
        # the leaders' residuals live in the inner scheme; snapshots and checkpoints see them
        self.feedback = self.inner.feedback
        self.produced = self.inner.produced

    @property
    def run_seed(self) -> int:
        """The run seed, shared with the leaders' inner scheme (whose keys name the messages
        between nodes): setting it sets both."""
        return self._run_seed

    @run_seed.setter
    def run_seed(self, value: int) -> None:
        self._run_seed = value
        inner = self.__dict__.get("inner")
        if inner is not None:
            inner.run_seed = value

    def check_group(self, world_size: int) -> int:
        """``ranks_per_node`` (when not given: :func:`ranks_per_node_from_environment`), after
        checking it divides ``world_size`` (every rank raises the same ``ValueError`` before
        sending anything)."""
        k = self.ranks_per_node
        if k is None:
            k = ranks_per_node_from_environment()
        if world_size % k:
            raise ValueError(
                f"hierarchical: ranks_per_node={k} does not divide the world size {world_size}"
            )
        return k

    @in_step_scope
    def reduce(
        self, transport: Transport, tensor: torch.Tensor, step: int, tensor_index: int = 0
    ) -> torch.Tensor:
        k = self.check_group(transport.world_size)
        rank = transport.rank
        leader = rank - rank % k
        n = tensor.numel()
        x = tensor.detach().reshape(-1).to("cpu", torch.float32)
        if not all_finite([x]):
            raise NonFiniteInputError(
                f"{self.compressor.name}: cannot reduce a tensor holding NaN or Inf; nothing was "
                "updated"
            )
        up = self.key(rank, step, tensor_index, _TO_LEADER_CHUNK)
        down = self.key(leader, step, tensor_index, _FROM_LEADER_CHUNK)
        if rank != leader:
            transport.send_bytes(leader, pack_floats(x, up), "node_reduce")
            got = host_bytes(transport.recv_bytes(leader, "node_broadcast"))
            _raise_if_abandoned(got, rank, leader, step)
            mean = unpack_floats(got, n, down)
        else:
            total = x.clone()
            for member in range(leader + 1, leader + k):
                got = host_bytes(transport.recv_bytes(member, "node_reduce"))
                total += unpack_floats(
                    got, n, self.key(member, step, tensor_index, _TO_LEADER_CHUNK)
                )
            node_mean = total.div_(k).view(tensor.shape)
            leaders = SubgroupTransport(transport, range(0, transport.world_size, k))
            try:
                mean = self.inner.reduce(leaders, node_mean, step, tensor_index).reshape(-1)
            except NonFiniteInputError as err:  # the node sum overflowed float32
                _abandon(transport, leader, k, err, down)
                raise
            mean = mean.to(torch.float32)
            message = pack_floats(mean, down)
            for member in range(leader + 1, leader + k):
                transport.send_bytes(member, message, "node_broadcast")
        return mean.view(tensor.shape).to(working_dtype(tensor.dtype))

    @in_step_scope
    def reduce_many_if_all_finite(
        self,
        transport: Transport,
        tensors: Sequence[torch.Tensor],
        indices: Sequence[int],
        step: int,
        finite: bool,
    ) -> tuple[list[torch.Tensor], list[int]]:
        """The means of ``tensors`` with one flag all-gather (every value of every tensor
        scanned for this rank's flag; counted under ``"finite_check"``), then, when every flag
        is up, ONE float32 message from each rank to its leader carrying every tensor, the
        leaders' :meth:`~gradzip.schemes._grid_scheme.GridScheme.reduce_many_if_all_finite`
        (one max ring for the scales) and ONE message back: the bytes of one by one less the
        headers and length prefixes of ``2 (K-1)`` node messages and ``2 (N-1)`` scale messages
        per extra tensor. The node sums add the same values in the same order, so every mean is
        bit-identical to :meth:`reduce` one tensor at a time. When some rank's flag is down,
        every rank returns ``([], down)`` having sent nothing else, nothing updated."""
        if len(tensors) != len(indices) or not tensors:
            raise ValueError(
                f"reduce_many_if_all_finite needs at least one tensor and one index per tensor, "
                f"got {len(tensors)} tensors and {len(indices)} indices"
            )
        k = self.check_group(transport.world_size)
        rank = transport.rank
        leader = rank - rank % k
        flat = [t.detach().reshape(-1).to("cpu", torch.float32) for t in tensors]
        finite = finite and all_finite(flat)
        _, down = transport.all_gather_flagged(b"\x01" if finite else b"\x00", finite, FINITE_CHECK)
        if down:
            return [], down
        sizes = [x.numel() for x in flat]
        first = indices[0]
        up = self.key(rank, step, first, _TO_LEADER_CHUNK)
        from_leader = self.key(leader, step, first, _FROM_LEADER_CHUNK)
        if rank != leader:
            transport.send_bytes(leader, pack_floats(torch.cat(flat), up), "node_reduce")
            got = host_bytes(transport.recv_bytes(leader, "node_broadcast"))
            _raise_if_abandoned(got, rank, leader, step)
            joined = unpack_floats(got, sum(sizes), from_leader)
        else:
            total = torch.cat(flat)  # a new tensor: the node sum, in rank order as in reduce
            for member in range(leader + 1, leader + k):
                got = host_bytes(transport.recv_bytes(member, "node_reduce"))
                total += unpack_floats(
                    got, total.numel(), self.key(member, step, first, _TO_LEADER_CHUNK)
                )
            node_means = [
                part.view(t.shape)
                for part, t in zip(torch.split(total.div_(k), sizes), tensors, strict=True)
            ]
            leaders = SubgroupTransport(transport, range(0, transport.world_size, k))
            means, lost = self.inner.reduce_many_if_all_finite(
                leaders, node_means, indices, step, True
            )
            if lost:  # a node sum overflowed float32: finite inputs, infinite node mean
                error = NonFiniteInputError(
                    f"hierarchical: the node means of leader(s) {[i * k for i in lost]} overflowed "
                    f"float32 at step {step}; nothing was updated"
                )
                _abandon(transport, leader, k, error, from_leader)
                raise error
            joined = torch.cat([m.reshape(-1).to(torch.float32) for m in means])
            message = pack_floats(joined, from_leader)
            for member in range(leader + 1, leader + k):
                transport.send_bytes(member, message, "node_broadcast")
        return [
            part.view(t.shape).to(working_dtype(t.dtype))
            for part, t in zip(torch.split(joined, sizes), tensors, strict=True)
        ], []


def _abandon(
    transport: Transport, leader: int, k: int, error: BaseException, key: StreamKey
) -> None:
    """The leader's notice to its node's members that the step failed (they wait for the node
    mean and would otherwise sit until their timeout), in place of the mean."""
    notice = abort_notice(error, key)
    for member in range(leader + 1, leader + k):
        transport.send_bytes(member, notice, "node_broadcast")


def _raise_if_abandoned(received: bytes, rank: int, leader: int, step: int) -> None:
    """A member's :class:`~gradzip.errors.NonFiniteInputError` when its leader sent an abort
    notice instead of the node mean: the same error class on every rank of the node, so a
    caller's handling (skip or raise) is the same everywhere."""
    reason = abort_reason(received)
    if reason is not None:
        raise NonFiniteInputError(
            f"hierarchical: rank {rank}'s node leader (rank {leader}) abandoned step {step}, "
            f"nothing was updated: {reason}"
        )
