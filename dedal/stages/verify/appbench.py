"""Application benchmarks: an app of ``dedal.verify.apps`` with a ``metric``, native against
container.

The microbenchmarks can pass while an application suffers (its own libraries, its I/O, its
start-up over many ranks), so the environment file can declare the number an application
prints (its time to solution: ``metric.match``, a regular expression whose group ``value``
captures it) and have it measured as the microbenchmarks are: natively (the image's root
unpacked, or the host's own programs where the verification's native side is the host) and in
the container, **interleaved** (:func:`dedal.stages.verify.plan.interleaved`: one unmeasured
warm-up per side, then each repetition native and container back to back, alternating which
goes first), ``metric.repetitions`` runs per side (else the verification's). The medians are
compared by :func:`dedal.stages.verify.checks.compare_app`, the engine of every other check (noise
from the spread of the repetitions), against ``metric.overhead_pct`` (10 % unless declared).

A fast wrong answer is no result, so **every run's correctness** is checked, the warm-ups'
too: exit 0 within the app's timeout, ``expect`` found in its output, the metric found and a
number; a group ``value`` in ``expect`` must capture the same text in every run of both sides
(Arbor's spike count); a ``reference`` file that the run writes in its working directory must
hold the lines of a file in the image, in any order (NEURON ringtest's spike raster, written by
the ranks in whatever order they finish, against its reference raster). Any incorrect run makes
the check bad, whatever the timing.

Each run has a working directory of its own, empty at its start, at the same path on both
sides (``raw/apps/<name>/<side>-NN/``, the verification's ``raw/apps`` bound into the container
and the native sandbox) and its log next to it (``<side>-NN.log``; ``-warmup`` for the warm-ups).
A check bad on timing alone (every run correct) is measured once more, as many repetitions
again, and judged on all of them, as the microbenchmarks are (``--no-remeasure``: at once).
"""

from __future__ import annotations

import re
import shutil
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from dedal.adapters import mpi, runtime
from dedal.model.envfile import AppCheck
from dedal.stages.verify import findings as F
from dedal.stages.verify.apps import check_name, line_of, program_output, skip_reason
from dedal.stages.verify.checks import CheckResult, compare_app, deciding_size, skipped_check
from dedal.stages.verify.findings import Finding, verdict_of
from dedal.stages.verify.plan import SIDES, interleaved
from dedal.ui.activity import activity

METRIC = "app"
Progress = Optional[Callable[[str], None]]


@dataclass
class Side:
    """How one side runs: its root (None: the host itself), runtime, binds, and for the
    container under srun the image mount that ranks on other nodes make themselves; under
    srun the nodes both sides' steps run on (those of the container's instances)."""

    root: runtime.RootArg
    runtime_name: str
    binds: List[runtime.Bind] = field(default_factory=list)
    image_mount: Optional[Tuple[str, str, int]] = None
    nodelist: Tuple[str, ...] = ()


@dataclass
class AppRun:
    """One run of an application benchmark and what its output says: ``value`` (the metric),
    ``expected`` (the text of expect's group ``value``), ``problems`` (why it is not correct;
    empty: it is)."""

    side: str
    rep: int  # 0: the warm-up
    rel: str  # its log, relative to the report directory
    workdir: str  # its working directory, likewise
    returncode: Optional[int] = None
    seconds: float = 0.0
    timed_out: bool = False
    value: Optional[float] = None
    expected: Optional[str] = None
    problems: List[str] = field(default_factory=list)
    tail: List[str] = field(default_factory=list)  # the last lines of its output (for a failure's evidence)

    @property
    def name(self) -> str:
        return f"{self.side}-{'warmup' if self.rep == 0 else f'{self.rep:02d}'}"

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.problems

    def to_json(self) -> Dict[str, Any]:
        return {
            "side": self.side,
            "repetition": self.rep,
            "log": self.rel,
            "workdir": self.workdir,
            "returncode": self.returncode,
            "seconds": round(self.seconds, 3),
            "timed_out": self.timed_out,
            "value": self.value,
            "expected": self.expected,
            "correct": self.ok,
            "problems": list(self.problems),
        }


# ---------------------------------------------------------------------------- one run's output


def sorted_lines(text: str) -> List[str]:
    """The lines of ``text`` without trailing blanks and empty lines, sorted: the form in which
    a reference file and a run's output are compared (ranks write in any order)."""
    return sorted(ln.rstrip() for ln in text.splitlines() if ln.strip())


def reference_problem(output_name: str, produced: Optional[str], expected_path: str, expected: str) -> str:
    """Why a run's ``produced`` file (None: not written) does not hold the reference's lines
    ("" when it does, in any order)."""
    if produced is None:
        return f"wrote no {output_name}"
    got, want = Counter(sorted_lines(produced)), Counter(sorted_lines(expected))
    if got == want:
        return ""
    extra, missing = sorted((got - want).elements()), sorted((want - got).elements())
    parts = []
    if extra:
        parts.append(f"{len(extra)} line(s) not in the reference (first {extra[0]!r})")
    if missing:
        parts.append(f"{len(missing)} line(s) of the reference missing (first {missing[0]!r})")
    return f"{output_name} differs from {expected_path} after sorting lines: {', '.join(parts)}"


def judge_run(
    app: AppCheck, run: AppRun, log_text: str, produced: Optional[str] = None, reference: Optional[str] = None
) -> None:
    """Fill ``run``'s value, expected text and problems from its log (``log_text``), and the
    file it wrote (``produced``, None: none) against the ``reference`` text (None: the app has
    no reference)."""
    assert app.metric is not None
    output = program_output(app, log_text)
    run.tail = [ln for ln in output.splitlines() if ln.strip()][-6:]
    run.problems = []
    if run.timed_out:
        run.problems.append(f"did not finish within {app.timeout:g} s")
        return
    if run.returncode != 0:
        run.problems.append(f"exited with code {run.returncode}")
        return
    if app.expect:
        found = re.search(app.expect, output, re.MULTILINE)
        if found is None:
            run.problems.append(f"its output lacks /{app.expect}/")
        elif "value" in found.re.groupindex:
            run.expected = found.group("value")
    metric = re.search(app.metric.match, output, re.MULTILINE)
    if metric is None:
        run.problems.append(f"its output lacks the metric /{app.metric.match}/")
    else:
        try:
            run.value = float(metric.group("value"))
        except (TypeError, ValueError):
            run.problems.append(
                f"the metric's value {metric.group('value')!r} is not a number (line: {line_of(output, metric)})"
            )
    if app.reference is not None and reference is not None:
        problem = reference_problem(app.reference.output, produced, app.reference.expected, reference)
        if problem:
            run.problems.append(problem)


# ---------------------------------------------------------------------------- the check


def judge_benchmark(app: AppCheck, runs: Sequence[AppRun], *, noise_sigmas: float = 3.0) -> CheckResult:
    """The check of an application benchmark from its runs (warm-ups included for correctness,
    left out of the numbers): every run correct, expect's value the same in every run of both
    sides, and the container's median metric within ``overhead_pct`` of native's."""
    assert app.metric is not None
    name, unit = check_name(app), app.metric.unit
    findings: List[Finding] = []
    crashed = [r for r in runs if r.returncode != 0 or r.timed_out]
    wrong = [r for r in runs if r.problems and r not in crashed]
    for group, code, what in ((crashed, "app-run-failed", "failed"), (wrong, "app-output-wrong", "incorrect")):
        if not group:
            continue
        first = group[0]
        by_problem: Dict[str, List[str]] = {}  # the same problem in every run is said once, with the runs
        for r in group:
            by_problem.setdefault(r.problems[0], []).append(r.name)
        shown = "; ".join(
            f"{problem} ({', '.join(names[:4])}{' ...' if len(names) > 4 else ''})"
            for problem, names in list(by_problem.items())[:2]
        ) + (" ..." if len(by_problem) > 2 else "")
        findings.append(
            F.error(
                code,
                f"{name}: {len(group)} of {len(runs)} run(s) {what}: {shown}; log {first.rel}",
                first.tail[-3:]
                + [f"{r.name}: {p}" for r in group[:2] for p in r.problems[1:2]]
                + [f"log: {first.rel}"],
            )
        )
    texts = {side: Counter(r.expected for r in runs if r.side == side and r.expected is not None) for side in SIDES}
    if len(set(texts["native"]) | set(texts["container"])) > 1:
        said = "; ".join(
            f"{side} " + ", ".join(f"{v!r} in {n} run(s)" for v, n in texts[side].most_common())
            for side in SIDES
            if texts[side]
        )
        findings.append(
            F.error(
                "app-value-differs",
                f"{name}: expect's value is not the same in every run ({said}): "
                "native and container must compute the same result",
                [f"expect: /{app.expect}/"],
            )
        )
    nat = [r.value for r in runs if r.side == "native" and r.rep > 0 and r.ok and r.value is not None]
    con = [r.value for r in runs if r.side == "container" and r.rep > 0 and r.ok and r.value is not None]
    if not nat or not con:
        missing = " and ".join(s for s, v in (("native", nat), ("container", con)) if not v)
        findings.append(F.error("no-measurement", f"{name}: no correct {missing} repetition, nothing to compare"))
        return CheckResult(
            name, METRIC, unit, verdict_of(findings, "bad"), findings, higher_is_better=app.metric.higher_is_better
        )
    cmp = compare_app(
        nat,
        con,
        name=name,
        unit=unit,
        higher_is_better=app.metric.higher_is_better,
        overhead_pct=app.metric.overhead_pct,
        noise_sigmas=noise_sigmas,
    )
    findings += cmp.findings
    findings.append(F.info("app-benchmark", summary_text(app, cmp, runs), [f"log: {r.rel}" for r in runs[:1]]))
    cmp.findings = findings
    cmp.verdict = verdict_of(findings, "good")
    return cmp


def ratio(check: CheckResult) -> Optional[float]:
    """Container / native of the medians (None: nothing compared, or a native median of 0)."""
    s = deciding_size(check)
    return s.container.median / s.native.median if s is not None and s.native.median else None


def summary_text(app: AppCheck, check: CheckResult, runs: Sequence[AppRun]) -> str:
    """The check in one line: the ratio, the medians, what was held to what, and the correctness."""
    assert app.metric is not None
    s = check.sizes[0]
    r = ratio(check)
    reps = f"{s.native.n} native and {s.container.n} container repetition(s)"
    way = "higher" if app.metric.higher_is_better else "lower"
    correct = sum(1 for x in runs if x.ok)
    what = ["exit 0"] + ([f"/{app.expect}/ found"] if app.expect else [])
    values = sorted({x.expected for x in runs if x.expected is not None})
    if len(values) == 1:
        what.append(f"expect's value {values[0]} on both sides")
    if app.reference is not None:
        what.append(f"{app.reference.output} equal to {app.reference.expected} after sorting lines")
    return (
        (
            f"{check.name}: container/native {r:.3f} ({s.container.median:.4g} against {s.native.median:.4g} "
            f"{app.metric.unit}, medians of {reps}; {way} is better; limit {app.metric.overhead_pct:g} %); "
            f"{correct} of {len(runs)} run(s) correct ({', '.join(what)})"
        )
        if r is not None
        else (f"{check.name}: native median 0 {app.metric.unit}: no ratio; {correct} of {len(runs)} run(s) correct")
    )


def measurement(app: AppCheck, runs: Sequence[AppRun]) -> Dict[str, Any]:
    """The check's entry in verify.json's ``measurements``: the values of the measured correct
    runs per side (one "size", 0, as MPI init's), container / native of their medians, and
    every run with its log and correctness."""
    assert app.metric is not None
    vals = {
        side: [r.value for r in runs if r.side == side and r.rep > 0 and r.ok and r.value is not None] for side in SIDES
    }
    nat, con = (statistics.median(vals[s]) if vals[s] else None for s in SIDES)
    return {
        "unit": app.metric.unit,
        "metric": METRIC,
        "better": app.metric.better,
        "overhead_pct": app.metric.overhead_pct,
        "native": {0: vals["native"]},
        "container": {0: vals["container"]},
        "ratio": round(con / nat, 6) if nat and con is not None else None,
        "runs": [r.to_json() for r in runs],
    }


def remeasurable(check: CheckResult, runs: Sequence[AppRun]) -> bool:
    """Bad on timing alone: its only errors are the exceeded threshold, and every run was correct."""
    errors = [f for f in check.findings if f.severity == "error"]
    return (
        check.verdict == "bad"
        and bool(errors)
        and all(f.code == f"{METRIC}-overhead" for f in errors)
        and all(r.ok for r in runs)
    )


# ---------------------------------------------------------------------------- the runs


def apps_dir(outdir: Path) -> Path:
    """Where the application benchmarks' logs and working directories are (``raw/apps``); the
    runner binds it into both sides at the same path before any container starts."""
    return (Path(outdir) / "raw" / "apps").resolve()


def order(app: AppCheck, first: int, count: int, warmup: bool) -> List[Tuple[int, str]]:
    """(repetition, side) in run order: one warm-up per side first (``warmup``), then ``count``
    repetitions from ``first`` on, interleaved (:func:`~dedal.stages.verify.plan.interleaved`)."""
    return ([(0, side) for side in SIDES] if warmup else []) + [
        (rep, side) for _a, rep, side in interleaved([app], first, count)
    ]


def run_one(
    app: AppCheck,
    rep: int,
    side: str,
    how: Side,
    *,
    launcher: str,
    outdir: Path,
    env: Mapping[str, str],
    reference: Optional[str],
    label: str,
    of: int,
) -> AppRun:
    """One run of ``app`` on ``side`` in a fresh working directory, judged (:func:`judge_run`)."""
    base = apps_dir(outdir) / app.name
    name = f"{side}-{'warmup' if rep == 0 else f'{rep:02d}'}"
    workdir, log = base / name, base / f"{name}.log"
    rel = str(log.relative_to(Path(outdir).resolve()))
    run = AppRun(side, rep, rel, str(workdir.relative_to(Path(outdir).resolve())))
    shutil.rmtree(workdir, ignore_errors=True)  # empty at its start: nothing a run finds there is another's
    workdir.mkdir(parents=True)
    log.unlink(missing_ok=True)
    note = [
        f"dedal verify: {side} {'warm-up' if rep == 0 else f'repetition {rep} of {of}'} of application benchmark "
        f"{app.name} ({app.ranks} rank(s) on {app.nodes} node(s), launcher {launcher})",
        f"working directory: {workdir}",
    ]
    with activity(label, log=log, after=3, announce=False):
        res = mpi.run_ranks(
            launcher,
            how.root,
            app.command,
            app.ranks,
            nodes=app.nodes,
            env={**env, **app.env},
            log=log,
            script_dir=Path(outdir) / "raw" / ".launch",
            timeout=app.timeout,
            runtime_name=how.runtime_name,
            binds=how.binds,
            note=note,
            image_mount=how.image_mount,
            cwd=workdir,
            nodelist=how.nodelist,
        )
    run.returncode, run.seconds, run.timed_out = res.returncode, res.seconds, res.timed_out
    produced = None
    if app.reference is not None:
        out = workdir / app.reference.output
        produced = out.read_text(errors="replace") if out.is_file() else None
    judge_run(app, run, log.read_text(errors="replace") if log.exists() else "", produced, reference)
    return run


def run_benchmarks(
    apps: Sequence[AppCheck],
    sides: Mapping[str, Side],
    *,
    launcher: str,
    nodes: int,
    outdir: Path,
    env: Mapping[str, str],
    repetitions: int,
    references: Mapping[str, Optional[bytes]],
    noise_sigmas: float = 3.0,
    remeasure: bool = True,
    no_gpu: str = "",
    gpu_versions: str = "",
    progress: Progress = None,
) -> Tuple[List[CheckResult], Dict[str, Any], List[str]]:
    """Run and judge every application benchmark of ``apps`` (those with a metric): the checks,
    their measurements (verify.json) and the names of those measured once more. ``no_gpu``: why
    GPU applications cannot run here ("" when they can); ``gpu_versions``: the host driver's and
    the image's CUDA versions, written next to a GPU application's ratio (a container/native gap
    on the GPU is first a question of those two). ``sides``: how
    native and container run; ``references``: the image's reference files by path (None: the
    image lacks it: the check is bad without a run)."""
    checks: List[CheckResult] = []
    measurements: Dict[str, Any] = {}
    remeasured: List[str] = []
    for app in apps:
        if app.metric is None:
            continue
        name, unit = check_name(app), app.metric.unit
        reason = skip_reason(app, launcher, nodes, no_gpu)
        if reason:
            checks.append(skipped_check(name, METRIC, unit, reason, gpu=app.gpu))
            continue
        reference: Optional[str] = None
        if app.reference is not None:
            data = references.get(app.reference.expected)
            if data is None:
                checks.append(
                    CheckResult(
                        name,
                        METRIC,
                        unit,
                        "bad",
                        [
                            F.error(
                                "app-reference-missing",
                                f"{name}: the image has no {app.reference.expected} (reference.expected): "
                                "its runs could not be checked, so none was run",
                            )
                        ],
                    )
                )
                continue
            reference = data.decode(errors="replace")
        count = app.metric.repetitions or repetitions
        runs: List[AppRun] = []
        left_out: List[str] = []

        def series(first: int, of: int, warmup: bool) -> None:
            planned = order(app, first, count, warmup)
            for i, (rep, side) in enumerate(planned, 1):
                when = "warm-up" if rep == 0 else f"rep {rep}/{of}"
                failed = next((r for r in runs if r.side == side and (r.returncode != 0 or r.timed_out)), None)
                if failed is not None:  # a side that crashed once is not run again (each run may take its timeout)
                    left_out.append(f"{side}-{rep:02d}: not run, {failed.name} failed")
                    continue
                run = run_one(
                    app,
                    rep,
                    side,
                    sides[side],
                    launcher=launcher,
                    outdir=outdir,
                    env=env,
                    reference=reference,
                    label=f"[{i}/{len(planned)}] {side} app {app.name} {when}",
                    of=of,
                )
                runs.append(run)
                if progress:
                    value = f"{run.value:g} {unit}" if run.value is not None else "no value"
                    state = "ok" if run.ok else f"WRONG: {run.problems[0]}"
                    progress(
                        f"[{i}/{len(planned)}] {side:9s} app {app.name} {when}: {run.seconds:.1f} s, {value}, {state}"
                    )

        series(1, count, True)
        check = judge_benchmark(app, runs, noise_sigmas=noise_sigmas)
        if remeasure and remeasurable(check, runs):
            if progress:
                progress(f"app {app.name}: over its threshold on timing alone; {count} more repetition(s) of each side")
            series(count + 1, 2 * count, False)
            check = judge_benchmark(app, runs, noise_sigmas=noise_sigmas)
            check.findings.append(
                F.info(
                    "remeasured",
                    f"{name}: over its threshold after {count} repetitions on "
                    f"timing alone (every run correct); {count} more were run, and the check "
                    f"rests on all {2 * count}",
                )
            )
            remeasured.append(name)
        if left_out:
            check.findings.append(
                F.warning(
                    "runs-skipped",
                    f"{name}: {len(left_out)} run(s) not run after a failed run of the same side",
                    left_out,
                )
            )
        if app.gpu and gpu_versions:
            check.findings.append(F.info("app-gpu", f"{name}: on the GPU, {gpu_versions}"))
        checks.append(check)
        measurements[name] = measurement(app, runs)
        if progress:
            r = ratio(check)
            progress(
                f"app {app.name}: container/native {r:.3f} {check.verdict}"
                if r is not None
                else f"app {app.name}: {check.verdict}"
            )
    return checks, measurements, remeasured
