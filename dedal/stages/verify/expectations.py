"""Expectations: what a measurement should be on its hardware, declared as rows and judged once.

Native vs container (:mod:`dedal.stages.verify.checks`) catches what the container adds. It
cannot catch a stack that is as slow natively as in the container: the esd-gpu image on an
NVIDIA H200 took ~150 us for an 8 B message between GPU buffers on both sides, where the same
host moved host buffers in 0.4 us and its own CUDA copies took 14-22 us (issue 36). So each
measurement is also held to references:

- the **hardware class** it belongs to (``host``: host buffers, shared memory or an RDMA
  fabric; ``cuda``: NVIDIA GPU buffers): a bound that the class gives everywhere;
- **another fact of the same host**: device-buffer latency against the host-buffer latency
  measured there, and against the floor that dedal measures there itself with
  ``dedal_cuda_floor`` (a two-process CUDA IPC ping-pong, CUDA copy + synchronize, copy
  bandwidth): the platform's own primitives, which no MPI stack can beat.

A :class:`Fact` is one number that a parse result shows, with the lines that show it
(:func:`facts_of` reads them from the OSU/dedal-bench tables). An :class:`Expectation` is one
row of :data:`EXPECTATIONS`: its finding code, the hardware class and fact it reads, the range
that fires it (``at_least`` / ``below``, absolute in the fact's unit or times a reference
fact ``of``), where it applies (``scope``; ``unless`` a fact makes it moot: a class bound
where the host's own floor was measured), severity, verdict and message. :func:`judge`
applies every row to every fact once, for ``dedal verify parse`` (the facts of one log) and
for ``dedal verify`` (the facts of all the runs of one side and scope) alike.

The rows are data, so that they become rows of the one rules table of issue 38 unchanged
(code, when: hardware class + scope + the facts read, severity, message).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from dedal.stages.verify.findings import Finding

#: every fact an expectation may read: ``class:name`` -> (unit, better: lower|higher, what it is)
FACTS: Dict[str, Tuple[str, str, str]] = {
    "host:latency_small_us": ("us", "lower", "point-to-point latency between host buffers, smallest at <= 64 B"),
    "host:bandwidth_large_mbs": ("MB/s", "higher", "point-to-point bandwidth between host buffers, peak at >= 1 MiB"),
    "cuda:latency_small_us": ("us", "lower", "point-to-point latency between GPU buffers, smallest at <= 64 B"),
    "cuda:bandwidth_large_mbs": ("MB/s", "higher", "point-to-point bandwidth between GPU buffers, peak at >= 1 MiB"),
    "cuda:collective_small_us": ("us", "lower", "a collective (all-reduce ...) between GPU buffers, smallest latency "
                                 "at <= 64 B"),
    "cuda:ipc_latency_us": ("us", "lower", "dedal_cuda_floor: CUDA IPC ping-pong between two processes (one copy "
                            "into the peer's buffer, synchronize, a host message), half round trip, smallest at <= 64 B"),
    "cuda:copy_sync_us": ("us", "lower", "dedal_cuda_floor: one device-to-host copy + synchronize, smallest at <= 64 B"),
    "cuda:copy_bandwidth_mbs": ("MB/s", "higher", "dedal_cuda_floor: copies into the peer process's GPU buffer, "
                                "64 in flight, peak at >= 1 MiB"),
}
SMALL_MAX = 64          # bytes: a "small message" (latency facts)
LARGE_MIN = 1 << 20     # bytes: a "large message" (bandwidth facts)
#: the benchmark whose tables are the platform's own floor, and the fact of each of its columns
FLOOR_BENCHMARK = "dedal_cuda_floor"
FLOOR_COLUMNS = {"ipc latency": "ipc_latency_us", "d2h+sync": "copy_sync_us"}
FLOOR_BANDWIDTH = "dedal_cuda_copy_bandwidth"


@dataclass(frozen=True)
class Fact:
    """One number a parse result shows: ``hardware`` class, ``name`` (a key of :data:`FACTS`
    without its class), the benchmark it comes from (``subject``), value, unit, and the lines
    that show it (``evidence``)."""

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
        return {"fact": self.key, "subject": self.subject, "value": self.value, "unit": self.unit,
                "evidence": list(self.evidence)}


@dataclass(frozen=True)
class Expectation:
    """One declared expectation. It fires for a fact ``hardware:fact`` whose value is
    ``>= at_least`` and ``< below`` (either may be None), both in the fact's unit, or times the
    best value of the reference fact ``of`` where one is named (no reference measured: not
    judged). ``scope``: only where the fact was measured in that scope ("" anywhere; a log whose
    scope is unknown is judged by every row); ``unless``: not judged where one of these facts
    was measured. ``message`` is formatted with ``subject``, ``value``, ``unit``, ``limit``, and
    where ``of`` is set ``ref`` (its benchmark), ``ref_value``, ``ratio``."""

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

    @property
    def key(self) -> str:
        return f"{self.hardware}:{self.fact}"


#: the facts of the host's own floor: where one was measured, the class bounds of GPU buffers are moot
FLOOR = ("cuda:ipc_latency_us", "cuda:copy_sync_us")

EXPECTATIONS: Tuple[Expectation, ...] = (
    # --- host buffers: shared memory within a node, an RDMA fabric between nodes -------------
    Expectation("latency-tcp-like", "host", "latency_small_us", at_least=25.0,
                message="{subject}: small-message latency {value:g} us is what TCP sockets give, not shared memory "
                        "or an RDMA fabric (< 5 us): likely a TCP fallback"),
    Expectation("latency-high", "host", "latency_small_us", at_least=10.0, below=25.0, severity="warning",
                message="{subject}: small-message latency {value:g} us is high for shared memory or an RDMA fabric "
                        "(TCP or a slow path?)"),
    Expectation("bandwidth-tcp-like", "host", "bandwidth_large_mbs", below=1000.0, severity="warning",
                message="{subject}: large-message bandwidth peaks at {value:g} MB/s, what TCP over Ethernet gives"),
    # --- GPU buffers: the class bound, where the host's own floor is not known ----------------
    Expectation("device-latency-slow", "cuda", "latency_small_us", at_least=50.0, unless=FLOOR,
                message="{subject}: small messages between GPU buffers take {value:g} us (at least {limit:g} us): "
                        "one CUDA copy and synchronize takes 2-20 us and GPUs exchange small messages in about as "
                        "much (CUDA IPC, GDRCopy, GPUDirect RDMA), so the MPI/UCX stack takes a slow path; it is "
                        "slow natively too where the native side runs the same stack"),
    Expectation("device-latency-high", "cuda", "latency_small_us", at_least=20.0, below=50.0,
                unless=FLOOR, severity="warning",
                message="{subject}: small messages between GPU buffers take {value:g} us, high for CUDA IPC or "
                        "GPUDirect (2-20 us; GDRCopy missing?)"),
    Expectation("device-collective-slow", "cuda", "collective_small_us", at_least=100.0, severity="warning",
                message="{subject}: a collective of small GPU buffers takes {value:g} us (at least {limit:g} us): "
                        "where small messages between GPU buffers take 2-20 us, a collective of a few ranks takes "
                        "tens of us (the slow path of point-to-point messages, or many ranks?)"),
    # --- GPU buffers against the same host's own references ------------------------------------
    Expectation("device-latency-vs-host", "cuda", "latency_small_us", at_least=100.0, of="host:latency_small_us",
                severity="warning",
                message="{subject}: small messages between GPU buffers take {value:g} us, {ratio:.0f}x the "
                        "{ref_value:g} us between host buffers on this host ({ref}; expected within 100x)"),
    Expectation("device-latency-vs-floor", "cuda", "latency_small_us", at_least=2.0, of="cuda:ipc_latency_us",
                scope="intra-node",
                message="{subject}: small messages between GPU buffers take {value:g} us, {ratio:.1f}x the "
                        "platform's own floor measured by dedal on this host ({ref}: a CUDA IPC ping-pong of "
                        "{ref_value:g} us; expected within 2x): the MPI/UCX stack adds a slow path"),
    Expectation("device-latency-vs-copy", "cuda", "latency_small_us", at_least=4.0, of="cuda:copy_sync_us",
                scope="intra-node", unless=("cuda:ipc_latency_us",),
                message="{subject}: small messages between GPU buffers take {value:g} us, {ratio:.1f}x one CUDA "
                        "copy + synchronize on this host ({ref}: {ref_value:g} us; expected within 4x)"),
    Expectation("device-bandwidth-vs-copy", "cuda", "bandwidth_large_mbs", below=0.9, of="cuda:copy_bandwidth_mbs",
                scope="intra-node", severity="warning",
                message="{subject}: large messages between GPU buffers peak at {value:g} MB/s, {ratio:.0%} of the "
                        "CUDA copies into a peer's buffer on this host ({ref}: {ref_value:g} MB/s; expected 90 %)"),
)
#: the finding codes of the rows (findings with these codes come from :func:`judge`)
CODES = frozenset(e.code for e in EXPECTATIONS)
#: the facts that dedal_cuda_floor measures (the platform's own, whichever side ran it)
FLOOR_FACTS = frozenset(FLOOR + ("cuda:copy_bandwidth_mbs",))


def codes_of(hardware: str) -> frozenset:
    """The finding codes of the rows of one hardware class."""
    return frozenset(e.code for e in EXPECTATIONS if e.hardware == hardware)


def _rows(table: Mapping[str, Any], column: int, *, small: bool) -> List[Tuple[int, float, str]]:
    """(size, value, the line that shows it) of the small or large rows; the line is the row as
    printed, or the log's own line where the table keeps it (``row_lines``: ucx_perftest)."""
    out = []
    lines = table.get("row_lines") or []
    for i, row in enumerate(table.get("rows") or []):
        if len(row) > column and isinstance(row[0], (int, float)) and isinstance(row[column], (int, float)):
            size = int(row[0])
            if (size <= SMALL_MAX) if small else (size >= LARGE_MIN):
                out.append((size, float(row[column]), lines[i] if i < len(lines) else " ".join(str(v) for v in row)))
    return out


def _fact(hardware: str, name: str, subject: str, rows: List[Tuple[int, float, str]]) -> Optional[Fact]:
    if not rows:
        return None
    unit, better, _what = FACTS[f"{hardware}:{name}"]
    size, value, line = (min if better == "lower" else max)(rows, key=lambda r: r[1])
    return Fact(hardware, name, subject, value, unit, (line,))


def facts_of(parsed: Mapping[str, Any]) -> List[Fact]:
    """The facts of one parse result: of each point-to-point table (``pt2pt``: OSU, dedal-bench,
    ucx_perftest) its small-message latency or large-message bandwidth, by the class of its
    buffers (``cuda`` where OSU ran with ``-d cuda``, ucx_perftest with ``-m cuda``), and of
    ``dedal_cuda_floor`` its columns."""
    out: List[Optional[Fact]] = []
    for t in parsed.get("tables") or []:
        columns = [str(c).lower() for c in t.get("columns") or []]
        if not columns or columns[0] != "size":
            continue
        bench = t.get("benchmark") or "?"
        if bench == FLOOR_BENCHMARK:
            for i, col in enumerate(columns[1:], 1):
                name = next((n for prefix, n in FLOOR_COLUMNS.items() if col.startswith(prefix)), None)
                if name:
                    out.append(_fact("cuda", name, bench, _rows(t, i, small=True)))
            continue
        if bench == FLOOR_BANDWIDTH:
            out.append(_fact("cuda", "copy_bandwidth_mbs", bench, _rows(t, 1, small=False)))
            continue
        device = t.get("device")
        hardware = "host" if device is None else device
        if not t.get("pt2pt"):
            if device is not None and t.get("metric") == "latency" and "init" not in str(t.get("title") or "").lower():
                out.append(_fact(hardware, "collective_small_us", bench, _rows(t, 1, small=True)))
            continue
        if t.get("metric") == "latency":
            out.append(_fact(hardware, "latency_small_us", bench, _rows(t, 1, small=True)))
        elif t.get("metric") == "bandwidth":
            out.append(_fact(hardware, "bandwidth_large_mbs", bench, _rows(t, 1, small=False)))
    return [f for f in out if f is not None and f.key in FACTS]


def median_facts(facts_per_run: Iterable[Sequence[Fact]], logs: Sequence[str] = ()) -> List[Fact]:
    """One fact per (class, name, benchmark) from the facts of several runs (the repetitions of
    a benchmark): the median value, with the evidence of the run nearest to it and, where
    ``logs`` names each run's log, that log."""
    groups: Dict[Tuple[str, str, str], List[Tuple[Fact, str]]] = {}
    for i, facts in enumerate(facts_per_run):
        for f in facts:
            groups.setdefault((f.hardware, f.name, f.subject), []).append((f, logs[i] if i < len(logs) else ""))
    out = []
    for (hardware, name, subject), items in groups.items():
        value = statistics.median(f.value for f, _log in items)
        nearest, log = min(items, key=lambda fl: abs(fl[0].value - value))
        note = f"median of {len(items)} run(s)" if len(items) > 1 else ""
        evidence = nearest.evidence + tuple(x for x in (f"log: {log}" if log else "", note) if x)
        out.append(Fact(hardware, name, subject, value, nearest.unit, evidence))
    return out


def _best(facts: Sequence[Fact]) -> Fact:
    better = FACTS[facts[0].key][1]
    return (min if better == "lower" else max)(facts, key=lambda f: f.value)


def judge(facts: Iterable[Fact], *, scope: Optional[str] = None, hardware: Optional[Sequence[str]] = None,
          rows: Sequence[Expectation] = EXPECTATIONS) -> List[Finding]:
    """Every row of ``rows`` applied once to every fact it reads; a finding per fact that falls
    in a row's range, quoting the fact's lines (and its reference's). ``scope``: where the
    facts were measured (None: unknown, every row applies); ``hardware``: judge only the rows
    of these classes."""
    by_key: Dict[str, List[Fact]] = {}
    for f in facts:
        by_key.setdefault(f.key, []).append(f)
    out: List[Finding] = []
    for row in rows:
        if hardware is not None and row.hardware not in hardware:
            continue
        if row.scope and scope is not None and scope != row.scope:
            continue
        if any(by_key.get(u) for u in row.unless):
            continue
        ref: Optional[Fact] = None
        if row.of:
            if not by_key.get(row.of):
                continue
            ref = _best(by_key[row.of])
        scale = ref.value if ref is not None else 1.0
        for f in by_key.get(row.key, []):
            if row.at_least is not None and not f.value >= row.at_least * scale:
                continue
            if row.below is not None and not f.value < row.below * scale:
                continue
            limit = (row.at_least if row.at_least is not None else row.below or 0.0) * scale
            values = {"subject": f.subject, "value": f.value, "unit": f.unit, "limit": limit}
            if ref is not None:
                values.update(ref=ref.subject, ref_value=ref.value, ratio=f.value / ref.value if ref.value else 0.0)
            evidence = list(f.evidence) + (list(ref.evidence) if ref is not None else [])
            out.append(Finding(row.severity, row.code, row.message.format(**values), evidence, row.verdict))
    return out


def check_table(rows: Sequence[Expectation] = EXPECTATIONS) -> List[str]:
    """What is wrong with a table of expectations (empty: nothing): unknown facts, rows that
    can never fire, references that are not facts, unknown severities, messages that name
    values they are not given."""
    problems = []
    for row in rows:
        where = f"{row.code}:"
        if row.key not in FACTS:
            problems.append(f"{where} reads {row.key}, not a fact")
        for ref in (row.of, *row.unless):
            if ref and ref not in FACTS:
                problems.append(f"{where} refers to {ref}, not a fact")
        if row.at_least is None and row.below is None:
            problems.append(f"{where} has no range")
        if row.at_least is not None and row.below is not None and row.below <= row.at_least:
            problems.append(f"{where} has an empty range")
        if row.severity not in ("info", "warning", "error"):
            problems.append(f"{where} severity {row.severity!r}")
        values = {"subject": "x", "value": 1.0, "unit": "us", "limit": 1.0}
        if row.of:
            values.update(ref="y", ref_value=1.0, ratio=1.0)
        try:
            row.message.format(**values)
        except (KeyError, IndexError, ValueError) as exc:
            problems.append(f"{where} message: {exc}")
    return problems
