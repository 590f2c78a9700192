"""UCX logs (``UCX_LOG_LEVEL=info``, ``UCX_PROTO_INFO=y``): which transports UCX selected.

A UCX log line is ``[time] [host:pid:thread] file.c:NNN UCX LEVEL message``. UCX 1.14+
prints one selection line per endpoint configuration and, with ``UCX_PROTO_INFO=y``, a
table of protocols per message-size range::

    UCX  INFO    ucp_context_0 intra-node cfg#1 tag(sysv/memory cma/memory)
    | ucp_context_0 intra-node cfg#1 | tagged message by ucp_tag_send* from host memory |
    |        0..92 | eager short                               | sysv/memory |
    |    5423..inf | (?) rendezvous zero-copy read from remote | cma/memory  |

Older UCX prints ``ep_cfg[1]: tag(posix/memory knem/memory); rma(...)`` instead. Rows of
several processes interleave; they are attributed by the ``[host:pid:...]`` prefix. The
tables also come with a ``| mpi ep_cfg[3] | ...`` header (UCX 1.13), as bare rows without
the ``UCX INFO`` tag (UCX 1.17+), commented with ``#`` (``ucx_info -e``), or cut from their
header: such rows take the scope their transports imply (shared memory: intra-node, RDMA:
inter-node). A ``ucx-protocols`` note quotes the rows when no TCP is among them.

What UCX selected is kept per scope with the lines that show it (``transports_by_scope``,
``ucx_transport_evidence``), and what it was asked for and could not open (``WARN network
device 'mlx5_0:1' is not available``, ``transports 'rc' are not available``: ``ucx_unavailable``):
facts, judged by the rules of :mod:`dedal.stages.verify.rules` (TCP within a node, TCP between
nodes that have a fabric, a missing device: fallbacks). Other WARN and ERROR lines are reported
(``suboptimal``), except perftest's own note that the benchmark is not pinned to a CPU; DIAG lines
are harmless and only counted, except those that say UCX runs without its memory event hooks
(UCM), noted (``ucx-memory-hooks-off``).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

from dedal.stages.verify import findings as F
from dedal.stages.verify.facts import transport_family
from dedal.stages.verify.findings import Finding

UCX_LINE = re.compile(r"\bUCX\s+(?P<level>INFO|WARN|WARNING|ERROR|DIAG|DEBUG|TRACE|FATAL|PRINT)\s+(?P<msg>.*)$")
PREFIX = re.compile(r"\[(?P<host>[^\]:\s]+):(?P<pid>\d+)\s*(?::[^\]]*)?\]")  # [vm:860  :0]: UCX pads the pid
VERSION = re.compile(r"^Version (?P<v>\d+\.\d+\.\d+\S*)")
ENV = re.compile(r"^UCX_\* env variables?:\s*(?P<vars>.*)$")
SELECTION = re.compile(
    r"^(?P<ctx>\S+)\s+(?P<scope>self|intra-node|inter-node|[\w-]+)\s+cfg#(?P<cfg>\d+)\s+(?P<lanes>\w+\(.*)$"
)
OLD_SELECTION = re.compile(r"^ep_cfg\[(?P<cfg>\d+)\]:\s*(?P<lanes>\w+\(.*)$")
LANE = re.compile(r"(?P<op>[\w]+)\((?P<tls>[^)]*)\)")
TL = re.compile(r"(?P<tl>[a-z][a-z0-9_]*)/(?P<dev>[\w:.\-]+)")
TABLE_HEAD = re.compile(
    r"\|\s*(?P<ctx>\S+)\s+(?:(?P<scope>self|intra-node|inter-node|[\w-]+)\s+cfg#(?P<cfg>\d+)|"
    r"ep_cfg\[(?P<epcfg>\d+)\])\s*\|\s*(?P<op>[^|]*?)\s*\|"
)
TABLE_ROW = re.compile(r"\|\s*(?P<range>[\w.]+\.\.[\w.]+)\s*\|\s*(?P<proto>[^|]*?)\s*\|\s*(?P<tl>[^|]*?)\s*\|")
#: a protocol table line, with or without the ``UCX INFO`` tag (UCX 1.17+ prints the rows bare;
#: ``ucx_info -e`` comments them with ``#``): a header with cfg#/ep_cfg, or a size range with a transport
PROTO_LINE = re.compile(
    r"\|\s*\S+\s+(?:(?:self|intra-node|inter-node)\s+cfg#\d+|ep_cfg\[\d+\])\s*\||"
    r"\|\s*[\w.]+\.\.[\w.]+\s*\|[^|]*\|[^|]*\b[a-z][a-z0-9_]*/[\w:.\-]+"
)
DEVICE_UNAVAILABLE = re.compile(
    r"network device '(?P<dev>[^']+)' is not available(?:, please use one or more of: (?P<alt>.*))?"
)
TL_UNAVAILABLE = re.compile(
    r"transports? (?P<tls>'[^']+'(?:\s*,\s*'[^']+')*) (?:is|are) not available"
    r"(?:, please use one or more of: (?P<alt>.*))?"
)

# ranks in separate user namespaces (ch-run, some Apptainer set-ups) cannot open each other's
# /proc/<pid>/fd: UCX's posix transport fails for that peer and sysv/cma are used instead
#: DIAG lines of a UCX without its memory event hooks (UCM): no registration or memory-type cache
MEMORY_HOOKS_OFF = re.compile(
    r"failed to (?:install|set) UCM (?:memtype )?event handler|"
    r"could not create UCP registration cache"
)
POSIX_PROC_DENIED = re.compile(r"open\(/proc/\d+/fd/\d+\) failed: Permission denied")
#: WARN lines about the benchmark process, not the transports (ucx_perftest without -c)
BENIGN_WARN = re.compile(r"CPU affinity is not set \(bound to \d+ cpus\)")


def has_ucx_lines(lines: List[str]) -> bool:
    return any(UCX_LINE.search(line) for line in lines)


def _tls(text: str) -> List[str]:
    return [f"{m.group('tl')}/{m.group('dev')}" for m in TL.finditer(text)]


def parse(lines: List[str]) -> Dict[str, Any]:
    findings: List[Finding] = []
    version: Optional[str] = None
    env: Dict[str, str] = {}
    selections: "OrderedDict[Tuple[str, str, int, str], Dict[str, Any]]" = OrderedDict()
    protocols: "OrderedDict[Tuple, Dict[str, Any]]" = OrderedDict()
    current: Dict[str, Tuple[str, str, int, str]] = {}  # pid -> table context
    warn_lines: List[str] = []
    error_lines: List[str] = []
    proc_denied: List[str] = []
    unavailable_dev: List[str] = []
    unavailable_tl: List[str] = []
    benign: List[str] = []
    diag = 0
    no_hooks: List[str] = []
    ucx_lines = 0

    for raw in lines:
        line = raw.strip()
        if line.startswith("#") and "|" in line:
            line = line.lstrip("# ")  # ucx_info -e comments its tables
        pm = PREFIX.search(line)
        pid = pm.group("pid") if pm else ""
        if "|" in line and ("cfg#" in line or "ep_cfg[" in line):
            m = TABLE_HEAD.search(line)
            if m:
                cfg = m.group("cfg") or m.group("epcfg")
                current[pid] = (m.group("ctx"), m.group("scope") or "", int(cfg), m.group("op"))
                ucx_lines += 1
                continue
        if line.count("|") >= 4 and ".." in line:
            m = TABLE_ROW.search(line)
            if m:  # rows before their header (a cut log) keep an unknown scope, inferred from the transports
                ctx, scope, cfg, op = current.get(pid, ("?", "", -1, ""))
                key = (ctx, scope, cfg, op, m.group("range"), m.group("proto"), m.group("tl"))
                if key not in protocols:
                    protocols[key] = {
                        "context": ctx,
                        "scope": scope,
                        "cfg": cfg,
                        "operation": op,
                        "range": m.group("range"),
                        "protocol": m.group("proto"),
                        "transports": _tls(m.group("tl")),
                        "line": line,
                    }
                ucx_lines += 1
                continue
        m = UCX_LINE.search(line)
        if not m:
            continue
        ucx_lines += 1
        level, msg = m.group("level"), m.group("msg").strip()
        if level == "DIAG":
            diag += 1
            if MEMORY_HOOKS_OFF.search(msg):
                no_hooks.append(line)
            continue
        if level in ("WARN", "WARNING"):
            if DEVICE_UNAVAILABLE.search(msg):
                unavailable_dev.append(line)
            elif TL_UNAVAILABLE.search(msg):
                unavailable_tl.append(line)
            elif BENIGN_WARN.search(msg):
                benign.append(line)
            else:
                warn_lines.append(line)
            continue
        if level in ("ERROR", "FATAL"):
            if POSIX_PROC_DENIED.search(msg):
                proc_denied.append(line)
            else:
                error_lines.append(line)
            continue
        mv = VERSION.match(msg)
        if mv:
            version = version or mv.group("v")
            continue
        me = ENV.match(msg)
        if me:
            for kv in me.group("vars").split():
                if "=" in kv:
                    k, v = kv.split("=", 1)
                    env[k] = v
            continue
        ms = SELECTION.match(msg) or OLD_SELECTION.match(msg)
        if ms:
            gd = ms.groupdict()
            ctx = gd.get("ctx") or "ep"
            scope = gd.get("scope") or ""
            lanes_text = ms.group("lanes").rstrip("; ")
            key = (ctx, scope, int(ms.group("cfg")), lanes_text)
            if key not in selections:
                lanes: Dict[str, List[str]] = {}
                for lm in LANE.finditer(lanes_text):
                    lanes.setdefault(lm.group("op"), []).extend(_tls(lm.group("tls")))
                tls = sorted({t for v in lanes.values() for t in v})
                selections[key] = {
                    "context": ctx,
                    "scope": scope or _infer_scope(tls),
                    "cfg": int(ms.group("cfg")),
                    "lanes": lanes,
                    "transports": tls,
                    "count": 0,
                    "line": line,
                }
            selections[key]["count"] += 1

    # ---- transports per scope ------------------------------------------------------
    by_scope: Dict[str, List[str]] = {}
    evidence: Dict[str, List[str]] = {}
    for sel in selections.values():
        for t in sel["transports"]:
            lst = by_scope.setdefault(sel["scope"], [])
            if t not in lst:
                lst.append(t)
        evidence.setdefault(sel["scope"], []).append(sel["line"])
    for p in protocols.values():
        p["scope"] = p["scope"] or _infer_scope(p["transports"])
        for t in p["transports"]:
            lst = by_scope.setdefault(p["scope"], [])
            if t not in lst:
                lst.append(t)

    # evidence per scope and transport: the selection lines and protocol rows that name it
    tl_evidence: Dict[str, Dict[str, List[str]]] = {}
    for sel in selections.values():
        for t in sel["transports"]:
            lst = tl_evidence.setdefault(sel["scope"], {}).setdefault(t, [])
            if len(lst) < 2:
                lst.append(sel["line"])
    for p in protocols.values():
        for t in p["transports"]:
            lst = tl_evidence.setdefault(p["scope"], {}).setdefault(t, [])
            if len(lst) < 4:
                lst.append(p["line"])
    # what UCX was asked for and could not open (the rules judge it against the host's fabric)
    unavailable: List[Dict[str, Any]] = []
    if unavailable_dev:
        m = DEVICE_UNAVAILABLE.search(unavailable_dev[0])
        dev = m.group("dev") if m else "?"
        alt = (m.group("alt") or "").strip() if m else ""
        hosts = sorted({h.group("host") for h in (PREFIX.search(x) for x in unavailable_dev) if h})
        unavailable.append(
            {
                "what": "device",
                "items": [dev],
                "lines": unavailable_dev[:3],
                "detail": f"requested network device '{dev}' is not available on {', '.join(hosts) or 'a node'} "
                f"({len(unavailable_dev)} line(s)); UCX can only use {alt or 'other devices'}",
            }
        )
    if unavailable_tl:
        m = TL_UNAVAILABLE.search(unavailable_tl[0])
        unavailable.append(
            {
                "what": "transport",
                "items": [m.group("tls") if m else "?"],
                "lines": unavailable_tl[:3],
                "detail": f"transports {m.group('tls') if m else '?'} are not available "
                f"({len(unavailable_tl)} line(s)); left: "
                f"{(m.group('alt') or '?').strip() if m else '?'}",
            }
        )

    if warn_lines:
        findings.append(F.warning("ucx-warn", f"UCX printed {len(warn_lines)} WARN line(s)", warn_lines[:5]))
    if benign:
        findings.append(
            F.info(
                "ucx-perftest-affinity",
                "ucx_perftest runs without CPU affinity (its own note about "
                "the benchmark's pinning, not about the transports)",
                benign[:1],
            )
        )
    if proc_denied:
        findings.append(
            F.info(
                "ucx-posix-proc-denied",
                f"UCX could not open a peer's /proc/<pid>/fd ({len(proc_denied)} "
                "line(s)): the ranks run in separate user namespaces, so the posix shared-memory "
                "transport is unusable between them and UCX uses sysv/cma (harmless)",
                proc_denied[:2],
            )
        )
    if no_hooks:
        findings.append(
            F.info(
                "ucx-memory-hooks-off",
                f"UCX could not install its memory event hooks (UCM; "
                f"{len(no_hooks)} line(s)): it runs without its registration cache and memory-type "
                "cache, which it would otherwise keep across messages",
                no_hooks[:3],
            )
        )
    if error_lines:
        findings.append(
            F.warning(
                "ucx-error",
                f"UCX printed {len(error_lines)} ERROR line(s) (the run may still "
                "have succeeded over other transports)",
                error_lines[:5],
            )
        )
    fast = {scope: [t for t in tls if transport_family(t.split("/")[0]) != "tcp"] for scope, tls in by_scope.items()}
    if protocols and fast == by_scope:
        rows = [p["line"] for p in protocols.values()]
        findings.append(
            F.info(
                "ucx-protocols",
                "UCX protocol tables: " + "; ".join(f"{scope}: {', '.join(tls)}" for scope, tls in fast.items() if tls),
                rows[:2] + rows[2:][-1:],
            )
        )

    recognized = ucx_lines > 0
    has_data = bool(selections or protocols)
    return {
        "ucx_version": version,
        "ucx_env": env,
        "selections": [{k: v for k, v in s.items()} for s in selections.values()],
        "protocols": [{k: v for k, v in p.items() if k != "line"} for p in protocols.values()],
        "transports_by_scope": by_scope,
        "ucx_transport_evidence": tl_evidence,
        "ucx_unavailable": unavailable,
        "ucx_warnings": len(warn_lines) + len(benign) + len(unavailable_dev) + len(unavailable_tl),
        "ucx_errors": len(error_lines),
        "ucx_diag": diag,
        "_findings": findings,
        "_base_verdict": "good" if has_data else "unknown",
        "_recognized": recognized,
        "_has_data": has_data,
    }


def _infer_scope(tls: List[str]) -> str:
    fams = {transport_family(t.split("/")[0]) for t in tls}
    if fams and fams <= {"shm"}:
        return "intra-node"
    if "rdma" in fams:
        return "inter-node"
    return "unknown"
