"""The emulated cluster of ``gradzip bench cluster``: network namespaces, veth pairs, a bridge, tbf.

Topology for ``P`` ranks in nodes of ``K`` (``--ranks-per-node``, default 1; which rank is on
which node: :class:`~.cluster_topology.Topology`), built by :class:`ClusterNetwork` (names carry
the launcher's pid, so concurrent runs never collide)::

    netns gzc<pid>n0: lo, veth0 10.213.<run>.1/24  --veth--  n0 ┐   ranks 0 .. K-1
    netns gzc<pid>n1: lo, veth0 10.213.<run>.2/24  --veth--  n1 ├ br0 in netns gzc<pid>b
    ...                                                         ┘

The K ranks of a node run in its namespace and bind its one address: between them traffic
goes over the namespace's loopback (no limit, not on the veth), between nodes over the veths.

Every device is created directly inside the cluster's own namespaces (``ip -n NS link add
veth0 type veth peer name rK netns BRIDGE``): the host's network namespace, its devices, addresses
and routes are never touched, and the namespaces have no route anywhere else.

A rate limit puts ``tc qdisc ... root tbf rate R burst B latency L`` on BOTH ends of every
link: the node's ``veth0`` (what the node sends) and the bridge's ``nN`` (what it receives), so
each node's uplink and downlink both run at ``R``, as on a switched cluster with a NIC of rate
``R`` per node. ``none`` removes the qdiscs (veth then runs at memory speed). [CHOICE] tbf only
(the kernel these benchmarks ran on has no netem, so no added delay): burst is 2 ms of the rate
but at least 64 KiB (veth hands over GSO packets of up to 64 KiB, and a burst smaller than a
packet makes tbf segment or drop it), latency (the most a packet may wait in the queue) 50 ms.

Teardown deletes the namespaces (deleting a namespace deletes its veth ends and the bridge);
:func:`sweep_stale` deletes namespaces left by launchers that died (names with the prefix whose
pid no longer exists), never those of a live process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from gradzip.errors import GradzipError
from gradzip_lab.bench.cluster_topology import Topology

PREFIX = "gzc"
RANK_DEVICE = "veth0"  # the node's end of its link, inside the node's namespace
BRIDGE_DEVICE = "br0"
# r<rank>: the names of launchers from before nodes held several ranks, still swept
_OWN_NAME = re.compile(rf"^{PREFIX}(\d+)(?:[nr]\d+|b)$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}  # tc's units: powers of 10
MIN_BURST_BYTES = 64 * 1024
BURST_SECONDS = 0.002
LATENCY = "50ms"


class ClusterSetupError(GradzipError):
    """A command that builds or changes the emulated cluster failed."""


def parse_rate(text: str) -> int | None:
    """Bits per second of a tc rate (``100mbit``, ``1gbit``, ``500kbit``), None for ``none``.

    Raises ``ValueError`` naming the accepted forms otherwise."""
    key = text.strip().lower()
    if key == "none":
        return None
    match = _RATE.match(key)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(
            f"bad rate {text!r}: give a number with a unit bit, kbit, mbit or gbit (e.g. 100mbit, "
            "1gbit), or none"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def tbf_arguments(rate: str) -> list[str]:
    """``tc qdisc`` arguments of the tbf for ``rate`` (see the module docstring for the burst)."""
    bits = parse_rate(rate)
    if bits is None:
        raise ValueError("rate none has no tbf")
    burst = max(MIN_BURST_BYTES, int(bits / 8 * BURST_SECONDS))
    return ["tbf", "rate", rate.strip().lower(), "burst", str(burst), "latency", LATENCY]


def missing_privilege() -> str | None:
    """Why the cluster cannot be built here (not root, ``ip`` or ``tc`` missing), or None:
    what is needed, ``needs ...``, for the caller to put after what needs it."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc); run it as root"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"needs the {' and '.join(missing)} command (iproute2)"
    return None


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise ClusterSetupError(
            f"`{' '.join(argv)}` failed (exit {done.returncode}): {done.stderr.strip()}"
        )
    return done


def list_namespaces() -> list[str]:
    """The names in ``ip netns list`` (each line's first word)."""
    out = _run("ip", "netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Delete the namespaces named by :class:`ClusterNetwork` for a pid that no longer exists;
    returns their names. Namespaces of live launchers (this one included) stay."""
    removed = []
    for name in list_namespaces():
        match = _OWN_NAME.match(name)
        if match and not _pid_alive(int(match.group(1))):
            _run("ip", "netns", "del", name, check=False)
            removed.append(name)
    return removed


@dataclass
class ClusterNetwork:
    """``world_size`` ranks in node namespaces of ``ranks_per_node`` joined through a bridge
    namespace (see the module doc).

    ``run`` is the third octet of the addresses (they exist inside these namespaces only)."""

    world_size: int
    run: int = 0
    pid: int = field(default_factory=os.getpid)
    built: list[str] = field(default_factory=list)  # namespaces created so far, for teardown
    ranks_per_node: int = 1

    @property
    def topology(self) -> Topology:
        return Topology(self.world_size, self.ranks_per_node)

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.pid}b"

    def node_namespace(self, node: int) -> str:
        return f"{PREFIX}{self.pid}n{node}"

    def rank_namespace(self, rank: int) -> str:
        """The namespace of ``rank``'s node."""
        return self.node_namespace(self.topology.node_of(rank))

    def address(self, rank: int) -> str:
        """The address ``rank`` binds: its node's veth address."""
        return self.topology.rank_address(rank, self.run)

    def setup(self) -> None:
        """Create the namespaces, links, bridge and addresses (no rate limit yet). On failure
        whatever was built is torn down before the error propagates."""
        topology = self.topology  # a bad node size fails before anything is built
        try:
            self._add_namespace(self.bridge)
            br = self.bridge
            _run("ip", "-n", br, "link", "add", BRIDGE_DEVICE, "type", "bridge")
            _run("ip", "-n", br, "link", "set", BRIDGE_DEVICE, "up")
            for node in range(topology.nodes):
                ns = self.node_namespace(node)
                self._add_namespace(ns)
                port = f"n{node}"
                _run(
                    "ip", "-n", ns, "link", "add", RANK_DEVICE, "type", "veth",
                    "peer", "name", port, "netns", br,
                )  # fmt: skip
                _run("ip", "-n", br, "link", "set", port, "master", BRIDGE_DEVICE)
                _run("ip", "-n", br, "link", "set", port, "up")
                address = topology.node_address(node, self.run)
                _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", RANK_DEVICE)
                _run("ip", "-n", ns, "link", "set", RANK_DEVICE, "up")
        except BaseException:
            self.teardown()
            raise

    def _add_namespace(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self.built.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")
        # no IPv6 (router solicitations, DAD) in the cluster: only the ranks' traffic moves
        # the veth counters; set before the veth exists, so it inherits the default
        for conf in ("all", "default"):
            _run(
                "ip", "netns", "exec", name, "sh", "-c",
                f"echo 1 > /proc/sys/net/ipv6/conf/{conf}/disable_ipv6",
                check=False,
            )  # fmt: skip

    def links(self) -> list[tuple[str, str]]:
        """Every ``(namespace, device)`` that carries a qdisc: both ends of each node's link."""
        ends = []
        for node in range(self.topology.nodes):
            ends.append((self.node_namespace(node), RANK_DEVICE))
            ends.append((self.bridge, f"n{node}"))
        return ends

    def set_rate(self, rate: str) -> None:
        """Limit both ends of every link to ``rate`` (tbf), or lift the limit (``none``)."""
        for ns, dev in self.links():
            if parse_rate(rate) is None:
                # no qdisc of ours yet is fine: deleting then fails, and the link is unlimited
                _run("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
            else:
                _run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *tbf_arguments(rate))

    def qdiscs(self) -> dict[str, str]:
        """``tc qdisc show`` of every link end, for the record."""
        return {
            f"{ns}:{dev}": _run("tc", "-n", ns, "qdisc", "show", "dev", dev).stdout.strip()
            for ns, dev in self.links()
        }

    def teardown(self) -> list[str]:
        """Delete every namespace this cluster created; returns the names still listed after
        (empty when all went)."""
        for name in reversed(self.built):
            _run("ip", "netns", "del", name, check=False)
        mine = set(self.built)
        self.built = []
        return [name for name in list_namespaces() if name in mine]

    def exec_prefix(self, rank: int) -> list[str]:
        """The argv prefix that runs a command inside the namespace of ``rank``'s node."""
        return ["ip", "netns", "exec", self.rank_namespace(rank)]
