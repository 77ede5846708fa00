"""Which ranks of ``gradzip bench cluster`` share a node, and a hierarchical variant's node size.

A *node* is one network namespace of the emulated cluster (:mod:`.cluster_netns`) holding
``ranks_per_node`` (K) consecutive ranks, node ``n`` the ranks ``[n K, (n + 1) K)``, as a
launcher places the processes of one multi-GPU machine. The node has one address (its
``veth0``); the K ranks all bind it (``GLOO_SOCKET_IFNAME=veth0``) and differ by port. A packet
between two ranks of one node goes to an address of the namespace itself, which the kernel
routes over the namespace's loopback device: no rate limit and no count on the veth, as
between the processes of one machine. Between nodes it crosses both rate-limited veth ends.
So a veth's counters are a *node's* bytes; a rank's share is the node's divided by K.

[CHOICE] P must be a multiple of K (every node full, as on a cluster of identical machines); a
K that does not divide P is an error naming both.

A gradzip variant whose scheme takes a ``ranks_per_node`` option (the hierarchical scheme) gets
it from ``--ranks-per-node`` where the variant does not say it (:func:`with_ranks_per_node`), and
an error naming both numbers where the two disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the scheme option a hierarchical scheme takes its node size from
RANKS_PER_NODE_OPTION = "ranks_per_node"
ADDRESS_PREFIX = "10.213"  # only inside the cluster's own namespaces


@dataclass(frozen=True)
class Topology:
    """``world_size`` ranks in nodes of ``ranks_per_node`` consecutive ranks."""

    world_size: int
    ranks_per_node: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.ranks_per_node < 1:
            raise ValueError(
                f"world size ({self.world_size}) and ranks per node ({self.ranks_per_node}) must "
                "be >= 1"
            )
        if self.world_size % self.ranks_per_node:
            raise ValueError(
                f"{self.world_size} ranks do not fill nodes of {self.ranks_per_node}: the world "
                "size must be a multiple of --ranks-per-node"
            )
        if self.nodes > 254:
            raise ValueError(f"{self.nodes} nodes: at most 254 fit the cluster's /24 subnet")

    @property
    def nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    def node_of(self, rank: int) -> int:
        """The node that holds ``rank``; ``ValueError`` outside ``[0, world_size)``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not in [0, {self.world_size})")
        return rank // self.ranks_per_node

    def ranks_of(self, node: int) -> range:
        """The ranks node ``node`` holds."""
        if not 0 <= node < self.nodes:
            raise ValueError(f"node {node} is not in [0, {self.nodes})")
        return range(node * self.ranks_per_node, (node + 1) * self.ranks_per_node)

    def node_address(self, node: int, run: int = 0) -> str:
        """Node ``node``'s veth address; ``run`` (the third octet) tells clusters apart."""
        if not 0 <= node < self.nodes:
            raise ValueError(f"node {node} is not in [0, {self.nodes})")
        return f"{ADDRESS_PREFIX}.{run % 256}.{node + 1}"

    def rank_address(self, rank: int, run: int = 0) -> str:
        """The address ``rank`` binds and is reached at: its node's."""
        return self.node_address(self.node_of(rank), run)

    def same_node(self, a: int, b: int) -> bool:
        """Whether ranks ``a`` and ``b`` talk over a node's loopback (no rate limit)."""
        return self.node_of(a) == self.node_of(b)


def with_ranks_per_node(name: str, ranks_per_node: int) -> str:
    """The variant ``name`` with its scheme's ``ranks_per_node`` set to ``ranks_per_node``
    where the scheme takes that option and the name does not give it; other names unchanged.

    ``ValueError`` naming both numbers where the name gives another value. Names that are no
    exchange spec (``fp32``), or whose scheme or compressor is unknown, come back unchanged:
    :func:`.cluster_variants.select` reports those."""
    if not name.startswith("gradzip:"):
        return name
    from gradzip.schemes.spec import ExchangeSpec, SchemeSpec, option_hints

    try:
        spec = ExchangeSpec.parse(name)
    except ValueError:
        return name  # unknown scheme (not on this branch) or a typo: select() names it
    if RANKS_PER_NODE_OPTION not in option_hints(spec.scheme.scheme_class):
        return name
    options = spec.scheme.kwargs()
    given = options.get(RANKS_PER_NODE_OPTION)
    if given is not None and given != ranks_per_node:
        raise ValueError(
            f"variant {name} says {RANKS_PER_NODE_OPTION}={given} but --ranks-per-node is "
            f"{ranks_per_node}: give the same number (or leave it out of the variant)"
        )
    options[RANKS_PER_NODE_OPTION] = ranks_per_node
    scheme = SchemeSpec.of(spec.scheme.name, **options)
    return str(ExchangeSpec.of(spec.compressor, dict(spec.params), spec.error_feedback, scheme))
