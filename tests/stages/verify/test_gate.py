"""Issue 23: the publish gate follows the verification verdict (setting verify_gate)."""

from __future__ import annotations

import json

import pytest

from dedal.model.config import load_settings
from dedal.stages.verify.checks import CheckResult, skipped_check, skipped_of, skipped_text
from dedal.stages.verify.findings import GATES, VERDICTS, gate_allows, gate_refusal
from dedal.stages.verify.report import VerifyReport, write_report


def test_the_default_gate_lets_passed_verifications_through() -> None:
    assert [v for v in VERDICTS if gate_allows(v)] == ["good", "suboptimal"]


def test_gate_good_and_off() -> None:
    assert [v for v in VERDICTS if gate_allows(v, "good")] == ["good"]
    assert all(gate_allows(v, "off") for v in VERDICTS)


def test_an_unknown_gate_is_refused() -> None:
    with pytest.raises(ValueError, match="verify_gate"):
        gate_allows("good", "sometimes")


def test_verify_gate_is_a_setting(tmp_path) -> None:
    settings = load_settings(config_file=None, overrides={"verify_gate": "good"}, environ={})
    assert settings.verify_gate == "good" and set(GATES) == {"passed", "good", "off"}
    assert load_settings(config_file=None, environ={}).verify_gate == "passed"


# -- a verification whose planned checks did not all run (a GPU image verified without GPU)

GPU_SKIPPED = "GPU checks skipped: no GPU"


def test_the_strict_gate_refuses_what_did_not_run_and_the_default_lets_it_through() -> None:
    assert not gate_allows("good", "good", GPU_SKIPPED)
    assert gate_allows("good", "good", "") and gate_allows("good", "good")  # nothing skipped (older reports)
    assert gate_allows("good", "passed", GPU_SKIPPED) and gate_allows("suboptimal", "passed", GPU_SKIPPED)
    assert gate_allows("good", "off", GPU_SKIPPED)
    assert not gate_allows("bad", "passed", GPU_SKIPPED)


def test_a_refusal_names_what_was_skipped_and_the_settings_that_publish_it_anyway() -> None:
    reason, overrides = gate_refusal("good", "good", GPU_SKIPPED)
    assert "verdict good (GPU checks skipped: no GPU)" in reason and "verify_gate good" in reason
    assert overrides == ["verify_gate=passed", "verify_gate=off"]
    reason, overrides = gate_refusal("bad", "passed", GPU_SKIPPED)  # passed would not help: only off
    assert "verdict bad (GPU checks skipped: no GPU)" in reason and overrides == ["verify_gate=off"]
    assert gate_refusal("good", "passed", GPU_SKIPPED) == ("", [])
    assert gate_refusal("good", "good") == ("", [])


def test_what_was_skipped_is_read_back_from_verify_json(tmp_path) -> None:
    """verify.json carries the skipped checks; a report without them (older ones) skipped nothing."""
    gpu = skipped_check("osu_latency D D", "latency", "us", "no GPU", gpu=True)
    report = VerifyReport(image="gpu.sif", checks=[CheckResult("osu_latency", "latency", "us", "good"), gpu])
    write_report(report, tmp_path)
    data = json.loads((tmp_path / "verify.json").read_text())
    assert data["verdict"] == "good" and skipped_of(data) == GPU_SKIPPED == skipped_text(report.checks)
    data["checks"] = [c for c in data["checks"] if c["verdict"] != "skipped"]
    assert skipped_of(data) == ""
    assert skipped_of({"verdict": "good"}) == "" and skipped_of({"checks": "?"}) == "" and skipped_of([1]) == ""
    cpu = skipped_check("osu_latency", "latency", "us", "not repeated", gpu=False)
    assert skipped_of({"checks": [gpu.to_json(), cpu.to_json()]}) == "checks skipped: no GPU; not repeated"
