"""Open MPI component selection output (``--mca btl_base_verbose 100``, ``pml_base_verbose``).

Lines are ``[host:pid] mca: base: components_open: ...``, ``[host:pid] select: init of
component vader returned success``, ``[host:pid] select: component ob1 selected`` and,
most telling, ``[host:pid] mca: bml: Using sm btl for send to [[52108,1],0] on node vm``:
the BTL that each process really uses for each peer.

The BTL used for each peer (``btl_peers``, with the line that shows it) is a fact the rules of
:mod:`dedal.stages.verify.rules` judge: shared memory (``sm``, ``vader``) within a node; a
fabric BTL (``uct``, ``ofi``, ``openib``, ``usnic``) or ``pml ucx``/``cm`` between nodes;
``tcp`` within a node, or between nodes that have a fabric, is a TCP fallback. Component init
failures are listed (``info``): most are the normal pruning of components for hardware the node
does not have.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Dict, List, Optional

from dedal.stages.verify import findings as F
from dedal.stages.verify.findings import Finding

PREFIX = re.compile(r"^\[(?P<host>[^\]:\s]+):(?P<pid>\d+)\]\s*(?P<msg>.*)$")
REGISTER = re.compile(r"mca: base: components_register: registering framework (?P<fw>\w+) components")
OPEN_FW = re.compile(r"mca: base: components_open: opening (?P<fw>\w+) components")
FOUND = re.compile(r"mca: base: components_(?P<phase>register|open): found loaded component (?P<comp>\w+)")
OPENED = re.compile(r"mca: base: components_open: component (?P<comp>\w+) open function successful")
INITIALIZING = re.compile(r"select: initializing (?P<fw>\w+) component (?P<comp>\w+)")
INIT_RESULT = re.compile(r"select: init of component (?P<comp>\w+) returned (?P<res>success|failure)")
SELECTED = re.compile(r"select: component (?P<comp>\w+) selected")
NOT_SELECTED = re.compile(r"select: component (?P<comp>\w+) not selected")
BEST = re.compile(r"selected (?P<comp>\w+) best priority (?P<prio>\d+)")
BASE_SELECTED = re.compile(r"mca:base:select:\(\s*(?P<fw>\w+)\)\s*Selected component \[(?P<comp>\w+)\]")
USING_BTL = re.compile(
    r"mca: bml: Using (?P<btl>\w+) btl for send to (?P<peer>\[\[[\d,]+\],\d+\]) on node (?P<node>\S+)"
)
PML_UCX = re.compile(r"pml_ucx\.c:\d+|common_ucx\.c:\d+")
SHM_BTLS = {"sm", "vader", "smcuda", "self"}
FABRIC_BTLS = {"uct", "ofi", "openib", "usnic", "ugni", "portals4", "psm2"}


def has_ompi_lines(lines: List[str]) -> bool:
    return any(PREFIX.match(ln.strip()) and ("mca: " in ln or "select: " in ln) for ln in lines)


def _short(host: str) -> str:
    return host.split(".")[0]


def parse(lines: List[str]) -> Dict[str, Any]:
    findings: List[Finding] = []
    fw_of: Dict[str, str] = {}  # pid -> framework being handled
    frameworks: Dict[str, Dict[str, List[str]]] = {}
    init_fw: Dict[tuple, str] = {}
    selected: Counter = Counter()
    fw_selected: Dict[str, Counter] = {}
    btl_used: Counter = Counter()
    peers: List[Dict[str, Any]] = []
    hosts: List[str] = []
    failures: List[str] = []
    recognized_lines = 0

    def fw_entry(fw: str) -> Dict[str, List[str]]:
        return frameworks.setdefault(fw, {"registered": [], "opened": [], "initialized": [], "failed": []})

    def add(lst: List[str], item: str) -> None:
        if item not in lst:
            lst.append(item)

    for raw in lines:
        line = raw.strip()
        m = PREFIX.match(line)
        if not m:
            continue
        host, pid, msg = m.group("host"), m.group("pid"), m.group("msg")
        if not (msg.startswith(("mca:", "select:", "selected ", "check:select")) or PML_UCX.search(msg)):
            continue
        recognized_lines += 1
        if host not in hosts:
            hosts.append(host)
        mm = REGISTER.search(msg) or OPEN_FW.search(msg)
        if mm:
            fw_of[pid] = mm.group("fw")
            fw_entry(mm.group("fw"))
            continue
        mm = FOUND.search(msg)
        if mm and pid in fw_of:
            add(fw_entry(fw_of[pid])["registered"], mm.group("comp"))
            continue
        mm = OPENED.search(msg)
        if mm and pid in fw_of:
            add(fw_entry(fw_of[pid])["opened"], mm.group("comp"))
            continue
        mm = INITIALIZING.search(msg)
        if mm:
            fw_of[pid] = mm.group("fw")
            init_fw[(pid, mm.group("comp"))] = mm.group("fw")
            fw_entry(mm.group("fw"))
            continue
        mm = INIT_RESULT.search(msg)
        if mm:
            fw = init_fw.get((pid, mm.group("comp")), fw_of.get(pid, "btl"))
            if mm.group("res") == "success":
                add(fw_entry(fw)["initialized"], mm.group("comp"))
            else:
                add(fw_entry(fw)["failed"], mm.group("comp"))
                failures.append(line)
            continue
        mm = BASE_SELECTED.search(msg)
        if mm:
            fw_selected.setdefault(mm.group("fw"), Counter())[mm.group("comp")] += 1
            if mm.group("fw") == "pml":
                selected[mm.group("comp")] += 1
            continue
        mm = SELECTED.search(msg)
        if mm:
            fw = init_fw.get((pid, mm.group("comp")), "pml")
            fw_selected.setdefault(fw, Counter())[mm.group("comp")] += 1
            if fw == "pml":
                selected[mm.group("comp")] += 1
            continue
        mm = USING_BTL.search(msg)
        if mm:
            btl, node = mm.group("btl"), mm.group("node")
            same = _short(node) == _short(host)
            btl_used[btl] += 1
            peers.append(
                {
                    "host": host,
                    "pid": int(pid),
                    "btl": btl,
                    "peer": mm.group("peer"),
                    "node": node,
                    "same_node": same,
                    "line": line,
                }
            )
            continue

    pml = selected.most_common(1)[0][0] if selected else None
    btl_fw = frameworks.get("btl", {})
    if failures:
        comps = sorted({INIT_RESULT.search(f).group("comp") for f in failures if INIT_RESULT.search(f)})
        findings.append(
            F.info(
                "ompi-component-init-failed", f"components that did not initialise: {', '.join(comps)}", failures[:3]
            )
        )
    inited = btl_fw.get("initialized", []) if btl_fw else []
    if inited:
        findings.append(
            F.info(
                "ompi-btl-initialized",
                f"BTL components initialised: {', '.join(inited)}" + (f"; PML selected: {pml}" if pml else ""),
            )
        )
    has_data = bool(inited or btl_used or selected)
    return {
        "pml": pml,
        "pml_selected": dict(selected),
        "selected": {fw: c.most_common(1)[0][0] for fw, c in fw_selected.items()},
        "frameworks": frameworks,
        "btl_components": inited,
        "btl_used": dict(btl_used),
        "btl_peers": peers,
        "hosts": hosts,
        "_findings": findings,
        "_base_verdict": "good" if has_data else "unknown",
        "_recognized": recognized_lines > 0,
    }


def fabric_btl(name: str) -> Optional[str]:
    """Classify a BTL name: ``shm``, ``fabric``, ``tcp`` or None."""
    if name in SHM_BTLS:
        return "shm"
    if name in FABRIC_BTLS:
        return "fabric"
    if name == "tcp":
        return "tcp"
    return None
