"""Issue 23: the publish gate follows the verification verdict (setting verify_gate)."""
from __future__ import annotations

import pytest

from dedal.model.config import load_settings
from dedal.stages.verify.findings import GATES, VERDICTS, gate_allows


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
