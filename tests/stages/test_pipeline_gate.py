"""build-image's verify stage and the publish gate (setting verify_gate) when planned checks did
not run: a GPU image verified on a host without GPU is never "good" enough for the strict gate."""

from __future__ import annotations

import dataclasses

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from dedal.errors import DedalError
from dedal.model.config import load_settings
from dedal.model.artifacts import sha256_file
from dedal.stages import pipeline
from dedal.stages.verify import findings as F
from dedal.stages.verify.checks import CheckResult, skipped_check
from dedal.stages.verify.report import VerifyReport, write_report
from dedal.model.image_options import ImageOptions
from dedal.model.target import Target


def _gpu_report(image: Path, sha256: str, target: Target) -> VerifyReport:
    """What `dedal verify` of a GPU image says on a host without GPU: good, GPU checks skipped;
    made with the settings build-image verifies with."""
    checks = [
        CheckResult("osu_latency", "latency", "us", "good"),
        skipped_check("osu_latency D D", "latency", "us", "no GPU", gpu=True),
    ]
    digest = pipeline.verify_options(target, image, _outdir(target, image)).settings_digest()
    return VerifyReport(image=str(image), checks=checks, meta={"image_sha256": sha256, "settings_sha256": digest})


def _outdir(target: Target, image: Path) -> Path:
    return Path(target.settings.reports_dir) / image.stem


def _target(tmp_path: Path, monkeypatch, gate: str):
    image = tmp_path / "images" / "gpu.sif"
    image.parent.mkdir()
    image.write_bytes(b"not really a SIF: the verify stage only hashes it here")
    monkeypatch.setattr(pipeline, "_image_path", lambda target, plan: image)
    settings = load_settings(
        config_file=None,
        environ={},
        overrides={"data_dir": str(tmp_path / "data"), "cache_dir": str(tmp_path / "cache"), "verify_gate": gate},
    )
    return Target(settings=settings, name="gpu"), image


def _run(target: Target, **kw) -> pipeline.PipelineSummary:
    return pipeline.run_pipeline(
        target,
        ImageOptions(),
        stages=["verify", "publish"],
        executor="local",
        jobs=1,
        keep_going=False,
        quiet=True,
        **kw,
    )


@pytest.mark.parametrize("fresh", [False, True], ids=["report-of-this-image", "verified-now"])
def test_the_strict_gate_refuses_skipped_gpu_checks(tmp_path, monkeypatch, fresh):
    target, image = _target(tmp_path, monkeypatch, "good")
    report = _gpu_report(image, sha256_file(image), target)
    outdir = Path(target.settings.reports_dir) / image.stem
    if fresh:  # the verify stage runs: its outcome carries the report
        monkeypatch.setattr(
            pipeline,
            "run_verify",
            lambda opts, progress=None: SimpleNamespace(report=report, paths=write_report(report, opts.output)),
        )
    else:  # a finished verification of the same image is read back from its verify.json
        write_report(report, outdir)
    summary = _run(target, reverify=fresh)
    stages = {s.name: s for s in summary.stages}
    assert stages["verify"].status == "failed" and not summary.ok
    assert isinstance(summary.failure, DedalError)
    assert summary.verdict == "good" and summary.verdict_text == "good (GPU checks skipped: no GPU)"
    detail = stages["verify"].detail
    assert "verdict good (GPU checks skipped: no GPU)" in detail and "not published" in detail
    assert "verify_gate=passed" in detail and "verify_gate=off" in detail
    assert stages["publish"].status == "pending" and "not run" in stages["publish"].detail


def test_the_default_gate_lets_skipped_gpu_checks_through(tmp_path, monkeypatch):
    target, image = _target(tmp_path, monkeypatch, "passed")
    write_report(_gpu_report(image, sha256_file(image), target), Path(target.settings.reports_dir) / image.stem)
    summary = _run(target)
    stages = {s.name: s for s in summary.stages}
    assert summary.ok and stages["verify"].status == "current", stages["verify"].detail
    assert summary.skipped == "GPU checks skipped: no GPU" and summary.to_json()["skipped"] == summary.skipped
    assert stages["publish"].status == "skipped"  # no registry configured


@pytest.mark.parametrize("fresh", [False, True], ids=["report-of-this-image", "verified-now"])
def test_the_summary_names_the_warnings_behind_a_suboptimal_verdict(tmp_path, monkeypatch, fresh):
    target, image = _target(tmp_path, monkeypatch, "passed")
    digest = pipeline.verify_options(target, image, _outdir(target, image)).settings_digest()
    checks = [
        CheckResult("dedal_init intra-node job wall time", "init", "ms", "good", [F.warning("startup-overhead", "m")]),
        CheckResult("dedal_latency intra-node", "latency", "us", "suboptimal", [F.warning("latency-noisy", "m")]),
    ]
    report = VerifyReport(
        image=str(image),
        checks=checks,
        findings=[F.info("cpu-target", "m")],
        meta={"image_sha256": sha256_file(image), "settings_sha256": digest},
    )
    if fresh:
        monkeypatch.setattr(
            pipeline,
            "run_verify",
            lambda opts, progress=None: SimpleNamespace(report=report, paths=write_report(report, opts.output)),
        )
    else:
        write_report(report, _outdir(target, image))
    summary = _run(target, reverify=fresh)
    assert summary.ok and summary.verdict == "suboptimal", summary.error
    assert summary.findings == "2 warnings: startup-overhead, latency-noisy"
    assert summary.to_json()["findings"] == summary.findings


def test_an_older_report_without_skipped_checks_passes_the_strict_gate(tmp_path, monkeypatch):
    target, image = _target(tmp_path, monkeypatch, "good")
    report = _gpu_report(image, sha256_file(image), target)
    report.checks = report.checks[:1]  # as written before checks could be skipped
    write_report(report, Path(target.settings.reports_dir) / image.stem)
    summary = _run(target)
    assert summary.ok and summary.verdict_text == "good", summary.error


def test_a_report_made_with_other_settings_is_not_current(tmp_path, monkeypatch):
    """The same image verified with other settings (here: the environment file's application
    checks changed) is verified again, not judged by the old report."""
    from dedal.model.envfile import AppCheck, EnvFile, VerifySpec

    target, image = _target(tmp_path, monkeypatch, "passed")
    write_report(_gpu_report(image, sha256_file(image), target), _outdir(target, image))
    ran = []
    monkeypatch.setattr(
        pipeline,
        "run_verify",
        lambda opts, progress=None: (
            ran.append(opts)
            or SimpleNamespace(
                report=_gpu_report(image, sha256_file(image), target),
                paths=write_report(_gpu_report(image, sha256_file(image), target), opts.output),
            )
        ),
    )
    assert _run(target).ok and not ran  # same settings: the report is current
    ring = AppCheck(name="ring", command=["python3", "ring.py"])
    target = replace(
        target,
        env=EnvFile(
            path=tmp_path / "env.yaml",
            spack={},
            name="gpu",  # a Target is frozen
            verify=VerifySpec(apps=[ring]),
        ),
    )
    outdir = Path(target.settings.reports_dir) / "gpu" / "latest"  # build-image's report directory with an env file
    write_report(_gpu_report(image, sha256_file(image), target), outdir)
    assert _run(target).ok and not ran  # the report of these settings is current too
    target.env.verify.apps[0].expect = "ranks=2"
    summary = _run(target)
    assert len(ran) == 1 and [a.expect for a in ran[0].apps] == ["ranks=2"]
    assert {s.name: s.status for s in summary.stages}["verify"] == "done"


def _suboptimal_report(image: Path, target: Target) -> VerifyReport:
    checks = [CheckResult("osu_latency", "latency", "us", "suboptimal")]
    digest = pipeline.verify_options(target, image, _outdir(target, image)).settings_digest()
    return VerifyReport(
        image=str(image), checks=checks, meta={"image_sha256": sha256_file(image), "settings_sha256": digest}
    )


def _verdict_report(image: Path, target: Target, verdict: str) -> VerifyReport:
    report = _suboptimal_report(image, target)
    report.checks = [CheckResult("osu_latency", "latency", "us", verdict)]
    return report


@pytest.mark.parametrize(
    "gate, last, again",
    [
        ("passed", "bad", True),
        ("passed", "failed", True),
        ("good", "suboptimal", True),
        ("passed", "suboptimal", False),
        ("off", "bad", False),
    ],
)
def test_a_report_the_gate_refuses_is_measured_again(tmp_path, monkeypatch, gate, last, again):
    """A verdict the gate refuses is not reused as current: the same image measured again on a
    quieter machine may pass (a bad report of the README's demo on a busy machine otherwise
    refused the image until --reverify); with the gate off, or a verdict it lets through, the
    report is current."""
    target, image = _target(tmp_path, monkeypatch, gate)
    write_report(_verdict_report(image, target, last), _outdir(target, image))
    ran = []
    monkeypatch.setattr(
        pipeline,
        "run_verify",
        lambda opts, progress=None: (
            ran.append(opts)
            or SimpleNamespace(
                report=_verdict_report(image, target, "good"),
                paths=write_report(_verdict_report(image, target, "good"), opts.output),
            )
        ),
    )
    summary = _run(target)
    verify = {s.name: s for s in summary.stages}["verify"]
    if again:
        assert len(ran) == 1 and summary.ok and summary.verdict == "good", verify.detail
        assert verify.status == "done" and f"measured again: the last report's verdict was {last}" in verify.detail
    else:
        assert not ran and verify.status == "current" and summary.verdict == last, verify.detail


@pytest.mark.parametrize("busy_now, again", [(False, True), (True, False)], ids=["host-quiet-now", "host-still-busy"])
def test_a_report_measured_on_a_busy_host_is_measured_again_once_the_host_is_quiet(
    tmp_path, monkeypatch, busy_now, again
):
    """A report whose preflight found the host busy (host-busy: suboptimal however good the
    checks) is measured again when this host is quiet now: that verdict is the load's, not the
    image's, and the gate (passed) would publish it as the image's. While the host is still
    busy the report is current (measuring again would say host-busy again)."""
    target, image = _target(tmp_path, monkeypatch, "passed")
    report = _verdict_report(image, target, "good")
    report.findings = [F.warning("host-busy", "the host is busy before the runs start (load average 5.10 on 2 CPU(s))")]
    write_report(report, _outdir(target, image))
    monkeypatch.setattr(pipeline, "host_busy", lambda: busy_now)
    ran = []
    good = _verdict_report(image, target, "good")
    monkeypatch.setattr(
        pipeline,
        "run_verify",
        lambda opts, progress=None: (
            ran.append(opts) or SimpleNamespace(report=good, paths=write_report(good, opts.output))
        ),
    )
    summary = _run(target)
    verify = {s.name: s for s in summary.stages}["verify"]
    if again:
        assert len(ran) == 1 and summary.verdict == "good", verify.detail
        assert "measured again: the last report's verdict was suboptimal on a busy host" in verify.detail
    else:
        assert not ran and verify.status == "current" and summary.verdict == "suboptimal", verify.detail


def _publish_only(tmp_path, monkeypatch, gate: str, report: bool):
    """build-image --from publish: verify does not run, the gate judges the image's report."""
    import dedal.stages.publish as publish_stage

    target, image = _target(tmp_path, monkeypatch, gate)
    target.settings.registry = "oras://127.0.0.1:9/esd/gpu"  # nothing listens: a refusal must come first
    if report:
        write_report(_suboptimal_report(image, target), _outdir(target, image))
    sent = []
    monkeypatch.setattr(
        publish_stage,
        "publish",
        lambda sif, refs, **kw: sent.append(kw) or SimpleNamespace(references=refs, blobs_uploaded=[]),
    )
    summary = pipeline.run_pipeline(
        target, ImageOptions(), stages=["publish"], executor="local", jobs=1, keep_going=False, quiet=True
    )
    return summary, {s.name: s for s in summary.stages}, sent, _outdir(target, image)


def test_publish_alone_applies_the_gate_to_the_report_of_the_image(tmp_path, monkeypatch):
    summary, stages, sent, _ = _publish_only(tmp_path, monkeypatch, "good", report=True)
    assert stages["publish"].status == "failed" and not sent and not summary.ok
    assert "verification verdict suboptimal, refused by verify_gate good" in stages["publish"].detail
    assert "not published" in stages["publish"].detail


def test_publish_alone_attaches_the_report_the_gate_lets_through(tmp_path, monkeypatch):
    summary, stages, sent, outdir = _publish_only(tmp_path, monkeypatch, "passed", report=True)
    assert summary.ok and stages["publish"].status == "done", stages["publish"].detail
    assert summary.verdict == "suboptimal" and outdir in sent[0]["attachments"]


@pytest.mark.parametrize("gate", ["passed", "good"])
def test_publish_alone_refuses_an_unverified_image(tmp_path, monkeypatch, gate):
    summary, stages, sent, _ = _publish_only(tmp_path, monkeypatch, gate, report=False)
    assert stages["publish"].status == "failed" and not sent
    detail = stages["publish"].detail
    assert f"verification verdict unverified, refused by verify_gate {gate}" in detail
    assert "no current verification report" in detail and "--from verify" in detail


def test_publish_alone_with_the_gate_off_publishes_an_unverified_image(tmp_path, monkeypatch):
    summary, stages, sent, _ = _publish_only(tmp_path, monkeypatch, "off", report=False)
    assert summary.ok and len(sent) == 1 and stages["publish"].status == "done"


@pytest.mark.parametrize(
    "verify",
    [
        {"ranks": 1},
        {"ranks": 1, "nodes": 2, "launcher": "srun"},
        {"ranks": 4, "repetitions": 3, "env": {"UCX_TLS": "tcp"}, "thresholds": {"bandwidth_pct": 5}},
    ],
)
def test_build_image_and_dedal_verify_merge_the_env_file_alike(tmp_path, monkeypatch, verify):
    """One merge: build-image's verification and `dedal verify IMAGE --env-file` of the same file
    have the same options (settings digest), ``ranks: 1`` on one node accepted by both."""
    import yaml

    from dedal.cli import build_parser
    from dedal.model.envfile import load_env
    from dedal.stages.verify.options import options_from_args

    target, image = _target(tmp_path, monkeypatch, "good")
    env_file = tmp_path / "env.yaml"
    env_file.write_text(yaml.safe_dump({"spack": {"specs": ["zlib"]}, "dedal": {"verify": verify}}))
    target = dataclasses.replace(target, env=load_env(env_file))  # Target is frozen
    monkeypatch.setenv("DEDAL_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DEDAL_CACHE_DIR", str(tmp_path / "cache"))
    from_pipeline = pipeline.verify_options(target, image, _outdir(target, image))
    from_command = options_from_args(
        build_parser().parse_args(
            ["verify", str(image), "--env-file", str(env_file), "-o", str(_outdir(target, image))]
        )
    )
    assert from_pipeline.ranks == from_command.ranks == verify["ranks"]
    assert from_pipeline.settings_digest() == from_command.settings_digest()
