"""`dedal build-image`: the stages in order, each skipped when its output is current.

fetch -> build -> assemble -> verify -> publish. Every stage is idempotent on its own
(fetch: mirror and lock stamps; build: content-addressed layers; assemble: the image's
inputs digest; verify: a report for the same image sha256; publish: blobs already in
the registry are not sent), so a rerun after any failure resumes where it stopped.
``--from``/``--until`` pick a slice of the stages.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from dedal.errors import DedalError, Interrupted, UserError
from dedal.model.config import Settings
from dedal.model import verify_report
from dedal.model.artifacts import exclusive, sha256_file
from dedal.model.image_options import ImageOptions
from dedal.model.plan import Plan
from dedal.model.target import Target
from dedal.model.verify_report import VerifyRecord
from dedal.stages.assemble import assemble as do_assemble, image_paths
from dedal.stages.building import check_build, run_build
from dedal.stages.fetch import run_fetch
from dedal.stages.verify import (
    Given,
    Options,
    gate_allows,
    gate_refusal,
    host_busy,
    skipped_text,
    verdict_with,
    verify as run_verify,
    verify_options as merge_verify_options,
)
from dedal.stages.workspace import Prepared, prepare
from dedal.ui.progress import BuildProgress

STAGES = ("fetch", "build", "assemble", "verify", "publish")


class StageFailed(DedalError):
    """A stage finished but its result is a failure (build errors, a failed verification)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class StageRecord:
    name: str
    status: str = "pending"  # done | current | skipped | failed | interrupted | pending
    seconds: float = 0.0
    detail: str = ""


@dataclass
class PipelineSummary:
    env: str
    stages: List[StageRecord] = field(default_factory=list)
    image: str = ""
    image_size: int = 0
    image_sha256: str = ""
    layers_built: int = 0
    layers_reused: int = 0
    verdict: str = ""
    skipped: str = ""  # planned checks that did not run ("GPU checks skipped: no GPU")
    findings: str = ""  # the report's errors and warnings by code ("2 warnings: startup-overhead, latency-noisy")
    report: str = ""
    published: List[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""
    failure: Optional[DedalError] = field(default=None, repr=False)

    @property
    def verdict_text(self) -> str:
        """The verdict with what did not run, as the report says it: ``good (GPU checks skipped: no GPU)``."""
        return verdict_with(self.verdict, self.skipped)

    @property
    def ok(self) -> bool:
        return not self.error and all(s.status != "failed" for s in self.stages)

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        data.pop("failure", None)
        data["ok"] = self.ok
        return data


def stage_range(start: str, until: str) -> List[str]:
    for name in (start, until):
        if name not in STAGES:
            raise UserError(f"unknown stage {name!r} (stages: {', '.join(STAGES)})")
    first, last = STAGES.index(start), STAGES.index(until)
    if first > last:
        raise UserError(f"--from {start} comes after --until {until}")
    return list(STAGES[first : last + 1])


def _registry(target: Target) -> str:
    if target.env is not None and target.env.registry:
        return target.env.registry
    return target.settings.registry


def _image_path(target: Target, plan: Optional[Plan]) -> Path:
    """Where `dedal assemble` puts this environment's image by default; ``plan``: this run's,
    if a stage prepared it (else the target's is read, nothing written)."""
    return image_paths(target.settings, plan if plan is not None else target.plan(), None, [])[0]


def _verify_report(outdir: Path, sha256: str, settings_sha256: str) -> Tuple[Optional[VerifyRecord], Optional[str]]:
    """(the report, None) for a finished verification of exactly this image (same sha256)
    with the same settings (an older report without their digest is not); else (None, why
    verify must run again)."""
    try:
        record = verify_report.load(outdir / "verify.json")
    except UserError:  # none, unreadable or not JSON: there is no current report
        return None, f"no readable {outdir / 'verify.json'}"
    if record.is_of(sha256, settings_sha256):
        return record, None
    if record.meta.image_sha256 != sha256:
        return None, "the report is of another image (sha256)"
    if record.meta.settings_sha256 != settings_sha256:
        return None, "the report was made with other verification settings"
    return None, "the report has no verdict (an unfinished verification)"


def verify_current(outdir: Path, sha256: str, settings_sha256: str) -> Optional[str]:
    """None when ``outdir/verify.json`` is the finished verification of the image of this
    ``sha256`` with these settings (its stamp: ``meta.image_sha256`` and
    ``meta.settings_sha256``), else why verify must run again."""
    return _verify_report(outdir, sha256, settings_sha256)[1]


def _verify_report_current(outdir: Path, sha256: str, settings_sha256: str) -> Optional[VerifyRecord]:
    """The report of :func:`verify_current`, None without a current one."""
    return _verify_report(outdir, sha256, settings_sha256)[0]


def _report_dir(target: Target, image: Path) -> Path:
    """Where build-image keeps the verification report of this environment's image."""
    reports = Path(target.settings.reports_dir)
    return reports / target.name / target.tag if target.env is not None else reports / image.stem


def verify_options(target: Target, image: Path, outdir: Path, verify_env: Optional[Dict[str, str]] = None) -> Options:
    """The verification build-image runs: the environment file's dedal.verify section
    (defaults without one), ``verify_env`` over its variables; merged and checked as
    ``dedal verify --env-file`` merges and checks them (:func:`dedal.stages.verify.options.verify_options`)."""
    spec = target.env.verify if target.env is not None else None
    return merge_verify_options(image, outdir, target.settings, spec, Given(env=dict(verify_env or {})))


def run_pipeline(
    target: Target,
    image: ImageOptions,
    *,
    stages: List[str],
    executor: str,
    jobs: int,
    keep_going: bool,
    quiet: bool = False,
    verify_env: Optional[Dict[str, str]] = None,
    reverify: bool = False,
) -> PipelineSummary:
    """Run ``stages`` of ``target``'s environment in order. The plan is prepared once (by
    fetch, else by the first stage that needs it) and every later stage takes it;
    ``image`` (the image options and date) the command resolved."""
    settings: Settings = target.settings
    prepared: List[Prepared] = []  # the one plan of this run, once a stage has prepared it

    def the_plan() -> Prepared:
        if not prepared:
            prepared.append(prepare(target))
        return prepared[0]

    summary = PipelineSummary(env=target.name, stages=[StageRecord(s) for s in STAGES])
    records = {r.name: r for r in summary.stages}
    for r in summary.stages:
        if r.name not in stages:
            r.status = "skipped"
            r.detail = "not selected"
    started = time.monotonic()
    progress = BuildProgress(0, title=f"build-image {target.name}", quiet=quiet)
    note: Callable[[str], None] = progress.note

    def run(name: str, fn: Callable[[StageRecord], None]) -> None:
        record = records[name]
        note(f"== {name}")
        t0 = time.monotonic()
        try:
            fn(record)
        except (Interrupted, KeyboardInterrupt) as exc:  # KeyboardInterrupt: Ctrl-C where no stage holds signals
            stop = Interrupted.by(getattr(exc, "signum", signal.SIGINT), name)  # one wording, whatever stopped
            record.status = "interrupted"
            record.detail = f"by signal {stop.signal_name}"
            record.seconds = round(time.monotonic() - t0, 2)
            summary.error = stop.one_line()
            summary.failure = stop
            raise stop from None
        except DedalError as exc:
            record.status = "failed"
            record.detail = exc.one_line()
            record.seconds = round(time.monotonic() - t0, 2)
            summary.error = f"{name}: {exc.one_line()}"
            summary.failure = exc
            raise
        record.seconds = round(time.monotonic() - t0, 2)
        if record.status == "pending":
            record.status = "done"

    def fetch(record: StageRecord) -> None:
        result, fetched = run_fetch(target, progress=progress)
        prepared[:] = [fetched]
        sources = f"{result.sources} sources ({result.fetched} fetched)"
        record.detail = f"{sources}, {'concretized' if result.concretized else 'lock reused'}"
        if not result.concretized and result.fetched == 0:
            record.status = "current"

    def build(record: StageRecord) -> None:
        if prepared:  # by fetch
            cache = check_build(prepared[0].plan, settings)
        else:  # every check before the work directory is written
            lock = target.read_lock()
            plan = target.work_plan(lock)
            cache = check_build(plan, settings)
            prepared.append(prepare(target, lock, plan))
        result = run_build(
            prepared[0], settings, cache, executor=executor, jobs=jobs, keep_going=keep_going, quiet=quiet
        )
        summary.layers_built = len(result.built)
        summary.layers_reused = len(result.reused)
        record.detail = f"{len(result.built)} built, {len(result.reused)} reused"
        if not result.built and result.ok:
            record.status = "current"
        stop = result.interruption()
        if stop is not None:
            raise stop
        if result.detached:
            raise StageFailed(
                f"slurm.detach: {result.jobs + result.adopted} Slurm job(s) left to build the layers "
                f"without dedal; run this again once `dedal status` shows them done"
            )
        if not result.ok:
            failed = (
                "; ".join(f"{k}: {v}" for k, v in result.failed.items())
                or f"{len(result.blocked)} package(s) not built"
            )
            raise StageFailed(f"{len(result.failed)} package(s) failed: {failed}")

    def assemble(record: StageRecord) -> None:
        plan, _path, lock = the_plan()
        result = do_assemble(plan, image, settings, lock=lock, progress=note)
        summary.image, summary.image_size, summary.image_sha256 = result.image, result.size, result.sha256
        record.detail = f"{result.image} ({result.size / 2**20:.1f} MiB, {len(result.layers)} layers)"
        if result.status == "present":
            record.status = "current"

    def need_image() -> None:
        if summary.image:
            return
        path = _image_path(target, prepared[0].plan if prepared else None)
        if not path.is_file():
            raise UserError(f"no image {path} yet: run the assemble stage first (--from assemble)")
        summary.image, summary.image_size, summary.image_sha256 = str(path), path.stat().st_size, sha256_file(path)

    def verify(record: StageRecord) -> None:
        need_image()
        spec = target.env.verify if target.env is not None else None
        if spec is not None and not spec.enabled:
            record.status, record.detail = "skipped", "verification disabled in the environment file"
            return
        outdir, opts, current = report_of_image()
        # a verdict the gate refuses is measured again, not reused: the same image and settings
        # on a quieter machine or a later day may measure within the thresholds, and a bad
        # report kept as current would refuse the image for good (--reverify was the only way
        # out). What only lacks checks that could not run here (no GPU) would lack them again.
        # So is a report measured on a busy host, once this host is quiet: its host-busy
        # finding alone makes it suboptimal, a verdict of the load that the gate would publish
        # as the image's.
        refused = current is not None and not gate_allows(current.verdict, settings.verify_gate)
        busy = current is not None and not refused and current.measured_busy and not host_busy()
        again = refused or busy
        if current is not None and not reverify and not again:
            take_report(current, outdir)
            record.status, record.detail = (
                "current",
                (f"verdict {current.verdict_text or summary.verdict} (report of this image)"),
            )
        else:
            if refused and not reverify:
                note(
                    f"the report of this image has verdict {current.verdict_text or current.verdict}, refused by "
                    f"verify_gate {settings.verify_gate}: verifying again"
                )
            elif busy and not reverify:
                note(
                    f"the report of this image (verdict {current.verdict}) was measured on a busy host "
                    "(host-busy), and this host is quiet now: verifying again"
                )
            outcome = run_verify(opts, progress=note)
            summary.verdict = outcome.report.overall
            summary.skipped = skipped_text(outcome.report.checks)
            summary.findings = verify_report.findings_in_brief(outcome.report)
            summary.report = str(outcome.paths.get("report.md", outdir / "report.md"))
            record.detail = f"verdict {outcome.report.verdict_text}; report {summary.report}"
            if again and not reverify:
                why = " on a busy host" if busy else ""
                record.detail += f" (measured again: the last report's verdict was {current.verdict}{why})"
        apply_gate()

    def report_of_image() -> Tuple[Path, Options, Optional[VerifyRecord]]:
        """Where the image's report lies, the verification build-image runs, and the report of
        exactly this image with those settings (None without one)."""
        outdir = _report_dir(target, Path(summary.image))
        opts = verify_options(target, Path(summary.image), outdir, verify_env)
        return outdir, opts, _verify_report_current(outdir, summary.image_sha256, opts.settings_digest())

    def take_report(report: VerifyRecord, outdir: Path) -> None:
        summary.verdict, summary.report = report.verdict, str(outdir / "report.md")
        summary.skipped = report.skipped
        summary.findings = verify_report.findings_in_brief(report)

    def apply_gate() -> None:
        """``verify_gate`` on the verdict of this image; an image without one is ``unverified``."""
        gate = settings.verify_gate
        verdict = summary.verdict or "unverified"
        reason, overrides = gate_refusal(verdict, gate, summary.skipped)
        if reason:
            anyway = " or ".join(f"`dedal -s {o} build-image ...`" for o in overrides)
            where = (
                f"see {summary.report}"
                if summary.report
                else (
                    f"no current verification report of {summary.image} (`dedal build-image --from verify` makes one)"
                )
            )
            raise StageFailed(f"{reason}: the image is not published ({anyway} publishes it anyway); {where}")
        if gate == "off" and not gate_allows(verdict):
            note(f"verification verdict {verdict}, published anyway (verify_gate off)")

    def publish(record: StageRecord) -> None:
        registry = _registry(target)
        if not registry:
            record.status, record.detail = "skipped", "no registry configured (dedal.registry or setting registry)"
            return
        need_image()
        spec = target.env.verify if target.env is not None else None
        if records["verify"].status not in ("done", "current") and (spec is None or spec.enabled):
            # verify did not run here (--from publish): the gate judges the image's current report
            outdir, _, current = report_of_image()
            if current is not None:
                take_report(current, outdir)
            apply_gate()
        # imported here: the registry client (requests) and GitPython would add ~0.25 s to every `dedal` start, --help included
        from dedal.adapters import git
        from dedal.adapters.registry import registry_access
        from dedal.stages.publish import publish as do_publish, source_url

        attachments = []
        outdir = Path(summary.report).parent if summary.report else None
        if outdir is not None and outdir.is_dir():
            attachments.append(outdir)  # as CI attaches it: report, plots, verify.json, the logs as one archive
        sbom = Path(summary.image).with_name(Path(summary.image).name.replace(".sif", ".sbom.cdx.json"))
        if sbom.is_file():
            attachments.append(sbom)
        ref = registry if ":" in registry.split("/", 3)[-1] else f"{registry}:{target.tag}"
        source, revision = git.origin(target.env.directory) if target.env else (None, None)
        result = do_publish(
            summary.image,
            [ref],
            description=target.env.description if target.env else None,
            source=source_url(source, strict=False) if source else None,
            revision=revision,
            attachments=attachments,
            progress=note,
            gate=settings.verify_gate,
            access=registry_access(settings),
            sign=bool(settings.sign),
            sign_keyidx=int(settings.sign_keyidx),
            sign_passphrase=os.environ.get("DEDAL_SIGN_PASSPHRASE"),
            provenance=bool(settings.provenance),
        )
        summary.published = list(result.references)
        record.detail = f"{', '.join(result.references)} ({len(result.blobs_uploaded)} blob(s) uploaded)"

    steps = {"fetch": fetch, "build": build, "assemble": assemble, "verify": verify, "publish": publish}
    try:  # one build-image of an environment at a time: a second one waits, then finds the stages current
        with exclusive(target.workdir, f"environment {target.name}", note):
            for name in stages:
                run(name, steps[name])
    except DedalError:
        for later in stages[stages.index(name) + 1 :]:
            records[later].detail = f"not run: {name} {records[name].status}"
    finally:
        summary.seconds = round(time.monotonic() - started, 2)
    return summary
