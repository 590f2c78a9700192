"""``dedal verify IMAGE``: run the benchmarks natively and in the container, judge, report.

The steps, each a function of its own:

1. **image** (:mod:`dedal.stages.verify.image`): labels, target, CUDA, and where the
   benchmarks are in the image (``dedal_*``, ``osu_*``, ``all_reduce_perf``);
2. **preflight** (:mod:`dedal.stages.verify.preflight`): PMIx in ``srun --mpi=list``,
   ``/dev/infiniband``, GPU driver vs CUDA, CPU vs target; a fatal finding stops here
   (exit 2, one line) before anything runs;
3. **native** (:func:`dedal.stages.verify.image.prepare_native`): what the native side is (the
   host's MPI and programs where it has them, else the image's root filesystem unpacked
   onto local storage and run without a container runtime), written into the report;
4. **runs**: every benchmark, intra-node (always) and inter-node (``srun`` with 2+
   nodes), natively and in the container, **interleaved** in one allocation: each
   repetition runs native and container back to back, alternating which goes first
   (N C, C N, N C ...), so that drift of the machine hits both sides alike; one
   unmeasured warm-up per side first. ``mpirun`` locally (the image's own ``mpirun``, the
   launcher and its ranks in one container) or ``srun --mpi=pmix`` (one container per
   rank) through :mod:`dedal.adapters.mpi`. UCX (``UCX_LOG_LEVEL=info UCX_PROTO_INFO=y``),
   Open MPI (``pml_base_verbose``) and NCCL (``NCCL_DEBUG=INFO``) debug output is on;
   each run's output goes to ``raw/<scope>/<program>/<side>-<rep>.log``;
5. **checks** (:mod:`dedal.stages.verify.checks`): the parsed runs compared native vs container
   per benchmark and scope, the transport rules applied to every log with the
   preflight's host facts; every TCP fallback, failed run or failure signature becomes
   a finding that quotes its log lines;
6. **report** (:func:`dedal.stages.verify.report.write_report`): ``verify.json``, ``report.md``
   and plots in ``reports/<image>/``; exit code 0 (good, suboptimal) or 1.

Settings come from (later wins): built-in defaults, the image's label
``dedal.verify.thresholds`` (JSON), the environment file's ``dedal.verify`` section
(``--env-file``), the command line.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from dedal.ui.console import err, print_json
from dedal.errors import UserError
from dedal.stages.verify import findings as F
from dedal.stages.verify import image as img
from dedal.stages.verify import preflight as pre
from dedal.stages.verify.catalogue import Bench, select_benchmarks
from dedal.stages.verify.checks import (CheckResult, HostFacts, Thresholds, check_transports, compare_init,
                                 compare_nccl_runs, compare_osu_runs)
from dedal.stages.verify.findings import Finding, verdict_of, verdict_rank
from dedal.stages.verify.options import Options, add_arguments, options_from_args
from dedal.stages.verify.parsers import parse_file
from dedal.stages.verify.report import VerifyReport, slug, write_report

__all__ = ["Options", "add_arguments", "main", "options_from_args", "verify"]

SIDES = ("native", "container")

#: debug output every run has on (the caller's --env can override each)
DEBUG_ENV = {
    "UCX_LOG_LEVEL": "info",          # UCX: version, selected transports per endpoint configuration
    "UCX_PROTO_INFO": "y",            # UCX: protocol table per message size range
    "OMPI_MCA_pml": "ucx",            # the UCX pml (ob1 hangs under Slurm's PMIx 4 server)
    "OMPI_MCA_pml_ucx_tls": "any",    # Open MPI 5 defaults to Mellanox transports only
    "OMPI_MCA_pml_ucx_devices": "any",
    "OMPI_MCA_pml_base_verbose": "10",  # which pml was selected
}
NCCL_ENV = {"NCCL_DEBUG": "INFO"}


# ---------------------------------------------------------------------------- runs


@dataclass
class Run:
    side: str
    scope: str
    bench: Bench
    rep: int               # 0: warm-up
    ranks: int
    nodes: int
    log: Path
    rel: str
    returncode: Optional[int] = None
    seconds: float = 0.0
    timed_out: bool = False
    parsed: Optional[Dict[str, Any]] = None
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@dataclass
class Plan:
    launcher: str
    scopes: List[Tuple[str, int]]        # (scope, nodes)
    benches: List[Bench]
    repetitions: int
    ranks: int
    gpus: int

    def ranks_for(self, bench: Bench, nodes: int) -> int:
        if bench.pt2pt:
            return 2
        if bench.gpu:
            return max(1, self.gpus) * nodes
        return self.ranks * nodes

    def order(self) -> List[Tuple[str, Bench, int, str]]:
        """(scope, bench, repetition, side) in run order: warm-up first, then each
        repetition with native and container back to back, alternating who goes first."""
        out: List[Tuple[str, Bench, int, str]] = []
        warm = next((b for b in self.benches if b.key == "init"), self.benches[0] if self.benches else None)
        for scope, _nodes in self.scopes:
            if warm is not None:
                for side in SIDES:
                    out.append((scope, warm, 0, side))
        for rep in range(1, self.repetitions + 1):
            for scope, _nodes in self.scopes:
                for bench in self.benches:
                    sides = SIDES if rep % 2 == 1 else tuple(reversed(SIDES))
                    for side in sides:
                        out.append((scope, bench, rep, side))
        return out


def _launcher(choice: str) -> str:
    if choice != "auto":
        return choice
    return "srun" if os.environ.get("SLURM_JOB_ID") and shutil.which("srun") else "mpirun"


def _allocation_nodes() -> Optional[int]:
    try:
        return int(os.environ["SLURM_JOB_NUM_NODES"]) if os.environ.get("SLURM_JOB_ID") else None
    except (KeyError, ValueError):
        return None


def _say(progress: Optional[Callable[[str], None]], text: str) -> None:
    if progress:
        progress(text)


def _run_env(opts: Options, bench: Bench) -> Dict[str, str]:
    env = dict(DEBUG_ENV)
    if bench.gpu:
        env.update(NCCL_ENV)
    env.update(opts.env)
    if env.get("OMPI_MCA_pml") == "ob1":
        env.setdefault("OMPI_MCA_btl_base_verbose", "100")  # which BTL each peer uses
    return env


# ---------------------------------------------------------------------------- the verification


@dataclass
class Outcome:
    report: VerifyReport
    paths: Dict[str, Path]
    outdir: Path
    runs: List[Run]
    summary: List[Dict[str, Any]]


def verify(opts: Options, progress: Optional[Callable[[str], None]] = None) -> Outcome:
    """Run the whole verification (see the module notes); raises PreflightFailed before
    anything runs when the host cannot run the image meaningfully."""
    from dedal.adapters import mpi, runtime
    from dedal.adapters.slurm import Slurm

    started = time.time()
    t0 = time.monotonic()
    backend = runtime.resolve_runtime(opts.runtime)
    _say(progress, f"image {opts.image}: looking for the benchmarks")
    info = img.inspect_image(opts.image, runtime_name=opts.runtime, progress=progress)
    launcher = _launcher(opts.launcher)
    alloc = _allocation_nodes() if launcher == "srun" else None
    nodes = opts.nodes or (alloc or 1)
    if launcher == "mpirun" and nodes > 1:
        raise UserError(f"{nodes} nodes need the srun launcher (inside a Slurm allocation); mpirun runs on this node")

    # thresholds: defaults < image label < env file / command line
    label_th: Dict[str, Any] = {}
    raw = info.labels.get("dedal.verify.thresholds")
    if raw:
        try:
            label_th = json.loads(raw) if isinstance(raw, str) else dict(raw)
        except (ValueError, TypeError):
            raise UserError(f"{opts.image}: label dedal.verify.thresholds is not a JSON object: {raw!r}") from None
    thresholds = Thresholds.from_mapping({**label_th, **opts.thresholds})

    # preflight
    pf = pre.run_preflight(image_target=info.target, image_cuda=info.cuda, image_arch=info.arch, launcher=launcher,
                           nodes=nodes, want_gpu=opts.gpu, srun_mpi_list=(lambda: Slurm().mpi_plugins()),
                           allocation_nodes=alloc)
    for f in pf.findings:
        _say(progress, f"preflight [{f.severity}] {f.code}: {f.message}")
    if pf.fatal:
        raise pre.PreflightFailed(pf.fatal_line())
    use_gpu = bool(pf.facts.get("gpu_benchmarks"))
    extra_binds: List[Any] = []
    bundled_note = ""
    wants_bundled = any(k in opts.benchmarks for k in ("init", "latency", "bw", "allreduce"))
    if wants_bundled and not any(p in info.programs for p in img.BUNDLED_MPI) and "mpicc" in info.programs:
        built = img.compile_bundled(info, opts.cache_dir, runtime_name=opts.runtime, progress=progress)
        for name in img.BUNDLED_MPI:
            info.programs[name] = f"{img.BUNDLED_DIR}/{name}"
        extra_binds.append(runtime.Bind(built, img.BUNDLED_DIR, readonly=True))
        bundled_note = (f"the image does not carry dedal-benchmarks: dedal verify built them with the image's own "
                        f"mpicc ({built}) and runs those same binaries natively and in the container")
        _say(progress, bundled_note)
    benches, notes = select_benchmarks(opts.benchmarks, info.programs, gpu=use_gpu)
    if not benches:
        have = ", ".join(p for p in info.programs if p.startswith(("dedal_", "osu_", "all_reduce"))) or "none"
        raise UserError(f"{opts.image}: none of the requested benchmarks ({', '.join(opts.benchmarks)}) is in the "
                        f"image (found: {have}); build the environment with the dedal-benchmarks package")
    if "mpirun" not in info.programs and launcher == "mpirun":
        raise UserError(f"{opts.image}: the image has no mpirun on its PATH, so it cannot be verified with the "
                        "mpirun launcher (use --launcher srun under Slurm)")

    outdir = Path(opts.output) if opts.output else opts.reports_dir / slug(info.name)
    if outdir.exists() and not outdir.is_dir():
        raise UserError(f"{outdir}: exists and is not a directory")

    # native
    wanted = [b.program for b in benches]
    host_programs = {p: mpi.host_which(p) for p in wanted}
    host_mpi = mpi.host_mpirun() if launcher == "mpirun" and all(host_programs.values()) else None
    native = img.prepare_native(info, mode=opts.native, wanted=wanted, cache=opts.cache_dir / "verify-native",
                                native_root=opts.native_root, host_programs=host_programs, host_mpi=host_mpi,
                                launcher=launcher, progress=progress)
    _say(progress, f"native: {native.description}")

    rawdir = outdir / "raw"
    _clean_previous(outdir)
    rawdir.mkdir(parents=True, exist_ok=True)

    logs: List[Dict[str, Any]] = [{**p, "side": "host"} for p in pf.logs]
    if "ucx_info" in info.programs:
        ucx_log = rawdir / "container-ucx_info-d.txt"
        runtime.run_in(opts.image, ["ucx_info", "-d"], log=ucx_log, what="ucx_info -d", runtime=opts.runtime,
                       check=False, timeout=120)
        parsed = parse_file(ucx_log, "ucx-info")
        parsed["source"] = str(ucx_log.relative_to(outdir))
        parsed["side"] = "image"
        logs.append(parsed)

    scopes = [("intra-node", 1)] + ([("inter-node", 2)] if launcher == "srun" and nodes >= 2 else [])
    plan = Plan(launcher, scopes, benches, opts.repetitions, opts.ranks, pf.host.gpus)
    order = plan.order()
    # The image stays mounted for all container runs, as Apptainer shares one loop device
    # between the processes that use an image: the runs measure the container's steady
    # state, not a cold mount each time (the whole-job wall time still shows start-up).
    mounts = contextlib.ExitStack()
    container_root: Any = opts.image
    if backend != "apptainer" and runtime.root_kind(opts.image) in ("sif", "squashfs"):
        container_root = mounts.enter_context(runtime.mounted(opts.image))
    try:
        runs: List[Run] = []
        failed_series: Dict[Tuple[str, str, str], Run] = {}
        for i, (scope, bench, rep, side) in enumerate(order, 1):
            nnodes = dict(scopes)[scope]
            ranks = plan.ranks_for(bench, nnodes)
            name = "warmup" if rep == 0 else f"{rep:02d}"
            rel = f"raw/{scope}/{bench.program}/{side}-{name}.log"
            run = Run(side, scope, bench, rep, ranks, nnodes, outdir / rel, rel)
            runs.append(run)
            key = (scope, bench.program, side)
            if key in failed_series:
                run.skipped = f"not repeated: {failed_series[key].rel} failed"
                continue
            program = native.programs.get(bench.program) if side == "native" else info.programs[bench.program]
            argv = [program or bench.program, *bench.args(opts.max_size, opts.nccl_max_size)]
            env = _run_env(opts, bench)
            root = native.root if side == "native" else container_root
            binds = (img.native_binds() if side == "native" and native.root is not None else []) + extra_binds
            # the native side never goes through a container runtime: a plain bubblewrap chroot
            rt = "bwrap" if side == "native" else opts.runtime
            note = [f"dedal verify: {side} {'warm-up' if rep == 0 else f'repetition {rep} of {opts.repetitions}'} of "
                    f"{bench.program} ({scope}, {ranks} rank(s) on {nnodes} node(s), launcher {launcher})",
                    f"{side}: " + (native.description if side == "native" else _container_text(backend, launcher))]
            if launcher == "srun":
                res = mpi.run_srun(root, argv, ranks, env=env, log=run.log, script_dir=rawdir / ".launch", nodes=nnodes,
                                   timeout=opts.timeout, runtime_name=rt, binds=binds,
                                   nv=bench.gpu and side == "container", note=note)
            else:
                res = mpi.run_mpirun(root, argv, ranks, env=env, log=run.log, timeout=opts.timeout,
                                     runtime_name=rt, binds=binds, nv=bench.gpu and side == "container",
                                     oversubscribe=ranks > (os.cpu_count() or 1), note=note)
            run.returncode, run.seconds, run.timed_out = res.returncode, res.seconds, res.timed_out
            run.parsed = parse_file(run.log, "nccl-tests" if bench.suite == "nccl-tests" or bench.program ==
                                    "dedal_nccl_allreduce" else "osu")
            run.parsed.update({"source": rel, "side": side, "scope": scope, "program": bench.program,
                               "repetition": rep, "returncode": run.returncode, "seconds": round(run.seconds, 3)})
            if not run.ok and rep > 0:
                failed_series[key] = run
            state = "ok" if run.ok else ("TIMED OUT" if run.timed_out else f"FAILED (exit {run.returncode})")
            _say(progress, f"[{i}/{len(order)}] {side:9s} {bench.program} {scope} "
                           f"{'warm-up' if rep == 0 else f'rep {rep}/{opts.repetitions}'}: {run.seconds:.1f} s {state}"
                           f" ({run.parsed['verdict']})")

    finally:
        mounts.close()
    checks, measurements, summary = _compare(runs, plan, thresholds)
    findings: List[Finding] = list(pf.findings)
    if launcher == "srun" and nodes >= 2 and backend != "apptainer":
        findings.append(F.warning("sandbox-mount-local", f"the {backend} sandboxes run the image mounted on this node "
                                  f"({socket.gethostname()}); ranks on other nodes find it only where that path is "
                                  "shared: on a cluster, verify with Apptainer"))
    findings += [F.info("not-run", n) for n in notes]
    if bundled_note:
        findings.append(F.info("bundled-benchmarks", bundled_note))
    findings += _run_findings(runs)
    findings += _log_findings(runs, logs, pf.host)
    transports = _transports(runs)
    for side in SIDES:
        for scope, tls in transports.get(side, {}).items():
            findings.append(F.info("ucx-transports", f"{side}, {scope}: UCX moved messages over {', '.join(tls)}"))
    logs += [r.parsed for r in runs if r.parsed is not None]

    meta = _meta(opts, info, native, launcher, backend, nodes, plan, started, t0, transports, summary, pf)
    if Path(opts.image).is_file():  # which bytes were verified: lets build-image reuse this report
        from dedal.model.layers import sha256_file
        meta["image_sha256"] = sha256_file(Path(opts.image))
    report = VerifyReport(image=info.name, checks=checks, findings=findings, logs=logs, measurements=measurements,
                          host=pf.host, thresholds=thresholds, meta=meta)
    paths = write_report(report, outdir)
    return Outcome(report, paths, outdir, runs, summary)


def _container_text(backend: str, launcher: str) -> str:
    tmp = "/tmp" if launcher == "mpirun" else "the host's /tmp (PMIx rendezvous)"
    how = {"apptainer": "apptainer exec", "bwrap": f"bubblewrap sandbox of the mounted image (private /dev and /run, "
           f"{tmp}; the image's environment scripts)", "charliecloud": "ch-run (own user namespace per process)"}
    where = ("the image's own mpirun and its ranks in one container" if launcher == "mpirun"
             else "srun --mpi=pmix with one container per rank (Slurm's PMIx server on the host)")
    return f"{how.get(backend, backend)}; {where}"


def _clean_previous(outdir: Path) -> None:
    """Remove what a previous verification wrote (verify.json first: its presence means
    a complete report), so that nothing stale is mistaken for this run's."""
    if not outdir.exists():
        return
    if not outdir.is_dir():
        raise UserError(f"{outdir}: exists and is not a directory")
    for name in ("verify.json", "report.md"):
        (outdir / name).unlink(missing_ok=True)
    for png in outdir.glob("*.png"):
        png.unlink()
    shutil.rmtree(outdir / "raw", ignore_errors=True)


# ---------------------------------------------------------------------------- judging


def _representative(check: CheckResult) -> Optional[Dict[str, Any]]:
    """One number per side for the summary: latency at the smallest non-zero size,
    bandwidth at the largest, init and bus bandwidth as measured."""
    sizes = [s for s in check.sizes]
    if not sizes:
        return None
    if check.metric == "latency":
        pick = next((s for s in sizes if s.size and s.size > 0), sizes[0])
    elif check.metric in ("bandwidth", "busbw"):
        pick = sizes[-1]
    else:
        pick = sizes[0]
    n, c = pick.native.median, pick.container.median
    return {"check": check.name, "metric": check.metric, "unit": check.unit, "size": pick.size,
            "native": n, "container": c, "ratio": (c / n) if n else None, "verdict": check.verdict}


def _compare(runs: Sequence[Run], plan: Plan, thresholds: Thresholds
             ) -> Tuple[List[CheckResult], Dict[str, Any], List[Dict[str, Any]]]:
    checks: List[CheckResult] = []
    measurements: Dict[str, Any] = {}
    summary: List[Dict[str, Any]] = []
    for scope, _nodes in plan.scopes:
        for bench in plan.benches:
            sel = [r for r in runs if r.scope == scope and r.bench == bench and r.rep > 0 and r.ok and r.parsed]
            nat = [r.parsed for r in sel if r.side == "native"]
            con = [r.parsed for r in sel if r.side == "container"]
            name = f"{bench.program} {scope}"
            if not nat or not con:
                missing = " and ".join(s for s, v in (("native", nat), ("container", con)) if not v)
                chk = CheckResult(name, bench.key, "", "failed", [F.error(
                    "no-measurement", f"{name}: no successful {missing} run, nothing to compare", verdict="failed")])
                checks.append(chk)
                continue
            if bench.gpu:
                chk = compare_nccl_runs(nat, con, thresholds, name=name)  # type: ignore[arg-type]
            else:
                chk = compare_osu_runs(nat, con, bench.table, thresholds, name=name)  # type: ignore[arg-type]
            checks.append(chk)
            if bench.key == "init":
                job = compare_init([r.seconds * 1000 for r in sel if r.side == "native"],
                                   [r.seconds * 1000 for r in sel if r.side == "container"], thresholds,
                                   name=f"{bench.program} {scope} job wall time")
                # whole-job time includes the launcher and the container start: reported, never failing
                for f in job.findings:
                    if f.severity == "error":
                        f.severity, f.verdict = "warning", None
                        f.code = "startup-overhead"
                job.verdict = verdict_of(job.findings, "good") if job.verdict in ("bad", "suboptimal") else job.verdict
                checks.append(job)
            for c in checks[-2:] if bench.key == "init" else checks[-1:]:
                measurements[c.name] = {
                    "unit": c.unit, "metric": c.metric,
                    "native": {(s.size if s.size is not None else 0): list(_values(sel, "native", c, s.size))
                               for s in c.sizes},
                    "container": {(s.size if s.size is not None else 0): list(_values(sel, "container", c, s.size))
                                  for s in c.sizes},
                }
                rep = _representative(c)
                if rep:
                    summary.append(rep)
    return checks, measurements, summary


def _values(sel: Sequence[Run], side: str, check: CheckResult, size: Optional[int]) -> List[float]:
    from dedal.stages.verify.checks import series_from_nccl, series_from_osu

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
    keep = [ln for ln in lines if ln.strip() and not ln.startswith(("#@", "$ ")) and "|" not in ln
            and "UCX  DIAG" not in ln]
    return keep[-n:]


def _run_findings(runs: Sequence[Run]) -> List[Finding]:
    out: List[Finding] = []
    for r in runs:
        if r.skipped or r.returncode is None or r.ok:
            continue
        what = "did not finish within the time limit" if r.timed_out else f"exited with code {r.returncode}"
        warm = " (warm-up)" if r.rep == 0 else ""
        out.append(F.error("run-failed", f"{r.side} {r.bench.program} ({r.scope}){warm} {what}; log {r.rel}",
                           _tail(r.log) + [f"log: {r.rel}"], verdict="failed"))
    same = [r for r in runs if r.scope == "inter-node" and r.ok and r.parsed
            and len(set(r.parsed.get("hosts") or [])) == 1]
    if same:
        host = same[0].parsed["hosts"][0]  # type: ignore[index]
        out.append(F.warning("inter-node-same-host", f"{len(same)} inter-node run(s) had every rank on one machine "
                             f"({host}): Slurm's nodes share a host here, so these are not inter-node measurements",
                             [f"log: {r.rel}" for r in same[:3]]))
    skipped = [r for r in runs if r.skipped]
    if skipped:
        out.append(F.warning("runs-skipped", f"{len(skipped)} repetition(s) not run after a failure of the same "
                             "benchmark on the same side", [f"{r.rel}: {r.skipped}" for r in skipped[:5]]))
    return out


def _log_findings(runs: Sequence[Run], extra_logs: Sequence[Dict[str, Any]], host: HostFacts) -> List[Finding]:
    """Transport rules and the parsers' own findings over every log, merged per side and
    code: one finding that says in how many runs it was seen and quotes the first."""
    groups: Dict[Tuple[str, str, str], Dict[str, Any]] = {}
    order: List[Tuple[str, str, str]] = []
    totals: Dict[str, int] = {}
    sources: List[Tuple[str, Dict[str, Any]]] = [(p.get("side") or "image", p) for p in extra_logs]
    sources += [(r.side, r.parsed) for r in runs if r.parsed is not None]
    for side, parsed in sources:
        totals[side] = totals.get(side, 0) + 1
        rule = check_transports([parsed], host)
        rule_codes = {f.code for f in rule}
        own = [Finding.from_json(f) for f in parsed.get("findings") or []]
        for f in rule + [f for f in own if f.code not in rule_codes]:
            if f.code in ("truncated",) and not parsed.get("returncode", 0) == 0:
                continue  # a failed run's cut output: run-failed says it already
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
            msg = msg[len(first) + 2:]
        if side in SIDES:
            seen = f" (seen in {len(srcs)} of {totals.get(side, 0)} {side} run log(s), first {first})"
        else:
            seen = f" ({first})"
        out.append(Finding(f.severity, f.code, f"[{side}] {msg}{seen}", list(f.evidence) + [f"log: {first}"],
                           f.verdict))
    return out


def _transports(runs: Sequence[Run]) -> Dict[str, Dict[str, List[str]]]:
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


def _meta(opts: Options, info: img.ImageInfo, native: img.Native, launcher: str, backend: str, nodes: int,
          plan: Plan, started: float, t0: float, transports: Mapping[str, Any], summary: Sequence[Mapping[str, Any]],
          pf: pre.Preflight) -> Dict[str, Any]:
    from dedal import __version__

    env = {**DEBUG_ENV, **opts.env}
    meta: Dict[str, Any] = {
        "image": str(info.path),
        "image_kind": info.kind,
        "image_target": f"{info.target or 'unknown'}" + (f" ({info.target_source})" if info.target_source else ""),
        "image_versions": ", ".join(f"{k} {v}" for k, v in sorted(info.versions.items())) or "not labelled",
        "benchmarks": ", ".join(f"{b.program} ({info.programs[b.program]})" for b in plan.benches),
        "native": native.description,
        "native_mode": native.mode,
        "container": _container_text(backend, launcher),
        "runtime": backend,
        "launcher": launcher,
        "ranks": f"{plan.ranks} per node for init/all-reduce, 2 for latency/bandwidth",
        "nodes": nodes,
        "scopes": ", ".join(s for s, _ in plan.scopes),
        "repetitions": plan.repetitions,
        "order": "interleaved: each repetition runs native and container back to back, alternating which goes "
                 "first; one unmeasured warm-up per side",
        "run_env": " ".join(f"{k}={v}" for k, v in env.items()),
        "user_env": " ".join(f"{k}={v}" for k, v in opts.env.items()) or "none",
        "max_message_size": opts.max_size,
        "host": f"{socket.gethostname()}, {platform.system()} {platform.release()}, {pf.facts.get('cpu_model') or '?'}"
                f", {os.cpu_count()} CPU(s)",
        "host_infiniband": ", ".join(pf.facts.get("infiniband") or []) or "none",
        "host_nvidia_driver": pf.facts.get("nvidia_driver") or "none",
        "started": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - t0, 1),
        "dedal_version": __version__,
        "raw_logs": "raw/<scope>/<program>/<side>-<repetition>.log: the benchmark output and the UCX/Open MPI debug "
                    "output of each run",
    }
    if native.root is not None:
        meta["native_root"] = str(native.root)
    for side in SIDES:
        for scope, tls in (transports.get(side) or {}).items():
            meta[f"transports_{side}_{scope}"] = ", ".join(tls)
    for s in summary:
        ratio = f" (x{s['ratio']:.3f})" if s.get("ratio") is not None else ""
        where = f" at {s['size']} B" if s.get("size") else ""
        meta[f"result {s['check']}"] = (f"native {s['native']:.4g} {s['unit']}, container {s['container']:.4g} "
                                        f"{s['unit']}{ratio}{where}")
    return meta


# ---------------------------------------------------------------------------- CLI


def main(args: argparse.Namespace) -> int:
    opts = options_from_args(args)

    def progress(text: str) -> None:
        err.print(text, markup=False, highlight=False)

    outcome = verify(opts, progress=progress)
    rep = outcome.report
    if args.json:
        data = rep.to_json()
        data["report_dir"] = str(outcome.outdir)
        data["files"] = {k: str(v) for k, v in outcome.paths.items()}
        print_json(data)
        return rep.exit_code
    print(f"verdict: {rep.overall.upper()}  ({rep.image}; exit code {rep.exit_code})")
    if outcome.summary:
        width = max(len(s["check"]) for s in outcome.summary)
        print(f"{'check':<{width}}  {'native':>12}  {'container':>12}  {'ratio':>7}  verdict")
        for s in outcome.summary:
            unit = s["unit"]
            ratio = f"{s['ratio']:.3f}" if s.get("ratio") is not None else "-"
            print(f"{s['check']:<{width}}  {s['native']:>9.4g} {unit:<2}  {s['container']:>9.4g} {unit:<2}  "
                  f"{ratio:>7}  {s['verdict']}")
    for c in rep.checks:
        if not c.passed:
            print(f"check {c.name}: {c.verdict}")
    shown = [f for f in rep.findings if f.severity != "info"] + [f for c in rep.checks for f in c.findings
                                                                  if f.severity != "info"]
    shown.sort(key=lambda f: -verdict_rank(f.implied_verdict))
    for f in shown[:20]:
        print(f"[{f.severity}] {f.code}: {f.message}")
        for ev in f.evidence[:3]:
            print(f"    | {ev}")
    print(f"report: {outcome.paths['report.md']} (verify.json, "
          f"{sum(1 for k in outcome.paths if k.startswith('plot:'))} plot(s)); raw logs: {outcome.outdir / 'raw'}")
    return rep.exit_code
