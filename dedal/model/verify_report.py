"""``verify.json`` read back: the verification report as its readers need it.

The verify stage writes the file (:mod:`dedal.stages.verify.report`); publish (the verdict
annotation and the gate of an attached report), the pipeline (is there a current report of
this image?) and CI (which report directory names this image?) read it, and all three read
it through :func:`load` (or :func:`from_json` for data already read), so that each of them
sees the same verdict, the same skipped checks and the same provenance.

The reader is lenient about shape: a report written by an older dedal (no ``skip_reason``,
no ``settings_sha256``), or a file someone attached by hand (``passed: true``, ``status``),
gives a record with what it has; :attr:`VerifyRecord.verdict` is then "unknown". It is
strict only about bytes: a file that is not JSON, or over ``limit``, is a ``UserError``.
The checks' skipped text and the verdict rules are defined here once, for the writer too
(:func:`skipped_text` takes the stage's ``CheckResult`` as well as a :class:`CheckRecord`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Tuple, Union

from dedal.model.inputs import parse_json, read_input

__all__ = [
    "REPORT_LIMIT",
    "SCHEMA_VERSION",
    "SKIPPED",
    "CheckRecord",
    "FindingRecord",
    "ReportMeta",
    "VerifyRecord",
    "exit_code",
    "findings_in_brief",
    "from_json",
    "load",
    "skipped_text",
    "verdict_in",
    "verdict_with",
]

SCHEMA_VERSION = 1  # the ``schema`` of verify.json
SKIPPED = "skipped"  # the verdict of a check planned and not run
REPORT_LIMIT = 64 << 20  # bytes of a verify.json read back (measurements and logs make it larger than most inputs)


@dataclass(frozen=True)
class CheckRecord:
    """One check of the report (``checks[]``): its verdict, and why it did not run."""

    name: str
    metric: str
    unit: str
    verdict: str
    skip_reason: str = ""
    gpu: bool = False
    findings: Tuple[FindingRecord, ...] = ()  # the check's own: an exceeded threshold, a noisy size

    @property
    def skipped(self) -> bool:
        return self.verdict == SKIPPED

    @property
    def passed(self) -> bool:
        return self.verdict in ("good", "suboptimal")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CheckRecord":
        return cls(
            str(data.get("name", "")),
            str(data.get("metric", "")),
            str(data.get("unit", "")),
            str(data.get("verdict", "")),
            skip_reason=str(data.get("skip_reason") or ""),
            gpu=bool(data.get("gpu")),
            findings=_findings(data.get("findings")),
        )


@dataclass(frozen=True)
class FindingRecord:
    """One finding of the report (``findings[]``): what a log or a comparison showed."""

    severity: str
    code: str
    message: str
    evidence: Tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "FindingRecord":
        evidence = data.get("evidence")
        return cls(
            str(data.get("severity", "")),
            str(data.get("code", "")),
            str(data.get("message", "")),
            tuple(str(e) for e in evidence) if isinstance(evidence, list) else (),
        )


@dataclass(frozen=True)
class ReportMeta:
    """The provenance readers compare (``meta``): which image, verified with which settings.
    ``raw`` keeps the whole section (versions, commands, dates) for who shows it."""

    image_sha256: Optional[str] = None
    settings_sha256: Optional[str] = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> "ReportMeta":
        if not isinstance(data, Mapping):
            return cls()
        sha, settings = data.get("image_sha256"), data.get("settings_sha256")
        return cls(sha if isinstance(sha, str) else None, settings if isinstance(settings, str) else None, dict(data))


@dataclass(frozen=True)
class VerifyRecord:
    """A ``verify.json`` as read back. ``verdict`` is "unknown" where the file has none;
    ``written_verdict`` says whether it had one (a report cut short has not)."""

    image: str = ""
    verdict: str = "unknown"
    verdict_text: str = ""
    exit_code: Optional[int] = None
    checks: Tuple[CheckRecord, ...] = ()
    findings: Tuple[FindingRecord, ...] = ()
    meta: ReportMeta = field(default_factory=ReportMeta)
    measurements: Mapping[str, Any] = field(default_factory=dict)
    schema: Optional[int] = None
    written_verdict: bool = False

    @property
    def skipped(self) -> str:
        """What was planned and not run (:func:`skipped_text`): "" when everything ran."""
        return skipped_text(self.checks)

    @property
    def measured_busy(self) -> bool:
        """Whether the host was busy before the runs (preflight's finding ``host-busy``): the
        timings, and a verdict below good, may be the host's noise rather than the image's."""
        return any(f.code == "host-busy" for f in self.findings)

    def is_of(self, image_sha256: str, settings_sha256: str) -> bool:
        """Whether this is a finished verification of exactly this image with these settings
        (an older report without the settings' digest is not)."""
        return (
            self.written_verdict
            and self.meta.image_sha256 == image_sha256
            and self.meta.settings_sha256 == settings_sha256
        )


def verdict_in(data: Any) -> str:
    """The verdict of a report's data: ``verdict`` (string), else ``result``/``status``
    (a string, or an object with a ``verdict``), else ``passed``/``ok``/``pass`` (bool: "pass"
    or "fail"); "unknown" when there is none. Lower case."""
    if not isinstance(data, Mapping):
        return "unknown"
    for key in ("verdict", "result", "status"):
        value = data.get(key)
        if isinstance(value, str) and value:
            return value.lower()
        if isinstance(value, Mapping) and isinstance(value.get("verdict"), str):
            return value["verdict"].lower()
    for key in ("passed", "ok", "pass"):
        if isinstance(data.get(key), bool):
            return "pass" if data[key] else "fail"
    return "unknown"


def from_json(data: Any) -> VerifyRecord:
    """The record of a report's data (anything JSON gives: a list or a string is a report
    with nothing in it)."""
    if not isinstance(data, Mapping):
        return VerifyRecord()
    checks = data.get("checks")
    findings = data.get("findings")
    measurements = data.get("measurements")
    code = data.get("exit_code")
    schema = data.get("schema")
    return VerifyRecord(
        image=str(data.get("image") or ""),
        verdict=verdict_in(data),
        verdict_text=str(data.get("verdict_text") or ""),
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        checks=tuple(CheckRecord.from_json(c) for c in checks if isinstance(c, Mapping))
        if isinstance(checks, list)
        else (),
        findings=_findings(findings),
        meta=ReportMeta.from_json(data.get("meta")),
        measurements=dict(measurements) if isinstance(measurements, Mapping) else {},
        schema=schema if isinstance(schema, int) else None,
        written_verdict=bool(data.get("verdict")),
    )


def load(path: Union[str, Path], limit: int = REPORT_LIMIT, where: Optional[str] = None) -> VerifyRecord:
    """Read ``path`` (a ``verify.json``); a UserError naming ``where`` (default: the path)
    when it cannot be read, is over ``limit`` bytes, or is not JSON."""
    return from_json(parse_json(read_input(Path(path), limit), where or str(path)))


def _findings(data: Any) -> Tuple[FindingRecord, ...]:
    """A ``findings`` list of verify.json read back (the report's or a check's)."""
    if not isinstance(data, list):
        return ()
    return tuple(FindingRecord.from_json(f) for f in data if isinstance(f, Mapping))


def findings_in_brief(report: Any) -> str:
    """The errors and warnings of a report by their codes, for a line under its verdict:
    ``1 error: ucx-tcp-inter-node; 3 warnings: startup-overhead, latency-noisy (2)`` ("" when it
    has none; a code found more than once named once, with its count: "3 warnings:
    latency-noisy, bandwidth-noisy" read as a count that did not add up), so that "suboptimal"
    or "bad" says why without the report open. ``report``: a
    :class:`VerifyRecord` or the stage's report (its findings, and each check's)."""
    every = list(report.findings) + [f for c in report.checks for f in c.findings]
    parts = []
    for severity in ("error", "warning"):
        counts = Counter(f.code for f in every if f.severity == severity)  # in the order first found
        total = sum(counts.values())
        if total:
            plural = "" if total == 1 else "s"
            named = [code if n == 1 else f"{code} ({n})" for code, n in counts.items()]
            parts.append(f"{total} {severity}{plural}: {', '.join(named)}")
    return "; ".join(parts)


def skipped_text(checks: Iterable[Any]) -> str:
    """What was planned and not run, for the verdict: ``GPU checks skipped: no GPU`` ("" when
    everything ran). ``checks``: anything with ``skipped``, ``gpu`` and ``skip_reason``."""
    skipped = [c for c in checks if c.skipped]
    if not skipped:
        return ""
    what = "GPU checks" if all(c.gpu for c in skipped) else "checks"
    reasons = sorted({c.skip_reason for c in skipped if c.skip_reason})
    return f"{what} skipped: {'; '.join(reasons) or 'not run'}"


def verdict_with(verdict: str, skipped: str = "") -> str:
    """The verdict as people read it, with what did not run: ``good (GPU checks skipped: no GPU)``."""
    return f"{verdict} ({skipped})" if skipped else verdict


def exit_code(verdict: str) -> int:
    """Process exit code for a verification verdict: 0 when it passed (good, or suboptimal with
    warnings), 1 when a check failed or nothing could be verified."""
    return 0 if verdict in ("good", "suboptimal") else 1
