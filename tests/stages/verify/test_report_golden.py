"""verify's report.md, against a golden file: the text ``write_report`` writes (its
``render_markdown``, with the plot names it gives; the plots themselves take matplotlib
seconds and are not text) for a fixed report: a latency check that fails at one size, a
bandwidth check with a size measured in the container only, findings of each severity,
a log, the host's facts and provenance with fixed values. ``DEDAL_UPDATE_GOLDEN=1``
rewrites the golden file."""

from __future__ import annotations

from dedal.stages.verify.facts import HostFacts
from dedal.stages.verify.report import render_markdown, slug
from tests.fixtures.golden import assert_golden
from tests.stages.verify.test_report_counts import _report


def test_report_md_matches_the_golden_file() -> None:
    report = _report()
    report.logs = [{"source": "container/osu_latency.log", "kind": "osu", "verdict": "ok"}]
    report.host = HostFacts(has_infiniband=True, multi_node=False, gpus=0)
    report.meta = {"dedal": "0.0.0+golden", "started": "2023-11-14T22:13:20Z", "image": "demo.sif"}
    plots = {c.name: f"{slug(c.name)}.png" for c in report.checks}
    assert_golden("report.md", render_markdown(report, plots))
