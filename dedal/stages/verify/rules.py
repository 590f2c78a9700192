"""The rules: one table of what a fact means on a host (issue 38; ReFrame's "declare, judge
once"); the one judge that applies it is :mod:`dedal.stages.verify.judge`.

A :class:`Rule` is a row: a finding ``code``; **when** it fires: the fact it reads (``hardware:fact``:
a :class:`~dedal.stages.verify.facts.Seen` such as ``ucx:tcp`` or a measured
:class:`~dedal.stages.verify.facts.Fact` such as ``host:latency_small_us`` with its range), the
``scope`` it was seen in, conditions on the host (``host``: ``fabric``, ``multi_node``, ``gpus``,
``gpu_p2p``, ``gdrdma``; ``None`` is "unknown"), a regular expression one of the seen items must
match (``match``); its ``severity``, implied verdict and ``message``. Of the rows a fact matches,
the most specific one (most host conditions, then a ``match``) gives the finding; a site's row of
the same specificity replaces dedal's.

A row whose code is ``*`` is a **context** row: it fires no finding of its own but re-grades every
finding whose row ``means`` the same (``tcp``: the traffic went over TCP) in its scope and host
conditions. "TCP between nodes is fine on nodes without an RDMA network" is the one such row
(:data:`TCP_BETWEEN_NODES_WITHOUT_FABRIC`): UCX, Open MPI and NCCL over TCP and the latency or bus
bandwidth that TCP gives are graded alike, for run logs, ``dedal verify parse`` and the preflight.

:func:`check_table` says what is wrong with a table (a site's rows included);
:func:`rules_from_config` reads a site's rows (``dedal.verify.rules`` of the environment file).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from dedal.errors import UserError
from dedal.stages.verify.facts import FACTS, SEEN
from dedal.stages.verify.findings import SEVERITIES, VERDICTS

#: the conditions on the host a row may name
HOST_KEYS = ("fabric", "multi_node", "gpus", "gpu_p2p", "gdrdma")


@dataclass(frozen=True)
class Rule:
    """One row (see the module). ``hardware``: the class of a measured fact (``host``, ``cuda``,
    ``nccl``) or the stack of a seen one (``ucx``, ``ompi``, ``nccl``, ``ucx-info``, ``slurm``);
    ``fact``: its name. A measured row fires for a value ``>= at_least`` and ``< below`` (either
    may be None), absolute or times the best value of the reference fact ``of``; ``unless``: not
    judged where one of these facts (measured or seen) is there. ``message`` is formatted with
    ``items``, ``scope``, ``detail`` (seen) or ``subject``, ``value``, ``unit``, ``limit`` and, with
    ``of``, ``ref``, ``ref_value``, ``ratio`` (measured); a context row's with ``message``."""

    code: str
    hardware: str
    fact: str
    message: str
    at_least: Optional[float] = None
    below: Optional[float] = None
    of: str = ""
    scope: str = ""
    unless: Tuple[str, ...] = ()
    severity: str = "error"
    verdict: Optional[str] = None
    host: Tuple[Tuple[str, Any], ...] = ()
    match: str = ""
    means: str = ""
    origin: str = "dedal"

    @property
    def key(self) -> str:
        return f"{self.hardware}:{self.fact}"

    @property
    def measured(self) -> bool:
        return self.at_least is not None or self.below is not None

    @property
    def context(self) -> bool:
        return self.code == "*"

    @property
    def specificity(self) -> int:
        return 2 * len(self.host) + (1 if self.match else 0)

    def signature(self) -> Tuple[Any, ...]:
        """What makes two rows the same row (a site's row replaces dedal's of the same signature)."""
        return (self.code, self.key, self.scope, self.host, self.match)


def rule(code: str, on: str, message: str, *, host: Optional[Mapping[str, Any]] = None, **kw: Any) -> Rule:
    """A row from ``on`` (``hardware:fact``) and ``host`` as a mapping."""
    hardware, _, fact = on.partition(":")
    return Rule(code, hardware, fact, message, host=tuple(sorted((host or {}).items())), **kw)


_TCP_INTRA = "the traffic within a node should use shared memory"
#: the one row that says TCP between nodes is what nodes without an RDMA network have
TCP_BETWEEN_NODES_WITHOUT_FABRIC = rule(
    "*",
    "*:*",
    "{message} (expected here: no RDMA network between the nodes)",
    means="tcp",
    scope="inter-node",
    host={"fabric": False},
    severity="info",
)

RULES: Tuple[Rule, ...] = (
    # --- TCP: within a node always a fallback; between nodes where the nodes have a fabric ----------
    rule(
        "ucx-tcp-intra-node",
        "ucx:tcp",
        "UCX uses TCP within a node ({items}){detail} instead of shared memory",
        scope="intra-node",
    ),
    rule(
        "ucx-tcp-inter-node",
        "ucx:tcp",
        "UCX uses TCP between nodes ({items}){detail} where an RDMA transport is expected: a TCP fallback",
        scope="inter-node",
        means="tcp",
    ),
    rule("ucx-tcp-transport", "ucx:tcp", "UCX uses TCP ({items}){detail}", scope="unknown", means="tcp"),
    rule(
        "ucx-tcp-self",
        "ucx:tcp-self",
        "UCX selected TCP ({items}) even for loopback; shared memory transports are excluded",
        scope="self",
        severity="warning",
    ),
    rule(
        "ompi-tcp-intra-node",
        "ompi:tcp",
        "Open MPI sends to peers on the same node over the tcp BTL instead of shared memory (sm/vader)",
        scope="intra-node",
    ),
    rule(
        "ompi-tcp-inter-node",
        "ompi:tcp",
        "Open MPI sends to other nodes over the tcp BTL where an RDMA network is expected: a TCP fallback",
        scope="inter-node",
        means="tcp",
    ),
    rule(
        "nccl-socket-transport",
        "nccl:tcp",
        "NCCL uses TCP sockets between nodes ({items}), not InfiniBand/RoCE or another RDMA network: a socket fallback",
        scope="inter-node",
        means="tcp",
    ),
    TCP_BETWEEN_NODES_WITHOUT_FABRIC,
    # --- the fabric is there and the stack does not use it ----------------------------------------
    rule(
        "nccl-fabric-unused",
        "nccl:socket-network",
        "NCCL runs over TCP sockets ({items}) on a system with a "
        "high-speed fabric: the fabric's network is missing or unusable (IB verbs or the device not reachable, "
        "or the libfabric plugin aws-ofi-nccl that Slingshot and EFA need not found): a socket fallback",
        scope="inter-node",
        host={"fabric": True},
    ),
    rule("ucx-device-unavailable", "ucx:device-unavailable", "UCX: {detail}: a TCP fallback", scope="inter-node"),
    rule(
        "ucx-device-unavailable",
        "ucx:device-unavailable",
        "UCX was asked for a network device that this host does not have: {detail}",
        scope="inter-node",
        host={"fabric": False},
        severity="warning",
    ),
    rule("ucx-transport-unavailable", "ucx:transport-unavailable", "UCX: {detail}", scope="inter-node"),
    rule(
        "ucx-transport-unavailable",
        "ucx:transport-unavailable",
        "UCX was asked for transports that this host does not have: {detail}",
        scope="inter-node",
        host={"fabric": False},
        severity="warning",
    ),
    rule(
        "ucx-no-rdma-inter-node",
        "ucx:no-rdma",
        "no RDMA transport between nodes ({items})",
        scope="inter-node",
        host={"fabric": True, "multi_node": True},
        severity="warning",
    ),
    rule(
        "ucx-no-rdma",
        "ucx-info:no-rdma",
        "the host has an RDMA fabric but the container's UCX lists no RDMA "
        "transport (UCX built without verbs/mlx5, or /dev/infiniband not bound)",
        scope="inter-node",
        host={"fabric": True},
    ),
    # --- shared memory within a node ----------------------------------------------------------------
    rule(
        "ucx-no-shm-intra-node",
        "ucx:no-shm",
        "UCX moves intra-node messages through {items}, not shared memory",
        scope="intra-node",
        severity="warning",
    ),
    rule(
        "ucx-rdma-intra-node",
        "ucx:rdma-loopback",
        "UCX moves intra-node messages through the RDMA adapter ({items}), not shared memory",
        scope="intra-node",
        severity="info",
    ),
    # --- GPUs ------------------------------------------------------------------------------------
    rule(
        "nccl-shm-hop",
        "nccl:shm-hop",
        "GPU to GPU traffic within a node goes through host shared memory ({items}) "
        "instead of P2P/NVLink: no peer-to-peer access between these GPUs (topology, IOMMU/ACS or container "
        "isolation)",
        scope="gpu",
        severity="warning",
    ),
    rule(
        "nccl-shm-hop",
        "nccl:shm-hop",
        "GPU to GPU traffic within a node goes through host shared memory ({items}) "
        "although the GPUs can use NVLink/P2P",
        scope="gpu",
        host={"gpu_p2p": True},
    ),
    rule(
        "nccl-shm-hop",
        "nccl:shm-hop",
        "GPU to GPU traffic within a node goes through host shared memory ({items}) (the GPUs have no P2P path)",
        scope="gpu",
        host={"gpu_p2p": False},
        severity="info",
    ),
    rule(
        "nccl-no-gdrdma",
        "nccl:no-gdrdma",
        "network connections do not use GPUDirect RDMA ({items}; data is staged "
        "through host memory): nvidia-peermem / dmabuf unavailable, or NCCL_NET_GDR_LEVEL too strict",
        scope="inter-node",
        severity="warning",
    ),
    rule(
        "nccl-no-gdrdma",
        "nccl:no-gdrdma",
        "network connections without GPUDirect RDMA ({items}) although the host supports it",
        scope="inter-node",
        host={"gdrdma": True},
    ),
    rule(
        "nccl-no-gdrdma",
        "nccl:no-gdrdma",
        "network connections without GPUDirect RDMA ({items}; not supported on this host)",
        scope="inter-node",
        host={"gdrdma": False},
        severity="info",
    ),
    rule(
        "nccl-no-gdrdma",
        "nccl:no-gdrdma",
        "network connections through a libfabric plugin without GPUDirect RDMA "
        "({items}): whether the instance or provider offers it is not known here",
        scope="inter-node",
        host={"gdrdma": None},
        match=r"^NET/(?:AWS Libfabric|OFI|Libfabric)",
        severity="info",
    ),
    rule(
        "ucx-no-cuda",
        "ucx-info:no-cuda",
        "GPUs on the host but no CUDA transport in the container's UCX (cuda_copy/cuda_ipc/gdr_copy)",
        scope="gpu",
        host={"gpus": True},
        severity="warning",
    ),
    # --- NCCL's network plugins ---------------------------------------------------------------------
    rule("nccl-plugin-failure", "nccl:plugin-failed", "NET plugin {detail}", scope="inter-node", severity="warning"),
    rule(
        "nccl-plugin-failure",
        "nccl:plugin-failed-to-socket",
        "NET plugin {detail}: traffic between nodes goes over TCP sockets",
        scope="inter-node",
    ),
    rule(
        "nccl-plugin-not-found",
        "nccl:plugin-not-found",
        "no external NET plugin (libnccl-net.so) found; NCCL uses its internal IB/Socket transports",
        scope="inter-node",
        severity="info",
    ),
    rule(
        "nccl-no-ibverbs",
        "nccl:no-ibverbs",
        "NCCL cannot use InfiniBand/RoCE: libibverbs or an IB device is missing (not bound into the container?)",
        scope="inter-node",
        severity="warning",
    ),
    rule(
        "nccl-no-ibverbs",
        "nccl:no-ibverbs",
        "NCCL cannot use InfiniBand/RoCE: libibverbs or an IB device is missing "
        "(not bound into the container?); one node, so no data goes over the network",
        scope="intra-node",
        severity="info",
    ),
    # --- Slurm -----------------------------------------------------------------------------------------
    rule(
        "pmix-missing",
        "slurm:no-pmix",
        "Slurm has no pmix MPI plugin: `srun --mpi=pmix` cannot launch the image's Open MPI 5 (plugins: {items})",
    ),
    # --- measurements: host buffers (shared memory within a node, an RDMA fabric between nodes) --------
    rule(
        "latency-tcp-like",
        "host:latency_small_us",
        "{subject}: small-message latency {value:g} us is what TCP "
        "sockets give, not shared memory or an RDMA fabric (< 5 us): likely a TCP fallback",
        at_least=25.0,
        means="tcp",
    ),
    rule(
        "latency-high",
        "host:latency_small_us",
        "{subject}: small-message latency {value:g} us is high for shared "
        "memory or an RDMA fabric (TCP or a slow path?)",
        at_least=10.0,
        below=25.0,
        severity="warning",
        means="tcp",
    ),
    rule(
        "bandwidth-tcp-like",
        "host:bandwidth_large_mbs",
        "{subject}: large-message bandwidth peaks at {value:g} MB/s, what TCP over Ethernet gives",
        below=1000.0,
        severity="warning",
        means="tcp",
    ),
    rule(
        "busbw-socket-like",
        "nccl:busbw_peak_gbs",
        "{subject}: between nodes the peak bus bandwidth is only "
        "{value:g} GB/s: what NCCL over TCP sockets gives, not an RDMA fabric; check NCCL_DEBUG=INFO for NET/Socket",
        below=8.0,
        scope="inter-node",
        unless=("nccl:fabric-network",),
        means="tcp",
    ),
)
#: the rows of the measurements of GPU buffers, judged over all the runs of a side (expectations)
_FLOOR = ("cuda:ipc_latency_us", "cuda:copy_sync_us")
RULES += (
    rule(
        "device-latency-slow",
        "cuda:latency_small_us",
        "{subject}: small messages between GPU buffers take "
        "{value:g} us (at least {limit:g} us): one CUDA copy and synchronize takes 2-20 us and GPUs exchange small "
        "messages in about as much (CUDA IPC, GDRCopy, GPUDirect RDMA), so the MPI/UCX stack takes a slow path; it "
        "is slow natively too where the native side runs the same stack",
        at_least=50.0,
        unless=_FLOOR,
    ),
    rule(
        "device-latency-high",
        "cuda:latency_small_us",
        "{subject}: small messages between GPU buffers take {value:g} "
        "us, high for CUDA IPC or GPUDirect (2-20 us; GDRCopy missing?)",
        at_least=20.0,
        below=50.0,
        unless=_FLOOR,
        severity="warning",
    ),
    rule(
        "device-collective-slow",
        "cuda:collective_small_us",
        "{subject}: a collective of small GPU buffers takes "
        "{value:g} us (at least {limit:g} us): where small messages between GPU buffers take 2-20 us, a collective "
        "of a few ranks takes tens of us (the slow path of point-to-point messages, or many ranks?)",
        at_least=100.0,
        severity="warning",
    ),
    rule(
        "device-latency-vs-host",
        "cuda:latency_small_us",
        "{subject}: small messages between GPU buffers take "
        "{value:g} us, {ratio:.0f}x the {ref_value:g} us between host buffers on this host ({ref}; expected within "
        "100x)",
        at_least=100.0,
        of="host:latency_small_us",
        severity="warning",
    ),
    rule(
        "device-latency-vs-floor",
        "cuda:latency_small_us",
        "{subject}: small messages between GPU buffers take "
        "{value:g} us, {ratio:.1f}x the platform's own floor measured by dedal on this host ({ref}: a CUDA IPC "
        "ping-pong of {ref_value:g} us; expected within 2x): the MPI/UCX stack adds a slow path",
        at_least=2.0,
        of="cuda:ipc_latency_us",
        scope="intra-node",
    ),
    rule(
        "device-latency-vs-copy",
        "cuda:latency_small_us",
        "{subject}: small messages between GPU buffers take "
        "{value:g} us, {ratio:.1f}x one CUDA copy + synchronize on this host ({ref}: {ref_value:g} us; expected "
        "within 4x)",
        at_least=4.0,
        of="cuda:copy_sync_us",
        scope="intra-node",
        unless=("cuda:ipc_latency_us",),
    ),
    rule(
        "device-bandwidth-vs-copy",
        "cuda:bandwidth_large_mbs",
        "{subject}: large messages between GPU buffers peak "
        "at {value:g} MB/s, {ratio:.0%} of the CUDA copies into a peer's buffer on this host ({ref}: {ref_value:g} "
        "MB/s; expected 90 %)",
        below=0.9,
        of="cuda:copy_bandwidth_mbs",
        scope="intra-node",
        severity="warning",
    ),
)


# ---------------------------------------------------------------------------- the table itself


def check_table(rows: Sequence[Rule] = RULES) -> List[str]:
    """What is wrong with a table of rules (empty: nothing): unknown facts, rows that can never
    fire, references that are not facts, unknown severities, verdicts and host conditions, regular
    expressions that do not compile, messages that name values they are not given."""
    problems = []
    known = set(FACTS) | set(SEEN)
    for row in rows:
        where = f"{row.code}:"
        if row.context:
            if not row.means:
                problems.append(f"{where} a context row re-grades nothing (no 'means')")
        elif row.key in FACTS:
            if not row.measured:
                problems.append(f"{where} has no range")
        elif row.key in SEEN:
            if row.measured:
                problems.append(f"{where} a range on {row.key}, which is seen, not measured")
        else:
            problems.append(f"{where} reads {row.key}, not a fact")
        for ref in (row.of, *row.unless):
            if ref and ref not in known:
                problems.append(f"{where} refers to {ref}, not a fact")
        if row.at_least is not None and row.below is not None and row.below <= row.at_least:
            problems.append(f"{where} has an empty range")
        if row.severity not in SEVERITIES:
            problems.append(f"{where} severity {row.severity!r}")
        if row.verdict is not None and row.verdict not in VERDICTS:
            problems.append(f"{where} verdict {row.verdict!r}")
        for k, _v in row.host:
            if k not in HOST_KEYS:
                problems.append(f"{where} host condition {k!r} (known: {', '.join(HOST_KEYS)})")
        if row.match:
            try:
                re.compile(row.match)
            except re.error as exc:
                problems.append(f"{where} match: {exc}")
        if row.context:
            values: Dict[str, Any] = {"message": "x"}
        elif row.measured or row.key in FACTS:
            values = {"subject": "x", "value": 1.0, "unit": "us", "limit": 1.0}
            if row.of:
                values.update(ref="y", ref_value=1.0, ratio=1.0)
        else:
            values = {"items": "x", "scope": "x", "detail": "x"}
        try:
            row.message.format(**values)
        except (KeyError, IndexError, ValueError) as exc:
            problems.append(f"{where} message: {exc}")
    return problems


def rules_from_config(rows: Sequence[Mapping[str, Any]], origin: str = "site") -> Tuple[Rule, ...]:
    """A site's rows as the environment file writes them (``dedal.verify.rules``: ``code``,
    ``when: {fact|seen, scope, host, match, at_least, below, of, unless}``, ``severity``, ``verdict``,
    ``message``, ``means``; the shape is checked by the file's schema), each checked by
    :func:`check_table`: a row that could never fire is a :class:`UserError` naming it."""
    out = []
    for i, data in enumerate(rows):
        when = dict(data.get("when") or {})
        on = when.pop("seen", None) or when.pop("fact", None) or "*:*"
        host = when.pop("host", None) or {}
        code = str(data["code"])
        message = str(data.get("message") or ("{message}" if code == "*" else code))
        r = rule(
            code,
            on,
            message,
            host=host,
            severity=data.get("severity", "error"),
            verdict=data.get("verdict"),
            means=data.get("means", ""),
            origin=f"{origin} row {i}",
            scope=when.pop("scope", ""),
            match=when.pop("match", ""),
            unless=tuple(when.pop("unless", ())),
            of=when.pop("of", ""),
            at_least=when.pop("at_least", None),
            below=when.pop("below", None),
        )
        problems = check_table([r])
        if problems:
            raise UserError(f"dedal.verify.rules.{i}: {problems[0]}")
        out.append(r)
    return tuple(out)


def with_site(site: Sequence[Rule], rows: Sequence[Rule] = RULES) -> Tuple[Rule, ...]:
    """dedal's rows with a site's: a site row replaces the row of the same code, fact, scope, host
    conditions and match; any other is added after dedal's (so of equal specificity it wins)."""
    mine = {r.signature() for r in site}
    return tuple(r for r in rows if r.signature() not in mine) + tuple(site)
