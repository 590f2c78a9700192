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

The rows are rows of the one rules table (:data:`dedal.stages.verify.rules.RULES`, issue 38):
:data:`EXPECTATIONS` is its measured rows and :func:`judge` its judge over measured facts; the
facts themselves (:class:`~dedal.stages.verify.facts.Fact`) are read here from the tables.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from dedal.stages.verify import judge as the_judge
from dedal.stages.verify import rules
from dedal.stages.verify.facts import FACTS, Fact
from dedal.stages.verify.findings import Finding
from dedal.stages.verify.rules import Rule

SMALL_MAX = 64  # bytes: a "small message" (latency facts)
LARGE_MIN = 1 << 20  # bytes: a "large message" (bandwidth facts)
#: the benchmark whose tables are the platform's own floor, and the fact of each of its columns
FLOOR_BENCHMARK = "dedal_cuda_floor"
FLOOR_COLUMNS = {"ipc latency": "ipc_latency_us", "d2h+sync": "copy_sync_us"}
FLOOR_BANDWIDTH = "dedal_cuda_copy_bandwidth"

#: an expectation is a measured row of the rules table
Expectation = Rule
#: the facts of the host's own floor: where one was measured, the class bounds of GPU buffers are moot
FLOOR = ("cuda:ipc_latency_us", "cuda:copy_sync_us")
EXPECTATIONS: Tuple[Rule, ...] = tuple(r for r in rules.RULES if r.measured)
#: the finding codes of the rows (findings with these codes come from :func:`judge`)
CODES = frozenset(e.code for e in EXPECTATIONS)
#: the facts that dedal_cuda_floor measures (the platform's own, whichever side ran it)
FLOOR_FACTS = frozenset(FLOOR + ("cuda:copy_bandwidth_mbs",))
codes_of = the_judge.codes_of


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
    buffers (``cuda`` where OSU ran with ``-d cuda``, ucx_perftest with ``-m cuda``), of
    ``dedal_cuda_floor`` its columns, and of nccl-tests between nodes its peak bus bandwidth."""
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
    peak, avg = parsed.get("peak_busbw"), parsed.get("avg_busbw")
    if isinstance(peak, (int, float)) and len(parsed.get("hosts") or []) > 1 and parsed.get("nranks") != 1:
        evidence = [f"peak busbw {peak:g} GB/s at {parsed.get('peak_busbw_size')} B"]
        evidence += [f"# Avg bus bandwidth : {avg:g}"] if isinstance(avg, (int, float)) else []
        out.append(
            Fact("nccl", "busbw_peak_gbs", parsed.get("test") or "nccl-tests", float(peak), "GB/s", tuple(evidence))
        )
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


def judge(
    facts: Iterable[Fact],
    *,
    scope: Optional[str] = None,
    hardware: Optional[Sequence[str]] = None,
    rows: Sequence[Rule] = EXPECTATIONS,
) -> List[Finding]:
    """The measured rows of the rules table applied once to every fact they read
    (:func:`dedal.stages.verify.judge.judge`, no host: the class bounds and the same host's
    references); ``scope``: where the facts were measured (None: unknown, every row applies);
    ``hardware``: judge only the rows of these classes."""
    return the_judge.judge(facts=facts, scope=scope, hardware=hardware or [r.hardware for r in rows], rows=rows)


def check_table(rows: Sequence[Rule] = EXPECTATIONS) -> List[str]:
    """What is wrong with a table of expectations (:func:`dedal.stages.verify.rules.check_table`)."""
    return rules.check_table(rows)
