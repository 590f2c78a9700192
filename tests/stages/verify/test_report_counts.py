"""Issue 23: one source of truth for a report's counts (headline, Findings, verify.json, console),
the deciding size in the summary, and plots that show the threshold band."""

from __future__ import annotations

import io
import json
from pathlib import Path

from dedal.stages.verify import findings as F
from dedal.stages.verify.checks import compare_bandwidth, compare_latency
from dedal.stages.verify.report import (
    VerifyReport,
    console_lines,
    counts,
    headline,
    plot_png,
    ratio_limit,
    render_markdown,
    shown_findings,
    write_report,
)

SIZES = [1 << i for i in range(0, 21)]


def lat(size: int) -> float:
    return 0.2 + size / 10000.0


def _report() -> VerifyReport:
    native = {s: [lat(s) * f for f in (1.0, 1.01, 0.99, 1.02, 1.0)] for s in SIZES}
    container = {s: [v * (3.29 if s == 262144 else 1.0) for v in vals] for s, vals in native.items()}
    container[1] = [v + 0.7 for v in native[1]]  # over the 0.5 us limit at 1 B as well
    latency = compare_latency(native, container)
    bw = {s: [min(s / lat(s), 20000.0)] * 5 for s in SIZES}
    faster = {s: [v * 1.2 for v in vals] for s, vals in bw.items()}
    faster[1 << 22] = [24000.0] * 5  # measured in the container only: a note
    bandwidth = compare_bandwidth(bw, faster)
    return VerifyReport(
        "demo",
        checks=[latency, bandwidth],
        findings=[
            F.warning("loader-warning", "libnl: no version information", ["a line"]),
            F.info("ucx-transports", "native, intra-node: UCX moved messages over sysv/memory"),
        ],
    )


def test_headline_findings_and_verify_json_agree(tmp_path: Path) -> None:
    rep = _report()
    n = counts(rep)
    assert n == {"checks": 2, "checks_not_passed": 1, "checks_skipped": 0, "errors": 1, "warnings": 1, "notes": 2}
    md = render_markdown(rep)
    assert headline(rep) in md.splitlines()[4]
    findings_section = md.split("## Findings", 1)[1].split("\n## ", 1)[0]
    listed = [ln for ln in findings_section.splitlines() if ln.startswith("- **")]
    assert len(listed) == n["errors"] + n["warnings"] == len(shown_findings(rep))
    assert sum("**error**" in ln for ln in listed) == n["errors"]
    paths = write_report(rep, tmp_path)
    data = json.loads(paths["verify.json"].read_text())
    assert data["counts"] == n and data["headline"] == headline(rep)
    every = data["findings"] + [f for c in data["checks"] for f in c["findings"]]
    assert sum(f["severity"] == "warning" for f in every) == n["warnings"]
    assert sum(f["severity"] == "error" for f in every) == n["errors"]


def test_the_check_table_names_the_deciding_size() -> None:
    md = render_markdown(_report())
    row = next(ln for ln in md.splitlines() if ln.startswith("| osu_latency |"))
    assert "262144 B:" in row and "fail" in row


def test_sizes_carry_their_state_into_verify_json(tmp_path: Path) -> None:
    data = json.loads(write_report(_report(), tmp_path)["verify.json"].read_text())
    states = {s["size"]: s["state"] for s in data["checks"][0]["sizes"]}
    assert states[262144] == "fail" and states[1] == "fail" and states[8] == "ok"


def test_ratio_limits_follow_the_threshold() -> None:
    rep = _report()
    latency, bandwidth = rep.checks
    one = next(s for s in latency.sizes if s.size == 1)
    assert abs(ratio_limit(one, False) - (one.native.median + 0.5) / one.native.median) < 1e-9
    big = next(s for s in latency.sizes if s.size == 1 << 20)
    assert abs(ratio_limit(big, False) - 1.02) < 1e-9
    small_bw = next(s for s in bandwidth.sizes if s.size == 1024)
    assert ratio_limit(small_bw, True) is None  # not checked: no band there
    assert abs(ratio_limit(bandwidth.sizes[-1], True) - 0.98) < 1e-9


def test_the_plot_has_a_ratio_panel_with_the_band_and_the_failing_sizes(monkeypatch) -> None:
    from matplotlib.figure import Figure

    drawn = {}
    real = Figure.savefig

    def keep(self, *args, **kwargs):
        drawn["fig"] = self
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    png = plot_png(_report().checks[0])
    assert png.startswith(b"\x89PNG")
    top, ratio = drawn["fig"].axes
    assert ratio.get_ylabel() == "container / native"
    labels = ratio.get_legend_handles_labels()[1]
    assert "allowed by the threshold" in labels and "fails the threshold" in labels
    failing = [c for c in ratio.collections if c.get_label() == "fails the threshold"][0]
    assert sorted(x for x, _ in failing.get_offsets()) == [1, 262144]
    assert io.BytesIO(png).getbuffer().nbytes > 1000


def test_the_console_shows_the_same_counts_and_the_deciding_sizes() -> None:
    rep = _report()
    n = counts(rep)
    lines = console_lines(rep)
    assert lines[0].startswith("verdict: BAD") and lines[1] == headline(rep)
    assert sum(ln.startswith("[error] ") for ln in lines) == n["errors"]
    assert sum(ln.startswith("[warning] ") for ln in lines) == n["warnings"]
    latency_row = next(ln for ln in lines if ln.startswith("osu_latency "))
    assert " 262144 " in latency_row and " fail " in latency_row
    bandwidth_row = next(ln for ln in lines if ln.startswith("osu_bw "))
    # the container is faster everywhere: the row shows the checked size nearest the limit, and a size measured on
    # one side only (a note) does not make it suboptimal
    assert " ok " in bandwidth_row and "1.200" in bandwidth_row and bandwidth_row.endswith(" good")
    few = console_lines(rep, limit=1)
    assert few[-1] == f"... and {n['errors'] + n['warnings'] - 1} more error(s)/warning(s) in the report"
