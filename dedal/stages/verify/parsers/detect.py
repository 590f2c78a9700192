"""Guess the kind of a log from its content.

Every kind has markers (regular expressions over lines). When several kinds are present
(an OSU table with UCX warnings in between, nccl-tests run with ``NCCL_DEBUG=INFO``)
the measurement wins and the others are parsed as sections of the same result:

    nccl-tests > osu > ucx-perftest > srun-mpi-list > ucx-info > nccl-debug > ompi-verbose > ucx-log > failure

``failure`` is a log whose main content is a known failure signature (no benchmark
output, no debug log); ``unknown`` is a log with nothing recognizable.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence

from dedal.stages.verify.parsers import nccl_debug, ompi_verbose, osu, srun_mpi, ucx_log, ucx_perftest
from dedal.stages.verify.parsers import nccl_tests
from dedal.stages.verify.parsers.signatures import scan

PRIORITY = ("nccl-tests", "osu", "ucx-perftest", "srun-mpi-list", "ucx-info", "nccl-debug", "ompi-verbose", "ucx-log")

_NCCL_TESTS = (nccl_tests.HEADER, nccl_tests.AVG, nccl_tests.STARTING, nccl_tests.RANK)
_UCX_INFO = re.compile(r"^#?\s*(?:Memory domain|Transport):\s*\S+")
_OSU_COLUMNS = re.compile(r"^#?\s*Size\s+.*(?:\(us\)|MB/s|Latency|Bandwidth)")


def sections(lines: Sequence[str]) -> List[str]:
    """Every kind whose markers occur in ``lines``, in :data:`PRIORITY` order."""
    found: Dict[str, bool] = {k: False for k in PRIORITY}
    ucx_info_hits = 0
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if not found["nccl-tests"] and any(
            rx.search(line) if rx is nccl_tests.STARTING else rx.match(line) for rx in _NCCL_TESTS
        ):
            found["nccl-tests"] = True
        if not found["osu"] and (osu.TITLE.match(line) or osu.INIT.search(line) or _OSU_COLUMNS.match(line)):
            found["osu"] = True
        if not found["ucx-perftest"] and (
            ucx_perftest.HEADER.match(line) or (line.startswith("Final:") and ucx_perftest.ROW.match(line))
        ):
            found["ucx-perftest"] = True
        if not found["srun-mpi-list"] and (srun_mpi.HEADER.match(line) or srun_mpi.VERSIONS.search(line)):
            found["srun-mpi-list"] = True
        if _UCX_INFO.match(line):
            ucx_info_hits += 1
        if not found["nccl-debug"] and nccl_debug.NCCL_LINE.search(line):
            found["nccl-debug"] = True
        if not found["ompi-verbose"]:
            m = ompi_verbose.PREFIX.match(line)
            if m and m.group("msg").startswith(("mca: ", "mca:base:", "select: ")):
                found["ompi-verbose"] = True
        if not found["ucx-log"] and (
            ucx_log.UCX_LINE.search(line) or ("|" in line and ucx_log.PROTO_LINE.search(line))
        ):
            found["ucx-log"] = True
    found["ucx-info"] = ucx_info_hits >= 2
    return [k for k in PRIORITY if found[k]]


def detect_kind(lines: Sequence[str], found: Optional[List[str]] = None) -> str:
    """The main kind of ``lines`` (cleaned), ``failure`` or ``unknown``; ``found`` is
    :func:`sections` of the same lines when the caller has it already."""
    found = sections(lines) if found is None else found
    if found:
        return found[0]
    if scan(lines):
        return "failure"
    return "unknown"
