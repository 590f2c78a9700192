"""Findings (what a parser or a check noticed) and verdicts (what it means overall).

A :class:`Finding` is one observation with the log lines that prove it. Each finding
implies a verdict: by default ``info`` implies ``good``, ``warning`` implies
``suboptimal`` and ``error`` implies ``bad``; a finding may name another verdict
explicitly (a crash implies ``failed``, a one-rank NCCL run implies ``degenerate``).

Verdicts, from best to worst (:data:`VERDICT_ORDER`)::

    unknown < good < suboptimal < degenerate < bad < failed

``unknown`` means nothing recognizable was found, so any real observation replaces
it. ``degenerate`` (the measurement itself is meaningless, e.g. bus bandwidth of a
one-rank all-reduce) is worse than ``suboptimal`` because nothing can be concluded,
but better than ``bad`` (evidence of a real problem) and ``failed`` (the run crashed,
aborted or was truncated). Combining verdicts always keeps the worst one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from dedal.model.verify_report import verdict_with

SEVERITIES = ("info", "warning", "error")
VERDICTS = ("good", "suboptimal", "bad", "failed", "degenerate", "unknown")
VERDICT_ORDER = ("unknown", "good", "suboptimal", "degenerate", "bad", "failed")
_RANK = {v: i for i, v in enumerate(VERDICT_ORDER)}
_SEVERITY_VERDICT = {"info": "good", "warning": "suboptimal", "error": "bad"}

#: how many evidence lines a finding keeps (the count of all matches is in the message)
MAX_EVIDENCE = 5


@dataclass
class Finding:
    """One observation: ``severity`` (info|warning|error), a stable ``code`` (kebab-case),
    a one-line ``message`` for people, and ``evidence``: the log lines that prove it."""

    severity: str
    code: str
    message: str
    evidence: List[str] = field(default_factory=list)
    verdict: Optional[str] = None  # implied verdict; None = derived from severity

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r} (one of {', '.join(SEVERITIES)})")
        if self.verdict is not None and self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r} (one of {', '.join(VERDICTS)})")
        self.evidence = [str(e).rstrip("\r\n") for e in self.evidence][:MAX_EVIDENCE]

    @property
    def implied_verdict(self) -> str:
        return self.verdict or _SEVERITY_VERDICT[self.severity]

    def to_json(self) -> Dict[str, Any]:
        return {
            "severity": self.severity,
            "code": self.code,
            "message": self.message,
            "evidence": list(self.evidence),
            "verdict": self.implied_verdict,
        }

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Finding":
        return cls(
            severity=data["severity"],
            code=data["code"],
            message=data.get("message", ""),
            evidence=list(data.get("evidence") or []),
            verdict=data.get("verdict"),
        )


def info(code: str, message: str, evidence: Iterable[str] = (), verdict: Optional[str] = None) -> Finding:
    return Finding("info", code, message, list(evidence), verdict)


def warning(code: str, message: str, evidence: Iterable[str] = (), verdict: Optional[str] = None) -> Finding:
    return Finding("warning", code, message, list(evidence), verdict)


def error(code: str, message: str, evidence: Iterable[str] = (), verdict: Optional[str] = None) -> Finding:
    return Finding("error", code, message, list(evidence), verdict)


def verdict_rank(verdict: str) -> int:
    """Position in :data:`VERDICT_ORDER` (higher is worse)."""
    try:
        return _RANK[verdict]
    except KeyError:
        raise ValueError(f"unknown verdict {verdict!r} (one of {', '.join(VERDICTS)})") from None


def worst(*verdicts: str) -> str:
    """The worst of the given verdicts; ``unknown`` when none is given."""
    result = "unknown"
    for v in verdicts:
        if verdict_rank(v) > verdict_rank(result):
            result = v
    return result


def verdict_of(findings: Iterable[Finding], base: str = "unknown") -> str:
    """Combine ``base`` (what the data alone says) with the verdicts the findings imply."""
    return worst(base, *(f.implied_verdict for f in findings))


def as_finding(obj: Any) -> Finding:
    """Accept a Finding or its JSON dict."""
    if isinstance(obj, Finding):
        return obj
    return Finding.from_json(obj)


#: ``verify_gate`` values: which verification verdicts let an image be published
GATES = ("passed", "good", "off")
_PASSING = {"passed": ("good", "suboptimal", "pass"), "good": ("good",)}


def gate_allows(verdict: str, gate: str = "passed", skipped: str = "") -> bool:
    """Whether an image with this verification verdict may be published: ``passed`` (the default)
    lets good and suboptimal through, ``good`` only good with every planned check run (``skipped``:
    what did not run, as :func:`~dedal.stages.verify.checks.skipped_text` says it: a GPU image
    verified without GPU is not "good" for what was never measured), ``off`` everything (the
    report is still attached and shows the verdict)."""
    if gate not in GATES:
        raise ValueError(f"unknown verify_gate {gate!r} (one of {', '.join(GATES)})")
    if gate == "off":
        return True
    return verdict in _PASSING[gate] and not (gate == "good" and skipped)


def gate_refusal(verdict: str, gate: str, skipped: str = "") -> Tuple[str, List[str]]:
    """Why the gate refuses this verification, naming what did not run, and the settings that
    would publish it anyway (("", []) when it lets it through); the caller says how to set them."""
    if gate_allows(verdict, gate, skipped):
        return "", []
    reason = f"verification verdict {verdict_with(verdict, skipped)}, refused by verify_gate {gate}"
    if gate_allows(verdict, "passed"):  # only what did not run stops it
        return f"{reason} (it publishes only what was measured in full)", ["verify_gate=passed", "verify_gate=off"]
    return reason, ["verify_gate=off"]
