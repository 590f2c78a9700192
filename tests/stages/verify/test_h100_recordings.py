"""The parsers and the GPU preflight against outputs recorded on a real H100 machine
(tests/stages/verify/data/h100, made by tests/gpu/device_check.sh: the bundled NCCL benchmark
built with nvcc 13.0 against NCCL 2.28.3, Ubuntu's Open MPI 4.1.6 with UCX 1.16.0).
Expected values were read from the files by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from dedal.stages.verify import preflight
from dedal.stages.verify.parsers import parse_file

H100 = Path(__file__).parent / "data" / "h100"

EXPECTED = {
    "nccl_allreduce_1rank.log": ("nccl-tests", "degenerate"),
    "nccl_allreduce_2ranks_1gpu.log": ("nccl-debug", "failed"),
    "latency_ucx.log": ("ompi-verbose", "failed"),
    "latency_ucx_any.log": ("osu", "good"),
    "latency_ucx_tcp.log": ("osu", "bad"),
}


def codes(result, severity=None):
    return [f["code"] for f in result["findings"] if severity is None or f["severity"] == severity]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_kind_and_verdict(name):
    result = parse_file(H100 / name)
    assert (result["kind"], result["verdict"]) == EXPECTED[name]


def test_every_recording_listed():
    assert {p.name for p in H100.glob("*.log")} == set(EXPECTED)


def test_one_rank_all_reduce_is_degenerate_not_slow():
    r = parse_file(H100 / "nccl_allreduce_1rank.log")
    assert r["nranks"] == 1 and r["nnodes"] == 1
    assert [row["size"] for row in r["rows"]] == [8 << i for i in range(26)]  # 8 B .. 256 MiB
    assert r["peak_busbw"] == 0.0 and r["avg_busbw"] == 0.0  # busbw = algbw * 2(n-1)/n = 0 for n = 1
    last = r["rows"][-1]
    assert (last["size"], last["oop_time_us"], last["oop_algbw"]) == (268435456, 180.59, 1486.41)
    assert r["network"] == "Socket" and r["transports"] == {}
    # one node without InfiniBand: NCCL's own IB transport finds no device, nothing to warn about
    assert "degenerate" in codes(r, "warning") and codes(r, "warning") == ["degenerate"]
    assert "nccl-plugin-failure" not in codes(r)
    assert set(codes(r, "info")) == {"nccl-plugin-not-found", "nccl-no-ibverbs"}


def test_nccl_debug_of_the_one_rank_run_is_clean():
    r = parse_file(H100 / "nccl_allreduce_1rank.log", "nccl-debug")
    assert r["verdict"] == "good" and r["nccl_version"] == "2.28.3+cuda13.0" and r["gdrdma"] is None


def test_two_ranks_on_one_gpu_named():
    r = parse_file(H100 / "nccl_allreduce_2ranks_1gpu.log")
    errors = codes(r, "error")
    assert errors[0] == "nccl-duplicate-gpu" and {"nccl-failure", "mpi-abort"} <= set(errors)
    dup = next(f for f in r["findings"] if f["code"] == "nccl-duplicate-gpu")
    assert "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 60" in dup["evidence"][0]


def test_pml_ucx_without_a_usable_transport():
    r = parse_file(H100 / "latency_ucx.log")
    assert codes(r) == ["pml-unavailable"]


def test_ucx_shared_memory_within_the_node():
    r = parse_file(H100 / "latency_ucx_any.log")
    intra = [s for s in r["selections"] if s["scope"] == "intra-node"]
    assert len(intra) == 2 and all(s["transports"] == ["cma/memory", "sysv/memory"] for s in intra)
    table = r["tables"][0]
    assert table["rows"][0] == [0, 0.49] and table["rows"][-1] == [65536, 9.25]


def test_forced_tcp_is_a_bad_transport():
    r = parse_file(H100 / "latency_ucx_tcp.log")
    assert codes(r) == ["ucx-tcp-intra-node"]
    bad = r["findings"][0]
    assert "tcp/lo" in bad["message"] and "UCX_TLS=tcp" in bad["message"]
    assert r["tables"][0]["rows"][-1] == [65536, 57.73]  # vs 9.25 us over shared memory


def test_preflight_reads_the_real_driver(tmp_path):
    gpus = tmp_path / "gpus"
    (gpus / "0000:00:06.0").mkdir(parents=True)
    info = preflight.gpu_driver(H100 / "proc_driver_nvidia_version.txt", gpus)
    assert info["driver"] == "580.159.04" and info["gpus"] == 1
    assert "Open Kernel Module" in info["line"]
    ok = preflight.check_gpu("12.6", info["driver"], info["gpus"], want_gpu=True, driver_line=info["line"])
    assert [(f.severity, f.code) for f in ok] == [("info", "gpu-driver")]
    ok13 = preflight.check_gpu("13.0", info["driver"], info["gpus"], want_gpu=True)
    assert [f.code for f in ok13] == ["gpu-driver"]
    old = preflight.check_gpu("13.0", "575.51.03", 1, want_gpu=True)
    assert [(f.severity, f.code) for f in old] == [("error", "gpu-driver-too-old")]
