"""``NCCL_DEBUG=INFO`` logs: which network NCCL chose and which transport each channel uses.

Lines look like ``host:pid:tid [dev] NCCL INFO <message>``. What is extracted:

- ``network``: the network NCCL uses (``Using network IB`` / ``Socket`` / ``AWS Libfabric``),
  the most frequent one when ranks disagree (all are in ``networks`` with counts);
- ``transports``: how many channel connections use each transport, from the
  ``Channel 00/0 : 0[0] -> 1[1] via P2P/IPC`` lines, with the per-NIC index dropped
  (``NET/IB/3/GDRDMA`` counts as ``NET/IB/GDRDMA``, ``NET/Socket/0`` as ``NET/Socket``);
  ``transport_classes`` groups them (``P2P``, ``SHM``, ``NET/IB``, ``NET/Socket`` ...);
- ``gdrdma``: True when a network connection uses GPUDirect RDMA, False when network
  connections exist but none does, None when the log shows no network connection;
- ``plugins``: NET plugin events (not found, loaded, initialised, failed, assigned).

Rules a careful engineer applies: a socket transport between nodes is ``bad``; a GPU to
GPU hop through host shared memory (``SHM``) or a network path without GPUDirect RDMA
is ``suboptimal``; an external NET plugin that loads but fails, after which NCCL falls
back to its own transport, is reported with the lines that prove it (``bad`` when what is
left between nodes is TCP sockets).
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any, Dict, List, Optional

from dedal.stages.verify import findings as F
from dedal.stages.verify.findings import Finding

NCCL_LINE = re.compile(r"\bNCCL (?:INFO|WARN|TRACE|ABORT)\b")
INFO_MSG = re.compile(r"\bNCCL (?P<level>INFO|WARN|TRACE|ABORT)\s+(?P<msg>.*)$")
VERSION = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+\S*)")
USING_NETWORK = re.compile(r"^Using network (?P<net>.+?)\s*$")
NET_IB = re.compile(r"^NET/IB\s*:\s*Using\s+(?P<devs>.*?)(?:;\s*OOB\s+(?P<oob>\S+))?\s*$")
NET_SOCKET = re.compile(r"^NET/Socket\s*:\s*Using\s+(?P<ifs>.*?)\s*$")
VIA = re.compile(r"(?:Channel|Ring)\s+\d+(?:/\d+)?\s*:\s*(?P<src>\d+)(?:\[[^\]]*\])?\s*->\s*(?P<dst>\d+)(?:\[[^\]]*\])?"
                 r"(?:\s*\[(?P<dir>send|receive)\])?\s*via\s+(?P<via>\S.*?)\s*$")
COMM = re.compile(r"\bnRanks\s+(?P<nranks>\d+)\s+nNodes\s+(?P<nnodes>\d+)")
INIT_RANK = re.compile(r"ncclCommInitRank comm \S+ rank (?P<rank>\d+) nranks (?P<nranks>\d+)")
GDR_STATE = re.compile(r"GPU Direct RDMA (?P<state>Enabled|Disabled)", re.IGNORECASE)
OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (?P<prov>\S+)")
OFI_VERSION = re.compile(r"NET/OFI Using aws-ofi-nccl (?P<v>\S+)")
PLUGIN_LOADED = re.compile(r"(?:NET/Plugin: Loaded net plugin|Loaded net plugin) (?P<name>.+?)\s*$")
PLUGIN_INIT = re.compile(r"^Initialized NET plugin (?P<name>.+?)\s*$")
PLUGIN_ASSIGNED = re.compile(r"^Assigned NET plugin (?P<name>.+?) to comm")
PLUGIN_MISSING = re.compile(r"NET/Plugin\s*:?\s*(?:No plugin found|Could not find:?|Plugin load \(?\S*\)? returned \d+|"
                            r"Plugin load returned \d+)", re.IGNORECASE)
PLUGIN_FAIL = re.compile(r"(?:plugin/net\.cc:\d+ -> [1-9]\d*|NET/Plugin\s*:?\s*Failed to initialize|"
                         r"Failed to initialize NET plugin|NET/OFI .*(?:Invalid|[Ff]ailed|[Ee]rror|Unable))")
INTERNAL_FAIL = re.compile(r"Failed to initialize NET plugin (?:IB|Socket)\s*$")
NO_VERBS = re.compile(r"Failed to open libibverbs|NET/IB\s*:\s*No device found|NET/IB\s*:\s*No IB device", re.IGNORECASE)


def normalize_transport(via: str) -> str:
    """``NET/IB/3/GDRDMA`` -> ``NET/IB/GDRDMA``; ``NET/Socket/0`` -> ``NET/Socket``; others unchanged."""
    parts = [p.strip() for p in via.split("/")]
    kept = [p for p in parts if p and not re.match(r"^\d+(?:\(\d+\))?$", p)]
    return "/".join(kept)


def transport_class(transport: str) -> str:
    parts = transport.split("/")
    if parts[0] == "NET" and len(parts) > 1:
        return f"NET/{parts[1]}"
    return parts[0]


def has_nccl_lines(lines: List[str]) -> bool:
    return any(NCCL_LINE.search(line) for line in lines)


def parse(lines: List[str]) -> Dict[str, Any]:
    findings: List[Finding] = []
    version: Optional[str] = None
    networks: Counter = Counter()
    ib_devices: List[str] = []
    oob: Optional[str] = None
    socket_ifs: List[str] = []
    transports: Counter = Counter()
    evidence: Dict[str, List[str]] = {}
    nranks: Optional[int] = None
    nnodes: Optional[int] = None
    gdr_enabled: List[str] = []
    gdr_disabled: List[str] = []
    plugins: Dict[str, Any] = {"loaded": [], "initialized": [], "assigned": [], "not_found": False,
                               "failed": False, "ofi_provider": None, "aws_ofi_nccl": None}
    plugin_fail_lines: List[str] = []
    plugin_init_lines: List[str] = []
    plugin_missing_lines: List[str] = []
    no_verbs: List[str] = []
    warns: List[str] = []
    nccl_lines = 0

    for raw in lines:
        line = raw.strip()
        m = VERSION.search(line)
        if m and version is None:
            version = m.group("v")
        mi = INFO_MSG.search(line)
        if not mi:
            continue
        nccl_lines += 1
        level, msg = mi.group("level"), mi.group("msg").strip()
        if level in ("WARN", "ABORT"):
            warns.append(line)
        m = USING_NETWORK.match(msg)
        if m:
            networks[m.group("net")] += 1
            continue
        m = NET_IB.match(msg)
        if m:
            for dev in re.findall(r"\[\d+\]\s*(\S+)", m.group("devs")):
                if dev not in ib_devices:
                    ib_devices.append(dev)
            oob = oob or m.group("oob")
            continue
        m = NET_SOCKET.match(msg)
        if m:
            for itf in re.findall(r"\[\d+\]\s*(\S+)", m.group("ifs")) or [m.group("ifs")]:
                if itf not in socket_ifs:
                    socket_ifs.append(itf)
            continue
        m = VIA.search(msg)
        if m:
            t = normalize_transport(m.group("via"))
            transports[t] += 1
            evidence.setdefault(t, [])
            if len(evidence[t]) < 3:
                evidence[t].append(line)
            continue
        m = COMM.search(msg)
        if m:
            nranks = int(m.group("nranks"))
            nnodes = int(m.group("nnodes"))
            continue
        m = INIT_RANK.search(msg)
        if m:
            nranks = nranks or int(m.group("nranks"))
            continue
        m = GDR_STATE.search(msg)
        if m:
            (gdr_enabled if m.group("state").lower() == "enabled" else gdr_disabled).append(line)
            continue
        m = OFI_PROVIDER.search(msg)
        if m:
            plugins["ofi_provider"] = m.group("prov")
        m = OFI_VERSION.search(msg)
        if m:
            plugins["aws_ofi_nccl"] = m.group("v")
        if msg.startswith(("TUNER/", "PROFILER/", "ENV/Plugin", "GIN/")):
            continue  # tuner/profiler plugins are optional and never change the transport
        m = PLUGIN_LOADED.search(msg)
        if m:
            if m.group("name") not in plugins["loaded"]:
                plugins["loaded"].append(m.group("name"))
            continue
        m = PLUGIN_INIT.match(msg)
        if m:
            if m.group("name") not in plugins["initialized"]:
                plugins["initialized"].append(m.group("name"))
            if m.group("name") not in ("IB", "Socket"):
                plugin_init_lines.append(line)
            continue
        m = PLUGIN_ASSIGNED.match(msg)
        if m:
            if m.group("name") not in plugins["assigned"]:
                plugins["assigned"].append(m.group("name"))
            continue
        if PLUGIN_FAIL.search(msg):
            plugin_fail_lines.append(line)
            continue
        if PLUGIN_MISSING.search(msg):
            plugins["not_found"] = True
            plugin_missing_lines.append(line)
            continue
        if NO_VERBS.search(msg):
            no_verbs.append(line)
            continue

    # ---- derived facts -------------------------------------------------------------
    network = networks.most_common(1)[0][0] if networks else None
    if network is None:
        # older NCCL prints no "Using network X": infer it from the connections, then the devices
        if any(t.startswith("NET/Socket") for t in transports):
            network = "Socket"
        elif any(t.startswith("NET/") for t in transports):
            network = transport_class(next(t for t in transports if t.startswith("NET/"))).split("/", 1)[1]
        elif ib_devices:
            network = "IB"
        elif socket_ifs and no_verbs:
            network = "Socket"
    classes: Counter = Counter()
    for t, n in transports.items():
        classes[transport_class(t)] += n
    net_transports = {t: n for t, n in transports.items() if t.startswith(("NET/", "CollNet"))}
    gdrdma: Optional[bool]
    if any("GDRDMA" in t for t in net_transports) or gdr_enabled:
        gdrdma = True
    elif net_transports or gdr_disabled:
        gdrdma = False
    else:
        gdrdma = None
    link_layers = sorted({d.rsplit("/", 1)[1] for d in ib_devices if "/" in d})

    # plugin failure: an external NET plugin was loaded/initialised, reported an error, and
    # the communicator went to another plugin (NCCL's internal IB or Socket)
    external = [p for p in plugins["loaded"] if p not in ("IB", "Socket")]
    # NCCL >= 2.2x says "Failed to initialize NET plugin IB" for its own IB transport when a
    # host has no IB device: that is the no-device case below, not a plugin failing
    real_failures = [ln for ln in plugin_fail_lines
                     if not (INTERNAL_FAIL.search(ln) and no_verbs and not external)]
    fail_evidence = plugin_init_lines[:1] + plugin_fail_lines
    fell_back = bool(external) and bool(plugins["assigned"]) and all(
        not any(a.startswith(e.split(" (")[0]) for e in external) for a in plugins["assigned"])
    if real_failures or fell_back:
        plugins["failed"] = True
        ext = ", ".join(external) or "an external NET plugin"
        if plugins["aws_ofi_nccl"]:
            ext += f" (aws-ofi-nccl {plugins['aws_ofi_nccl']})"
        to = plugins["assigned"][0] if plugins["assigned"] else network
        msg = f"NET plugin {ext} failed to initialise" + (f"; NCCL fell back to its internal {to} transport" if to else "")
        ev = _dedupe(fail_evidence)[:3] + [ln for ln in lines if "Assigned NET plugin" in ln][:1]
        if to == "Socket" and nnodes != 1:
            # the fabric's plugin is gone and what is left between nodes is TCP
            ev += [ln.strip() for ln in lines if "Using network Socket" in ln][:1]
            findings.append(F.error("nccl-plugin-failure", msg + ": traffic between nodes goes over TCP sockets", ev))
        else:
            findings.append(F.warning("nccl-plugin-failure", msg, ev))
    elif plugins["not_found"] and not external:
        findings.append(F.info("nccl-plugin-not-found", "no external NET plugin (libnccl-net.so) found; "
                               "NCCL uses its internal IB/Socket transports", plugin_missing_lines[:2]))
    if no_verbs:
        text = "NCCL cannot use InfiniBand/RoCE: libibverbs or an IB device is missing (not bound into the container?)"
        if nnodes == 1:  # one node: the network carries no data, only where the job spans nodes
            findings.append(F.info("nccl-no-ibverbs", text + "; one node, so no data goes over the network",
                                   _dedupe(no_verbs)[:3]))
        else:
            findings.append(F.warning("nccl-no-ibverbs", text, _dedupe(no_verbs)[:3]))

    socket_lines = [ln for t in transports if t.startswith("NET/Socket") for ln in evidence.get(t, [])]
    if socket_lines or (network == "Socket" and (nnodes or 0) > 1):
        n = sum(n for t, n in transports.items() if t.startswith("NET/Socket"))
        ev = socket_lines or [ln for ln in lines if "Using network Socket" in ln][:2]
        ev = ev + [ln for ln in lines if "NET/Socket : Using" in ln][:1]
        findings.append(F.error(
            "nccl-socket-transport",
            f"NCCL uses TCP sockets between nodes (NET/Socket, {n} connections), not InfiniBand/RoCE or another "
            "RDMA network: a socket fallback", ev))
    shm = {t: n for t, n in transports.items() if t.startswith("SHM")}
    if shm:
        ev = [ln for t in shm for ln in evidence[t]]
        findings.append(F.warning(
            "nccl-shm-hop",
            f"GPU to GPU traffic goes through host shared memory ({', '.join(f'{t}: {n}' for t, n in shm.items())}) "
            "instead of P2P/NVLink: no peer-to-peer access between these GPUs (topology, IOMMU/ACS or container "
            "isolation)", ev))
    ib_net = {t: n for t, n in net_transports.items() if not t.startswith("NET/Socket")}
    if ib_net and not any("GDRDMA" in t for t in ib_net) and not gdr_enabled:
        ev = [ln for t in ib_net for ln in evidence.get(t, [])][:3] + gdr_disabled[:2]
        findings.append(F.warning(
            "nccl-no-gdrdma", "network connections do not use GPUDirect RDMA (data is staged through host memory): "
            "nvidia-peermem / dmabuf unavailable, or NCCL_NET_GDR_LEVEL too strict", ev))
    if warns:
        findings.append(F.warning("nccl-warn", f"NCCL printed {len(warns)} WARN line(s)", _dedupe(warns)[:5]))

    recognized = nccl_lines > 0 or version is not None
    has_data = bool(transports or networks)
    return {
        "nccl_version": version,
        "nranks": nranks,
        "nnodes": nnodes,
        "network": network,
        "networks": dict(networks),
        "ib_devices": ib_devices,
        "ib_link_layers": link_layers,
        "oob_interface": oob,
        "socket_interfaces": socket_ifs,
        "transports": dict(transports),
        "transport_classes": dict(classes),
        "transport_evidence": evidence,
        "gdrdma": gdrdma,
        "plugins": plugins,
        "_findings": findings,
        "_base_verdict": "good" if has_data else "unknown",
        "_recognized": recognized,
    }


def _dedupe(lines: List[str]) -> List[str]:
    """Drop repeats that differ only in the ``host:pid:tid [dev]`` prefix."""
    seen = set()
    out = []
    for ln in lines:
        key = re.sub(r"^\S+:\d+:\d+ \[\d+\]\s*", "", ln.strip())
        if key not in seen:
            seen.add(key)
            out.append(ln.strip())
    return out
