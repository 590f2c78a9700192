"""`dedal verify parse` through the installed console script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dedal.stages.verify.parsers import KINDS


def test_parse_json(run_dedal, logs: Path) -> None:
    p = run_dedal(
        "verify", "parse", str(logs / "nccl_tests/all_reduce_perf_2.17.1_2nodes_8xGH200_good_aligned.txt"), "--json"
    )
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["kind"] == "nccl-tests" and data["verdict"] == "good"
    assert data["peak_busbw"] == 123.11 and data["avg_busbw"] == 19.7866 and data["nranks"] == 8
    assert data["findings"] == [] and data["sections"] == ["nccl-tests"]


def test_bad_verdict_still_exits_zero(run_dedal, logs: Path) -> None:
    p = run_dedal("verify", "parse", str(logs / "osu/osu_iallreduce_v7.5_cuda_openmpi509_SEGFAULT.txt"), "--json")
    assert p.returncode == 0
    data = json.loads(p.stdout)
    assert data["verdict"] == "failed"
    assert all({"severity", "code", "message", "evidence"} <= set(f) for f in data["findings"])


def test_human_summary(run_dedal, logs: Path) -> None:
    p = run_dedal(
        "verify", "parse", str(logs / "nccl_debug/nccl_2.21.5_info_k8s_2node_4rank_NET_Socket_and_SHM_BAD.log")
    )
    assert p.returncode == 0
    first = p.stdout.splitlines()[0]
    assert first.endswith("BAD  (kind nccl-debug)")
    assert "via NET/Socket: 8" in p.stdout and "nccl-socket-transport" in p.stdout


def test_human_summary_of_the_h200s_ucx_perftest(run_dedal) -> None:
    """Issue 36: UCX's own test between GPU buffers on the H200, 155 us: BAD, and why."""
    log = Path(__file__).parents[1] / "stages/verify/data/real/gpu/run2-C-perf-lat.txt"
    p = run_dedal("verify", "parse", str(log))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].endswith("BAD  (kind ucx-perftest; sections ucx-perftest, ucx-log)")
    assert lines[1] == "ucx_perftest: 1 table(s)" and "    8  155.15" in lines
    assert (
        "[error] device-latency-slow: ucx_perftest_unknown: small messages between GPU buffers take 155.15 us"
        in p.stdout
    )


def test_forced_kind(run_dedal, logs: Path) -> None:
    p = run_dedal(
        "verify",
        "parse",
        str(logs / "slurm_pmix/srun_mpi_list_slurm_pmix_v5_oci.txt"),
        "--kind",
        "srun-mpi-list",
        "--json",
    )
    data = json.loads(p.stdout)
    assert data["plugins"] == ["none", "cray_shasta", "pmi2", "pmix"] and data["pmix_versions"] == ["pmix_v5"]


@pytest.mark.parametrize(
    "args, message",
    [
        (("verify", "parse", "/nonexistent/osu.txt"), "no such file"),
        (("verify", "parse", "{file}", "--kind", "iperf"), "unknown log kind 'iperf'"),
        (("verify", "parse", "{dir}"), "is a directory"),
    ],
)
def test_bad_input_exits_2(run_dedal, tmp_path: Path, args, message: str) -> None:
    f = tmp_path / "log.txt"
    f.write_text("# OSU MPI Latency Test v7.5\n")
    args = tuple(a.format(file=f, dir=tmp_path) for a in args)
    p = run_dedal(*args)
    assert p.returncode == 2
    assert p.stderr.startswith("dedal: error: ") and message in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_help_documents_kinds(run_dedal) -> None:
    p = run_dedal("verify", "parse", "--help")
    assert p.returncode == 0
    for kind in KINDS:
        assert kind in p.stdout


def test_verify_image_shorthand_reaches_the_runner(run_dedal, tmp_path: Path) -> None:
    """`dedal verify IMAGE` is `dedal verify run IMAGE` (the runner may not exist yet)."""
    p = run_dedal("verify", str(tmp_path / "img.sif"))
    q = run_dedal("verify", "run", str(tmp_path / "img.sif"))
    assert p.returncode == q.returncode != 0
    assert "invalid choice" not in p.stderr


def test_parse_stdin(run_dedal, logs: Path) -> None:
    text = (logs / "slurm_pmix/srun_mpi_list_slurm_pmix_v5_oci.txt").read_text()
    p = run_dedal("verify", "parse", "-", "--json", input=text)
    assert p.returncode == 0 and json.loads(p.stdout)["pmix_versions"] == ["pmix_v5"]
