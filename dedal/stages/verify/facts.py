"""Facts: what a log or a measurement shows, without a judgement (issue 38).

Two kinds, both read by the one judge (:mod:`dedal.stages.verify.judge`) of the rules table
(:mod:`dedal.stages.verify.rules`); :data:`SEEN` and :data:`FACTS` name every one a rule may read:

- :class:`Seen`: something a runtime's log shows in one scope (``intra-node``, ``inter-node``,
  ``self``, ``unknown`` where the log does not say, ``gpu``, ``""`` anywhere): the stack that
  said it (``ucx``, ``ompi``, ``nccl``, ``ucx-info``, ``slurm``, ``net`` for what the log says
  of the network itself), what it is (``tcp``, ``shm-hop``, ``plugin-failed`` ...: the
  :data:`SEEN` vocabulary), the transports/plugins/devices it names, and the lines that show it;
- :class:`Fact`: one number a benchmark table shows (latency, bandwidth ...), with its lines
  (:mod:`dedal.stages.verify.expectations` reads them from the tables).

:func:`seen_of` reads every :class:`Seen` from a parse result
(:func:`dedal.stages.verify.parsers.parse_file`): the parsers keep what they saw per scope, with
evidence, and no severity; this is the one reading of it. A fact is true of the log whatever
the host: whether it is bad depends on the host, which the rules know.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from dedal.errors import UserError

#: what a :class:`Seen` may say, ``stack:what`` -> what it means
SEEN: Dict[str, str] = {
    "ucx:tcp": "UCX selected TCP for the endpoints of this scope",
    "ucx:tcp-self": "UCX selected TCP even for loopback (no endpoint to another process)",
    "ucx:no-shm": "UCX moves intra-node messages through neither shared memory nor the RDMA adapter",
    "ucx:rdma-loopback": "UCX moves intra-node messages through the RDMA adapter (loopback, GPUDirect)",
    "ucx:no-rdma": "no RDMA transport among UCX's endpoints between nodes (and no TCP either)",
    "ucx:device-unavailable": "UCX was asked for a network device that it cannot open on a node",
    "ucx:transport-unavailable": "UCX was asked for transports that are not available",
    "ompi:tcp": "Open MPI's ob1 sends to peers over the tcp BTL",
    "nccl:tcp": "NCCL channels between nodes go through NET/Socket (TCP)",
    "nccl:socket-network": "NCCL chose its Socket network (TCP) for the communicator",
    "nccl:fabric-network": "NCCL chose a fabric network (IB, an OFI/libfabric plugin ...)",
    "nccl:shm-hop": "GPU to GPU channels within a node go through host shared memory",
    "nccl:no-gdrdma": "network channels without GPUDirect RDMA (staged through host memory)",
    "nccl:plugin-failed": "an external NET plugin failed; NCCL fell back to its internal transport",
    "nccl:plugin-failed-to-socket": "an external NET plugin failed and NCCL fell back to TCP sockets between nodes",
    "nccl:plugin-not-found": "no external NET plugin (libnccl-net.so) found; NCCL's internal IB/Socket is used",
    "nccl:no-ibverbs": "NCCL cannot open libibverbs or an IB device",
    "ucx-info:no-rdma": "the container's UCX lists no RDMA transport",
    "ucx-info:no-cuda": "the container's UCX lists no CUDA transport",
    "slurm:no-pmix": "Slurm offers no pmix MPI plugin",
    "net:fabric": "the log names a high-speed fabric: an RDMA device (mlx5_*, cxi*, efa), a Slingshot or IPoIB "
    "interface (hsn*, ib*)",
}
#: every measured fact a rule may read: ``class:name`` -> (unit, better: lower|higher, what it is)
FACTS: Dict[str, Tuple[str, str, str]] = {
    "host:latency_small_us": ("us", "lower", "point-to-point latency between host buffers, smallest at <= 64 B"),
    "host:bandwidth_large_mbs": ("MB/s", "higher", "point-to-point bandwidth between host buffers, peak at >= 1 MiB"),
    "cuda:latency_small_us": ("us", "lower", "point-to-point latency between GPU buffers, smallest at <= 64 B"),
    "cuda:bandwidth_large_mbs": ("MB/s", "higher", "point-to-point bandwidth between GPU buffers, peak at >= 1 MiB"),
    "cuda:collective_small_us": (
        "us",
        "lower",
        "a collective (all-reduce ...) between GPU buffers, smallest latency at <= 64 B",
    ),
    "cuda:ipc_latency_us": (
        "us",
        "lower",
        "dedal_cuda_floor: CUDA IPC ping-pong between two processes (one copy "
        "into the peer's buffer, synchronize, a host message), half round trip, smallest at <= 64 B",
    ),
    "cuda:copy_sync_us": (
        "us",
        "lower",
        "dedal_cuda_floor: one device-to-host copy + synchronize, smallest at <= 64 B",
    ),
    "cuda:copy_bandwidth_mbs": (
        "MB/s",
        "higher",
        "dedal_cuda_floor: copies into the peer process's GPU buffer, 64 in flight, peak at >= 1 MiB",
    ),
    "nccl:busbw_peak_gbs": ("GB/s", "higher", "nccl-tests between nodes: the largest bus bandwidth of any row"),
}
SCOPES = ("intra-node", "inter-node", "self", "unknown", "gpu", "")

# interfaces and devices that only exist where a high-speed fabric is: Slingshot (hsn0), IPoIB (ib0,
# ibp12s0, ibs65), an RDMA adapter NCCL/UCX named (mlx5_0, mlx5_bond_0, cxi0, efa), a libfabric
# provider of a fabric (cxi, efa, verbs)
_FABRIC_IFACE = re.compile(r"^(?:hsn\d+|ib[ps]?\d+\w*)$")
_FABRIC_DEVICE = re.compile(r"^(?:mlx\d+_\w+|cxi\d+|rdmap\w+|efa\w*|hfi\d+_\d+|bnxt_re\d+|irdma\d+)(?::\d+)?")
_FABRIC_PROVIDERS = ("cxi", "efa", "verbs", "psm3", "opx")


@dataclass
class HostFacts:
    """What the host offers, found by the preflight. ``None`` means unknown."""

    has_infiniband: bool = False  # an RDMA fabric: /dev/infiniband (IB, RoCE, EFA) or Slingshot's /dev/cxi*
    multi_node: bool = False  # the run spans more than one node
    gpus: int = 0  # GPUs per node used by the run
    gpu_p2p: Optional[bool] = None  # GPUs of a node can reach each other by NVLink / PCIe P2P
    gdrdma: Optional[bool] = None  # GPUDirect RDMA possible (nvidia-peermem or dma-buf)

    @classmethod
    def from_mapping(cls, data: Optional[Mapping[str, Any]]) -> "HostFacts":
        known = {f.name for f in fields(cls)}
        unknown = set(data or {}) - known
        if unknown:
            raise UserError(f"unknown host fact(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
        return cls(**dict(data or {}))

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Fact:
    """One number a parse result shows: ``hardware`` class, ``name`` (a key of
    :data:`FACTS` without its class), the benchmark it comes
    from (``subject``), value, unit, and the lines that show it (``evidence``)."""

    hardware: str
    name: str
    subject: str
    value: float
    unit: str
    evidence: Tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.hardware}:{self.name}"

    def to_json(self) -> Dict[str, Any]:
        return {
            "fact": self.key,
            "subject": self.subject,
            "value": self.value,
            "unit": self.unit,
            "evidence": list(self.evidence),
        }


@dataclass(frozen=True)
class Seen:
    """Something a log shows: ``stack:what`` (a key of :data:`SEEN`) in ``scope``, naming
    ``items`` (transports, plugins, devices), shown by ``evidence`` lines. ``nic``: the items
    are on a network interface other than ``lo`` (TCP of unknown placement in an inter-node
    run is the endpoint to the other node)."""

    stack: str
    what: str
    scope: str = ""
    items: Tuple[str, ...] = ()
    evidence: Tuple[str, ...] = ()
    nic: bool = False
    detail: str = ""  # what the parser read, in words (a device's name and hosts, a count)

    @property
    def key(self) -> str:
        return f"{self.stack}:{self.what}"

    def to_json(self) -> Dict[str, Any]:
        return {"seen": self.key, "scope": self.scope, "items": list(self.items), "evidence": list(self.evidence)}


def _seen(
    stack: str,
    what: str,
    scope: str,
    items: Iterable[str],
    evidence: Iterable[str],
    nic: bool = False,
    detail: str = "",
) -> Seen:
    return Seen(
        stack, what, scope, tuple(dict.fromkeys(items)), tuple(dict.fromkeys(e for e in evidence if e))[:4], nic, detail
    )


SHM_TLS = {
    "sysv",
    "posix",
    "xpmem",
    "knem",
    "cma",
    "mm",
    "self",
    "cuda_ipc",
    "rocm_ipc",
    "ze_ipc",
    "cuda_copy",
    "rocm_copy",
    "ze_copy",
    "gdr_copy",
}
TCP_TLS = {"tcp", "sockcm"}


def transport_family(tl: str) -> str:
    """A UCX transport's family: ``sysv`` -> ``shm``; ``rc_mlx5`` -> ``rdma``; ``tcp`` -> ``tcp``."""
    if tl in TCP_TLS:
        return "tcp"
    if tl in SHM_TLS:
        return "shm"
    return "rdma"


def _family(tl: str) -> str:
    return transport_family(tl.split("/")[0])


def _ucx(p: Mapping[str, Any]) -> List[Seen]:
    by_scope: Mapping[str, List[str]] = p.get("transports_by_scope") or {}
    ev: Mapping[str, Mapping[str, List[str]]] = p.get("ucx_transport_evidence") or {}
    out: List[Seen] = []

    def lines(scope: str, tls: Sequence[str]) -> List[str]:
        return [ln for t in tls for ln in (ev.get(scope) or {}).get(t, [])]

    for scope, tls in by_scope.items():
        tcp = [t for t in tls if _family(t) == "tcp"]
        if tcp and (scope != "self" or not any(s != "self" for s in by_scope)):
            nic = all(t.partition("/")[2] not in ("", "lo") for t in tcp)
            forced = (p.get("ucx_env") or {}).get("UCX_TLS")
            out.append(
                _seen(
                    "ucx",
                    "tcp-self" if scope == "self" else "tcp",
                    scope,
                    tcp,
                    lines(scope, tcp),
                    nic,
                    f" (UCX_TLS={forced})" if forced else "",
                )
            )
    intra = by_scope.get("intra-node") or []
    if intra and not any(_family(t) == "tcp" for t in intra) and not any(_family(t) == "shm" for t in intra):
        rdma = all(_family(t) == "rdma" for t in intra)
        out.append(_seen("ucx", "rdma-loopback" if rdma else "no-shm", "intra-node", intra, lines("intra-node", intra)))
    inter = by_scope.get("inter-node") or []
    if inter and not any(_family(t) in ("rdma", "tcp") for t in inter):
        out.append(_seen("ucx", "no-rdma", "inter-node", inter, lines("inter-node", inter)))
    for u in p.get("ucx_unavailable") or []:
        out.append(
            _seen(
                "ucx",
                f"{u['what']}-unavailable",
                "inter-node",
                u.get("items") or [],
                u.get("lines") or [],
                detail=u.get("detail") or "",
            )
        )
    return out


def _ompi(p: Mapping[str, Any]) -> List[Seen]:
    out: List[Seen] = []
    for same, scope in ((True, "intra-node"), (False, "inter-node")):
        peers = [x for x in p.get("btl_peers") or [] if x.get("btl") == "tcp" and bool(x.get("same_node")) == same]
        if peers:
            out.append(_seen("ompi", "tcp", scope, ["btl tcp"], [x.get("line", "") for x in peers][:3]))
    return out


def _nccl(p: Mapping[str, Any]) -> List[Seen]:
    out: List[Seen] = []
    transports = p.get("transports") if isinstance(p.get("transports"), Mapping) else {}
    ev: Mapping[str, List[str]] = p.get("transport_evidence") or {}
    nnodes = p.get("nnodes")
    net_lines = list(p.get("network_lines") or [])
    sock_lines = list(p.get("socket_lines") or [])

    def lines(names: Iterable[str]) -> List[str]:
        return [ln for t in names for ln in ev.get(t, [])][:3]

    plugins = p.get("plugins") if isinstance(p.get("plugins"), Mapping) else {}
    external = [x for x in plugins.get("loaded") or [] if x not in ("IB", "Socket")]
    if plugins.get("failed"):
        to = (plugins.get("assigned") or [p.get("network")])[0]
        what = "plugin-failed-to-socket" if to == "Socket" and nnodes != 1 else "plugin-failed"
        out.append(
            _seen(
                "nccl", what, "inter-node", external, p.get("plugin_lines") or [], detail=p.get("plugin_failure") or ""
            )
        )
    elif plugins.get("not_found") and not external:
        out.append(_seen("nccl", "plugin-not-found", "inter-node", [], p.get("plugin_missing_lines") or []))
    if p.get("no_verbs_lines"):
        out.append(
            _seen(
                "nccl",
                "no-ibverbs",
                "intra-node" if nnodes == 1 else "inter-node",
                p.get("ib_unopenable") or [],
                p["no_verbs_lines"],
            )
        )
    sock = [t for t in transports if t.startswith("NET/Socket")]
    if sock or (p.get("network") == "Socket" and (nnodes or 0) > 1):
        out.append(
            _seen("nccl", "tcp", "inter-node", sock or ["NET/Socket"], lines(sock) or net_lines[:2] + sock_lines[:1])
        )
    if p.get("network") == "Socket" and nnodes != 1:
        out.append(
            _seen(
                "nccl",
                "socket-network",
                "inter-node",
                [f"NET/Socket on {i}" for i in p.get("socket_interfaces") or []] or ["NET/Socket"],
                net_lines[:1] + sock_lines[:1] + list(p.get("ib_lines") or [])[:1],
            )
        )
    elif p.get("network") and p.get("network") != "Socket":
        out.append(_seen("nccl", "fabric-network", "inter-node", [p["network"]], net_lines[:1]))
    shm = [t for t in transports if t.startswith("SHM")]
    if shm:
        out.append(_seen("nccl", "shm-hop", "gpu", [f"{t}: {transports[t]}" for t in shm], lines(shm)))
    net = [t for t in transports if t.startswith(("NET/", "CollNet")) and not t.startswith("NET/Socket")]
    if net and not any("GDRDMA" in t for t in net) and not p.get("gdr_enabled_lines"):
        out.append(_seen("nccl", "no-gdrdma", "inter-node", net, lines(net) + list(p.get("gdr_disabled_lines") or [])))
    return out


def _fabric(p: Mapping[str, Any]) -> List[Seen]:
    """What the log says of a high-speed fabric on the host, whatever the stack used."""
    items: List[str] = []
    evidence: List[str] = []
    for itf in p.get("socket_interfaces") or []:
        if _FABRIC_IFACE.match(itf.split(":")[0]):
            items.append(itf.split(":")[0])
            evidence += list(p.get("socket_lines") or [])[:1]
    for dev in list(p.get("ib_devices") or []) + list(p.get("ib_unopenable") or []):
        if _FABRIC_DEVICE.match(dev):
            items.append(dev.split("/")[0])
    evidence += list(p.get("ib_lines") or [])[:2]
    provider = (p.get("plugins") or {}).get("ofi_provider") if isinstance(p.get("plugins"), Mapping) else None
    if provider and provider.split(";")[0] in _FABRIC_PROVIDERS:
        items.append(f"libfabric {provider}")
    for tl in [t for tls in (p.get("transports_by_scope") or {}).values() for t in tls]:
        if _family(tl) == "rdma" and "/" in tl:
            items.append(tl.partition("/")[2])
    if p.get("has_rdma"):
        items += [d for d in p.get("devices") or [] if isinstance(d, str) and _FABRIC_DEVICE.match(d)]
    for u in p.get("ucx_unavailable") or []:
        if u.get("what") == "device":
            items += [d for d in u.get("items") or [] if _FABRIC_DEVICE.match(d)]
            evidence += list(u.get("lines") or [])[:1]
    return [_seen("net", "fabric", "", items, evidence)] if items else []


def seen_of(parsed: Mapping[str, Any]) -> List[Seen]:
    """Every :class:`Seen` of one parse result, in a stable order (the parsers' data: UCX's
    transports per scope, Open MPI's BTL per peer, NCCL's channels, network and plugins,
    ``ucx_info``'s transports, Slurm's MPI plugins)."""
    out = _ucx(parsed) + _ompi(parsed) + _nccl(parsed)
    if parsed.get("kind") == "ucx-info" or "has_rdma" in parsed:
        names = list(parsed.get("transport_names") or [])
        ev = [f"transports: {', '.join(names)}"]
        if not parsed.get("has_rdma"):
            out.append(_seen("ucx-info", "no-rdma", "inter-node", names, ev))
        if not parsed.get("has_cuda"):
            out.append(_seen("ucx-info", "no-cuda", "gpu", names, ev))
    if parsed.get("kind") == "srun-mpi-list" and not parsed.get("has_pmix"):
        plugins = list(parsed.get("plugins") or [])
        out.append(
            _seen(
                "slurm",
                "no-pmix",
                "",
                plugins,
                list(parsed.get("list_lines") or []) or [f"plugins: {', '.join(plugins) or 'none'}"],
            )
        )
    return out + _fabric(parsed)


def seen_json(seen: Iterable[Seen]) -> List[Dict[str, Any]]:
    return [s.to_json() for s in seen]


def fabric_of(seen: Iterable[Seen]) -> Optional[bool]:
    """True where the log names a high-speed fabric, None where it does not say."""
    return True if any(s.key == "net:fabric" for s in seen) else None
