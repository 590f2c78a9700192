"""``ucx_perftest`` output: UCX's own latency and bandwidth test, without MPI.

What its client prints::

    +--------------+--------------+------------------------------+---------------------+-----------------------+
    |              |              |        latency (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |
    +--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
    |    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
    +--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
    [thread 0]              3214    154.754   155.608   155.608        0.05       0.05        6426        6426
    Final:                 20000    153.585   152.854   155.150        0.05       0.05        6542        6445

The test (``-t tag_lat``), message size (``-s 8``) and memory type (``-m cuda``) are read from
the command line where the log has it (a shell's ``$ ucx_perftest ...``, or UCX's own ``cmd
line:`` DEBUG line); else the memory type from UCX's note that it copies "from host memory to
cuda send memory", and the size from the final bandwidth over the final message rate (UCX's MB
is 2^20 bytes). The final row becomes one table in the OSU layout (``tables``: benchmark
``ucx_perftest_<test>``, suite ``ucx-perftest``, ``device`` the memory type where it is a GPU's),
so that the expectations read it as they read OSU's: latency tests give their overall latency
(us), bandwidth tests their overall bandwidth in MB/s (10^6 bytes, as OSU's). A header without a
final row is a cut output (``truncated``).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from dedal.stages.verify import findings as F
from dedal.stages.verify.findings import Finding

HEADER = re.compile(r"^\|\s*\|\s*\|\s*(?:latency|overhead) \(usec\)\s*\|\s*bandwidth \(MB/s\)")
ROW = re.compile(
    r"^(?:\[thread \d+\]|Final:)\s+(?P<iters>\d+)\s+(?P<p50>[\d.]+)\s+(?P<avg>[\d.]+)\s+"
    r"(?P<overall>[\d.]+)\s+(?P<bw_avg>[\d.]+)\s+(?P<bw>[\d.]+)\s+(?P<mr_avg>[\d.]+)\s+(?P<mr>[\d.]+)"
)
COMMAND = re.compile(r"\bucx_perftest\b(?P<args>(?:\s+\S+)*)")
COPY_NOTE = re.compile(r"copy one-byte value from host memory to (?P<mem>[\w-]+) send memory")
GPU_MEMORY = {"cuda": "cuda", "cuda-managed": "cuda", "rocm": "rocm", "rocm-managed": "rocm"}


def _option(args: List[str], flag: str) -> Optional[str]:
    for i, a in enumerate(args[:-1]):
        if a == flag:
            return args[i + 1]
    return None


def _table(
    test: Optional[str], size: Optional[int], memory: Optional[str], final: "re.Match[str]", line: str
) -> Dict[str, Any]:
    bw_mib = float(final.group("bw"))
    rate = float(final.group("mr"))
    if size is None and rate > 0 and bw_mib > 0:  # bytes per message = bandwidth / message rate
        guess = bw_mib * (1 << 20) / rate
        size = 1 << max(0, round(guess).bit_length() - 1) if guess >= 1 else 1
        if abs(size * 2 - guess) < abs(size - guess):
            size *= 2
    name = test or "unknown"
    latency = "lat" in name or test is None
    value = float(final.group("overall")) if latency else round(bw_mib * 1.048576, 2)
    return {
        "benchmark": f"ucx_perftest_{name}",
        "title": f"ucx_perftest {name}",
        "suite": "ucx-perftest",
        "version": None,
        "device": GPU_MEMORY.get(memory or ""),
        "pt2pt": True,
        "columns": ["Size", "Latency (us)" if latency else "Bandwidth (MB/s)"],
        "rows": [[size if size is not None else 0, value]],
        "row_lines": [line],
        "meta": [],
        "metric": "latency" if latency else "bandwidth",
        "unit": "us" if latency else "MB/s",
        "perftest": {"test": test, "size": size, "memory": memory},
    }


def parse(lines: List[str]) -> Dict[str, Any]:
    """One table per ``Final:`` row, each with the command line (or notes) before it."""
    findings: List[Finding] = []
    test = memory = None
    size: Optional[int] = None
    header: Optional[str] = None  # a header still waiting for its final row
    tables: List[Dict[str, Any]] = []
    for raw in lines:
        line = raw.strip()
        if HEADER.match(line):
            if header is not None:
                findings.append(_cut(header))
            header = line
            continue
        if line.startswith("Final:"):
            m = ROW.match(line)
            if m:
                tables.append(_table(test, size, memory, m, line))
                header = None
            continue
        c = COMMAND.search(line)
        if c and re.search(r"\s-[tsm]\s", line):  # a new run: what its command line says, nothing older
            args = c.group("args").split()
            test = _option(args, "-t")
            size_text = (_option(args, "-s") or "").split(",")[0]
            size = int(size_text) if size_text.isdigit() else None
            memory = (_option(args, "-m") or "").split(",")[0] or None
            continue
        n = COPY_NOTE.search(line)
        if n and memory is None:
            memory = n.group("mem")
    if header is not None:
        findings.append(_cut(header))
    return {
        "perftest": tables[-1]["perftest"] if tables else None,
        "tables": tables,
        "_findings": findings,
        "_base_verdict": "good" if tables else "unknown",
        "_recognized": bool(tables or findings),
    }


def _cut(header: str) -> Finding:
    return F.error(
        "truncated",
        "ucx_perftest: the table header was printed but no 'Final:' row (run died or output cut)",
        [header],
        verdict="failed",
    )
