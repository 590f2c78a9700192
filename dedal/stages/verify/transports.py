"""Transport rules: what the runtime's own logs say about how messages moved, judged
against what the host offers.

A parsed log (UCX, Open MPI verbose, NCCL debug, ``ucx_info``, ``srun --mpi=list``) and the
:class:`HostFacts` the preflight found go in, :class:`~dedal.stages.verify.findings.Finding`
records come out: TCP within a node is always a fallback, TCP between nodes only where the
nodes have an RDMA network (InfiniBand/RoCE), a GPU run without CUDA transports or NCCL's
network plugin failing is a fallback to a slow path. The parsers read each log alone; the
rules here add what only the host knows.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Iterable, List, Mapping, Optional

from dedal.errors import UserError
from dedal.stages.verify import findings as F
from dedal.stages.verify.findings import Finding, verdict_of
from dedal.stages.verify.parsers.ucx_log import transport_family


@dataclass
class HostFacts:
    """What the host offers, found by the preflight. ``None`` means unknown."""

    has_infiniband: bool = False       # /dev/infiniband, an IB or RoCE adapter
    multi_node: bool = False           # the run spans more than one node
    gpus: int = 0                      # GPUs per node used by the run
    gpu_p2p: Optional[bool] = None     # GPUs of a node can reach each other by NVLink / PCIe P2P
    gdrdma: Optional[bool] = None      # GPUDirect RDMA possible (nvidia-peermem or dma-buf)

    @classmethod
    def from_mapping(cls, data: Optional[Mapping[str, Any]]) -> "HostFacts":
        known = {f.name for f in fields(cls)}
        unknown = set(data or {}) - known
        if unknown:
            raise UserError(f"unknown host fact(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
        return cls(**dict(data or {}))

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def _evidence(parsed: Mapping[str, Any], *codes: str) -> List[str]:
    for f in parsed.get("findings") or []:
        if f.get("code") in codes and f.get("evidence"):
            return list(f["evidence"])
    return []


def _is_tcp(tl: str) -> bool:
    return tl.split("/")[0] in ("tcp", "sockcm")


def _is_rdma(tl: str) -> bool:
    name = tl.split("/")[0]
    return name.startswith(("rc", "dc", "ud", "srd", "ib", "cxi", "gga", "efa"))


def check_transports(parsed_logs: Iterable[Mapping[str, Any]], host: Optional[HostFacts] = None) -> List[Finding]:
    """Transport rules over parsed logs (results of :func:`dedal.stages.verify.parsers.parse_file`):

    - shared memory within a node (UCX sysv/posix/cma/knem/xpmem, BTL sm/vader);
    - InfiniBand/RoCE between nodes when the host has it (UCX rc/dc/ud, NCCL NET/IB);
    - NVLink/P2P between the GPUs of a node, GPUDirect RDMA between nodes, where the
      hardware allows (``host.gpu_p2p`` / ``host.gdrdma``; unknown means: probably);
    - any TCP/socket fallback, host-SHM hop between GPUs or NET plugin failure is reported
      with the log lines that prove it;
    - Slurm must offer PMIx (``srun --mpi=list``).
    """
    host = host or HostFacts()
    out: List[Finding] = []
    for p in parsed_logs:
        src = p.get("source") or p.get("kind") or "log"
        out.extend(_ucx_rules(p, host, src))
        out.extend(_ompi_rules(p, host, src))
        out.extend(_nccl_rules(p, host, src))
        if p.get("kind") == "ucx-info":
            if host.has_infiniband and not p.get("has_rdma"):
                out.append(F.error("ucx-no-rdma", f"{src}: the host has InfiniBand/RoCE but the container's UCX lists "
                                   "no RDMA transport (UCX built without verbs/mlx5, or /dev/infiniband not bound)",
                                   [f"transports: {', '.join(p.get('transport_names') or [])}"]))
            if host.gpus and not p.get("has_cuda"):
                out.append(F.warning("ucx-no-cuda", f"{src}: GPUs on the host but no CUDA transport in the "
                                     "container's UCX (cuda_copy/cuda_ipc/gdr_copy)",
                                     [f"transports: {', '.join(p.get('transport_names') or [])}"]))
        if p.get("kind") == "srun-mpi-list" and not p.get("has_pmix"):
            out.append(F.error("pmix-missing", f"{src}: Slurm has no pmix MPI plugin; `srun --mpi=pmix` cannot launch "
                               "the image's Open MPI 5", [f"plugins: {', '.join(p.get('plugins') or []) or 'none'}"]))
    return out


def _ucx_rules(p: Mapping[str, Any], host: HostFacts, src: str) -> List[Finding]:
    out: List[Finding] = []
    by_scope = p.get("transports_by_scope") or {}
    intra = by_scope.get("intra-node") or []
    inter = by_scope.get("inter-node") or []
    tcp_intra = [t for t in intra if _is_tcp(t)]
    if tcp_intra:
        out.append(F.error("ucx-tcp-intra-node", f"{src}: UCX uses TCP within a node ({', '.join(tcp_intra)}) instead "
                           "of shared memory", _evidence(p, "ucx-tcp-intra-node")))
    elif intra and not any(t.split("/")[0] in ("sysv", "posix", "cma", "knem", "xpmem", "mm", "cuda_ipc", "rocm_ipc")
                           for t in intra):
        if all(_is_rdma(t) for t in intra):  # the HCA's loopback (GPUDirect into GPU memory): a fast path
            out.append(F.info("ucx-rdma-intra-node", f"{src}: UCX moves intra-node messages through the RDMA "
                              f"adapter ({', '.join(intra)}), not shared memory"))
        else:
            out.append(F.warning("ucx-no-shm-intra-node", f"{src}: UCX moves intra-node messages through "
                                 f"{', '.join(intra)}, not shared memory"))
    tcp_inter = [t for t in inter if _is_tcp(t)]
    if tcp_inter:
        ev = _evidence(p, "ucx-tcp-inter-node")
        if host.has_infiniband:
            out.append(F.error("ucx-tcp-inter-node", f"{src}: UCX uses TCP between nodes ({', '.join(tcp_inter)}) "
                               "although the host has InfiniBand/RoCE: a TCP fallback", ev))
        else:
            out.append(F.info("ucx-tcp-inter-node", f"{src}: UCX uses TCP between nodes ({', '.join(tcp_inter)}); "
                              "the host has no RDMA network", ev))
    if host.multi_node and host.has_infiniband and inter and not any(_is_rdma(t) for t in inter) and not tcp_inter:
        out.append(F.warning("ucx-no-rdma-inter-node", f"{src}: no RDMA transport between nodes ({', '.join(inter)})"))
    dev = _evidence(p, "ucx-device-unavailable", "ucx-transport-unavailable")
    if dev:
        if host.has_infiniband:
            out.append(F.error("ucx-device-unavailable", f"{src}: UCX cannot open the requested RDMA device/transport "
                               "in the container and falls back to TCP", dev))
        else:
            out.append(F.warning("ucx-device-unavailable", f"{src}: UCX was asked for a device or transport that "
                                 "this host does not have", dev))
    return out


def _ompi_rules(p: Mapping[str, Any], host: HostFacts, src: str) -> List[Finding]:
    out: List[Finding] = []
    peers = p.get("btl_peers") or []
    intra = [x for x in peers if x.get("btl") == "tcp" and x.get("same_node")]
    inter = [x for x in peers if x.get("btl") == "tcp" and not x.get("same_node")]
    if intra:
        out.append(F.error("ompi-tcp-intra-node", f"{src}: Open MPI uses the tcp BTL within a node instead of sm",
                           _evidence(p, "ompi-tcp-intra-node")))
    if inter:
        ev = _evidence(p, "ompi-tcp-inter-node")
        if host.has_infiniband:
            out.append(F.error("ompi-tcp-inter-node", f"{src}: Open MPI uses the tcp BTL between nodes although the "
                               "host has InfiniBand/RoCE", ev))
        else:
            out.append(F.info("ompi-tcp-inter-node", f"{src}: Open MPI uses the tcp BTL between nodes (no RDMA "
                              "network on this host)", ev))
    return out


def _nccl_plugin_rule(p: Mapping[str, Any], src: str) -> List[Finding]:
    """A NET plugin that failed: an error where the parser saw NCCL end up on TCP sockets, else a warning."""
    plugins = p.get("plugins") or {}
    if not isinstance(plugins, Mapping) or not plugins.get("failed"):
        return []
    own = next((f for f in p.get("findings") or [] if f.get("code") == "nccl-plugin-failure"), None)
    if own and own.get("severity") == "error":
        return [F.error("nccl-plugin-failure", f"{src}: {own.get('message')}", list(own.get("evidence") or []))]
    return [F.warning("nccl-plugin-failure", f"{src}: an NCCL NET plugin failed to initialise; NCCL fell back "
                      f"to {', '.join(plugins.get('assigned') or []) or p.get('network') or 'another transport'}",
                      _evidence(p, "nccl-plugin-failure"))]


def _nccl_rules(p: Mapping[str, Any], host: HostFacts, src: str) -> List[Finding]:
    out: List[Finding] = _nccl_plugin_rule(p, src)
    transports = p.get("transports")
    if not isinstance(transports, Mapping) or not transports:
        return out
    ev = p.get("transport_evidence") or {}
    sock = {t: n for t, n in transports.items() if t.startswith("NET/Socket")}
    if sock:
        lines = [ln for t in sock for ln in ev.get(t, [])][:3]
        if host.has_infiniband:
            out.append(F.error("nccl-socket-transport", f"{src}: NCCL uses TCP sockets between nodes although the "
                               "host has InfiniBand/RoCE: a socket fallback", lines))
        else:
            out.append(F.warning("nccl-socket-transport", f"{src}: NCCL uses TCP sockets between nodes (no RDMA "
                                 "network on this host)", lines))
    shm = {t: n for t, n in transports.items() if t.startswith("SHM")}
    if shm:
        lines = [ln for t in shm for ln in ev.get(t, [])][:3]
        msg = f"{src}: GPU to GPU traffic within a node goes through host shared memory ({', '.join(shm)})"
        if host.gpu_p2p is True:
            out.append(F.error("nccl-shm-hop", msg + " although the GPUs can use NVLink/P2P", lines))
        elif host.gpu_p2p is None:
            out.append(F.warning("nccl-shm-hop", msg + " instead of NVLink/P2P", lines))
        else:
            out.append(F.info("nccl-shm-hop", msg + " (the GPUs have no P2P path)", lines))
    net = {t: n for t, n in transports.items() if t.startswith("NET/") and not t.startswith("NET/Socket")}
    if net and not any("GDRDMA" in t for t in net):
        lines = [ln for t in net for ln in ev.get(t, [])][:3]
        msg = f"{src}: network connections without GPUDirect RDMA ({', '.join(net)})"
        if host.gdrdma is True:
            out.append(F.error("nccl-no-gdrdma", msg + " although the host supports it", lines))
        elif host.gdrdma is None:
            out.append(F.warning("nccl-no-gdrdma", msg, lines))
        else:
            out.append(F.info("nccl-no-gdrdma", msg + " (not supported on this host)", lines))
    return out


#: a run log's findings that say "TCP between nodes": a fallback where the nodes have an
#: RDMA network, what the network is where they have none
FABRIC_CODES = ("ucx-tcp-inter-node", "ompi-tcp-inter-node", "latency-tcp-like", "latency-high", "bandwidth-tcp-like")


def _tcp_of_unknown_placement_is_a_nic(parsed: Dict[str, Any]) -> bool:
    """UCX before 1.16 logs no placement with an endpoint's transports (``ep_cfg[1]:
    tag(tcp/eth0)``), so the parser files TCP on a network interface under "unknown". In an
    inter-node run that is the endpoint to the other node: TCP within a node would use
    ``lo`` or show in the intra-node runs, which are judged on their own."""
    unknown = (parsed.get("transports_by_scope") or {}).get("unknown") or []
    tcp = [t.partition("/") for t in unknown if transport_family(t.split("/")[0]) == "tcp"]
    return bool(tcp) and all(dev not in ("", "lo") for _tl, _sep, dev in tcp)


def judge_fabric(parsed: Dict[str, Any], host: HostFacts, scope: str) -> Dict[str, Any]:
    """Judge an inter-node run log against the nodes' network: on nodes without InfiniBand
    or RoCE, TCP between nodes is expected, so its findings become information and the
    log's verdict is what the rest of it says. The parser alone cannot know the fabric."""
    if scope != "inter-node" or host.has_infiniband:
        return parsed
    codes = FABRIC_CODES + (("ucx-tcp-transport",) if _tcp_of_unknown_placement_is_a_nic(parsed) else ())
    found = [F.as_finding(f) for f in parsed.get("findings") or []]
    if not any(f.code in codes and f.severity != "info" for f in found):
        return parsed
    regraded = [F.info(f.code, f"{f.message} (expected here: no RDMA network between the nodes)", f.evidence)
                if f.code in codes else f for f in found]
    parsed["findings"] = [f.to_json() for f in regraded]
    if parsed.get("verdict") == "bad":
        parsed["verdict"] = verdict_of(regraded, "good" if parsed.get("tables") else "unknown")
    return parsed
