"""nccl-tests output (``all_reduce_perf``, ``all_gather_perf``, ``sendrecv_perf`` ...).

Each result row has the message size in bytes, the element count, the type, (in newer
versions) the reduction op and root, then out-of-place and in-place
``time (us) / algbw (GB/s) / busbw (GB/s) / #wrong``. The run ends with::

    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 19.7866

``avg_busbw`` is that line (nccl-tests averages the bus bandwidth of every out-of-place
*and* in-place measurement); ``peak_busbw`` is the largest bus bandwidth of any row,
out-of-place or in-place, for the same reason. Bandwidths are in GB/s, times in us.

dedal's bundled ``dedal_nccl_allreduce`` prints the same table under its own first line
``# dedal-bench NCCL all-reduce v1.0: nranks 2, host gpu01, nccl 2.21.5``: ``test`` is
then ``dedal_nccl_allreduce`` and ``nranks``/``nccl_version`` come from that line (it
lists no devices).

A one-rank run has a bus bandwidth of 0 by definition (nothing crosses a link) and is
``degenerate``; a table without its ``Avg bus bandwidth`` line, or a header without
rows, is a truncated run (``failed``), with the rows parsed so far kept.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from dedal.stages.verify import findings as F
from dedal.stages.verify.findings import Finding
from dedal.stages.verify.parsers._text import strip_srun_label, to_number

PARAMS = re.compile(
    r"^#?\s*nThread\s+(?P<nthread>\d+)\s+nGpus\s+(?P<ngpus>\d+)\s+minBytes\s+(?P<min>\d+)\s+"
    r"maxBytes\s+(?P<max>\d+)(?P<rest>.*)$"
)
RANK = re.compile(
    r"^#?\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(?P<host>\S+)\s+device\s+"
    r"(?P<dev>\d+)\s+\[(?P<bus>[^\]]*)\]\s*(?P<name>.*)$"
)
HEADER = re.compile(r"^#?\s*size\s+count\s+type\b", re.IGNORECASE)
AVG = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*(?P<v>[-+\d.eE]+|nan|inf)", re.IGNORECASE)
OOB = re.compile(r"^#?\s*Out of bounds values\s*:\s*(?P<n>\d+)\s*(?P<status>\w+)?", re.IGNORECASE)
STARTING = re.compile(r"Collective test starting:\s*(?P<test>\S+)")
CONCLUDED = re.compile(r"Collective test concluded:\s*(?P<test>\S+)")
DEDAL = re.compile(
    r"^#\s*dedal-bench NCCL all-reduce v(?P<v>[\w.]+):\s*nranks\s+(?P<n>\d+),\s*host\s+(?P<host>\S+),"
    r"\s*nccl\s+(?P<nccl>[\w.]+)"
)
CMD = re.compile(r"\b(?P<test>[a-z_]+_perf)(?:_mpi)?\b")
TYPES = {
    "int8",
    "uint8",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "half",
    "float",
    "double",
    "bfloat16",
    "fp8_e4m3",
    "fp8_e5m2",
    "char",
    "int",
    "float16",
    "float32",
    "float64",
}


def _wrong(tok: str) -> Optional[float]:
    n = to_number(tok)
    return None if n is None else n


def _parse_row(line: str, error_style: bool = False) -> Optional[Dict[str, Any]]:
    toks = line.split()
    if len(toks) < 3 or to_number(toks[0]) is None or not isinstance(to_number(toks[0]), int):
        return None
    if to_number(toks[1]) is None or toks[2].lower() not in TYPES and not re.match(r"^[a-z][a-z0-9_]*$", toks[2]):
        return None
    i = 3
    redop = root = None
    if i < len(toks) and to_number(toks[i]) is None and toks[i] not in ("N/A",):
        redop = toks[i]
        i += 1
    rest = toks[i:]
    # root column (newer versions): an integer (-1 when not rooted) followed by 8 values
    if len(rest) in (5, 9) and isinstance(to_number(rest[0]), int):
        root = to_number(rest[0])
        rest = rest[1:]
    row: Dict[str, Any] = {
        "size": int(toks[0]),
        "count": to_number(toks[1]),
        "type": toks[2],
        "redop": redop,
        "root": root,
    }
    if len(rest) >= 8:
        vals = rest[-8:]
    elif len(rest) >= 4:
        vals = rest[-4:] + [None] * 4  # type: ignore[list-item]
    else:
        return {"partial": True, **row}
    nums = [to_number(v) if v is not None else None for v in vals]
    if any(nums[k] is None and vals[k] is not None for k in (0, 1, 2, 4, 5, 6) if vals[k] is not None):
        return {"partial": True, **row}
    row.update(
        {
            "oop_time_us": nums[0],
            "oop_algbw": nums[1],
            "oop_busbw": nums[2],
            "ip_time_us": nums[4],
            "ip_algbw": nums[5],
            "ip_busbw": nums[6],
        }
    )
    # newer nccl-tests count wrong elements (#wrong); older ones print the maximum error
    key = "error" if error_style else "wrong"
    row[f"oop_{key}"] = _wrong(vals[3] or "")
    row[f"ip_{key}"] = _wrong(vals[7]) if vals[7] is not None else None
    return row


def parse(lines: List[str]) -> Dict[str, Any]:
    findings: List[Finding] = []
    params: Dict[str, Any] = {}
    ranks: List[Dict[str, Any]] = []
    rows: List[Dict[str, Any]] = []
    partial: List[str] = []
    avg: Optional[float] = None
    oob: Optional[Dict[str, Any]] = None
    test: Optional[str] = None
    header_seen = False
    error_style = False
    concluded = False
    header_line = ""
    dedal: Optional[Dict[str, Any]] = None
    for raw in lines:
        line = strip_srun_label(raw).strip()
        if not line:
            continue
        m = STARTING.search(line)
        if m:
            test = m.group("test")
            continue
        m = DEDAL.match(line)
        if m:
            test = "dedal_nccl_allreduce"
            dedal = {"nranks": int(m.group("n")), "host": m.group("host"), "nccl": m.group("nccl")}
            continue
        if CONCLUDED.search(line):
            concluded = True
            continue
        m = PARAMS.match(line)
        if m:
            params = {
                "nThread": int(m.group("nthread")),
                "nGpus": int(m.group("ngpus")),
                "minBytes": int(m.group("min")),
                "maxBytes": int(m.group("max")),
            }
            for k, v in re.findall(r"([A-Za-z][\w ]*?):\s*(\S+)", m.group("rest")):
                params[k.strip().replace(" ", "_")] = to_number(v) if to_number(v) is not None else v
            continue
        m = RANK.match(line)
        if m:
            ranks.append(
                {
                    "rank": int(m.group("rank")),
                    "host": m.group("host"),
                    "device": int(m.group("dev")),
                    "busid": m.group("bus"),
                    "name": m.group("name").strip(),
                }
            )
            continue
        if HEADER.match(line):
            header_seen = True
            header_line = line
            error_style = "#wrong" not in line and re.search(r"\berror\b", line) is not None
            continue
        m = AVG.match(line)
        if m:
            avg = float(m.group("v"))
            continue
        m = OOB.match(line)
        if m:
            oob = {"count": int(m.group("n")), "status": m.group("status")}
            continue
        if line.startswith("#"):
            continue
        if test is None:
            mc = CMD.search(line)
            if mc and ("/" in line or line.startswith(("$", "+", "srun", "mpirun", "./"))):
                test = mc.group("test")
        if not header_seen:
            continue
        row = _parse_row(line, error_style)
        if row is None:
            continue
        if row.pop("partial", False):
            partial.append(line)
            continue
        rows.append(row)
        partial.clear()  # a short line followed by complete rows was noise, not the end of the output

    hosts = sorted({r["host"] for r in ranks})
    rank_ids = [r["rank"] for r in ranks]
    nranks: Optional[int] = len(set(rank_ids)) if ranks else (dedal["nranks"] if dedal else None)
    if len(rank_ids) != len(set(rank_ids)):
        findings.append(
            F.warning(
                "nccl-independent-ranks",
                f"rank numbers repeat ({len(rank_ids)} device lines, {nranks} distinct rank(s)): "
                "the processes ran as separate jobs (nccl-tests built without MPI, or launched without PMI)",
                [f"#  Rank {r['rank']} on {r['host']} device {r['device']} {r['name']}" for r in ranks[:3]],
            )
        )
    busbws = [v for r in rows for v in (r.get("oop_busbw"), r.get("ip_busbw")) if isinstance(v, (int, float))]
    peak = max(busbws) if busbws else None
    peak_row = None
    if peak is not None:
        peak_row = next(r for r in rows if peak in (r.get("oop_busbw"), r.get("ip_busbw")))
    avg_rows = sum(busbws) / len(busbws) if busbws else None

    recognized = header_seen or bool(rows) or avg is not None or bool(ranks)
    base = "good" if rows else "unknown"
    name = test or "nccl-tests"
    if header_seen and not rows:
        findings.append(
            F.error(
                "truncated",
                f"{name}: the result header was printed but no row follows (run died or output cut)",
                [header_line],
                verdict="failed",
            )
        )
    elif not rows and (params or ranks):
        findings.append(
            F.error(
                "truncated",
                f"{name}: the test started ({'devices listed' if ranks else 'parameters printed'}) "
                "but no result table follows",
                [],
                verdict="failed",
            )
        )
    elif rows and avg is None:
        last = rows[-1]["size"]
        findings.append(
            F.error(
                "truncated",
                f"{name}: no '# Avg bus bandwidth' line after {len(rows)} row(s) (last size {last} B"
                + (f" of {params['maxBytes']} B" if params.get("maxBytes") else "")
                + "): the run did not finish",
                partial[-1:] or [f"{last} ..."],
                verdict="failed",
            )
        )
    elif partial:
        findings.append(F.error("truncated", f"{name}: a result row is cut short", partial, verdict="failed"))

    wrong = [
        r for r in rows if any(isinstance(r.get(k), (int, float)) and r.get(k) > 0 for k in ("oop_wrong", "ip_wrong"))
    ]
    if wrong:
        findings.append(
            F.error(
                "nccl-wrong-results",
                f"{name}: {len(wrong)} size(s) report wrong results (#wrong > 0)",
                [f"size {r['size']}: #wrong {r.get('oop_wrong')} / {r.get('ip_wrong')}" for r in wrong],
            )
        )
    if oob is not None and oob["count"] > 0:
        findings.append(
            F.error(
                "nccl-out-of-bounds",
                f"{name}: {oob['count']} out-of-bounds values",
                [f"# Out of bounds values : {oob['count']} {oob.get('status') or ''}".strip()],
            )
        )

    degenerate = nranks == 1 or (bool(rows) and (peak or 0) == 0 and (avg is None or avg == 0))
    if degenerate and rows:
        why = "one rank" if nranks == 1 else "every bus bandwidth is 0"
        findings.append(
            F.warning(
                "degenerate",
                f"{name}: {why}: bus bandwidth of a single-rank collective is 0 by definition, "
                "nothing crossed a link; run with 2 or more GPUs/ranks to measure anything",
                [r_line for r_line in (f"# Avg bus bandwidth : {avg:g}" if avg is not None else "",) if r_line]
                + (
                    [f"#  Rank  0 on {ranks[0]['host']} device {ranks[0]['device']} {ranks[0]['name']}"]
                    if ranks
                    else []
                ),
                verdict="degenerate",
            )
        )

    return {
        "test": test,
        "nranks": nranks,
        "nnodes": len(hosts) if hosts else None,
        "hosts": hosts,
        "devices": ranks,
        "params": params,
        "rows": rows,
        "peak_busbw": peak,
        "peak_busbw_size": peak_row["size"] if peak_row else None,
        "avg_busbw": avg,
        "avg_busbw_rows": round(avg_rows, 6) if avg_rows is not None else None,
        "out_of_bounds": oob,
        "completed": avg is not None or concluded,
        **({"nccl_version": dedal["nccl"]} if dedal else {}),
        "_findings": findings,
        "_base_verdict": base,
        "_recognized": recognized,
    }
