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

These are facts, each with the lines that show it (``network_lines``, ``socket_lines``,
``ib_lines``, ``ib_unopenable``: RDMA devices NCCL found and could not open, ``no_verbs_lines``,
``plugin_lines``, ``plugin_missing_lines``, ``gdr_*_lines``); the rules of
:mod:`dedal.stages.verify.rules` judge them against the host: a socket transport between nodes
(a fallback where there is a fabric), NCCL on sockets where the log names a fabric (its network
plugin or the IB device missing), a GPU to GPU hop through host shared memory, a network path
without GPUDirect RDMA, an external NET plugin that failed.
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
VIA = re.compile(
    r"(?:Channel|Ring)\s+\d+(?:/\d+)?\s*:\s*(?P<src>\d+)(?:\[[^\]]*\])?\s*->\s*(?P<dst>\d+)(?:\[[^\]]*\])?"
    r"(?:\s*\[(?P<dir>send|receive)\])?\s*via\s+(?P<via>\S.*?)\s*$"
)
COMM = re.compile(r"\bnRanks\s+(?P<nranks>\d+)\s+nNodes\s+(?P<nnodes>\d+)")
INIT_RANK = re.compile(r"ncclCommInitRank comm \S+ rank (?P<rank>\d+) nranks (?P<nranks>\d+)")
GDR_STATE = re.compile(r"GPU Direct RDMA (?P<state>Enabled|Disabled)", re.IGNORECASE)
OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (?P<prov>\S+)")
OFI_VERSION = re.compile(r"NET/OFI Using aws-ofi-nccl (?P<v>\S+)")
PLUGIN_LOADED = re.compile(r"(?:NET/Plugin: Loaded net plugin|Loaded net plugin) (?P<name>.+?)\s*$")
PLUGIN_INIT = re.compile(r"^Initialized NET plugin (?P<name>.+?)\s*$")
PLUGIN_ASSIGNED = re.compile(r"^Assigned NET plugin (?P<name>.+?) to comm")
PLUGIN_MISSING = re.compile(
    r"NET/Plugin\s*:?\s*(?:No plugin found|Could not find:?|Plugin load \(?\S*\)? returned \d+|"
    r"Plugin load returned \d+)",
    re.IGNORECASE,
)
PLUGIN_FAIL = re.compile(
    r"(?:plugin/net\.cc:\d+ -> [1-9]\d*|NET/Plugin\s*:?\s*Failed to initialize|"
    r"Failed to initialize NET plugin|NET/OFI .*(?:Invalid|[Ff]ailed|[Ee]rror|Unable))"
)
INTERNAL_FAIL = re.compile(r"Failed to initialize NET plugin (?:IB|Socket)\s*$")
NO_VERBS = re.compile(
    r"Failed to open libibverbs|NET/IB\s*:\s*No device found|NET/IB\s*:\s*No IB device", re.IGNORECASE
)
#: an RDMA device NCCL found and could not open (in a container without it, or without permission)
IB_UNOPENABLE = re.compile(r"NET/IB\s*:\s*Unable to open device (?P<dev>\S+)")


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
    plugins: Dict[str, Any] = {
        "loaded": [],
        "initialized": [],
        "assigned": [],
        "not_found": False,
        "failed": False,
        "ofi_provider": None,
        "aws_ofi_nccl": None,
    }
    plugin_fail_lines: List[str] = []
    plugin_init_lines: List[str] = []
    plugin_missing_lines: List[str] = []
    no_verbs: List[str] = []
    ib_lines: List[str] = []
    ib_unopenable: List[str] = []
    network_lines: List[str] = []
    socket_lines: List[str] = []
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
            if len(network_lines) < 3:
                network_lines.append(line)
            continue
        m = NET_IB.match(msg)
        if m:
            for dev in re.findall(r"\[\d+\]\s*(\S+)", m.group("devs")):
                if dev not in ib_devices:
                    ib_devices.append(dev)
            oob = oob or m.group("oob")
            if len(ib_lines) < 2:
                ib_lines.append(line)
            continue
        m = IB_UNOPENABLE.search(msg)
        if m:
            if m.group("dev") not in ib_unopenable:
                ib_unopenable.append(m.group("dev"))
            ib_lines.append(line)
            no_verbs.append(line)
            continue
        m = NET_SOCKET.match(msg)
        if m:
            for itf in re.findall(r"\[\d+\]\s*(\S+)", m.group("ifs")) or [m.group("ifs")]:
                if itf not in socket_ifs:
                    socket_ifs.append(itf)
            if len(socket_lines) < 2:
                socket_lines.append(line)
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
    real_failures = [ln for ln in plugin_fail_lines if not (INTERNAL_FAIL.search(ln) and no_verbs and not external)]
    fell_back = (
        bool(external)
        and bool(plugins["assigned"])
        and all(not any(a.startswith(e.split(" (")[0]) for e in external) for a in plugins["assigned"])
    )
    plugin_evidence: List[str] = []
    plugin_failure = ""
    if real_failures or fell_back:
        plugins["failed"] = True
        ext = ", ".join(external) or "an external NET plugin"
        if plugins["aws_ofi_nccl"]:
            ext += f" (aws-ofi-nccl {plugins['aws_ofi_nccl']})"
        to = plugins["assigned"][0] if plugins["assigned"] else network
        plugin_failure = f"{ext} failed to initialise" + (
            f"; NCCL fell back to its internal {to} transport" if to else ""
        )
        plugin_evidence = (
            _dedupe(plugin_init_lines[:1] + plugin_fail_lines)[:3]
            + [ln for ln in lines if "Assigned NET plugin" in ln][:1]
        )
        if to == "Socket" and nnodes != 1:
            plugin_evidence += [ln.strip() for ln in lines if "Using network Socket" in ln][:1]
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
        "network_lines": network_lines,
        "socket_lines": socket_lines,
        "ib_lines": ib_lines[:3],
        "ib_unopenable": ib_unopenable,
        "no_verbs_lines": _dedupe(no_verbs)[:3],
        "gdr_enabled_lines": gdr_enabled[:2],
        "gdr_disabled_lines": gdr_disabled[:2],
        "plugin_lines": plugin_evidence,
        "plugin_failure": plugin_failure,
        "plugin_missing_lines": plugin_missing_lines[:2],
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
