"""verify.json read back (dedal.model.verify_report): what publish, the pipeline and CI see."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dedal.errors import UserError
from dedal.model import verify_report as vr

REPORT = {
    "schema": 1,
    "image": "/images/demo/latest.sif",
    "verdict": "good",
    "exit_code": 0,
    "verdict_text": "good (GPU checks skipped: no GPU)",
    "checks": [
        {"name": "osu_latency", "metric": "latency", "unit": "us", "verdict": "good"},
        {"name": "nccl", "metric": "busbw", "unit": "GB/s", "verdict": "skipped", "skip_reason": "no GPU", "gpu": True},
    ],
    "findings": [{"severity": "info", "code": "ucx-transports", "message": "m", "evidence": ["a", "b"]}],
    "measurements": {"osu_latency": {"unit": "us"}},
    "meta": {"image_sha256": "abc", "settings_sha256": "def", "dedal": "1.0"},
}


def test_a_report_is_read_into_frozen_records(tmp_path: Path) -> None:
    (tmp_path / "verify.json").write_text(json.dumps(REPORT))
    rec = vr.load(tmp_path / "verify.json")
    assert (rec.image, rec.verdict, rec.exit_code, rec.schema) == ("/images/demo/latest.sif", "good", 0, 1)
    assert [c.name for c in rec.checks] == ["osu_latency", "nccl"] and rec.checks[1].skipped and rec.checks[1].gpu
    assert rec.findings[0].evidence == ("a", "b") and rec.meta.raw["dedal"] == "1.0"
    assert rec.skipped == "GPU checks skipped: no GPU" and rec.verdict_text.startswith("good (")
    assert rec.is_of("abc", "def") and not rec.is_of("abc", "other") and not rec.is_of("xyz", "def")
    with pytest.raises(AttributeError):
        rec.verdict = "bad"  # type: ignore[misc]


@pytest.mark.parametrize(
    "data, verdict",
    [
        ({"verdict": "Suboptimal"}, "suboptimal"),
        ({"status": {"verdict": "BAD"}}, "bad"),
        ({"passed": False}, "fail"),
        ({"ok": True}, "pass"),
        ({"checks": []}, "unknown"),
        ([1, 2], "unknown"),
        ("text", "unknown"),
    ],
)
def test_the_verdict_of_any_attached_report(data, verdict) -> None:
    assert vr.from_json(data).verdict == verdict == vr.verdict_in(data)


def test_an_older_or_odd_report_gives_what_it_has() -> None:
    rec = vr.from_json({"verdict": "good", "checks": "?", "findings": [1], "meta": [], "exit_code": True})
    assert rec.checks == () and rec.findings == () and rec.exit_code is None and rec.skipped == ""
    assert not rec.is_of("abc", "def")  # no digests: not a report of this image
    assert not vr.from_json({"meta": REPORT["meta"]}).is_of("abc", "def")  # no verdict: cut short


def test_unreadable_reports_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "verify.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="--attach x: not valid JSON"):
        vr.load(bad, where="--attach x")
    with pytest.raises(UserError, match="no such file"):
        vr.load(tmp_path / "none.json")
    bad.write_text(json.dumps(REPORT))
    with pytest.raises(UserError, match="too large"):
        vr.load(bad, limit=10)


def test_exit_codes_and_verdict_words() -> None:
    assert [vr.exit_code(v) for v in ("good", "suboptimal", "bad", "failed", "unknown")] == [0, 0, 1, 1, 1]
    assert vr.verdict_with("good", "") == "good" and vr.verdict_with("good", "x") == "good (x)"


def test_the_errors_and_warnings_in_brief_name_the_report_s_and_each_check_s_codes() -> None:
    data = dict(
        REPORT,
        verdict="bad",
        checks=[
            {
                "name": "dedal_init intra-node job wall time",
                "verdict": "good",
                "findings": [{"severity": "warning", "code": "startup-overhead", "message": "m"}],
            },
            {
                "name": "dedal_bw intra-node",
                "verdict": "suboptimal",
                "findings": [
                    {"severity": "warning", "code": "bandwidth-noisy", "message": "65536 B"},
                    {"severity": "warning", "code": "bandwidth-noisy", "message": "131072 B"},
                    {"severity": "info", "code": "ucx-protocols", "message": "m"},
                ],
            },
            {"name": "odd", "verdict": "good", "findings": "not a list"},
        ],
        findings=[
            {"severity": "info", "code": "cpu-target", "message": "m"},
            {"severity": "error", "code": "ucx-tcp-inter-node", "message": "m"},
        ],
    )
    rec = vr.from_json(data)
    assert [f.code for f in rec.checks[1].findings] == ["bandwidth-noisy", "bandwidth-noisy", "ucx-protocols"]
    assert rec.checks[2].findings == ()
    # errors first; a code found twice is counted twice and named once, with its count; notes are left out
    assert vr.findings_in_brief(rec) == "1 error: ucx-tcp-inter-node; 3 warnings: startup-overhead, bandwidth-noisy (2)"
    assert vr.findings_in_brief(vr.from_json(REPORT)) == ""  # only a note: nothing to say under "good"
