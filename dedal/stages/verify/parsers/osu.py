"""OSU Micro-Benchmarks output (v5, v6, v7): point-to-point, collective, one-sided, init.

What an OSU output looks like::

    # OSU MPI Latency Test v7.5            <- title and version
    # Datatype: MPI_CHAR.                  <- meta comments (kept in ``meta``)
    # Size       Avg Latency(us)   Validation
    1                       3.00         Pass
    ...
    # OSU MPI Init Test v7.5
    nprocs: 144, min: 2032 ms, max: 2054 ms, avg: 2048 ms

The parser is a small state machine that tolerates what real logs contain: the ``#``
may be missing, loader/MPI/UCX warnings may sit between the rows (a table is not
closed by noise, only by the next header), several tables may follow each other,
extra columns (``-f`` min/max/iterations, ``--validation``) and single-value tables
without a size column (``osu_barrier`` v5) occur. A table that has a header but no
rows, a row cut in the middle, or a last table that stops short of the benchmark's
default largest message size (with no ``-m`` visible) is reported as truncated.

Units as printed by OSU: latency in microseconds (us), bandwidth in MB/s, init in ms.

dedal's bundled microbenchmarks (``recipes/repo/packages/dedal-benchmarks``) print the
same layout under a ``# dedal-bench MPI Latency Test v1.0`` title; their tables are
named ``dedal_latency``, ``dedal_bw``, ``dedal_allreduce``, ``dedal_init`` (``suite``
``dedal-bench``), and the ``# precise: min X ms, max Y ms, avg Z ms`` line that
``dedal_init`` prints after its (rounded) ``nprocs:`` line replaces the rounded values.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from dedal.stages.verify import findings as F
from dedal.stages.verify.findings import Finding
from dedal.stages.verify.parsers._text import strip_srun_label, to_number

TITLE = re.compile(
    r"^#?\s*(?:OSU|(?P<suite>dedal-bench))\s+(?P<title>.*?\bTest)\b(?:\s+v(?P<version>\d+(?:\.\d+)*\w*))?",
    re.IGNORECASE,
)
COLUMN_HEADER = re.compile(r"^#?\s*(?:Size\b|Avg Latency|Latency\s*\(|Bandwidth|MB/s)")
INIT = re.compile(
    r"nprocs:\s*(?P<nprocs>\d+),\s*min:\s*(?P<min>[\d.]+)\s*(?:ms)?,\s*max:\s*(?P<max>[\d.]+)\s*(?:ms)?,\s*"
    r"avg:\s*(?P<avg>[\d.]+)\s*(?:ms)?",
    re.IGNORECASE,
)
PRECISE_INIT = re.compile(
    r"^#\s*precise:\s*min\s+(?P<min>[\d.]+)\s*ms,\s*max\s+(?P<max>[\d.]+)\s*ms,\s*"
    r"avg\s+(?P<avg>[\d.]+)\s*ms"
)
MSG_SIZE_OPT = re.compile(r"(?:osu|dedal)_\w+.*?(?:\s-m|\s--message-size)[= ]\s*(?P<range>[\dKkMmGg:]+)")
#: a command line that runs a benchmark: its program as a word of its own (a path's last part)
COMMAND = re.compile(r"(?:^|[\s/])(?P<program>(?:osu|dedal)_\w+)(?=\s|$)")
WORDS_OK = {"pass", "passed", "fail", "failed", "n/a", "-"}
STANDALONE = {"size", "iterations", "validation", "mb/s", "messages/s", "overlap(%)"}

PT2PT_MAX = 1 << 22  # default largest message of osu_latency, osu_bw, one-sided ... (4 MiB)
COLLECTIVE_MAX = 1 << 20  # default largest message of the collectives (1 MiB)
COLLECTIVE_WORDS = (
    "allreduce",
    "allgather",
    "alltoall",
    "all-to-all",
    "barrier",
    "broadcast",
    "bcast",
    "gather",
    "reduce",
    "scatter",
    "scan",
    "neighbor",
    "collective",
)

_BENCH = [
    # (regex on the normalised title, program name); first match wins
    (r"^init$", "osu_init"),
    (r"^hello world$", "osu_hello"),
    (r"^multi-threaded latency$", "osu_latency_mt"),
    (r"^multi(?:ple)? latency$", "osu_multi_lat"),
    (r"^multi(?:-process|ple)? ?latency", "osu_latency_mp"),
    (r"^latency$", "osu_latency"),
    (r"^bi-directional bandwidth$", "osu_bibw"),
    (r"^bandwidth$", "osu_bw"),
    (r"^multiple bandwidth ?/ ?message rate$", "osu_mbw_mr"),
    (r"^mpi_put latency$", "osu_put_latency"),
    (r"^mpi_get latency$", "osu_get_latency"),
    (r"^mpi_put bandwidth$", "osu_put_bw"),
    (r"^mpi_get bandwidth$", "osu_get_bw"),
    (r"^mpi_put bi-directional bandwidth$", "osu_put_bibw"),
    (r"^mpi_accumulate latency$", "osu_acc_latency"),
    (r"^mpi_fetch_and_op latency$", "osu_fop_latency"),
    (r"^mpi_compare_and_swap latency$", "osu_cas_latency"),
    (r"^mpi_get_accumulate latency$", "osu_get_acc_latency"),
    (r"^barrier latency$", "osu_barrier"),
    (r"^non-blocking barrier latency$", "osu_ibarrier"),
    (r"^(broadcast|bcast) latency$", "osu_bcast"),
    (r"^non-blocking (broadcast|bcast) latency$", "osu_ibcast"),
    (r"^all-to-all personalized exchange latency$", "osu_alltoall"),
    (r"^all-to-allv personalized exchange latency$", "osu_alltoallv"),
    (r"^all-to-allw personalized exchange latency$", "osu_alltoallw"),
    (r"^non-blocking all-to-all (personalized exchange )?latency$", "osu_ialltoall"),
    (r"^non-blocking all-to-allv (personalized exchange )?latency$", "osu_ialltoallv"),
]


#: the programs whose default largest message is known (a table that stops short of it is cut)
KNOWN_PROGRAMS = frozenset(name for _rx, name in _BENCH)


def size_limit(option: Optional[str]) -> Optional[int]:
    """The largest message of an OSU ``-m`` value: ``"65536"``, ``"1:8192"``, ``"4M"`` -> bytes;
    None when it sets no upper bound (``"64:"``) or cannot be read."""
    if not option:
        return None
    top = option.split(":")[-1].strip()
    m = re.fullmatch(r"(\d+)([KkMmGg]?)", top)
    if not m:
        return None
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def benchmark_name(title: str) -> str:
    """``"MPI-CUDA Bandwidth"`` -> ``"osu_bw"``; unknown titles get a slug (``osu_<words>``)."""
    core = re.sub(r"\bTest\b", "", title, flags=re.IGNORECASE)
    core = re.sub(
        r"^(?:MPI|OpenSHMEM|UPC\+\+|UPC|NCCL)(?:-(?:CUDA|ROCM|ROCm|OpenACC|SYCL))?\s+",
        "",
        core.strip(),
        flags=re.IGNORECASE,
    )
    core = re.sub(r"\s+", " ", core).strip().lower()
    for rx, name in _BENCH:
        if re.search(rx, core):
            return name
    m = re.match(
        r"^(non-blocking )?(all-?gather|allgatherv|allreduce|gather|gatherv|reduce|reduce_scatter|"
        r"reduce-scatter|scatter|scatterv|scan|exscan)v? latency$",
        core,
    )
    if m:
        base = m.group(2).replace("-", "_").replace("all_gather", "allgather")
        if core.split(" latency")[0].endswith("v") and not base.endswith("v"):
            base += "v"
        return "osu_" + ("i" if m.group(1) else "") + base
    slug = re.sub(r"[^a-z0-9]+", "_", core).strip("_")
    return "osu_" + (slug or "unknown")


def _device(title: str) -> Optional[str]:
    m = re.search(r"-(CUDA|ROCM|OpenACC|SYCL)\b", title, re.IGNORECASE)
    return m.group(1).lower() if m else None


def _is_collective(title: str) -> bool:
    t = title.lower()
    return any(w in t for w in COLLECTIVE_WORDS)


def split_columns(header: str, width: Optional[int] = None) -> List[str]:
    """Column names of an OSU header line (without its ``#``).

    Names are separated by two or more blanks or a tab; when a header was printed with
    single blanks (or re-typed), words are grouped so that each name ends at a unit in
    parentheses or is a standalone name (Size, Iterations, Validation, MB/s ...).
    """
    text = header.strip().lstrip("#").strip()
    names = [n.strip() for n in re.split(r"\s{2,}|\t+", text) if n.strip()]
    if width is not None and len(names) != width or any(" " in n and "(" not in n for n in names):
        grouped: List[str] = []
        cur: List[str] = []
        for word in text.split():
            if word.lower() in STANDALONE and not cur:
                grouped.append(word)
                continue
            cur.append(word)
            if ")" in word or word.lower() in STANDALONE:
                grouped.append(" ".join(cur))
                cur = []
        if cur:
            grouped.append(" ".join(cur))
        if width is None or len(grouped) == width or len(names) != width:
            names = grouped
    return names


def _metric(columns: List[str]) -> Dict[str, Optional[str]]:
    value = columns[1] if len(columns) > 1 and columns[0].lower() == "size" else (columns[0] if columns else "")
    v = value.lower()
    if "latency" in v or "(us)" in v or "overall" in v:
        return {"metric": "latency", "unit": "us"}
    if "mb/s" in v or "bandwidth" in v:
        return {"metric": "bandwidth", "unit": "MB/s"}
    if "messages/s" in v:
        return {"metric": "message_rate", "unit": "messages/s"}
    return {"metric": None, "unit": None}


def suite_name(benchmark: str, suite: str) -> str:
    """``osu_latency`` as the bundled suite names it (``dedal_latency``); OSU names stay."""
    return "dedal_" + benchmark[len("osu_") :] if suite == "dedal-bench" and benchmark.startswith("osu_") else benchmark


class _Table:
    def __init__(self, title: Optional[str], version: Optional[str], line_no: int, suite: str = "osu") -> None:
        self.title = title
        self.version = version
        self.suite = suite
        self.line_no = line_no
        self.meta: List[str] = []
        self.columns: Optional[List[str]] = None
        self.rows: List[List[Any]] = []
        self.partial: List[str] = []  # rows cut short (evidence of truncation)
        self.init_seen = False
        self.command: Optional[Dict[str, Any]] = None  # the command line that ran it: {program, range, line}

    @property
    def has_size(self) -> bool:
        return bool(self.columns) and self.columns[0].lower() == "size"

    def to_json(self) -> Dict[str, Any]:
        columns = self.columns or []
        prefix = "dedal-bench" if self.suite == "dedal-bench" else "OSU"
        d: Dict[str, Any] = {
            "benchmark": suite_name(benchmark_name(self.title), self.suite) if self.title else "osu_unknown",
            "title": f"{prefix} {self.title}" if self.title else None,
            "suite": self.suite,
            "version": self.version,
            "device": _device(self.title or ""),
            # point to point (not a collective, not init): what the expectations' facts read
            "pt2pt": bool(self.title)
            and not _is_collective(self.title or "")
            and "init" not in (self.title or "").lower(),
            "columns": columns,
            "rows": self.rows,
            "meta": self.meta,
        }
        d.update(_metric(columns))
        return d


def _row_tokens(line: str) -> Optional[List[str]]:
    toks = line.split()
    if not toks:
        return None
    if not all(to_number(t) is not None or t.lower() in WORDS_OK for t in toks):
        return None
    if to_number(toks[0]) is None:
        return None
    return toks


def _convert(tok: str) -> Any:
    n = to_number(tok)
    return tok if n is None else n


def parse(lines: List[str]) -> Dict[str, Any]:
    """Parse OSU output lines (already cleaned); returns the kind-specific part of the result."""
    tables: List[_Table] = []
    inits: List[Dict[str, Any]] = []
    findings: List[Finding] = []
    versions: List[str] = []
    cur: Optional[_Table] = None
    events: List[str] = []  # order of structured elements: "table" / "init"
    msg_opt: Optional[str] = None
    command: Optional[Dict[str, Any]] = None  # the latest command line that ran a benchmark

    for no, raw in enumerate(lines):
        line = strip_srun_label(raw).strip()
        if not line:
            continue
        m = MSG_SIZE_OPT.search(line)
        if m:
            msg_opt = m.group("range")
        if not line.startswith("#"):
            c = COMMAND.search(line)
            if c and not re.match(r"^\S*(?:osu|dedal)_\w+:", line):  # not a loader's "prog: lib: warning"
                command = {"program": c.group("program"), "range": m.group("range") if m else None, "line": line}
        m = TITLE.match(line)
        if m:
            title = re.sub(r"\s+", " ", m.group("title")).strip()
            version = m.group("version")
            if version and version not in versions:
                versions.append(version)
            cur = _Table(title, version, no, "dedal-bench" if m.group("suite") else "osu")
            if command is not None and command["program"] == suite_name(benchmark_name(title), cur.suite):
                cur.command = command
            tables.append(cur)
            events.append("table")
            continue
        m = PRECISE_INIT.match(line)
        if m and inits:
            inits[-1].update(
                {"min_ms": float(m.group("min")), "max_ms": float(m.group("max")), "avg_ms": float(m.group("avg"))}
            )
            continue
        m = INIT.search(line)
        if m:
            inits.append(
                {
                    "nprocs": int(m.group("nprocs")),
                    "min_ms": float(m.group("min")),
                    "max_ms": float(m.group("max")),
                    "avg_ms": float(m.group("avg")),
                }
            )
            if cur is not None and cur.title and "init" in cur.title.lower():
                cur.init_seen = True
            events.append("init")
            continue
        if COLUMN_HEADER.match(line) and not _row_tokens(line):
            if cur is None or cur.columns is not None:
                # a header without a title line, or a second table under the same title
                cur = _Table(
                    cur.title if cur is not None else None,
                    cur.version if cur is not None else None,
                    no,
                    cur.suite if cur is not None else "osu",
                )
                tables.append(cur)
                events.append("table")
            cur.columns = split_columns(line)
            continue
        if line.startswith("#"):
            if cur is not None and cur.columns is None:
                cur.meta.append(line.lstrip("#").strip())
            continue
        toks = _row_tokens(line)
        if toks is None or cur is None:
            continue
        if cur.columns is None:
            if cur.title and "init" in cur.title.lower():
                continue
            # values without a column header (header lost): name the columns generically
            cur.columns = (["Size"] + [f"value{i}" for i in range(1, len(toks))]) if len(toks) > 1 else ["value"]
        width = len(cur.columns)
        if len(toks) != width and len(cur.columns) >= 1:
            renamed = split_columns(" ".join(cur.columns), width=len(toks)) if cur.rows == [] else None
            if renamed is not None and len(renamed) == len(toks):
                cur.columns = renamed
                width = len(toks)
        if len(toks) < width:
            cur.partial.append(line)
            continue
        row = [_convert(t) for t in toks]
        if len(row) > width:
            cur.columns = cur.columns + [f"value{i}" for i in range(width, len(row))]
        if cur.has_size:
            row[0] = int(row[0]) if isinstance(row[0], (int, float)) and float(row[0]).is_integer() else row[0]
            if cur.rows and isinstance(row[0], (int, float)) and row[0] <= cur.rows[-1][0]:
                # sizes start again: a repeated run of the same benchmark
                nxt = _Table(cur.title, cur.version, no, cur.suite)
                nxt.columns = list(cur.columns)
                nxt.meta = list(cur.meta)
                nxt.command = cur.command
                cur = nxt
                tables.append(cur)
                events.append("table")
        cur.rows.append(row)
        cur.partial = []  # a short line followed by complete rows was noise, not the end of the output

    # ---- what the tables say -------------------------------------------------------
    data_tables = [t for t in tables if not (t.title and "init" in t.title.lower() and not t.rows)]
    for t in tables:
        if t.title and "init" in t.title.lower() and not t.rows and not t.init_seen:
            findings.append(
                F.error(
                    "truncated",
                    f"{suite_name('osu_init', t.suite)}: the benchmark title was printed but no "
                    "'nprocs: ..., avg: ... ms' result",
                    [lines[t.line_no].strip()],
                    verdict="failed",
                )
            )
    for i, t in enumerate(data_tables):
        name = suite_name(benchmark_name(t.title), t.suite) if t.title else "OSU benchmark"
        is_last = i == len(data_tables) - 1 and (not inits or events[-1] == "table")
        if t.columns is not None and not t.rows:
            findings.append(
                F.error(
                    "truncated",
                    f"{name}: the table header was printed but no result row follows (run died or output cut)",
                    [lines[t.line_no].strip()] if t.line_no < len(lines) else [],
                    verdict="failed",
                )
            )
            continue
        if t.title is not None and t.columns is None and not t.rows and "hello" not in t.title.lower():
            findings.append(
                F.error(
                    "truncated",
                    f"{name}: the benchmark title was printed but nothing after it",
                    [lines[t.line_no].strip()],
                    verdict="failed",
                )
            )
            continue
        if t.partial:
            findings.append(
                F.error(
                    "truncated", f"{name}: a result row is cut short (output truncated)", t.partial, verdict="failed"
                )
            )
        if t.has_size and len(t.rows) >= 2 and (is_last or t.command is not None):
            findings.extend(_range_findings(t, name, msg_opt if is_last and t.command is None else None))
        findings.extend(_table_findings(t, name))

    result: Dict[str, Any] = {
        "version": versions[0] if versions else None,
        "versions": versions,
        "tables": [t.to_json() for t in data_tables if t.columns is not None or t.rows],
        "init": inits[0] if inits else None,
        "inits": inits,
        "message_size_option": msg_opt,
        "suites": sorted({t.suite for t in tables}),
    }
    recognized = bool(tables or inits)
    has_data = any(t.rows for t in data_tables) or bool(inits)
    result["_findings"] = findings
    result["_base_verdict"] = "good" if has_data else ("unknown" if not recognized else "unknown")
    result["_recognized"] = recognized
    return result


def _range_findings(t: _Table, name: str, msg_opt: Optional[str]) -> List[Finding]:
    """Whether a table that stops short of its largest message was cut. The largest message is
    the ``-m`` of the command line that ran it, else the benchmark's default where its command
    line is in the log without ``-m``. A log that shows no command line cannot tell a ``-m``
    limit from a cut: a note, and the table is judged on the rows it has. ``msg_opt``: a
    ``-m`` seen elsewhere in the log (the only table's, where the command was not matched)."""
    last = t.rows[-1][0]
    if not isinstance(last, (int, float)):
        return []
    program = benchmark_name(t.title or "")
    default = COLLECTIVE_MAX if _is_collective(t.title or "") else PT2PT_MAX
    known = program in KNOWN_PROGRAMS or _is_collective(t.title or "")
    row = [" ".join(str(v) for v in t.rows[-1])]
    if t.command is not None:
        limit = size_limit(t.command["range"]) if t.command["range"] else (default if known else None)
        why = f"-m {t.command['range']}" if t.command["range"] else "the default largest message, no -m"
        if limit is not None and last < limit and (last * 2 <= limit):
            return [
                F.error(
                    "truncated",
                    f"{name}: the table stops at {last} B, below the {limit} B its command line "
                    f"asks for ({why}): output truncated",
                    [t.command["line"]] + row,
                    verdict="failed",
                )
            ]
        return []
    if msg_opt is not None or not known or last >= default:
        return []
    return [
        F.info(
            "table-range-unknown",
            f"{name}: the table stops at {last} B, below the default largest message "
            f"of {default} B; the log shows no command line, so a -m limit and a cut output look alike "
            "(judged on the rows it has)",
            row,
        )
    ]


def _table_findings(t: _Table, name: str) -> List[Finding]:
    """What a table says of itself (failed validation); what its numbers mean on their hardware
    is judged by :mod:`dedal.stages.verify.expectations` from the table's facts."""
    out: List[Finding] = []
    cols = [c.lower() for c in (t.columns or [])]
    if "validation" in cols:
        vi = cols.index("validation")
        bad = [r for r in t.rows if vi < len(r) and isinstance(r[vi], str) and r[vi].lower().startswith("fail")]
        if bad:
            out.append(
                F.error(
                    "validation-failed",
                    f"{name}: data validation failed for {len(bad)} message size(s)",
                    [" ".join(str(v) for v in r) for r in bad],
                )
            )
    return out
