"""A transport over some ranks of another: the node leaders of a hierarchical scheme."""

from __future__ import annotations

from collections.abc import Sequence

from gradzip.comm.transport import Payload, Send, Transport


class SubgroupTransport(Transport):
    """The ranks ``members`` (parent ranks, in their new order) of ``parent`` as a group of
    their own: rank ``i`` here is ``members[i]`` there.

    Messages travel on the parent's primitive (so a simulated group stays simulated, a gloo
    group gloo) and are counted on the parent's meter, under the collective names the
    subgroup's callers give. Every member must issue the same subgroup collectives in the same
    order, interleaved the same way with its own parent traffic, as for any collective.
    """

    def __init__(self, parent: Transport, members: Sequence[int]) -> None:
        members = list(members)
        if len(set(members)) != len(members):
            raise ValueError(f"a subgroup lists some rank twice: {members}")
        for member in members:
            parent._check_peer(member)
        if parent.rank not in members:
            raise ValueError(f"rank {parent.rank} is not a member of the subgroup {members}")
        super().__init__(members.index(parent.rank), len(members))
        self.parent = parent
        self.members = members
        self.meter = parent.meter  # [CHOICE] one meter: a step's bytes are the rank's bytes

    def _transfer(
        self, sends: Sequence[Send], sources: Sequence[int]
    ) -> list[tuple[Payload, bool]]:
        mapped = [(self.members[dst], data, ok) for dst, data, ok in sends]
        return self.parent._transfer(mapped, [self.members[src] for src in sources])
