"""Judging the runs of a verification: native vs container per benchmark and scope, and
the findings of the runs and their logs.

The parsed runs are compared with :mod:`dedal.stages.verify.checks` (the OSU and NCCL
tables; for init also the whole job's wall time, which includes the launcher and the
container start: reported, never failing). Every failed or skipped run, every inter-node
run whose ranks all shared one machine, and every finding of the transport rules or the
parsers over the logs becomes a finding that quotes its log lines, merged per side and code.
The expectations of GPU buffers are judged once per side and scope over all its runs
(:func:`expectation_findings`): a device-buffer latency against the host-buffer latency and
the CUDA floor of the same host, which other runs measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from dedal.stages.verify import expectations
from dedal.stages.verify import findings as F
from dedal.stages.verify.rules import Rule
from dedal.stages.verify.catalogue import METRICS, Bench
from dedal.stages.verify.checks import (
    CheckResult,
    Thresholds,
    compare_job_time,
    compare_nccl_runs,
    compare_osu_runs,
    series_from_nccl,
    series_from_osu,
    skipped_check,
)
from dedal.stages.verify.transports import HostFacts, check_transports
from dedal.stages.verify.findings import Finding, verdict_of
from dedal.stages.verify.plan import SIDES, Plan, Run
from dedal.stages.verify.report import summary_row

#: the expectations of GPU buffers: judged over the runs of a side (:func:`expectation_findings`), not per log
GPU_EXPECTATIONS = expectations.codes_of("cuda")


def compare_runs(
    runs: Sequence[Run], plan: Plan, thresholds: Thresholds
) -> Tuple[List[CheckResult], Dict[str, Any], List[Dict[str, Any]]]:
    """The checks, the measurements (every value per side and size) and the summary (one
    representative number per side and check) of the measured runs (warm-ups left out)."""
    checks: List[CheckResult] = []
    measurements: Dict[str, Any] = {}
    summary: List[Dict[str, Any]] = []
    for scope, bench in plan.pairs():
        sel = [r for r in runs if r.scope == scope and r.bench == bench and r.rep > 0 and r.ok and r.parsed]
        nat = [r.parsed for r in sel if r.side == "native"]
        con = [r.parsed for r in sel if r.side == "container"]
        name = f"{bench.name} {scope}"
        if not nat or not con:
            missing = " and ".join(s for s, v in (("native", nat), ("container", con)) if not v)
            chk = CheckResult(
                name,
                bench.key,
                "",
                "failed",
                [
                    F.error(
                        "no-measurement", f"{name}: no successful {missing} run, nothing to compare", verdict="failed"
                    )
                ],
            )
            checks.append(chk)
            continue
        if bench.parser == "nccl-tests":
            chk = compare_nccl_runs(nat, con, thresholds, name=name)  # type: ignore[arg-type]
        else:
            chk = compare_osu_runs(nat, con, bench.table, thresholds, name=name)  # type: ignore[arg-type]
        checks.append(chk)
        if bench.key == "init":
            job = compare_job_time(
                [r.seconds * 1000 for r in sel if r.side == "native"],
                [r.seconds * 1000 for r in sel if r.side == "container"],
                thresholds,
                name=f"{bench.name} {scope} job wall time",
            )
            # whole-job time includes the launcher and the container start: reported, never failing
            for f in job.findings:
                if f.severity == "error":
                    f.severity, f.verdict = "warning", None
                    f.code = "startup-overhead"
                    f.message += (
                        f" (the whole job, its launcher and the container's start included; MPI_Init: {chk.name})"
                    )
            job.verdict = verdict_of(job.findings, "good") if job.verdict in ("bad", "suboptimal") else job.verdict
            checks.append(job)
        for c in checks[-2:] if bench.key == "init" else checks[-1:]:
            measurements[c.name] = {
                "unit": c.unit,
                "metric": c.metric,
                "native": {
                    (s.size if s.size is not None else 0): list(_values(sel, "native", c, s.size)) for s in c.sizes
                },
                "container": {
                    (s.size if s.size is not None else 0): list(_values(sel, "container", c, s.size)) for s in c.sizes
                },
            }
            rep = summary_row(c)
            if rep:
                summary.append(rep)
    return checks, measurements, summary


def remeasurable(checks: Sequence[CheckResult], runs: Sequence[Run], plan: Plan) -> List[Tuple[str, Bench]]:
    """The (scope, benchmark) pairs whose check is bad on timing alone: every error of the
    check is an exceeded threshold, and every measured run of the pair exited 0 with a log
    that the transport rules found good. Such a verdict may be one burst of interference on
    a shared machine (a median 12 % slower at one size, the ranges of repetitions apart by
    0.4 us); a failed run or a wrong transport is bad as it is."""
    by_name = {c.name: c for c in checks}
    out: List[Tuple[str, Bench]] = []
    for scope, bench in plan.pairs():
        check = by_name.get(f"{bench.name} {scope}")
        if check is None or check.verdict != "bad":
            continue
        errors = [f for f in check.findings if f.severity == "error"]
        if not errors or not all(f.code.endswith("-overhead") for f in errors):
            continue
        measured = [r for r in runs if r.scope == scope and r.bench == bench and r.rep > 0]
        if measured and all(r.ok and r.parsed and r.parsed.get("verdict") == "good" for r in measured):
            out.append((scope, bench))
    return out


def skipped_checks(benches: Sequence[Bench], scopes: Sequence[Tuple[str, int]], reason: str) -> List[CheckResult]:
    """One skipped check per benchmark and scope that was planned and could not run here
    (checks that need a GPU, on a host without one: :func:`~dedal.stages.verify.catalogue.gpu_planned`),
    each saying ``skipped: <reason>``; GPU checks all (OSU's host-buffer runs too where OSU is
    built with CUDA: they need the GPU driver to start)."""
    out = []
    for scope, _nodes in scopes:
        for bench in benches:
            if bench.intra_only and scope != "intra-node":
                continue
            metric, unit = METRICS[bench.key]
            out.append(skipped_check(f"{bench.name} {scope}", metric, unit, reason, gpu=True))
    return out


def _values(sel: Sequence[Run], side: str, check: CheckResult, size: Optional[int]) -> List[float]:
    runs = [r for r in sel if r.side == side]
    if check.name.endswith("job wall time"):
        return [round(r.seconds * 1000, 3) for r in runs]
    if check.metric == "init":
        return [r.parsed["init"]["avg_ms"] for r in runs if r.parsed and r.parsed.get("init")]
    parsed = [r.parsed for r in runs if r.parsed]
    series = series_from_nccl(parsed) if check.metric == "busbw" else series_from_osu(parsed, runs[0].bench.table)
    return series.get(int(size or 0), [])


def _tail(path: Path, n: int = 6) -> List[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    keep = [
        ln for ln in lines if ln.strip() and not ln.startswith(("#@", "$ ")) and "|" not in ln and "UCX  DIAG" not in ln
    ]
    return keep[-n:]


def _machines(parsed: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The ranks of one run grouped by machine (kernel boot id, from the rank script's lines):
    ``{boot_id, hosts, ranks, cpus}`` each."""
    by: Dict[str, Dict[str, Any]] = {}
    for r in parsed.get("rank_machines") or []:
        key = r.get("boot_id") or r.get("host") or "?"
        m = by.setdefault(key, {"boot_id": r.get("boot_id"), "hosts": [], "ranks": 0, "cpus": r.get("cpus")})
        m["ranks"] += 1
        if r.get("host") not in m["hosts"]:
            m["hosts"].append(r.get("host"))
    return list(by.values())


def _machine_findings(runs: Sequence[Run]) -> List[Finding]:
    """Where the ranks really ran: Slurm nodes that are one machine (network namespaces of
    one host, as the namespaced test cluster's, or VMs that are not), and machines with more
    ranks than CPUs, where ranks that busy-poll wait for each other's time slices."""
    shared: List[Tuple[Run, Dict[str, Any]]] = []
    crowded: List[Tuple[Run, Dict[str, Any]]] = []
    for r in runs:
        for m in _machines(r.parsed or {}):
            if r.scope == "inter-node" and len(m["hosts"]) > 1:
                shared.append((r, m))
            if m["cpus"] and m["ranks"] > m["cpus"]:
                crowded.append((r, m))
    out: List[Finding] = []
    if shared:
        r, m = shared[0]
        out.append(
            F.warning(
                "nodes-share-machine",
                f"{len({id(x) for x, _ in shared})} inter-node run(s) had ranks on "
                f"Slurm nodes {', '.join(m['hosts'])} that are one machine (one kernel, boot id "
                f"{m['boot_id']}): their messages crossed a network inside that machine, not a fabric "
                "between machines, so the inter-node numbers say nothing about an interconnect",
                [f"log: {r.rel}"],
            )
        )
    if crowded:
        r, m = crowded[0]
        out.append(
            F.warning(
                "oversubscribed",
                f"{len({id(x) for x, _ in crowded})} run(s) had more ranks than CPUs on "
                f"one machine ({m['ranks']} ranks on {m['cpus']} CPUs, nodes {', '.join(m['hosts'])}): "
                "ranks that busy-poll for messages wait for each other's time slices, so these timings "
                "(collectives above all) measure CPU contention, not the MPI stack; verify with at most "
                "one rank per CPU (fewer --ranks per node, or separate machines)",
                [f"log: {r.rel}"],
            )
        )
    return out


def containers(runs: Sequence[Run]) -> Dict[str, Any]:
    """How the container side's ranks really ran, from the ``#@ dedal-container:`` lines they
    wrote from inside: per run and node, the ranks, their mount namespaces (containers) and the
    mounts of the image they read. ``mode``: ``shared per node`` where every node with several
    ranks had one container, ``one per rank`` where each rank had its own, ``mixed``, or ""
    where no node had several ranks (nothing to share); ``example``: one such node, in words."""
    groups: List[Tuple[str, int, int, int]] = []  # (host, ranks, containers, image mounts)
    for r in runs:
        if r.side != "container" or not r.parsed:
            continue
        by: Dict[str, List[Dict[str, str]]] = {}
        for c in r.parsed.get("rank_containers") or []:
            by.setdefault(c.get("host") or "?", []).append(c)
        for host, ranks in sorted(by.items()):
            groups.append(
                (
                    host,
                    len(ranks),
                    len({c["mntns"] for c in ranks}),
                    len({c["imagedev"] for c in ranks if c.get("imagedev")}),
                )
            )
    several = [g for g in groups if g[1] > 1]
    if not several:
        return {"mode": "", "example": ""}
    shared = all(g[2] == 1 for g in several)
    apart = all(g[2] == g[1] for g in several)
    host, ranks, spaces, mounts = several[0]
    return {
        "mode": "shared per node" if shared else "one per rank" if apart else "mixed",
        "example": f"{ranks} ranks on {host} in {spaces} container(s), reading {mounts or '?'} mount(s) of the image",
    }


def run_findings(runs: Sequence[Run]) -> List[Finding]:
    """Failed runs (with the tail of their log), inter-node runs on one machine, skipped runs."""
    out: List[Finding] = []
    for r in runs:
        if r.skipped or r.returncode is None or r.ok:
            continue
        what = "did not finish within the time limit" if r.timed_out else f"exited with code {r.returncode}"
        warm = " (warm-up)" if r.rep == 0 else ""
        out.append(
            F.error(
                "run-failed",
                f"{r.side} {r.bench.name} ({r.scope}){warm} {what}; log {r.rel}",
                _tail(r.log) + [f"log: {r.rel}"],
                verdict="failed",
            )
        )
    same = [
        r for r in runs if r.scope == "inter-node" and r.ok and r.parsed and len(set(r.parsed.get("hosts") or [])) == 1
    ]
    if same:
        host = same[0].parsed["hosts"][0]  # type: ignore[index]
        out.append(
            F.warning(
                "inter-node-same-host",
                f"{len(same)} inter-node run(s) had every rank on one machine "
                f"({host}): Slurm's nodes share a host here, so these are not inter-node measurements",
                [f"log: {r.rel}" for r in same[:3]],
            )
        )
    out += _machine_findings(runs)
    seen = containers(runs)
    if seen["mode"]:
        out.append(
            F.info(
                "containers",
                f"container side: {seen['mode']} ({seen['example']}; measured from inside "
                "each rank: its mount namespace and the device of the image's file system)",
            )
        )
    skipped = [r for r in runs if r.skipped]
    if skipped:
        out.append(
            F.warning(
                "runs-skipped",
                f"{len(skipped)} repetition(s) not run after a failure of the same benchmark on the same side",
                [f"{r.rel}: {r.skipped}" for r in skipped[:5]],
            )
        )
    return out


def log_findings(
    runs: Sequence[Run], extra_logs: Sequence[Dict[str, Any]], host: HostFacts, rows: Optional[Sequence[Rule]] = None
) -> List[Finding]:
    """Transport rules and the parsers' own findings over every log, merged per side and
    code: one finding that says in how many runs it was seen and quotes the first."""
    groups: Dict[Tuple[str, str, str], Dict[str, Any]] = {}
    order: List[Tuple[str, str, str]] = []
    totals: Dict[str, int] = {}
    sources: List[Tuple[str, Dict[str, Any]]] = [(p.get("side") or "image", p) for p in extra_logs]
    sources += [(r.side, r.parsed) for r in runs if r.parsed is not None]
    for side, parsed in sources:
        totals[side] = totals.get(side, 0) + 1
        rule = check_transports([parsed], host, rows)
        rule_codes = {f.code for f in rule}
        own = [Finding.from_json(f) for f in parsed.get("findings") or []]
        for f in rule + [f for f in own if f.code not in rule_codes]:
            if f.code in ("truncated",) and not parsed.get("returncode", 0) == 0:
                continue  # a failed run's cut output: run-failed says it already
            if f.code in GPU_EXPECTATIONS and side in SIDES:
                continue  # judged over all the runs of the side: expectation_findings
            key = (side, f.code, f.severity)
            if key not in groups:
                groups[key] = {"finding": f, "sources": [], "verdict": f.implied_verdict}
                order.append(key)
            groups[key]["sources"].append(parsed.get("source") or "?")
    out: List[Finding] = []
    for key in order:
        g = groups[key]
        f: Finding = g["finding"]
        side = key[0]
        srcs = g["sources"]
        msg = f.message
        first = srcs[0]
        if msg.startswith(first + ": "):
            msg = msg[len(first) + 2 :]
        if side in SIDES:
            seen = f" (seen in {len(srcs)} of {totals.get(side, 0)} {side} run log(s), first {first})"
        else:
            seen = f" ({first})"
        out.append(
            Finding(f.severity, f.code, f"[{side}] {msg}{seen}", list(f.evidence) + [f"log: {first}"], f.verdict)
        )
    return out


def expectation_findings(runs: Sequence[Run], plan: Plan) -> List[Finding]:
    """The GPU expectations (:mod:`dedal.stages.verify.expectations`, class ``cuda``) judged
    once per side and scope over the facts of all its measured runs (the median of the
    repetitions of each benchmark), so that device-buffer latency meets the host-buffer
    latency and the CUDA floor measured in other runs. The floor is the native side's (the
    platform's own), for the container side too; each finding names its side and scope."""
    facts: Dict[Tuple[str, str], List[expectations.Fact]] = {}
    for scope, bench in plan.pairs():
        for side in SIDES:
            sel = [
                r
                for r in runs
                if r.scope == scope and r.bench == bench and r.side == side and r.rep > 0 and r.ok and r.parsed
            ]
            facts.setdefault((side, scope), []).extend(
                expectations.median_facts([expectations.facts_of(r.parsed or {}) for r in sel], [r.rel for r in sel])
            )
    out: List[Finding] = []
    for (side, scope), found in facts.items():
        floor = [f for f in facts.get(("native", scope), []) if f.key in expectations.FLOOR_FACTS]
        own = [f for f in found if f.key not in expectations.FLOOR_FACTS]
        floor = floor or [f for f in found if f.key in expectations.FLOOR_FACTS]
        for f in expectations.judge(own + floor, scope=scope, hardware=["cuda"]):
            f.message = f"[{side}] {f.message} ({scope})"
            out.append(f)
    return out


def transports(runs: Sequence[Run]) -> Dict[str, Dict[str, List[str]]]:
    """The UCX transports each side used per scope (``self`` left out), in order of first use."""
    out: Dict[str, Dict[str, List[str]]] = {}
    for r in runs:
        if not r.parsed:
            continue
        for scope, tls in (r.parsed.get("transports_by_scope") or {}).items():
            if scope == "self":
                continue
            lst = out.setdefault(r.side, {}).setdefault(scope, [])
            for t in tls:
                if t not in lst:
                    lst.append(t)
    return out
