"""``dedal verify IMAGE``: run the benchmarks natively and in the container, judge, report.

The steps, each a function of its own:

1. **image** (:mod:`dedal.stages.verify.image`): labels, target, CUDA, and where the
   benchmarks are in the image (``dedal_*``, ``osu_*``, ``all_reduce_perf``);
2. **preflight** (:mod:`dedal.stages.verify.preflight`): PMIx in ``srun --mpi=list``,
   ``/dev/infiniband``, GPU driver vs CUDA, CPU vs target; a fatal finding stops here
   (exit 2, one line) before anything runs;
3. **native** (:func:`dedal.stages.verify.native.prepare_native`): what the native side is (the
   host's MPI and programs where it has them, else the image's root filesystem unpacked
   onto local storage and run without a container runtime), written into the report;
4. **runs** (:mod:`dedal.stages.verify.plan`; the benchmarks of
   :mod:`dedal.stages.verify.catalogue`): every benchmark, intra-node (always) and
   inter-node (``srun`` with 2+ nodes), natively and in the container, **interleaved** in
   one allocation: each repetition runs native and container back to back, alternating
   which goes first (N C, C N, N C ...), so that drift of the machine hits both sides
   alike; one unmeasured warm-up per side first. ``mpirun`` locally (the image's own
   ``mpirun``, the launcher and its ranks in one container) or ``srun --mpi=pmix`` (one
   container per rank) through :mod:`dedal.adapters.mpi`. UCX (``UCX_LOG_LEVEL=info
   UCX_PROTO_INFO=y``), Open MPI (``pml_base_verbose``) and NCCL (``NCCL_DEBUG=INFO``)
   debug output is on; each run's output goes to ``raw/<scope>/<program>/<side>-<rep>.log``;
5. **checks** (:mod:`dedal.stages.verify.compare` with :mod:`dedal.stages.verify.checks`): the
   parsed runs compared native vs container per benchmark and scope, the transport rules
   applied to every log with the preflight's host facts; every TCP fallback, failed run
   or failure signature becomes a finding that quotes its log lines. Each side's numbers are
   also held to what their hardware gives (:mod:`dedal.stages.verify.expectations`): device-
   buffer latency against the same host's host-buffer latency and against the CUDA floor
   that ``dedal_cuda_floor`` measures there (built with the image's mpicc where the image
   lacks it), so a stack as slow natively as in the container is reported. A GPU image on a host
   without GPU plans its GPU checks all the same (OSU between device buffers, ``-d cuda D
   D``, and the NCCL all-reduce) and reports each as ``skipped: no GPU``; the verdict names
   them (``good (GPU checks skipped: no GPU)``), never plain "good" for what did not run.
   A check bad on timing alone (:func:`dedal.stages.verify.compare.remeasurable`: every run
   exited 0, every log good) is first measured once more, as many repetitions of both sides
   again, interleaved, and judged on all of them (``--no-remeasure``: at once);
6. **report** (:func:`dedal.stages.verify.report.write_report`): ``verify.json``, ``report.md``
   and plots in ``reports/<image>/``, with the provenance of :mod:`dedal.stages.verify.meta`;
   exit code 0 (good, suboptimal) or 1.

After the runs of step 4, the environment file's application checks (``dedal.verify.apps``,
:mod:`dedal.stages.verify.apps`) run in the container, launched as the benchmarks are; each
is a check of its own in steps 5 and 6 (exit 0 and the expected output: good, else bad).
Those with a ``metric`` are application benchmarks (:mod:`dedal.stages.verify.appbench`): run
natively and in the container, interleaved as the benchmarks are, every run's correctness
checked, the medians of their metric compared (``-b apps``: only the applications run).

Settings come from (later wins): built-in defaults, the image's label
``dedal.verify.thresholds`` (JSON), the environment file's ``dedal.verify`` section
(``--env-file``), the command line (:mod:`dedal.stages.verify.options`).

This module drives the steps: :func:`verify` takes the checked :class:`Options` and returns
the :class:`Outcome` (the report, its files). The command line (its options, printing the
verdict, the exit code) is :mod:`dedal.commands.verify`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from dedal.adapters import mpi, runtime
from dedal.adapters.slurm import Slurm
from dedal.errors import Signals, ToolError, UserError
from dedal.model.artifacts import exclusive
from dedal.stages.verify import appbench, compare
from dedal.stages.verify import findings as F
from dedal.stages.verify import image as img
from dedal.stages.verify import preflight as pre
from dedal.stages.verify.apps import own_test, run_apps, skip_reason as app_skip_reason
from dedal.stages.verify.catalogue import Bench, gpu_planned, needs_driver, select_benchmarks
from dedal.stages.verify.thresholds import Thresholds
from dedal.ui.activity import activity
from dedal.stages.verify.findings import Finding
from dedal.stages.verify.meta import container_text, report_meta
from dedal.stages.verify.native import native_binds, prepare_native
from dedal.stages.verify.options import Options, options_from_args
from dedal.stages.verify.parsers import parse_file
from dedal.stages.verify.plan import MPI_ENV, SIDES, Plan, Run, allocation_nodes, choose_launcher, run_env
from dedal.stages.verify.report import VerifyReport, slug, summary_row, write_report

__all__ = ["Options", "Outcome", "options_from_args", "verify"]


def _say(progress: Optional[Callable[[str], None]], text: str) -> None:
    if progress:
        progress(text)


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
    anything runs when the host cannot run the image meaningfully.

    SIGTERM, SIGINT and SIGHUP (scancel, a CI job's timeout, Ctrl-C) raise Interrupted
    (exit 143, 130 for Ctrl-C) wherever the run is: the running step's launcher gets SIGTERM (``srun``
    then ends its job step, ``mpirun`` its ranks; :func:`dedal.adapters.proc.stop`) and
    the image is unmounted on the way out, so no rank, step or allocation outlives dedal."""
    with Signals("verify"), contextlib.ExitStack() as held:
        return _verify(opts, progress, held)


def _check_shared(outdir: Path, paths: List[Optional[Path]], nodes: int) -> None:
    """Every rank of an srun step reads the rank script (in ``outdir``), the native root and
    the image from where this process sees them: stop with one line when a node does not
    see them, before the previous report is replaced, rather than fail every run."""
    outdir.mkdir(parents=True, exist_ok=True)
    probe = outdir / f".dedal-visible-{os.getpid()}"
    probe.write_text("")
    try:
        missing = mpi.missing_on_nodes([probe] + [p for p in paths if p is not None], nodes)
    finally:
        probe.unlink()
    if missing:
        where = "; ".join(f"{node}: {Path(path).parent if Path(path) == probe else path}" for node, path in missing)
        raise UserError(
            f"srun's ranks would not see what they need ({where}): the report directory (--output), "
            "the cache (DEDAL_CACHE_DIR) and the image must be on storage every node shares"
        )


def _verify(opts: Options, progress: Optional[Callable[[str], None]], held: contextlib.ExitStack) -> Outcome:
    started = time.time()
    t0 = time.monotonic()
    backend, runtime_why = runtime.choose_runtime(opts.runtime)
    _say(progress, f"runtime {backend} ({runtime_why})")
    _say(progress, f"image {opts.image}: looking for the benchmarks")
    info = img.inspect_image(opts.image, runtime_name=opts.runtime, progress=progress)
    launcher = choose_launcher(opts.launcher)
    alloc = allocation_nodes() if launcher == "srun" else None
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
    rows = opts.rule_table()  # dedal's rules with the site's (verify_rules, dedal.verify.rules)

    # preflight
    pf = pre.run_preflight(
        image_target=info.target,
        image_cuda=info.cuda,
        image_arch=info.arch,
        launcher=launcher,
        nodes=nodes,
        want_gpu=opts.gpu,
        srun_mpi_list=(lambda: Slurm().mpi_plugins()),
        allocation_nodes=alloc,
    )
    if pf.facts.get("gpu_benchmarks"):
        driver = runtime.host_driver() if backend != "apptainer" else None
        pf.add(
            pre.check_passthrough(
                backend, [n for _, n in driver.libraries] if driver else [], driver.note if driver else "", use_gpu=True
            ),
            fatal_codes=pre.FATAL,
        )
    pf.add(pre.check_mount(backend, runtime.root_kind(opts.image), runtime.cannot_mount()))
    for f in pf.findings:
        _say(progress, f"preflight [{f.severity}] {f.code}: {f.message}")
    if pf.fatal:
        raise pre.PreflightFailed(pf.fatal_line())
    use_gpu = bool(pf.facts.get("gpu_benchmarks"))
    extra_binds: List[Any] = []
    bundled_note = ""
    wanted_benchmarks = [b for b in opts.benchmarks if b != "apps"]  # "apps": the application checks alone
    wants_bundled = any(k in wanted_benchmarks for k in ("init", "latency", "bw", "allreduce"))
    build = list(img.BUNDLED_MPI) if wants_bundled and not any(p in info.programs for p in img.BUNDLED_MPI) else []
    # on a GPU: the CUDA floor that device-buffer messages are held to, and dedal's benchmarks between
    # device buffers (-d cuda), built where the image's dedal-benchmarks predate them
    gpu_build: List[str] = []
    if use_gpu and "latency" in wanted_benchmarks and img.CUDA_FLOOR not in info.programs:
        gpu_build.append(img.CUDA_FLOOR)
    if use_gpu and not info.dedal_cuda:
        gpu_build += [
            p for p, key in zip(img.DEVICE_MPI, ("latency", "bw")) if key in wanted_benchmarks and p not in build
        ]
    if (build or gpu_build) and "mpicc" in info.programs:
        names = build + gpu_build
        try:
            built = img.compile_bundled(info, opts.cache_dir, runtime_name=opts.runtime, progress=progress, names=names)
        except ToolError as exc:
            if build:
                raise
            built, names = None, []  # the GPU checks that need no build still run (the class bounds judge)
            bundled_note = f"{', '.join(gpu_build)} could not be built with the image's mpicc: {exc}"
        for name in names:  # dedal_latency/dedal_bw built for the GPU runs alone: only those use them
            key = f"{name}-cuda" if name in img.DEVICE_MPI and name not in build else name
            info.programs[key] = f"{img.BUNDLED_DIR}/{name}"
        if built is not None:
            info.dedal_cuda = True
            extra_binds.append(runtime.Bind(built, img.BUNDLED_DIR, readonly=True))
            what = "dedal-benchmarks" if build else "dedal-benchmarks that know GPU buffers"
            bundled_note = (
                f"the image does not carry {what}: dedal verify built {', '.join(names)} with the image's "
                f"own mpicc ({built}) and runs those same binaries natively and in the container"
            )
        _say(progress, bundled_note)
    benches, notes = select_benchmarks(
        wanted_benchmarks, info.programs, gpu=use_gpu, osu_cuda=info.osu_cuda, dedal_cuda=info.dedal_cuda
    )
    # a GPU image on a host without GPU: its GPU checks are reported as skipped, never as passed
    # (what a GPU host would run: the floor and the device-buffer builds too, where the image's mpicc builds them)
    buildable = "mpicc" in info.programs
    planned = {**({img.CUDA_FLOOR: img.BUNDLED_DIR} if buildable else {}), **info.programs}
    skipped = (
        []
        if use_gpu or not info.cuda
        else gpu_planned(wanted_benchmarks, planned, osu_cuda=info.osu_cuda, dedal_cuda=info.dedal_cuda or buildable)
    )
    skip_reason = "GPU checks turned off (--no-gpu)" if opts.gpu is False else "no GPU"
    if not benches and skipped:
        raise UserError(
            f"{opts.image}: only GPU benchmarks were asked for ({', '.join(b.name for b in skipped)}) and "
            f"they cannot run here: {skip_reason}"
        )
    if not benches and wanted_benchmarks:
        have = ", ".join(p for p in info.programs if p.startswith(("dedal_", "osu_", "all_reduce"))) or "none"
        raise UserError(
            f"{opts.image}: none of the requested benchmarks ({', '.join(opts.benchmarks)}) is in the "
            f"image (found: {have}); build the environment with the dedal-benchmarks package"
        )
    if "mpirun" not in info.programs and launcher == "mpirun":
        if info.mpirun_stub:
            raise UserError(
                f"{opts.image}: the image's mpirun ({info.mpirun_stub}) is Spack's stub for openmpi "
                "schedulers=slurm ~legacylaunchers, which only says to use srun: verify inside a Slurm "
                "allocation (--launcher srun)"
            )
        raise UserError(
            f"{opts.image}: the image has no mpirun on its PATH, so it cannot be verified with the "
            "mpirun launcher (use --launcher srun under Slurm)"
        )

    outdir = Path(opts.output) if opts.output else opts.reports_dir / slug(info.name)
    if outdir.exists() and not outdir.is_dir():
        raise UserError(f"{outdir}: exists and is not a directory")
    # one verification at a time writes a report directory: two (build-image started twice) each
    # overwrote the other's raw logs, and both reports said "failed: output truncated"
    held.enter_context(exclusive(outdir, f"the report {outdir}", lambda text: _say(progress, text)))

    # native
    wanted = list(dict.fromkeys(b.program for b in benches))
    host_programs = {p: mpi.host_which(p) for p in wanted}
    host_mpi = mpi.host_mpirun() if launcher == "mpirun" and all(host_programs.values()) else None
    native = prepare_native(
        info,
        mode=opts.native,
        wanted=wanted,
        cache=opts.cache_dir / "verify-native",
        native_root=opts.native_root,
        host_programs=host_programs,
        host_mpi=host_mpi,
        launcher=launcher,
        progress=progress,
    )
    _say(progress, f"native: {native.description}")

    scopes = [("intra-node", 1)] + ([("inter-node", 2)] if launcher == "srun" and nodes >= 2 else [])
    # the application benchmarks, and the nodes the runs span (an application may run on more than 2)
    app_benches = [a for a in opts.apps if a.metric is not None]
    no_gpu = "" if use_gpu else skip_reason
    span = max([scopes[-1][1]] + [a.nodes for a in opts.apps if not app_skip_reason(a, launcher, nodes, no_gpu)])
    if launcher == "srun":
        _check_shared(outdir, [native.root, info.path], span)
    references: Dict[str, Optional[bytes]] = {}
    wanted_refs = sorted({a.reference.expected for a in app_benches if a.reference is not None})
    if wanted_refs:
        references = img.read_image_files(opts.image, wanted_refs)
    rawdir = outdir / "raw"
    _clean_previous(outdir)
    rawdir.mkdir(parents=True, exist_ok=True)
    # each application benchmark run writes in a directory of its own under raw/apps, at the same path on
    # both sides: bound into the native sandbox and the container (an Apptainer instance gets it at its start)
    app_binds: List[runtime.Bind] = []
    if app_benches:
        appdir = appbench.apps_dir(outdir)
        appdir.mkdir(parents=True, exist_ok=True)
        app_binds.append(runtime.Bind(appdir, str(appdir)))

    logs: List[Dict[str, Any]] = [{**p, "side": "host"} for p in pf.logs]
    if "ucx_info" in info.programs:
        ucx_log = rawdir / "container-ucx_info-d.txt"
        runtime.run_in(
            opts.image,
            ["ucx_info", "-d"],
            log=ucx_log,
            what="ucx_info -d",
            runtime=opts.runtime,
            check=False,
            timeout=120,
        )
        parsed = parse_file(ucx_log, "ucx-info", host=pf.host, rows=rows)
        parsed["source"] = str(ucx_log.relative_to(outdir))
        parsed["side"] = "image"
        logs.append(parsed)

    plan = Plan(launcher, scopes, benches, opts.repetitions, opts.ranks, pf.host.gpus)
    order = plan.order()
    # The image stays mounted for all container runs (bwrap, ch-run: one mount dedal makes; Apptainer:
    # one instance per node that every run joins, under srun in an allocation, or on this machine): the runs after the
    # warm-up measure the container's steady state, as the native side's do, not a cold mount each
    # (each mount decompresses the MPI stack again; benchmarks/multinode/startup.md). The
    # whole-job wall time still shows start-up.
    mounts = contextlib.ExitStack()
    container_root: Any = opts.image
    image_mount: Optional[Tuple[str, str, int]] = None  # for ranks on nodes that lack this mount
    if backend != "apptainer" and runtime.root_kind(opts.image) in ("sif", "squashfs"):
        source = runtime.mount_source(opts.image)
        container_root = mounts.enter_context(runtime.mounted(opts.image))
        if source is not None:
            image_mount = (str(container_root), str(source[0]), source[1])
    elif backend == "apptainer":  # srun: one instance per node; mpirun: launcher and ranks in one here
        kept = dict(
            log=rawdir / "instances.log",
            binds=extra_binds + app_binds,
            nv=any(needs_driver(b, info.osu_cuda) for b in benches),
        )
        instance = mounts.enter_context(
            mpi.node_instances(Path(opts.image), span, **kept)
            if launcher == "srun"
            else mpi.local_instance(Path(opts.image), **kept)
        )
        if instance is not None:
            container_root = instance
    # both sides run on the nodes that have the instance (a native step elsewhere would compare
    # two different nodes); without one, where Slurm puts each step
    pinned = container_root.nodes if isinstance(container_root, runtime.Instance) else ()
    runs: List[Run] = []
    failed_series: Dict[Tuple[str, str, str], Run] = {}

    def run_one(i: int, total: int, scope: str, bench: Bench, rep: int, side: str, of: int) -> None:
        """Run ``rep`` (of ``of``; 0: the warm-up) of ``bench`` on ``side``, the ``i``-th run of ``total``."""
        nnodes = dict(scopes)[scope]
        ranks = plan.ranks_for(bench, nnodes)
        name = "warmup" if rep == 0 else f"{rep:02d}"
        rel = f"raw/{scope}/{bench.name}/{side}-{name}.log"
        run = Run(side, scope, bench, rep, ranks, nnodes, outdir / rel, rel)
        runs.append(run)
        key = (scope, bench.name, side)
        if key in failed_series:
            run.skipped = f"not repeated: {failed_series[key].rel} failed"
            return
        key = bench.name if bench.name in info.programs else bench.program  # a device-buffer build of its own
        program = native.programs.get(key) if side == "native" else info.programs[key]
        argv = [program or bench.program, *bench.args(opts.max_size, opts.nccl_max_size)]
        env = run_env(opts, bench)
        root = native.root if side == "native" else container_root
        binds = (native_binds() if side == "native" and native.root is not None else []) + extra_binds
        # the native side never goes through a container runtime: a plain bubblewrap chroot (a GPU run
        # gets the host's driver there too, as a program of the host finds it; the host itself needs none)
        rt = "bwrap" if side == "native" else opts.runtime
        note = [
            f"dedal verify: {side} {'warm-up' if rep == 0 else f'repetition {rep} of {of}'} of "
            f"{bench.name} ({scope}, {ranks} rank(s) on {nnodes} node(s), launcher {launcher})",
            f"{side}: " + (native.description if side == "native" else container_text(backend, launcher)),
        ]
        # a run of seconds (a bandwidth sweep, ranks waiting for slow nodes) is not silent on a terminal
        with activity(
            f"[{i}/{total}] {side} {bench.name} {scope} {'warm-up' if rep == 0 else f'rep {rep}/{of}'}",
            log=run.log,
            after=3,
            announce=False,
        ):
            res = mpi.run_ranks(
                launcher,
                root,
                argv,
                ranks,
                nodes=nnodes,
                env=env,
                log=run.log,
                script_dir=rawdir / ".launch",
                timeout=opts.timeout,
                runtime_name=rt,
                binds=binds,
                nv=needs_driver(bench, info.osu_cuda),
                note=note,
                image_mount=image_mount if side == "container" else None,
                nodelist=pinned,
            )
        run.returncode, run.seconds, run.timed_out = res.returncode, res.seconds, res.timed_out
        # judged once, against the host's facts and in the run's scope, with the site's rules
        run.parsed = parse_file(run.log, bench.parser, host=pf.host, scope=scope, rows=rows)
        run.parsed.update(
            {
                "source": rel,
                "side": side,
                "scope": scope,
                "program": bench.program,
                "benchmark": bench.name,
                "repetition": rep,
                "returncode": run.returncode,
                "seconds": round(run.seconds, 3),
            }
        )
        if not run.ok and rep > 0:
            failed_series[key] = run
        state = "ok" if run.ok else ("TIMED OUT" if run.timed_out else f"FAILED (exit {run.returncode})")
        _say(
            progress,
            f"[{i}/{total}] {side:9s} {bench.name} {scope} "
            f"{'warm-up' if rep == 0 else f'rep {rep}/{of}'}: {run.seconds:.1f} s {state}"
            f" ({run.parsed['verdict']})",
        )

    remeasured: List[str] = []
    try:
        for i, (scope, bench, rep, side) in enumerate(order, 1):
            run_one(i, len(order), scope, bench, rep, side, opts.repetitions)
        # bad on timing alone (no failed run, every log good): measured once more, as many
        # repetitions again, interleaved as before; the check then rests on all of them
        judged = compare.compare_runs(runs, plan, thresholds)
        again = compare.remeasurable(judged[0], runs, plan) if opts.remeasure else []
        if again:
            remeasured = [f"{bench.name} {scope}" for scope, bench in again]
            _say(
                progress,
                f"{', '.join(remeasured)}: over a threshold on timing alone; "
                f"{opts.repetitions} more repetitions of each side",
            )
            more = plan.again(again, opts.repetitions + 1)
            for i, (scope, bench, rep, side) in enumerate(more, 1):
                run_one(i, len(more), scope, bench, rep, side, 2 * opts.repetitions)
            judged = compare.compare_runs(runs, plan, thresholds)

        app_checks = run_apps(
            # the image's own test first: what `apptainer test IMAGE` tells a site is verified here too
            ([own_test(info.labels)] if info.own_test else []) + list(opts.apps),
            root=container_root,
            launcher=launcher,
            nodes=nodes,
            outdir=outdir,
            runtime_name=opts.runtime,
            env={**MPI_ENV, **opts.env},
            binds=extra_binds,
            image_mount=image_mount,
            no_gpu=no_gpu,
            progress=progress,
        )
        # native as the benchmarks' native side (the image's root unpacked, or the host's programs)
        sides = {
            "native": appbench.Side(
                native.root,
                "bwrap",
                (native_binds() if native.root is not None else []) + extra_binds + app_binds,
                nodelist=pinned,
            ),
            "container": appbench.Side(container_root, opts.runtime, extra_binds + app_binds, image_mount, pinned),
        }
        bench_checks, bench_measurements, bench_again = appbench.run_benchmarks(
            app_benches,
            sides,
            launcher=launcher,
            nodes=nodes,
            outdir=outdir,
            env={**MPI_ENV, **opts.env},
            repetitions=opts.repetitions,
            references=references,
            noise_sigmas=thresholds.noise_sigmas,
            remeasure=opts.remeasure,
            no_gpu=no_gpu,
            gpu_versions=pre.gpu_versions(pf.facts),
            progress=progress,
        )
    finally:
        mounts.close()
    checks, measurements, summary = judged
    checks += compare.skipped_checks(skipped, scopes, skip_reason)
    checks += app_checks + bench_checks
    measurements.update(bench_measurements)
    summary += [row for row in (summary_row(c) for c in bench_checks) if row]
    if skipped:
        _say(progress, f"{len(skipped) * len(scopes)} GPU check(s) skipped: {skip_reason}")
    findings: List[Finding] = list(pf.findings)
    findings += [F.info("not-run", n) for n in notes]
    if bundled_note:
        findings.append(F.info("bundled-benchmarks", bundled_note))
    if remeasured:
        findings.append(
            F.info(
                "remeasured",
                f"{', '.join(remeasured)}: over a threshold after {opts.repetitions} "
                f"repetitions on timing alone (every run exited 0, every log good); "
                f"{opts.repetitions} more were run, and the check rests on all "
                f"{2 * opts.repetitions}",
            )
        )
    findings += compare.run_findings(runs)
    findings += compare.log_findings(runs, logs, pf.host, rows)
    findings += compare.expectation_findings(runs, plan)
    transports = compare.transports(runs)
    for side in SIDES:
        for scope, tls in transports.get(side, {}).items():
            findings.append(F.info("ucx-transports", f"{side}, {scope}: UCX moved messages over {', '.join(tls)}"))
    logs += [r.parsed for r in runs if r.parsed is not None]

    meta = report_meta(opts, info, native, launcher, backend, nodes, plan, started, t0, transports, summary, pf)
    meta["runtime_choice"] = runtime_why
    shared = compare.containers(runs)["mode"]  # measured from inside the ranks, not assumed
    meta["runtime"] = f"{backend} ({shared})" if shared else backend
    if isinstance(container_root, runtime.Instance):
        meta["container"] += (
            f"; every container run joined one Apptainer instance per node ({container_root.name})"
            if launcher == "srun"
            else f"; every container run joined one Apptainer instance on this machine "
            f"({container_root.name}; the host's /tmp, where mpirun makes its session directory)"
        )
    meta["remeasured"] = remeasured + bench_again  # an application benchmark's own note is in its check
    if app_benches:
        meta["app_benchmarks"] = "; ".join(
            f"{a.name} ({a.ranks} rank(s) on {a.nodes} node(s), "
            f"{(a.metric.repetitions if a.metric else None) or opts.repetitions} repetition(s) per side)"
            for a in app_benches
        ) + (
            ": native and container interleaved after one warm-up per side, each run in its own working directory; "
            "raw/apps/<name>/<side>-<repetition>.log"
        )
    report = VerifyReport(
        image=info.name,
        checks=checks,
        findings=findings,
        logs=logs,
        measurements=measurements,
        host=pf.host,
        thresholds=thresholds,
        meta=meta,
    )
    paths = write_report(report, outdir)
    return Outcome(report, paths, outdir, runs, summary)


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
