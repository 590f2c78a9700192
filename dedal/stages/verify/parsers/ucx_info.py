"""``ucx_info -d``: the memory domains, transports and devices UCX can use on a host.

The output is a list of ``# Memory domain: X`` blocks, each with ``# Transport: T`` /
``# Device: D`` / ``# Type: network|intra-node|loopback|accelerator`` sub-blocks and
their capabilities (bandwidth in MB/s, latency in ns). ``< no supported devices found >``
marks a domain without devices.

The verdict is about what the listing offers: shared memory (sysv/posix/cma/knem/xpmem)
is expected; an RDMA network transport (rc/dc/ud over mlx5 or verbs) is reported as
present. A listing with TCP as the only network transport is only ``info`` here,
because whether the host has an RDMA network is a host fact: :mod:`dedal.stages.verify.checks`
turns it into an error when the host has InfiniBand but the container's UCX does not.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from dedal.stages.verify import findings as F
from dedal.stages.verify.findings import Finding
from dedal.stages.verify.facts import transport_family

MD = re.compile(r"^#?\s*Memory domain:\s*(?P<name>\S+)")
COMPONENT = re.compile(r"^#?\s*Component:\s*(?P<name>\S+)")
TRANSPORT = re.compile(r"^#?\s*Transport:\s*(?P<name>\S+)")
DEVICE = re.compile(r"^#?\s*Device:\s*(?P<name>\S+)")
TYPE = re.compile(r"^#?\s*Type:\s*(?P<type>\S+)")
SYSDEV = re.compile(r"^#?\s*System device:\s*(?P<dev>.*)$")
BANDWIDTH = re.compile(r"^#?\s*bandwidth:\s*(?P<ppn>[\d.]+)/ppn \+ (?P<bw>[\d.]+) MB/sec")
LATENCY = re.compile(r"^#?\s*latency:\s*(?P<lat>[\d.]+)(?: \+ (?P<per>[\d.]+) \* N)? nsec")
NO_DEVICES = re.compile(r"<\s*no supported devices found\s*>")
CM = re.compile(r"^#?\s*Connection manager:\s*(?P<name>\S+)")


def parse(lines: List[str]) -> Dict[str, Any]:
    findings: List[Finding] = []
    domains: List[Dict[str, Any]] = []
    transports: List[Dict[str, Any]] = []
    cms: List[str] = []
    md: Optional[Dict[str, Any]] = None
    tl: Optional[Dict[str, Any]] = None
    for raw in lines:
        line = raw.strip()
        m = MD.match(line)
        if m:
            md = {"name": m.group("name"), "component": None, "devices": True}
            domains.append(md)
            tl = None
            continue
        m = CM.match(line)
        if m:
            cms.append(m.group("name"))
            md = None
            tl = None
            continue
        if md is None:
            continue
        m = COMPONENT.match(line)
        if m:
            md["component"] = m.group("name")
            continue
        if NO_DEVICES.search(line):
            md["devices"] = False
            continue
        m = TRANSPORT.match(line)
        if m:
            tl = {
                "transport": m.group("name"),
                "device": None,
                "type": None,
                "memory_domain": md["name"],
                "component": md["component"],
                "bandwidth_mbs": None,
                "latency_ns": None,
                "family": transport_family(m.group("name")),
            }
            transports.append(tl)
            continue
        if tl is None:
            continue
        for rx, key in ((DEVICE, "device"), (TYPE, "type")):
            m = rx.match(line)
            if m:
                tl[key] = m.group(1)
                break
        else:
            m = BANDWIDTH.match(line)
            if m:
                tl["bandwidth_mbs"] = float(m.group("ppn")) + float(m.group("bw"))
                continue
            m = LATENCY.match(line)
            if m:
                tl["latency_ns"] = float(m.group("lat"))
    names = sorted({t["transport"] for t in transports})
    devices = sorted({t["device"] for t in transports if t["device"]})
    network = [t for t in transports if t["type"] == "network"]
    rdma = [t for t in network if t["family"] == "rdma"]
    shm = [t for t in transports if t["type"] == "intra-node"]
    cuda = [t for t in transports if t["transport"].startswith(("cuda", "gdr_copy", "rocm"))]
    if rdma:
        devs = sorted({t["device"] for t in rdma if t["device"]})
        findings.append(
            F.info(
                "ucx-rdma-available",
                f"RDMA transports available: {', '.join(sorted({t['transport'] for t in rdma}))} on {', '.join(devs)}",
            )
        )
    elif network:
        findings.append(
            F.info(
                "ucx-no-rdma",
                "no RDMA network transport: inter-node traffic would use TCP ("
                + ", ".join(f"{t['transport']}/{t['device']}" for t in network)
                + ")",
            )
        )
    if transports and not shm:
        findings.append(
            F.warning(
                "ucx-no-shm",
                "no shared-memory transport (sysv/posix/cma): intra-node traffic would go through the network stack",
            )
        )
    recognized = bool(domains)
    return {
        "memory_domains": [
            {"name": d["name"], "component": d["component"], "has_devices": d["devices"]} for d in domains
        ],
        "connection_managers": cms,
        "transports": transports,
        "transport_names": names,
        "devices": devices,
        "has_rdma": bool(rdma),
        "has_shm": bool(shm),
        "has_cuda": bool(cuda),
        "_findings": findings,
        "_base_verdict": "good" if transports else "unknown",
        "_recognized": recognized,
    }
