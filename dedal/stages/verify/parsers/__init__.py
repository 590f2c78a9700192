"""Parsers for benchmark outputs and debug logs: ``parse_text`` / ``parse_file``.

Kinds (the names are part of the CLI, ``dedal verify parse FILE --kind KIND``):

=================  ============================================================
``osu``            OSU Micro-Benchmarks output (v5-v7): latency, bandwidth,
                   collectives, one-sided, ``osu_init``
``nccl-tests``     nccl-tests output (``all_reduce_perf`` ...)
``nccl-debug``     ``NCCL_DEBUG=INFO`` log: network, channel transports, GDRDMA
``ucx-info``       ``ucx_info -d``: memory domains, transports, devices
``ucx-log``        ``UCX_LOG_LEVEL=info`` / ``UCX_PROTO_INFO=y`` log, UCX WARN/ERROR
``ucx-perftest``   ``ucx_perftest`` output: UCX's own latency/bandwidth, without MPI
``ompi-verbose``   Open MPI ``btl_base_verbose`` / ``pml_base_verbose`` output
``srun-mpi-list``  ``srun --mpi=list``: Slurm MPI plugins and PMIx versions
``failure``        a log whose main content is a known failure signature
=================  ============================================================

Every result is one JSON-able dict with at least ``kind``, ``verdict`` (good,
suboptimal, bad, failed, degenerate, unknown), ``findings`` (list of ``{severity,
code, message, evidence, verdict}``) and ``sections`` (every kind recognised in the
text). The kind-specific keys are documented in each module; a log that mixes kinds
(UCX warnings inside an OSU table, NCCL INFO lines inside nccl-tests output) gets the
keys of every section. Failure signatures (crashes, PMIx errors, CUDA driver too old,
missing ``--nv`` libraries ...) are looked for in every kind. What a log shows of its transports,
protocols and plugins (per scope, with the lines that show it: :func:`dedal.stages.verify.facts.seen_of`)
and the numbers of its tables (:func:`dedal.stages.verify.expectations.facts_of`) are facts,
judged once by the rules table (:mod:`dedal.stages.verify.rules`): TCP within a node or between
nodes that have a fabric, a TCP-like latency between host buffers, a slow path between GPU buffers.

Lines starting with ``#@ `` are ignored (provenance notes of recorded test data), except
the ``#@ dedal-rank:`` lines of dedal's rank script, read into ``rank_machines`` (``{host,
boot_id, cpus}`` per rank of an ``srun`` step), and the ``#@ dedal-container:`` lines its ranks
write from inside, read into ``rank_containers`` (``{host, mntns, imagedev}``).

The keys per kind (units as the tools print them: OSU latency in us, bandwidth in MB/s,
init in ms; NCCL bus bandwidth in GB/s, times in us):

- ``osu``: ``version`` (``"7.5"``), ``versions``, ``tables`` (list of ``{benchmark``
  (``osu_latency``...), ``title``, ``version``, ``device`` (cuda/rocm/None), ``pt2pt`` (point
  to point: not a collective, not init), ``columns``, ``rows``: ``[[size, value, ...], ...]``
  (no size for single-value tables such as ``osu_barrier`` v5; text columns such as
  ``Validation`` kept as strings), ``meta``,
  ``metric``, ``unit``, ``suite}``: ``osu`` or ``dedal-bench``, whose tables are named
  ``dedal_latency``...), ``init`` (first ``{nprocs, min_ms, max_ms, avg_ms}`` or None),
  ``inits`` (all of them), ``message_size_option`` (a ``-m`` seen on a command line),
  ``suites`` (every suite whose title was seen);
- ``nccl-tests``: ``test``, ``nranks``, ``nnodes``, ``hosts``, ``devices``, ``params``,
  ``rows`` (list of ``{size, count, type, redop, root, oop_time_us, oop_algbw,
  oop_busbw, oop_wrong, ip_time_us, ip_algbw, ip_busbw, ip_wrong}``; ``*_error`` instead
  of ``*_wrong`` for old versions), ``peak_busbw``, ``peak_busbw_size``, ``avg_busbw``
  (the ``# Avg bus bandwidth`` line, None when missing), ``avg_busbw_rows``,
  ``out_of_bounds``, ``completed`` (and ``nccl_version`` from ``dedal_nccl_allreduce``'s first line);
- ``nccl-debug``: ``nccl_version``, ``nranks``, ``nnodes``, ``network``, ``networks``,
  ``ib_devices``, ``ib_link_layers``, ``socket_interfaces``, ``transports`` (count per
  ``via`` transport, NIC index dropped: ``NET/IB/GDRDMA``, ``P2P/IPC``, ``NET/Socket``,
  ``SHM/direct/direct``), ``transport_classes``, ``transport_evidence``, ``gdrdma``
  (True/False/None), ``plugins``;
- ``ucx-info``: ``memory_domains``, ``transports`` (list of ``{transport, device, type,
  memory_domain, component, bandwidth_mbs, latency_ns, family}``), ``transport_names``,
  ``devices``, ``has_rdma``, ``has_shm``, ``has_cuda``, ``connection_managers``;
- ``ucx-log``: ``ucx_version``, ``ucx_env``, ``selections`` (``{context, scope, cfg,
  lanes, transports, count, line}``), ``protocols``, ``transports_by_scope``
  (``{"intra-node": [...], "inter-node": [...], "self": [...]}``), ``ucx_warnings``,
  ``ucx_errors``, ``ucx_diag``;
- ``ucx-perftest``: ``perftest`` (``{test, size, memory}`` from the command line or the
  output), ``tables`` (the final row as one table in the ``osu`` layout, benchmark
  ``ucx_perftest_<test>``, ``device`` the GPU memory type);
- ``ompi-verbose``: ``pml``, ``selected`` (per framework), ``frameworks``,
  ``btl_components``, ``btl_used`` (count per BTL of ``Using X btl for send to``),
  ``btl_peers``, ``hosts``;
- ``srun-mpi-list``: ``plugins``, ``pmix_versions``, ``has_pmix``;
- ``failure``: ``failures`` (the failure codes found).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from dedal.errors import UserError
from dedal.stages.verify import expectations, rules
from dedal.stages.verify.judge import judge
from dedal.stages.verify.facts import HostFacts, seen_of
from dedal.stages.verify.findings import Finding, verdict_of
from dedal.stages.verify.parsers import (
    nccl_debug,
    nccl_tests,
    ompi_verbose,
    osu,
    srun_mpi,
    ucx_info,
    ucx_log,
    ucx_perftest,
)
from dedal.stages.verify.parsers._text import clean_lines, rank_containers, rank_machines
from dedal.stages.verify.parsers.detect import detect_kind, sections
from dedal.stages.verify.parsers.signatures import scan

KINDS: Dict[str, str] = {
    "osu": "OSU Micro-Benchmarks output (v5-v7: latency, bw, collectives, init)",
    "nccl-tests": "nccl-tests output (all_reduce_perf ...): rows, peak and average bus bandwidth",
    "nccl-debug": "NCCL_DEBUG=INFO log: network, 'via' transports, GPUDirect RDMA, NET plugins",
    "ucx-info": "ucx_info -d: memory domains, transports and devices",
    "ucx-log": "UCX_LOG_LEVEL=info / UCX_PROTO_INFO=y log: selected transports, WARN/ERROR lines",
    "ucx-perftest": "ucx_perftest output: UCX's own latency/bandwidth (test, size, memory type), no MPI",
    "ompi-verbose": "Open MPI btl/pml verbose output: components, BTL used per peer",
    "srun-mpi-list": "srun --mpi=list: Slurm MPI plugins and PMIx versions",
    "failure": "a log whose main content is a known failure signature",
}

_PARSERS: Dict[str, Callable[[List[str]], Dict[str, Any]]] = {
    "osu": osu.parse,
    "nccl-tests": nccl_tests.parse,
    "nccl-debug": nccl_debug.parse,
    "ucx-info": ucx_info.parse,
    "ucx-log": ucx_log.parse,
    "ucx-perftest": ucx_perftest.parse,
    "ompi-verbose": ompi_verbose.parse,
    "srun-mpi-list": srun_mpi.parse,
}
#: kinds that are parsed as extra sections when they occur inside a log of another kind
_AUXILIARY = ("ucx-perftest", "nccl-debug", "ompi-verbose", "ucx-log")


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {}


def parse_lines(
    lines: List[str],
    kind: Optional[str] = None,
    *,
    host: Optional[HostFacts] = None,
    scope: Optional[str] = None,
    rows: Optional[Sequence[rules.Rule]] = None,
) -> Dict[str, Any]:
    """Parse cleaned lines (see :func:`clean_lines`); ``kind`` None means detect it. What the
    parsers saw is judged once by the rules (:func:`dedal.stages.verify.judge.judge`): against
    ``host`` where the preflight found it (None: the log alone), in ``scope`` where the run's is
    known, with ``rows`` (a site's table; default dedal's)."""
    if kind is not None and kind not in KINDS:
        raise UserError(f"unknown log kind {kind!r}; known kinds: {', '.join(KINDS)}")
    present = sections(lines)
    kind = kind or detect_kind(lines, present)
    result: Dict[str, Any] = {"kind": kind}
    findings: List[Finding] = []
    base = "unknown"
    parts = [kind] if kind in _PARSERS else []
    parts += [k for k in _AUXILIARY if k in present and k not in parts]
    for part in parts:
        data = _PARSERS[part](lines)
        part_findings = data.pop("_findings", [])
        part_base = data.pop("_base_verdict", "unknown")
        data.pop("_recognized", None)
        data.pop("_has_data", None)
        for key, value in data.items():
            if key not in result or _empty(result[key]):
                result[key] = value
            elif key == "tables" and value:  # OSU and ucx_perftest tables in one log: all of them
                result[key] = result[key] + value
        findings.extend(part_findings)
        base = part_base if part == kind or base == "unknown" else base
    judged = judge(
        seen_of(result),
        expectations.facts_of(result),
        host=host,
        scope=scope,
        rows=rules.RULES if rows is None else rows,
    )
    judged_codes = {f.code for f in judged}
    findings = [f for f in findings if f.code not in judged_codes] + judged
    failure_findings = [
        _no_gpu_used(f) if f.code == "nv-libraries-missing" and host is not None and not host.gpus else f
        for f in scan(lines)
    ]
    findings.extend(failure_findings)
    if kind == "failure":
        result["failures"] = [f.code for f in failure_findings]
    result["sections"] = present or ([kind] if kind not in ("unknown",) else [])
    result["verdict"] = verdict_of(findings, base)
    result["findings"] = [f.to_json() for f in findings]
    result["lines"] = len(lines)
    return result


def _no_gpu_used(found: Finding) -> Finding:
    """A GPU driver that cannot be loaded where the run uses no GPU (a GPU image verified on a
    host without one): the image's CUDA-aware components (Open MPI's accelerator and GPU memory
    components, UCX's cuda transports) try to load it and go on without: expected, not a fault
    of the container. Where the run uses GPUs it stays what it is: the driver is missing inside."""
    return Finding(
        "info",
        "cuda-driver-absent",
        "no GPU is used here: the image's CUDA-aware components find no "
        "GPU driver to load, as expected, and go on without it",
        found.evidence,
        "good",
    )


def parse_text(text: Union[str, bytes], kind: Optional[str] = None, **judged: Any) -> Dict[str, Any]:
    """Parse a log given as text (or bytes). See the module docstring for the result; ``judged``:
    the ``host``, ``scope`` and ``rows`` of :func:`parse_lines`."""
    result = parse_lines(clean_lines(text), kind, **judged)
    ranks = rank_machines(text)
    if ranks:
        result["rank_machines"] = ranks
    containers = rank_containers(text)
    if containers:
        result["rank_containers"] = containers
    return result


def parse_file(path: Union[str, Path], kind: Optional[str] = None, **judged: Any) -> Dict[str, Any]:
    """Parse a log file; a missing or unreadable file is a :class:`UserError`. ``judged``: the
    ``host``, ``scope`` and ``rows`` of :func:`parse_lines`."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: no such file")
    if p.is_dir():
        raise UserError(f"{p}: is a directory, not a log file")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise UserError(f"{p}: cannot read: {exc.strerror or exc}") from None
    result = parse_text(data, kind, **judged)
    result["source"] = str(p)
    return result


__all__ = ["KINDS", "parse_text", "parse_file", "parse_lines", "detect_kind", "clean_lines", "Finding"]
