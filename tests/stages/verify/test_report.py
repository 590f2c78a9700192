"""The report: verify.json, report.md (verdict first), PNG plots; atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

from dedal.stages.verify.catalogue import gpu_planned
from dedal.stages.verify.checks import compare_bandwidth, compare_init, compare_latency
from dedal.stages.verify.compare import skipped_checks
from dedal.stages.verify.transports import HostFacts, check_transports
from dedal.stages.verify.parsers import parse_file
from dedal.stages.verify.report import VerifyReport, console_lines, counts, headline, load_report, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SIZES = [0] + [1 << i for i in range(23)]


def _lat(s: int) -> float:
    return 0.2 + s / 10000.0


def make_report(local_data: Path, slow: float = 0.0) -> VerifyReport:
    native = {s: [_lat(s) * j for j in (1.0, 1.02, 0.99, 1.01, 1.0)] for s in SIZES}
    container = {s: [(_lat(s) + slow) * j for j in (1.0, 1.02, 0.99, 1.01, 1.0)] for s in SIZES}
    bw = {s: [min(s / _lat(s), 9000.0) * j for j in (1.0, 0.99, 1.01)] for s in SIZES[1:]}
    logs = [parse_file(local_data / "ompi5_ucx_info_proto_intranode_sysv_cma_GOOD.log")]
    return VerifyReport(
        image="esd-gpu_latest.sif",
        checks=[
            compare_latency(native, container, name="osu_latency intra-node"),
            compare_bandwidth(bw, bw, name="osu_bw intra-node"),
            compare_init([400.0, 410.0, 405.0], [420.0, 415.0, 430.0]),
        ],
        findings=check_transports(logs, HostFacts()),
        logs=logs,
        measurements={"osu_latency intra-node": {"unit": "us", "native": native, "container": container}},
        host=HostFacts(),
        meta={"ucx": "1.18.1", "openmpi": "5.0.7"},
    )


def test_report_files(tmp_path: Path, local_data: Path) -> None:
    paths = write_report(make_report(local_data), tmp_path / "reports" / "esd-gpu")
    out = tmp_path / "reports" / "esd-gpu"
    assert sorted(p.name for p in out.iterdir()) == [
        "osu_bw_intra-node.png",
        "osu_latency_intra-node.png",
        "report.md",
        "verify.json",
    ]
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000
    assert paths["verify.json"] == out / "verify.json"
    assert not list(out.glob(".*"))  # no temporary files left


def test_report_md_starts_with_verdict(tmp_path: Path, local_data: Path) -> None:
    write_report(make_report(local_data), tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# Verdict: GOOD\n")
    assert "![osu_latency intra-node](osu_latency_intra-node.png)" in md
    assert "| 4194304 |" in md and "## Thresholds" in md


def test_failed_check_makes_report_bad_with_evidence(tmp_path: Path, local_data: Path) -> None:
    rep = make_report(local_data, slow=1.0)
    rep.findings += check_transports([parse_file(local_data / "ompi5_ucx_forced_tcp_lo_intranode_BAD.log")])
    write_report(rep, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# Verdict: BAD\n")
    assert "`latency-overhead`" in md and "`ucx-tcp-intra-node`" in md and "tag(tcp/lo)" in md
    assert rep.exit_code == 1


def test_verify_json_has_every_measurement(tmp_path: Path, local_data: Path) -> None:
    rep = make_report(local_data)
    write_report(rep, tmp_path)
    data = load_report(tmp_path / "verify.json")
    assert data["verdict"] == "good" and data["exit_code"] == 0 and data["image"] == "esd-gpu_latest.sif"
    m = data["measurements"]["osu_latency intra-node"]
    assert list(m["native"])[:3] == ["0", "1", "2"] and len(m["native"]["4194304"]) == 5
    lat = data["checks"][0]
    assert lat["metric"] == "latency" and lat["sizes"][1]["native"]["median"] > 0
    assert data["checks"][2]["sizes"][0]["size"] is None
    assert data["logs"][0]["kind"] == "osu" and "protocols" not in data["logs"][0]
    assert data["plots"] == {
        "osu_latency intra-node": "osu_latency_intra-node.png",
        "osu_bw intra-node": "osu_bw_intra-node.png",
    }
    assert data["thresholds"]["latency_overhead_us"] == 0.5
    json.dumps(data)  # plain JSON


def test_rewrite_replaces_files(tmp_path: Path, local_data: Path) -> None:
    write_report(make_report(local_data, slow=1.0), tmp_path)
    write_report(make_report(local_data), tmp_path)
    assert load_report(tmp_path / "verify.json")["verdict"] == "good"


def test_gpu_checks_skipped_without_gpu_are_never_good(tmp_path: Path, local_data: Path) -> None:
    """A GPU image verified on a host without GPU: the device-buffer OSU runs and the NCCL all-reduce are
    planned, reported as 'skipped: no GPU', and the verdict says what did not run."""
    planned = gpu_planned(
        ["latency", "bw", "nccl", "osu"],
        {p: f"/opt/view/bin/{p}" for p in ("osu_latency", "osu_bw", "all_reduce_perf", "dedal_nccl_allreduce")},
        osu_cuda=True,
    )
    assert [b.name for b in planned] == [
        "dedal_nccl_allreduce",
        "osu_latency",
        "osu_bw",
        "all_reduce_perf",
        "osu_latency-cuda",
        "osu_bw-cuda",
    ]  # OSU +cuda needs the driver to start
    rep = make_report(local_data)
    # (the recorded report ran OSU between host buffers: the checks of an OSU without CUDA stand in for them)
    rep.checks += skipped_checks([b for b in planned if b.gpu or b.device], [("intra-node", 1)], "no GPU")
    assert rep.overall == "good" and rep.exit_code == 0  # what ran is good ...
    assert rep.verdict_text == "good (GPU checks skipped: no GPU)"  # ... and it says what did not run
    n = counts(rep)
    assert (n["checks"], n["checks_skipped"], n["checks_not_passed"]) == (7, 4, 0)
    assert headline(rep).startswith("7 check(s), 0 not passed, 4 skipped;")
    lines = console_lines(rep)
    assert lines[0].startswith("verdict: GOOD (GPU checks skipped: no GPU)  (esd-gpu_latest.sif; exit code 0)")
    assert "check osu_bw-cuda intra-node: skipped: no GPU" in lines
    write_report(rep, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# Verdict: GOOD (GPU checks skipped: no GPU)\n")
    assert "| osu_latency-cuda intra-node | latency (us) | skipped: no GPU | - |" in md
    assert "| all_reduce_perf intra-node | busbw (GB/s) | skipped: no GPU | - |" in md
    assert "`check-skipped`: dedal_nccl_allreduce intra-node: skipped: no GPU" in md
    data = json.loads((tmp_path / "verify.json").read_text())
    assert data["verdict"] == "good" and data["verdict_text"] == "good (GPU checks skipped: no GPU)"
    skipped = [c for c in data["checks"] if c["verdict"] == "skipped"]
    assert [(c["name"], c["skip_reason"], c["gpu"]) for c in skipped][0] == (
        "dedal_nccl_allreduce intra-node",
        "no GPU",
        True,
    )
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["osu_bw_intra-node.png", "osu_latency_intra-node.png"]
    # a failed check stays bad; the skipped ones are named next to it
    bad = make_report(local_data, slow=1.0)
    bad.checks += skipped_checks(planned[:1], [("intra-node", 1)], "no GPU")
    assert bad.verdict_text == "bad (GPU checks skipped: no GPU)" and bad.exit_code == 1
    # everything ran: the verdict reads as before
    assert make_report(local_data).verdict_text == "good"


def test_the_model_reads_what_the_writer_writes(tmp_path: Path) -> None:
    """dedal.model.verify_report (publish, pipeline, CI) reads verify.json as write_report writes it."""
    from dedal.model import verify_report
    from dedal.stages.verify.checks import CheckResult, skipped_check

    report = VerifyReport(
        image="gpu.sif",
        checks=[
            CheckResult("osu_latency", "latency", "us", "good"),
            skipped_check("nccl", "busbw", "GB/s", "no GPU", gpu=True),
        ],
        meta={"image_sha256": "abc", "settings_sha256": "def"},
    )
    write_report(report, tmp_path)
    rec = verify_report.load(tmp_path / "verify.json")
    assert (rec.image, rec.verdict, rec.verdict_text, rec.exit_code) == (
        report.image,
        report.overall,
        report.verdict_text,
        report.exit_code,
    )
    assert [(c.name, c.verdict, c.skip_reason, c.gpu) for c in rec.checks] == [
        (c.name, c.verdict, c.skip_reason, c.gpu) for c in report.checks
    ]
    assert rec.schema == verify_report.SCHEMA_VERSION and rec.is_of("abc", "def")
    assert rec.skipped == verify_report.skipped_text(report.checks) == "GPU checks skipped: no GPU"
