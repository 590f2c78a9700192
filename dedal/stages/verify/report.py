"""The verification report: ``verify.json``, ``report.md`` and PNG plots in one directory
(the runner uses ``reports/<image>/``).

- ``verify.json``: every measurement (the repetitions per size, native and container),
  every check with its per-size statistics, every finding with its evidence lines, the
  parsed logs, thresholds, host facts and provenance. Machine-readable; written last,
  so that its presence means the report is complete.
- ``report.md``: the verdict first, then a summary table of the checks, the findings
  with their evidence, and one table (and plot) per check.
- ``<check>.png``: latency or bandwidth against message size, native and container,
  the median as a line and the min..max of the repetitions as a band.

Every file is written to a temporary name in the same directory and renamed, so a file
exists whole or not at all. Plots are drawn with matplotlib's Agg canvas directly (no
pyplot global state, no display needed).
"""
from __future__ import annotations

import io
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from dedal.stages.verify.checks import CheckResult, HostFacts, Thresholds, excess, exit_code, overall_verdict
from dedal.stages.verify.findings import Finding, as_finding

SCHEMA_VERSION = 1
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
    findings: List[Finding] = field(default_factory=list)     # transport rules and log findings
    logs: List[Dict[str, Any]] = field(default_factory=list)   # parse results of the logs looked at
    measurements: Dict[str, Any] = field(default_factory=dict)  # name -> {unit, native: {size: [..]}, container: ..}
    host: Optional[HostFacts] = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    meta: Dict[str, Any] = field(default_factory=dict)          # provenance: versions, commands, dates
    verdict: Optional[str] = None                              # None: computed from checks and findings

    def __post_init__(self) -> None:
        self.findings = [as_finding(f) for f in self.findings]

    @property
    def overall(self) -> str:
        return self.verdict or overall_verdict(self.checks, self.findings)

    @property
    def exit_code(self) -> int:
        return exit_code(self.overall)

    def to_json(self) -> Dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "image": self.image,
            "verdict": self.overall,
            "exit_code": self.exit_code,
            "checks": [c.to_json() for c in self.checks],
            "findings": [f.to_json() for f in self.findings],
            "measurements": _jsonable(self.measurements),
            "logs": [_log_summary(entry) for entry in self.logs],
            "thresholds": self.thresholds.to_json(),
            "host": self.host.to_json() if self.host else None,
            "meta": _jsonable(self.meta),
        }


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
    """A parse result without its bulky parts (full protocol tables, per-channel evidence)."""
    drop = {"protocols", "transport_evidence", "btl_peers", "frameworks", "devices"}
    return _jsonable({k: v for k, v in result.items() if k not in drop})


# ---- files ---------------------------------------------------------------------------

def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


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
    """PNG of one check: median per size (line), min..max of the repetitions (band), native and
    container; log-2 message sizes; latency and bandwidth on a log scale, bus bandwidth linear."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(7.5, 4.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
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
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: _size_label(x)))
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    label = {"latency": "latency", "bandwidth": "bandwidth", "busbw": "bus bandwidth"}.get(check.metric, check.metric)
    ax.set_ylabel(f"{label} ({check.unit})")
    ax.set_title(f"{check.name}: {check.verdict}")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


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
    lines: List[str] = [f"# Verdict: {v.upper()}", "", f"**{_VERDICT_WORD.get(v, v)}**: image `{report.image}`.", ""]
    failed = [c for c in report.checks if not c.passed]
    warn = [f for f in report.findings if f.severity == "warning"]
    errs = [f for f in report.findings if f.severity == "error"]
    lines.append(f"{len(report.checks)} check(s), {len(failed)} not passed; {len(errs)} error(s) and {len(warn)} "
                 f"warning(s) in the logs.")
    lines.append("")
    if report.checks:
        lines += ["| check | metric | verdict | worst difference |", "| --- | --- | --- | --- |"]
        for c in report.checks:
            lines.append(f"| {_md_escape(c.name)} | {c.metric} ({c.unit}) | {c.verdict} | {_worst_text(c)} |")
        lines.append("")
    all_findings = [(None, f) for f in report.findings] + [(c.name, f) for c in report.checks for f in c.findings]
    shown = [(n, f) for n, f in all_findings if f.severity != "info"]
    if shown:
        lines += ["## Findings", ""]
        order = {"error": 0, "warning": 1}
        for name, f in sorted(shown, key=lambda nf: order.get(nf[1].severity, 2)):
            lines.append(f"- **{f.severity}** `{f.code}`: {f.message}")
            if f.evidence:
                lines.append("")
                lines.append("  ```")
                lines += [f"  {e}" for e in f.evidence]
                lines.append("  ```")
        lines.append("")
    for c in report.checks:
        lines += [f"## {c.name}: {c.verdict}", ""]
        if c.name in plots:
            lines += [f"![{c.name}]({plots[c.name]})", ""]
        if c.sizes:
            limit_head = "limit"
            lines += [f"| size (B) | native median [min..max] ({c.unit}) | container median [min..max] ({c.unit}) "
                      f"| difference | {limit_head} | ok |", "| ---: | ---: | ---: | ---: | ---: | :---: |"]
            for s in c.sizes:
                size = "-" if s.size is None else str(s.size)
                diff = f"{s.delta:+.3g} {c.unit}" + (f" ({s.delta_pct:+.2f} %)" if s.delta_pct is not None else "")
                lim = f"{s.limit:g} {s.limit_unit}" if s.limit is not None and s.checked else "not checked"
                ok = "yes" if s.ok else ("noise" if s.within_noise else "**no**")
                lines.append(f"| {size} | {_fmt(s.native.median)} [{_fmt(s.native.min)}..{_fmt(s.native.max)}] | "
                             f"{_fmt(s.container.median)} [{_fmt(s.container.min)}..{_fmt(s.container.max)}] | "
                             f"{diff} | {lim} | {ok} |")
            lines.append("")
    infos = [f for _, f in all_findings if f.severity == "info"]
    if infos:
        lines += ["## Notes", ""] + [f"- `{f.code}`: {f.message}" for f in infos] + [""]
    if report.logs:
        lines += ["## Logs", "", "| log | kind | verdict |", "| --- | --- | --- |"]
        for entry in report.logs:
            lines.append(f"| {_md_escape(str(entry.get('source') or '-'))} | {entry.get('kind')} | {entry.get('verdict')} |")
        lines.append("")
    th = report.thresholds
    lines += ["## Thresholds", "",
              f"- small-message latency overhead (up to {th.small_message_max} B): {th.latency_overhead_us:g} us",
              f"- bandwidth loss (from {th.bandwidth_min_size} B) and large-message latency growth: {th.bandwidth_pct:g} %",
              f"- NCCL bus bandwidth loss (from {th.busbw_min_size} B): {th.busbw_pct:g} %",
              f"- MPI init overhead: {th.init_overhead_pct:g} %",
              "- statistics: median of the repetitions; min..max shown; an exceeded threshold whose ranges overlap "
              "is reported as noise (warning)", ""]
    if report.host:
        lines += ["## Host", ""] + [f"- {k}: {val}" for k, val in report.host.to_json().items()] + [""]
    if report.meta:
        lines += ["## Provenance", ""] + [f"- {k}: {val}" for k, val in report.meta.items()] + [""]
    return "\n".join(lines).rstrip() + "\n"


def _worst_text(c: CheckResult) -> str:
    bad = [s for s in c.sizes if s.checked]
    if not bad:
        return "-"
    s = max(bad, key=excess)
    where = f"{s.size} B: " if s.size is not None else ""
    pct = f" ({s.delta_pct:+.2f} %)" if s.delta_pct is not None else ""
    return f"{where}{s.delta:+.3g} {c.unit}{pct}"


def load_report(path: Path) -> Dict[str, Any]:
    """Read a ``verify.json`` back (for publish, CI summaries)."""
    return json.loads(Path(path).read_text())


__all__: Sequence[str] = ["VerifyReport", "write_report", "render_markdown", "plot_png", "load_report"]
