"""Checks: native vs container measurements against thresholds (the transport rules over
the runtime's logs are in :mod:`dedal.stages.verify.transports`).

Everything here is a pure function over data: measurement series and parsed logs in,
:class:`~dedal.stages.verify.findings.Finding` records and verdicts out. The runner measures,
this module judges.

**Series.** A measurement series maps a message size in bytes to the values of the
repetitions at that size: ``{1: [0.21, 0.22, 0.21, 0.25, 0.21], 2: [...], ...}``.
Units are those of the benchmark: latency in us, OSU bandwidth in MB/s, NCCL bus
bandwidth in GB/s, MPI init in ms.

**Why medians.** Each repetition of an OSU or nccl-tests run is already a mean over
thousands of iterations, so what varies between repetitions is interference (another
job on the network, a daemon waking up, a cold page cache). Interference only ever
makes a repetition slower, so the spread is one-sided with occasional outliers. The
median of the repetitions ignores such an outlier on either side, where the mean would
follow it. The minimum ("best achievable") is a single extreme sample: comparing the
minima would let a container that is slower in four repetitions out of five pass on
one lucky run. So the checks compare median against median, and the report shows min
and max next to them, so that a reader sees the spread.

**Noise.** Whether an exceeded threshold is run-to-run noise is decided from the
repetitions themselves. The spread of each side is its interquartile range scaled to a
standard deviation (IQR / 1.349: robust to the one slow repetition interference makes);
the two combine as sqrt(s_native^2 + s_container^2). A difference whose excess over the
limit is at most ``noise_sigmas`` (3) such deviations, and whose ranges of repetitions
overlap, is noise: a ``warning`` (suboptimal: rerun with more repetitions). A difference
far beyond the spread (+229 % at 256 KiB with repetitions within a few %) is an ``error``
even when one outlying repetition makes the ranges touch. With fewer than 3
repetitions there is no spread to judge, and an exceeded threshold is an error.

**Thresholds** (defaults from the published measurements, see ``shared/notes/papers.md``):
small-message latency overhead 0.5 us (the container stayed within 0.5 us for
1-128 KiB messages), bandwidth and NCCL bus bandwidth within 2 % (all_reduce within
0.01-1.29 %), MPI init overhead within 15 % (6-14 % at up to 229,376 ranks); they are
:class:`~dedal.stages.verify.thresholds.Thresholds`.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from dedal.model import verify_report
from dedal.model.verify_report import SKIPPED, exit_code, skipped_text  # noqa: F401 (re-exported)
from dedal.stages.verify import findings as F
from dedal.stages.verify.findings import Finding, verdict_of, verdict_with, worst
from dedal.stages.verify.thresholds import Thresholds

Series = Mapping[int, Sequence[float]]


@dataclass
class Stats:
    """Summary of the repetitions at one size."""

    n: int
    min: float
    median: float
    max: float
    mean: float
    cv_pct: Optional[float]  # coefficient of variation (stdev / mean), in %

    @classmethod
    def of(cls, values: Sequence[float]) -> "Stats":
        vals = [float(v) for v in values]
        if not vals:
            raise ValueError("no repetitions")
        mean = statistics.fmean(vals)
        cv = statistics.stdev(vals) / mean * 100 if len(vals) > 1 and mean else None
        return cls(len(vals), min(vals), statistics.median(vals), max(vals), mean, cv)

    def to_json(self) -> Dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass
class SizeComparison:
    size: Optional[int]
    native: Stats
    container: Stats
    delta: float  # container - native, in the benchmark's unit
    delta_pct: Optional[float]  # (container - native) / native, in %
    penalty: Optional[float]  # how much worse the container is, in the limit's unit; <= 0: not worse
    limit: Optional[float]  # the threshold applied (None: size not checked)
    limit_unit: str  # "%", else the benchmark's unit: an absolute limit ("us" of latency, "ms" of a job)
    checked: bool
    ok: bool
    within_noise: bool
    spread: Optional[float] = None  # deviation of the difference from the repetitions' spread (unit of the benchmark)

    @property
    def state(self) -> str:
        """``not checked``, ``ok``, ``noise`` (over the limit within the spread) or ``fail``."""
        if not self.checked:
            return "not checked"
        return "ok" if self.ok else ("noise" if self.within_noise else "fail")

    def to_json(self) -> Dict[str, Any]:
        d = asdict(self)
        d["native"] = self.native.to_json()
        d["container"] = self.container.to_json()
        d["state"] = self.state
        for k in ("delta", "delta_pct", "penalty", "spread"):
            if isinstance(d[k], float):
                d[k] = round(d[k], 6)
        return d


#: SKIPPED (dedal.model.verify_report): the verdict of a check that was planned but not run (e.g. a
#: GPU check on a host without GPU): it neither passes nor fails, and the overall verdict, taken over
#: what ran, says it is partial. It, exit_code and skipped_text are the report model's, re-exported.


@dataclass
class CheckResult:
    """The outcome of one native vs container comparison (or, verdict :data:`SKIPPED`, why
    it was not made: ``skip_reason``; ``gpu``: a GPU check)."""

    name: str
    metric: str  # latency | bandwidth | busbw | init
    unit: str
    verdict: str
    findings: List[Finding] = field(default_factory=list)
    sizes: List[SizeComparison] = field(default_factory=list)
    higher_is_better: bool = False
    skip_reason: str = ""
    gpu: bool = False

    @property
    def passed(self) -> bool:
        return self.verdict in ("good", "suboptimal")

    @property
    def skipped(self) -> bool:
        return self.verdict == SKIPPED

    def to_json(self) -> Dict[str, Any]:
        out = {
            "name": self.name,
            "metric": self.metric,
            "unit": self.unit,
            "verdict": self.verdict,
            "higher_is_better": self.higher_is_better,
            "findings": [f.to_json() for f in self.findings],
            "sizes": [s.to_json() for s in self.sizes],
        }
        if self.skipped:
            out["skip_reason"] = self.skip_reason
        if self.gpu:
            out["gpu"] = True
        return out


def skipped_check(name: str, metric: str, unit: str, reason: str, *, gpu: bool = False) -> CheckResult:
    """A check that was planned but not run, with one note saying ``skipped: <reason>``."""
    return CheckResult(
        name,
        metric,
        unit,
        SKIPPED,
        [F.info("check-skipped", f"{name}: skipped: {reason}")],
        higher_is_better=metric in ("bandwidth", "busbw"),
        skip_reason=reason,
        gpu=gpu,
    )


def _common_sizes(native: Series, container: Series) -> List[int]:
    return sorted(
        set(int(k) for k, v in native.items() if len(v)) & set(int(k) for k, v in container.items() if len(v))
    )


def _get(series: Series, size: int) -> Sequence[float]:
    return series[size] if size in series else series[str(size)]  # type: ignore[index]


def _robust_sd(values: Sequence[float]) -> Optional[float]:
    """Interquartile range / 1.349 (the standard deviation of a normal sample with that IQR); None under 3 values."""
    vals = sorted(float(v) for v in values)
    if len(vals) < 3:
        return None
    q1, _, q3 = statistics.quantiles(vals, n=4, method="inclusive")
    return (q3 - q1) / 1.349


def _spread(native: Sequence[float], container: Sequence[float]) -> Optional[float]:
    """Deviation of the difference of the two sides from their repetitions (None: too few to say)."""
    sn, sc = _robust_sd(native), _robust_sd(container)
    if sn is None or sc is None:
        return None
    return (sn * sn + sc * sc) ** 0.5


def _compare(
    name: str,
    metric: str,
    unit: str,
    native: Series,
    container: Series,
    *,
    higher_is_better: bool,
    limit_for,
    noise_sigmas: float = 3.0,
    sized: bool = True,
) -> CheckResult:
    """Shared engine: ``limit_for(size) -> (limit, "%" or the unit) or None`` says what applies at a size;
    ``sized=False``: one number per run, no message sizes (MPI init, an application's metric)."""
    result = CheckResult(name, metric, unit, "good", higher_is_better=higher_is_better)
    sizes = _common_sizes(native, container)
    if not sizes:
        result.verdict = "unknown"
        result.findings.append(
            F.warning(
                "no-data", f"{name}: no message size measured both natively and in the container", verdict="unknown"
            )
        )
        return result
    missing = sorted(set(map(int, native)) ^ set(map(int, container)))
    if missing:
        # a note: a run cut short is a failure of its own (run-failed, truncated); the verdict rests on the
        # sizes both sides measured, so it is never 'suboptimal' for a container that is as fast or faster
        result.findings.append(
            F.info(
                "sizes-differ",
                f"{name}: sizes measured on one side only: "
                f"{', '.join(map(str, missing[:8]))}{' ...' if len(missing) > 8 else ''}",
            )
        )
    failures: List[SizeComparison] = []
    noisy: List[SizeComparison] = []
    for size in sizes:
        n = Stats.of(_get(native, size))
        c = Stats.of(_get(container, size))
        worse = (n.median - c.median) if higher_is_better else (c.median - n.median)
        worse_pct = worse / n.median * 100 if n.median else None
        pct = (c.median - n.median) / n.median * 100 if n.median else None
        rule = limit_for(size)
        checked = rule is not None
        ok = True
        within_noise = False
        limit, limit_unit = rule if rule else (None, "%")
        penalty = worse_pct if limit_unit == "%" else worse
        spread = _spread(_get(native, size), _get(container, size))
        if checked and penalty is not None and penalty > limit:
            ok = False
            separated = (c.max < n.min) if higher_is_better else (c.min > n.max)
            beyond = worse - (limit / 100 * n.median if limit_unit == "%" else limit)  # excess, in the unit
            within_noise = (
                not separated and min(n.n, c.n) >= 3 and spread is not None and beyond <= noise_sigmas * spread
            )
        comp = SizeComparison(
            size, n, c, c.median - n.median, pct, penalty, limit, limit_unit, checked, ok, within_noise, spread
        )
        result.sizes.append(comp)
        if not ok:
            (noisy if within_noise else failures).append(comp)
    if all(s.native.median == 0 for s in result.sizes):
        result.verdict = "degenerate"
        result.findings.append(
            F.warning(
                "degenerate",
                f"{name}: every native value is 0 (e.g. a one-rank collective): nothing to compare",
                verdict="degenerate",
            )
        )
        return result
    if not any(s.checked for s in result.sizes):
        result.findings.append(F.info("not-checked", f"{name}: no measured size is in the checked range"))
    for group, sev in ((failures, "error"), (noisy, "warning")):
        if not group:
            continue
        worst_cmp = max(group, key=excess)
        ev = [_describe(s, unit, sized) for s in group[:5]]
        what = "exceeds" if sev == "error" else "exceeds, within run-to-run noise,"
        count = f" at {len(group)} size(s); worst" if sized else ":"
        msg = f"{name}: container {what} the {metric} threshold{count} {_describe(worst_cmp, unit, sized)}"
        code = f"{metric}-overhead" if sev == "error" else f"{metric}-noisy"
        result.findings.append(Finding(sev, code, msg, ev))
    result.verdict = verdict_of(result.findings, "good")
    return result


def excess(s: SizeComparison) -> float:
    """How many times the limit a comparison uses (1.0 = exactly at the limit)."""
    if s.penalty is None:
        return 0.0
    return s.penalty / s.limit if s.limit else float("inf")


def deciding_size(check: CheckResult) -> Optional[SizeComparison]:
    """The size that decided the check: the worst failure, else the worst noise, else the checked size nearest
    its limit, else (nothing checked) the size where the container is relatively worst. The report's worst
    difference, the console summary and the plot all show this one size."""
    for group in (
        [s for s in check.sizes if s.state == "fail"],
        [s for s in check.sizes if s.state == "noise"],
        [s for s in check.sizes if s.checked],
    ):
        if group:
            return max(group, key=excess)
    sign = -1.0 if check.higher_is_better else 1.0
    rel = [s for s in check.sizes if s.delta_pct is not None]
    return max(rel, key=lambda s: sign * (s.delta_pct or 0.0)) if rel else (check.sizes[0] if check.sizes else None)


def _describe(s: SizeComparison, unit: str, sized: bool = True) -> str:
    where = f"{s.size} B: " if s.size is not None and sized else ""
    pct = f" ({s.delta_pct:+.2f} %)" if s.delta_pct is not None else ""
    lim = f"; limit {s.limit:g} {s.limit_unit}" if s.limit is not None else ""
    return (
        f"{where}native {s.native.median:.4g} {unit} [{s.native.min:.4g}..{s.native.max:.4g}], container "
        f"{s.container.median:.4g} {unit} [{s.container.min:.4g}..{s.container.max:.4g}], "
        f"delta {s.delta:+.3g} {unit}{pct}{lim}"
    )


def compare_latency(
    native: Series, container: Series, thresholds: Optional[Thresholds] = None, name: str = "osu_latency"
) -> CheckResult:
    """Latency (us, lower is better): up to ``small_message_max`` bytes the container may add at most
    ``latency_overhead_us`` (an absolute limit: small-message latency is a fixed software cost, and a
    relative limit on 0.2 us would be meaningless); above, latency is bandwidth-bound and may grow by at
    most ``bandwidth_pct`` %."""
    th = thresholds or Thresholds()
    return _compare(
        name,
        "latency",
        "us",
        native,
        container,
        higher_is_better=False,
        limit_for=lambda size: (
            (th.latency_overhead_us, "us") if size <= th.small_message_max else (th.bandwidth_pct, "%")
        ),
        noise_sigmas=th.noise_sigmas,
    )


def compare_bandwidth(
    native: Series, container: Series, thresholds: Optional[Thresholds] = None, name: str = "osu_bw", unit: str = "MB/s"
) -> CheckResult:
    """Bandwidth (higher is better): from ``bandwidth_min_size`` bytes on the container may lose at most
    ``bandwidth_pct`` % (smaller messages are latency-bound and covered by the latency check)."""
    th = thresholds or Thresholds()
    return _compare(
        name,
        "bandwidth",
        unit,
        native,
        container,
        higher_is_better=True,
        limit_for=lambda size: (th.bandwidth_pct, "%") if size >= th.bandwidth_min_size else None,
        noise_sigmas=th.noise_sigmas,
    )


def compare_busbw(
    native: Series, container: Series, thresholds: Optional[Thresholds] = None, name: str = "all_reduce_perf"
) -> CheckResult:
    """NCCL bus bandwidth (GB/s, higher is better): from ``busbw_min_size`` bytes on the container may
    lose at most ``busbw_pct`` %. All-zero native values (a one-rank run) are ``degenerate``."""
    th = thresholds or Thresholds()
    return _compare(
        name,
        "busbw",
        "GB/s",
        native,
        container,
        higher_is_better=True,
        limit_for=lambda size: (th.busbw_pct, "%") if size >= th.busbw_min_size else None,
        noise_sigmas=th.noise_sigmas,
    )


def compare_init(
    native: Sequence[float],
    container: Sequence[float],
    thresholds: Optional[Thresholds] = None,
    name: str = "osu_init",
    *,
    whole_job: bool = False,
) -> CheckResult:
    """MPI init time (ms, lower is better): the container may add at most ``init_overhead_pct`` %.
    Start-up has a heavy right tail (cold caches on the first run), hence the median of repetitions;
    the runner should also run one unmeasured warm-up. ``whole_job``: a whole job's wall time (the
    launcher and the container's start included), which may add ``init_overhead_pct`` % or
    ``startup_overhead_ms``, whichever is more: a relative limit alone judged a fixed start-up
    cost by how short the job is."""
    th = thresholds or Thresholds()
    return _compare_one(
        name,
        "init",
        "ms",
        native,
        container,
        higher_is_better=False,
        limit_pct=th.init_overhead_pct,
        noise_sigmas=th.noise_sigmas,
        absolute=th.startup_overhead_ms if whole_job else None,
    )


def compare_job_time(
    native: Sequence[float], container: Sequence[float], thresholds: Optional[Thresholds] = None, name: str = "job"
) -> CheckResult:
    """:func:`compare_init` of a whole job's wall time."""
    return compare_init(native, container, thresholds, name, whole_job=True)


def compare_app(
    native: Sequence[float],
    container: Sequence[float],
    *,
    name: str,
    unit: str,
    higher_is_better: bool,
    overhead_pct: float,
    noise_sigmas: float = 3.0,
) -> CheckResult:
    """An application's metric (one number per run, e.g. its time to solution in s): the
    container may be at most ``overhead_pct`` % worse than native, medians against medians,
    with the noise rule of every check (an application's time varies more between runs than a
    microbenchmark's, hence its own threshold, 10 % unless the environment file says)."""
    return _compare_one(
        name,
        "app",
        unit,
        native,
        container,
        higher_is_better=higher_is_better,
        limit_pct=overhead_pct,
        noise_sigmas=noise_sigmas,
    )


def _compare_one(
    name: str,
    metric: str,
    unit: str,
    native: Sequence[float],
    container: Sequence[float],
    *,
    higher_is_better: bool,
    limit_pct: float,
    noise_sigmas: float,
    absolute: Optional[float] = None,
) -> CheckResult:
    """:func:`_compare` of one number per run (no message size: the one comparison's size is None);
    ``absolute``: an excess in ``unit`` always allowed, where it is more than ``limit_pct`` % of
    the native median."""
    median = Stats.of(native).median if native else 0.0
    limit = (absolute, unit) if absolute is not None and absolute > limit_pct / 100 * median else (limit_pct, "%")
    res = _compare(
        name,
        metric,
        unit,
        {0: list(native)} if native else {},
        {0: list(container)} if container else {},
        higher_is_better=higher_is_better,
        limit_for=lambda size: limit,
        noise_sigmas=noise_sigmas,
        sized=False,
    )
    for s in res.sizes:
        s.size = None
    return res


def series_from_osu(results: Iterable[Mapping[str, Any]], benchmark: str, column: int = 1) -> Dict[int, List[float]]:
    """Collect one OSU benchmark's repetitions from several parse results (one per repetition):
    ``{size: [value of repetition 1, 2, ...]}``."""
    out: Dict[int, List[float]] = {}
    for res in results:
        for table in res.get("tables") or []:
            if table.get("benchmark") != benchmark or not table.get("columns") or table["columns"][0] != "Size":
                continue
            for row in table["rows"]:
                if len(row) > column and isinstance(row[column], (int, float)):
                    out.setdefault(int(row[0]), []).append(float(row[column]))
    return out


def series_from_nccl(results: Iterable[Mapping[str, Any]], key: str = "oop_busbw") -> Dict[int, List[float]]:
    """``{size: [busbw of repetition 1, 2, ...]}`` from several nccl-tests parse results."""
    out: Dict[int, List[float]] = {}
    for res in results:
        for row in res.get("rows") or []:
            if isinstance(row, Mapping) and isinstance(row.get(key), (int, float)):
                out.setdefault(int(row["size"]), []).append(float(row[key]))
    return out


def compare_osu_runs(
    native_runs: Sequence[Mapping[str, Any]],
    container_runs: Sequence[Mapping[str, Any]],
    benchmark: str,
    thresholds: Optional[Thresholds] = None,
    name: Optional[str] = None,
) -> CheckResult:
    """Compare one OSU benchmark from parse results, one result per repetition and side.

    The metric comes from the table (latency -> :func:`compare_latency`, bandwidth or
    message rate -> :func:`compare_bandwidth`); ``osu_init`` uses the ``avg_ms`` of each run.
    """
    label = name or benchmark
    if benchmark == "osu_init":
        nat = [r["init"]["avg_ms"] for r in native_runs if r.get("init")]
        con = [r["init"]["avg_ms"] for r in container_runs if r.get("init")]
        return compare_init(nat, con, thresholds, name=label)
    metric, unit = None, None
    for res in list(native_runs) + list(container_runs):
        for t in res.get("tables") or []:
            if t.get("benchmark") == benchmark and t.get("metric"):
                metric, unit = t["metric"], t.get("unit")
                break
        if metric:
            break
    nat_s = series_from_osu(native_runs, benchmark)
    con_s = series_from_osu(container_runs, benchmark)
    if metric in ("bandwidth", "message_rate"):
        return compare_bandwidth(nat_s, con_s, thresholds, name=label, unit=unit or "MB/s")
    return compare_latency(nat_s, con_s, thresholds, name=label)


def compare_nccl_runs(
    native_runs: Sequence[Mapping[str, Any]],
    container_runs: Sequence[Mapping[str, Any]],
    thresholds: Optional[Thresholds] = None,
    name: Optional[str] = None,
    key: str = "oop_busbw",
) -> CheckResult:
    """Compare nccl-tests bus bandwidth from parse results (one per repetition and side)."""
    label = name or next((r.get("test") for r in native_runs if r.get("test")), None) or "nccl-tests"
    res = compare_busbw(
        series_from_nccl(native_runs, key), series_from_nccl(container_runs, key), thresholds, name=label
    )
    if any(r.get("nranks") == 1 for r in list(native_runs) + list(container_runs)) and res.verdict != "degenerate":
        res.findings.append(
            F.warning("degenerate", f"{label}: a one-rank run: bus bandwidth is 0 by definition", verdict="degenerate")
        )
        res.verdict = verdict_of(res.findings, res.verdict)
    return res


def overall_verdict(checks: Iterable[CheckResult] = (), findings: Iterable[Finding] = ()) -> str:
    """The worst of the verdicts of the checks that ran and the findings' implied verdicts
    (a skipped check's note says nothing about the image: :func:`verdict_text` names it)."""
    return worst(*(c.verdict for c in checks if not c.skipped), *(f.implied_verdict for f in findings))


def skipped_of(report: Any) -> str:
    """What was planned and not run, of a ``verify.json`` read back (its dict): what the gate and
    the registry annotation need to know; "" for a report without skipped checks (older reports,
    written before checks could be skipped, included)."""
    return verify_report.from_json(report).skipped


def verdict_text(verdict: str, checks: Iterable[CheckResult]) -> str:
    """The verdict as people read it: ``good (GPU checks skipped: no GPU)`` where planned checks
    did not run, so that it never reads "good" for what was not measured."""
    return verdict_with(verdict, skipped_text(checks))
