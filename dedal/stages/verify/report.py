"""The verification report: ``verify.json``, ``report.md`` and PNG plots in one directory
(the runner uses ``reports/<image>/``).

- ``verify.json``: every measurement (the repetitions per size, native and container),
  every check with its per-size statistics, every finding with its evidence lines, the
  parsed logs, thresholds, host facts and provenance. Machine-readable; written last,
  so that its presence means the report is complete.
- ``report.md``: the verdict first, then a summary table of the checks, the findings
  with their evidence, and one table (and plot) per check.
- ``<check>.png``: latency or bandwidth against message size, native and container,
  the median as a line and the min..max of the repetitions as a band; below it the
  container/native ratio per size with the band the threshold allows, the failing sizes
  marked (red crosses) and the sizes within noise (orange triangles).

A check planned but not run (a GPU check on a host without GPU) has the verdict
``skipped`` and its reason; the overall verdict is taken over what ran, and every view
shows it with what did not run (``verdict_text``: ``good (GPU checks skipped: no GPU)``).

The counts (checks, checks not passed, skipped, errors, warnings, notes) come from one place,
:func:`counts` over :func:`all_findings` (the report's findings and every check's): the
headline of ``report.md``, its Findings section, ``verify.json`` (``counts``) and the
console summary of ``dedal verify`` show the same numbers.

Every file is written to a temporary name in the same directory and renamed, so a file
exists whole or not at all. Plots are drawn with matplotlib's Agg canvas directly (no
pyplot global state, no display needed).
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from dedal.model.artifacts import write_atomic
from dedal.model.verify_report import SCHEMA_VERSION, exit_code, skipped_text
from dedal.stages.verify.checks import (
    CheckResult,
    SizeComparison,
    Thresholds,
    deciding_size,
    overall_verdict,
    verdict_text,
)
from dedal.stages.verify.transports import HostFacts
from dedal.stages.verify.findings import Finding, as_finding

_VERDICT_WORD = {
    "good": "GOOD: the image performs like bare metal",
    "suboptimal": "SUBOPTIMAL: within thresholds, with warnings",
    "degenerate": "DEGENERATE: a measurement was meaningless (e.g. one rank), nothing could be concluded",
    "bad": "BAD: a check failed",
    "failed": "FAILED: a run crashed, aborted or was cut short",
    "unknown": "UNKNOWN: nothing could be verified",
}


@dataclass
class VerifyReport:
    image: str
    checks: List[CheckResult] = field(default_factory=list)
    findings: List[Finding] = field(default_factory=list)  # transport rules and log findings
    logs: List[Dict[str, Any]] = field(default_factory=list)  # parse results of the logs looked at
    measurements: Dict[str, Any] = field(default_factory=dict)  # name -> {unit, native: {size: [..]}, container: ..}
    host: Optional[HostFacts] = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    meta: Dict[str, Any] = field(default_factory=dict)  # provenance: versions, commands, dates
    verdict: Optional[str] = None  # None: computed from checks and findings

    def __post_init__(self) -> None:
        self.findings = [as_finding(f) for f in self.findings]

    @property
    def overall(self) -> str:
        return self.verdict or overall_verdict(self.checks, self.findings)

    @property
    def verdict_text(self) -> str:
        """The verdict with what did not run: ``good (GPU checks skipped: no GPU)``."""
        return verdict_text(self.overall, self.checks)

    @property
    def exit_code(self) -> int:
        return exit_code(self.overall)

    def to_json(self) -> Dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "image": self.image,
            "verdict": self.overall,
            "verdict_text": self.verdict_text,
            "exit_code": self.exit_code,
            "counts": counts(self),
            "headline": headline(self),
            "checks": [c.to_json() for c in self.checks],
            "findings": [f.to_json() for f in self.findings],
            "measurements": _jsonable(self.measurements),
            "logs": [_log_summary(entry) for entry in self.logs],
            "thresholds": self.thresholds.to_json(),
            "host": self.host.to_json() if self.host else None,
            "meta": _jsonable(self.meta),
        }


def all_findings(report: VerifyReport) -> List[Tuple[Optional[str], Finding]]:
    """Every finding of the report: its own (check None), then each check's (with the check's name)."""
    return [(None, f) for f in report.findings] + [(c.name, f) for c in report.checks for f in c.findings]


def counts(report: VerifyReport) -> Dict[str, int]:
    """The numbers every view of the report shows (one source of truth)."""
    every = [f for _, f in all_findings(report)]
    return {
        "checks": len(report.checks),
        "checks_not_passed": sum(1 for c in report.checks if not c.passed and not c.skipped),
        "checks_skipped": sum(1 for c in report.checks if c.skipped),
        "errors": sum(1 for f in every if f.severity == "error"),
        "warnings": sum(1 for f in every if f.severity == "warning"),
        "notes": sum(1 for f in every if f.severity == "info"),
    }


def headline(report: VerifyReport) -> str:
    n = counts(report)
    skipped = f", {n['checks_skipped']} skipped" if n["checks_skipped"] else ""
    return (
        f"{n['checks']} check(s), {n['checks_not_passed']} not passed{skipped}; {n['errors']} error(s), "
        f"{n['warnings']} warning(s), {n['notes']} note(s)"
    )


def shown_findings(report: VerifyReport) -> List[Tuple[Optional[str], Finding]]:
    """The errors and warnings, errors first: the Findings of report.md and of the console."""
    order = {"error": 0, "warning": 1}
    return sorted(
        [(n, f) for n, f in all_findings(report) if f.severity in order], key=lambda nf: order[nf[1].severity]
    )


def summary_row(check: CheckResult) -> Optional[Dict[str, Any]]:
    """One row per check for the summary: the size that decided the check (the worst failure, else the
    worst noise, else the checked size nearest its limit; :func:`checks.deciding_size`), so that the
    numbers shown are the ones the verdict rests on."""
    pick = deciding_size(check)
    if pick is None:
        return None
    n, c = pick.native.median, pick.container.median
    return {
        "check": check.name,
        "metric": check.metric,
        "unit": check.unit,
        "size": pick.size,
        "native": n,
        "container": c,
        "ratio": (c / n) if n else None,
        "state": pick.state,
        "verdict": check.verdict,
    }


def console_lines(report: VerifyReport, limit: int = 20) -> List[str]:
    """What `dedal verify` prints: the verdict, the headline, one row per check at its deciding size,
    the checks not passed and the errors and warnings (the first ``limit``, with their evidence)."""
    out = [f"verdict: {_upper_verdict(report)}  ({report.image}; exit code {report.exit_code})", headline(report)]
    rows = [r for r in (summary_row(c) for c in report.checks) if r]
    if rows:
        width = max(len(r["check"]) for r in rows)
        out.append(
            f"{'check':<{width}}  {'size (B)':>9}  {'native':>12}  {'container':>12}  {'ratio':>7}  "
            f"{'size is':<11}  verdict"
        )
        for r in rows:
            unit = r["unit"]
            ratio = f"{r['ratio']:.3f}" if r.get("ratio") is not None else "-"
            size = "-" if r.get("size") is None else str(r["size"])
            out.append(
                f"{r['check']:<{width}}  {size:>9}  {r['native']:>9.4g} {unit:<2}  {r['container']:>9.4g} "
                f"{unit:<2}  {ratio:>7}  {r['state']:<11}  {r['verdict']}"
            )
    out += [
        f"check {c.name}: {c.verdict}" + (f": {c.skip_reason}" if c.skipped else "")
        for c in report.checks
        if not c.passed
    ]
    shown = [f for _, f in shown_findings(report)]
    for f in shown[:limit]:
        out.append(f"[{f.severity}] {f.code}: {f.message}")
        out += [f"    | {ev}" for ev in f.evidence[:3]]
    if len(shown) > limit:
        out.append(f"... and {len(shown) - limit} more error(s)/warning(s) in the report")
    return out


def _jsonable(obj: Any) -> Any:
    """Series keyed by int sizes become JSON objects keyed by strings (sorted numerically)."""
    if isinstance(obj, Mapping):
        keys = list(obj.keys())
        if keys and all(isinstance(k, int) for k in keys):
            return {str(k): _jsonable(obj[k]) for k in sorted(keys)}
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _log_summary(result: Mapping[str, Any]) -> Dict[str, Any]:
    """A parse result without its bulky parts (full protocol tables, per-channel evidence, the
    evidence lines the parsers keep for the rules: the findings quote them)."""
    drop = {
        "protocols",
        "transport_evidence",
        "btl_peers",
        "frameworks",
        "devices",
        "ucx_transport_evidence",
        "ucx_unavailable",
        "network_lines",
        "socket_lines",
        "ib_lines",
        "ib_unopenable",
        "no_verbs_lines",
        "gdr_enabled_lines",
        "gdr_disabled_lines",
        "plugin_lines",
        "plugin_missing_lines",
        "plugin_failure",
        "list_lines",
    }
    return _jsonable({k: v for k, v in result.items() if k not in drop})


# ---- files ---------------------------------------------------------------------------


def _atomic_write(path: Path, data: bytes) -> None:
    write_atomic(path, data, mode=0o644, fsync=True)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "check"


def write_report(report: VerifyReport, outdir: Path) -> Dict[str, Path]:
    """Write plots, ``report.md`` and ``verify.json`` (last) into ``outdir``; return their paths."""
    outdir = Path(outdir)
    paths: Dict[str, Path] = {}
    plots: Dict[str, str] = {}
    used: set = set()
    for check in report.checks:
        if check.metric not in ("latency", "bandwidth", "busbw") or not check.sizes:
            continue
        name = slug(check.name)
        while name in used:
            name += "_"
        used.add(name)
        png = outdir / f"{name}.png"
        _atomic_write(png, plot_png(check))
        plots[check.name] = png.name
        paths[f"plot:{check.name}"] = png
    md = outdir / "report.md"
    _atomic_write(md, render_markdown(report, plots).encode())
    paths["report.md"] = md
    js = outdir / "verify.json"
    data = report.to_json()
    data["plots"] = plots
    _atomic_write(js, (json.dumps(data, indent=1, default=str) + "\n").encode())
    paths["verify.json"] = js
    return paths


# ---- plots ---------------------------------------------------------------------------


def plot_png(check: CheckResult) -> bytes:
    """PNG of one check. Top: median per size (line), min..max of the repetitions (band), native and
    container; latency and bandwidth on a log scale, bus bandwidth linear. Bottom: container/native ratio
    of the medians per size, the region the threshold allows shaded green (no shading where a size is not
    checked), failing sizes as red crosses, sizes within noise as orange triangles. Log-2 message sizes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(7.5, 6.8), dpi=100)
    FigureCanvasAgg(fig)
    ax, rx = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    log_y = check.metric in ("latency", "bandwidth")
    pts = [s for s in check.sizes if s.size is not None and s.size > 0]
    for side, color, marker in (("native", "#1f77b4", "o"), ("container", "#d62728", "s")):
        xs, med, lo, hi = [], [], [], []
        for s in pts:
            st = s.native if side == "native" else s.container
            if log_y and st.min <= 0:
                continue
            xs.append(s.size)
            med.append(st.median)
            lo.append(st.min)
            hi.append(st.max)
        if not xs:
            continue
        ax.plot(xs, med, marker=marker, markersize=3.5, linewidth=1.4, color=color, label=f"{side} (median)")
        ax.fill_between(xs, lo, hi, color=color, alpha=0.18, linewidth=0, label=f"{side} (min..max)")
    ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    label = {"latency": "latency", "bandwidth": "bandwidth", "busbw": "bus bandwidth"}.get(check.metric, check.metric)
    ax.set_ylabel(f"{label} ({check.unit})")
    ax.set_title(f"{check.name}: {check.verdict}")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    _plot_ratio(rx, check, pts)
    rx.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: _size_label(x)))
    rx.set_xlabel("message size (bytes)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def ratio_limit(s: SizeComparison, higher_is_better: bool) -> Optional[float]:
    """The container/native ratio of medians the threshold allows at a size (None: not checked)."""
    if not s.checked or s.limit is None or not s.native.median:
        return None
    if s.limit_unit != "%":  # absolute, in the benchmark's unit
        return (s.native.median + s.limit) / s.native.median
    return 1 - s.limit / 100 if higher_is_better else 1 + s.limit / 100


def _plot_ratio(rx, check: CheckResult, pts: List[SizeComparison]) -> None:
    rated = [(s, s.container.median / s.native.median) for s in pts if s.native.median]
    if not rated:
        rx.text(0.5, 0.5, "no ratio (native values are 0)", ha="center", va="center", transform=rx.transAxes)
        return
    xs = [s.size for s, _ in rated]
    ratios = [r for _, r in rated]
    rx.plot(xs, ratios, color="#444444", linewidth=1.0, marker="o", markersize=3, label="container / native")
    rx.axhline(1.0, color="#888888", linewidth=0.8)
    for state, style in (
        ("fail", dict(marker="x", color="#d62728", s=60, linewidths=2, label="fails the threshold")),
        ("noise", dict(marker="^", color="#ff7f0e", s=40, label="over, within noise")),
    ):
        sel = [(s.size, r) for s, r in rated if s.state == state]
        if sel:
            rx.scatter([x for x, _ in sel], [r for _, r in sel], zorder=3, **style)
    limits = [ratio_limit(s, check.higher_is_better) for s, _ in rated]
    top = max(ratios + [lim for lim in limits if lim is not None] + [1.0])
    bottom = min(ratios + [lim for lim in limits if lim is not None] + [1.0])
    log_r = top / max(bottom, 1e-9) > 20
    if log_r:
        rx.set_yscale("log")
    margin = 0.1 * (top - bottom + 0.1)
    pad_hi, pad_lo = (top * 1.5, bottom / 1.5) if log_r else (top + margin, bottom - margin)
    bound = [lim if lim is not None else float("nan") for lim in limits]
    # the allowed side of the limit: above it for bandwidth (higher is better), below it for latency
    allowed_lo = [b if check.higher_is_better else pad_lo for b in bound]
    allowed_hi = [pad_hi if check.higher_is_better else b for b in bound]
    checked = [lim is not None for lim in limits]
    rx.fill_between(
        xs,
        allowed_lo,
        allowed_hi,
        where=checked,
        color="#2ca02c",
        alpha=0.15,
        linewidth=0,
        step="mid",
        label="allowed by the threshold",
    )
    rx.plot(xs, bound, color="#2ca02c", linewidth=1.0, linestyle="--", drawstyle="steps-mid")
    rx.set_ylim(pad_lo, pad_hi)
    rx.set_ylabel("container / native")
    rx.grid(True, which="major", alpha=0.3)
    rx.legend(loc="best", fontsize=7)


def _size_label(x: float) -> str:
    for unit, factor in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if x >= factor:
            v = x / factor
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{x:.0f}" if x >= 1 else f"{x:g}"


# ---- markdown ------------------------------------------------------------------------


def _fmt(v: Optional[float]) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}" if abs(v) < 10 else f"{v:.2f}"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(report: VerifyReport, plots: Optional[Mapping[str, str]] = None) -> str:
    plots = plots or {}
    v = report.overall
    lines: List[str] = [
        f"# Verdict: {_upper_verdict(report)}",
        "",
        f"**{_VERDICT_WORD.get(v, v)}**: image `{report.image}`.",
        "",
    ]
    skipped = skipped_text(report.checks)
    if skipped:
        lines += [f"Not everything planned ran ({skipped}): the verdict is about what ran.", ""]
    lines.append(headline(report) + ".")
    lines.append("")
    if report.checks:
        lines += ["| check | metric | verdict | deciding size: difference |", "| --- | --- | --- | --- |"]
        for c in report.checks:
            verdict = f"skipped: {c.skip_reason}" if c.skipped else c.verdict
            lines.append(f"| {_md_escape(c.name)} | {c.metric} ({c.unit}) | {verdict} | {_worst_text(c)} |")
        lines.append("")
    shown = shown_findings(report)
    if shown:
        lines += ["## Findings", ""]
        for name, f in shown:
            lines.append(f"- **{f.severity}** `{f.code}`: {f.message}")
            if f.evidence:
                lines.append("")
                lines.append("  ```")
                lines += [f"  {e}" for e in f.evidence]
                lines.append("  ```")
        lines.append("")
    for c in report.checks:
        if c.skipped:
            continue  # its row in the table and its note say all there is
        lines += [f"## {c.name}: {c.verdict}", ""]
        if c.metric == "app" and c.sizes:  # an application benchmark: its number is the ratio
            lines += [_app_ratio_line(c), ""]
        if c.name in plots:
            lines += [f"![{c.name}]({plots[c.name]})", ""]
        if c.sizes:
            limit_head = "limit"
            lines += [
                f"| size (B) | native median [min..max] ({c.unit}) | container median [min..max] ({c.unit}) "
                f"| difference | {limit_head} | ok |",
                "| ---: | ---: | ---: | ---: | ---: | :---: |",
            ]
            for s in c.sizes:
                size = "-" if s.size is None else str(s.size)
                diff = f"{s.delta:+.3g} {c.unit}" + (f" ({s.delta_pct:+.2f} %)" if s.delta_pct is not None else "")
                lim = f"{s.limit:g} {s.limit_unit}" if s.limit is not None and s.checked else "not checked"
                ok = {"ok": "yes", "noise": "noise", "fail": "**no**"}.get(s.state, "-")
                lines.append(
                    f"| {size} | {_fmt(s.native.median)} [{_fmt(s.native.min)}..{_fmt(s.native.max)}] | "
                    f"{_fmt(s.container.median)} [{_fmt(s.container.min)}..{_fmt(s.container.max)}] | "
                    f"{diff} | {lim} | {ok} |"
                )
            lines.append("")
        if c.metric == "app":
            lines += _app_runs(c, report.measurements.get(c.name))
    infos = [f for _, f in all_findings(report) if f.severity == "info"]
    if infos:
        lines += ["## Notes", ""] + [f"- `{f.code}`: {f.message}" for f in infos] + [""]
    if report.logs:
        lines += ["## Logs", "", "| log | kind | verdict |", "| --- | --- | --- |"]
        for entry in report.logs:
            lines.append(
                f"| {_md_escape(str(entry.get('source') or '-'))} | {entry.get('kind')} | {entry.get('verdict')} |"
            )
        lines.append("")
    th = report.thresholds
    lines += [
        "## Thresholds",
        "",
        f"- small-message latency overhead (up to {th.small_message_max} B): {th.latency_overhead_us:g} us",
        f"- bandwidth loss (from {th.bandwidth_min_size} B) and large-message latency growth: {th.bandwidth_pct:g} %",
        f"- NCCL bus bandwidth loss (from {th.busbw_min_size} B): {th.busbw_pct:g} %",
        f"- MPI init overhead: {th.init_overhead_pct:g} %; a whole init job's extra wall time: "
        f"{th.init_overhead_pct:g} % or {th.startup_overhead_ms:g} ms, whichever is more",
        *(
            [
                "- application benchmarks: container / native of the medians within each application's own "
                "overhead_pct (its section says which)"
            ]
            if any(c.metric == "app" and c.sizes for c in report.checks)
            else []
        ),
        f"- statistics: median of the repetitions; min..max shown; an exceeded threshold is noise (warning) "
        f"only when the ranges overlap and the excess is within {th.noise_sigmas:g} deviations of the "
        f"repetitions (interquartile range / 1.349 of each side); otherwise it fails the check",
        "",
    ]
    if report.host:
        lines += ["## Host", ""] + [f"- {k}: {val}" for k, val in report.host.to_json().items()] + [""]
    if report.meta:
        lines += ["## Provenance", ""] + [f"- {k}: {val}" for k, val in report.meta.items()] + [""]
    return "\n".join(lines).rstrip() + "\n"


def _app_ratio_line(c: CheckResult) -> str:
    """An application benchmark's result in one line: container / native of the medians, and
    the ratio its threshold allows."""
    s = c.sizes[0]
    if not s.native.median:
        return "container / native: - (the native median is 0)"
    allowed = ratio_limit(s, c.higher_is_better)
    bound = f"; allowed: {'at least' if c.higher_is_better else 'at most'} {allowed:.3f}" if allowed is not None else ""
    return (
        f"container / native: **{s.container.median / s.native.median:.3f}** (medians of the repetitions, "
        f"{'higher' if c.higher_is_better else 'lower'} is better{bound})"
    )


def _app_runs(c: CheckResult, measured: Any) -> List[str]:
    """The table of an application benchmark's runs (verify.json's ``measurements``: each
    run's log, metric, time and correctness); none for a check without runs."""
    runs = measured.get("runs") if isinstance(measured, Mapping) else None
    if not runs:
        return []
    out = [f"| run | log | value ({c.unit}) | seconds | correct |", "| --- | --- | ---: | ---: | --- |"]
    for r in runs:
        name = f"{r['side']} {'warm-up' if r['repetition'] == 0 else r['repetition']}"
        value = "-" if r.get("value") is None else f"{r['value']:g}"
        ok = "yes" if r.get("correct") else "**no**: " + _md_escape("; ".join(r.get("problems") or ["failed"]))
        out.append(f"| {name} | {_md_escape(str(r['log']))} | {value} | {r['seconds']:.1f} | {ok} |")
    return out + [""]


def _upper_verdict(report: VerifyReport) -> str:
    """``GOOD (GPU checks skipped: no GPU)``: the verdict word in capitals, the rest as written."""
    text = report.verdict_text
    return report.overall.upper() + text[len(report.overall) :]


def _worst_text(c: CheckResult) -> str:
    s = deciding_size(c)
    if s is None:
        return "-"
    where = f"{s.size} B: " if s.size is not None else ""
    pct = f" ({s.delta_pct:+.2f} %)" if s.delta_pct is not None else ""
    return f"{where}{s.delta:+.3g} {c.unit}{pct}, {s.state}"


def load_report(path: Path) -> Dict[str, Any]:
    """A ``verify.json`` back as its whole data (every field, for tests and tools); publish, the
    pipeline and CI read it typed, through :func:`dedal.model.verify_report.load`."""
    return json.loads(Path(path).read_text())


__all__: Sequence[str] = [
    "VerifyReport",
    "write_report",
    "render_markdown",
    "plot_png",
    "load_report",
    "counts",
    "headline",
    "all_findings",
    "shown_findings",
    "summary_row",
    "console_lines",
]
