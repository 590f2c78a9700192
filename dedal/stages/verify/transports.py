"""Transport rules over parsed logs: what the runtime's own logs say about how messages moved,
judged against what the host offers.

A parsed log (UCX, Open MPI verbose, NCCL debug, ``ucx_info``, ``srun --mpi=list``) and the
:class:`HostFacts` the preflight found go in, :class:`~dedal.stages.verify.findings.Finding`
records come out. What the log shows is read once (:func:`dedal.stages.verify.facts.seen_of`)
and judged once, by the rules table (:mod:`dedal.stages.verify.rules`): TCP within a node is a
fallback, TCP between nodes only where the nodes have an RDMA network, and so on. This module
only applies that judge to the logs of a report.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Optional, Sequence

from dedal.stages.verify import rules
from dedal.stages.verify.judge import judge
from dedal.stages.verify.facts import HostFacts, seen_of
from dedal.stages.verify.findings import Finding

__all__ = ["HostFacts", "check_transports"]


def check_transports(
    parsed_logs: Iterable[Mapping[str, Any]],
    host: Optional[HostFacts] = None,
    rows: Optional[Sequence[rules.Rule]] = None,
) -> List[Finding]:
    """The rules over what each parsed log (a result of
    :func:`dedal.stages.verify.parsers.parse_file`) shows of its transports, protocols and plugins,
    judged against ``host`` (default: nothing special, no fabric, one node) in the log's own scope
    (``scope`` of a run log), each message prefixed with the log's source."""
    host = host or HostFacts()
    out: List[Finding] = []
    for p in parsed_logs:
        src = p.get("source") or p.get("kind") or "log"
        for f in judge(seen_of(p), host=host, scope=p.get("scope"), rows=rules.RULES if rows is None else rows):
            out.append(Finding(f.severity, f.code, f"{src}: {f.message}", f.evidence, f.verdict))
    return out
