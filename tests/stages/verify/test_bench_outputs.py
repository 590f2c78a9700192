"""The bundled microbenchmarks (recipes/repo/packages/dedal-benchmarks): the recipe's source
checksum, and the parsers on their real outputs.

The logs in ``data/runs/`` are whole raw logs of ``dedal verify`` runs on this machine (2-core VM,
debian-trixie base: Open MPI 5.0.7, UCX 1.18.1), benchmark output and UCX/Open MPI debug
output together, as the runner saves them. The NCCL benchmark cannot run here (no GPU): its
output is rebuilt from the ``printf`` formats of ``dedal_nccl_allreduce.cu`` itself, so the
test follows the source.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from dedal.stages.verify.checks import compare_osu_runs
from dedal.stages.verify.parsers import parse_file, parse_text
from dedal.stages.verify.parsers.osu import split_columns
from tests.conftest import ROOT

DATA = Path(__file__).parent / "data" / "runs"
RECIPE = ROOT / "recipes" / "repo" / "packages" / "dedal-benchmarks"
SRC = RECIPE / "src"


# ---------------------------------------------------------------------------- the recipe


def test_sources_checksum_matches_the_recipe() -> None:
    """package.py's SOURCES_SHA256 is the sha256 of src/* concatenated in sorted name order
    (what install() records), so that Spack's package hash changes with the sources."""
    digest = hashlib.sha256()
    for path in sorted(SRC.iterdir(), key=lambda p: p.name):
        digest.update(path.read_bytes())
    m = re.search(r'SOURCES_SHA256 = "([0-9a-f]{64})"', (RECIPE / "package.py").read_text())
    assert m, "package.py has no SOURCES_SHA256"
    assert m.group(1) == digest.hexdigest(), (
        f"SOURCES_SHA256 in package.py is stale: the sources hash to {digest.hexdigest()}"
    )


def test_recipe_builds_every_mpi_source() -> None:
    text = (RECIPE / "package.py").read_text()
    listed = re.search(r"MPI_BENCHMARKS = \[([^\]]*)\]", text)
    assert listed
    names = sorted(re.findall(r'"(dedal_\w+)"', listed.group(1)))
    assert names == sorted(p.stem for p in SRC.glob("dedal_*.c"))
    assert (SRC / "dedal_nccl_allreduce.cu").is_file() and "+cuda" in text


@pytest.mark.parametrize("source", sorted(p.name for p in SRC.glob("dedal_*.c")))
def test_each_benchmark_title_is_recognised(source: str) -> None:
    """The title each MPI benchmark prints makes the parser name its table dedal_<x>."""
    text = (SRC / source).read_text()
    titles = re.findall(r'"(# dedal-bench [^"]*?)v" DEDAL_BENCH_VERSION', text)
    if "MPI-CUDA" in text:  # -d cuda: the title with MPI-CUDA names the same table, between GPU buffers
        (cuda, host) = titles
        r = parse_text(cuda + "v1.0\n# Size   Latency (us)\n1   2.5\n2   2.5\n")
        assert [(t["benchmark"], t["device"]) for t in r["tables"]] == [(Path(source).stem, "cuda")]
        titles = [host]
    title = re.match(r"(.*)", titles[0]) if titles else None
    assert title, f"{source}: no '# dedal-bench ... v' title"
    out = title.group(1) + "v1.0\n"
    if source == "dedal_init.c":
        out += "nprocs: 2, min: 1 ms, max: 2 ms, avg: 1 ms\n# precise: min 1.250 ms, max 1.750 ms, avg 1.500 ms\n"
        r = parse_text(out)
        assert r["suites"] == ["dedal-bench"]
        assert r["init"] == {"nprocs": 2, "min_ms": 1.25, "max_ms": 1.75, "avg_ms": 1.5}
        return
    header = re.search(r'printf\("(# Size[^"]*)\\n"\)', text)
    assert header, f"{source}: no '# Size' column line"
    out += header.group(1) + "\n"
    values = len(split_columns(header.group(1).lstrip("# "))) - 1  # dedal_cuda_floor: three columns
    first = 0 if source == "dedal_latency.c" else (4 if "allreduce" in source else 1)
    out += f"{first:<10}" + f" {1.5:18.2f}" * values + f"\n{first * 2 or 1:<10}" + f" {2.5:18.2f}" * values + "\n"
    r = parse_text(out + f"$ mpirun -np 2 {Path(source).stem} -m 2\n")
    assert [t["benchmark"] for t in r["tables"]] == [Path(source).stem]
    assert r["tables"][0]["suite"] == "dedal-bench" and r["verdict"] == "good"


# ---------------------------------------------------------------------------- real outputs


def test_native_latency_log() -> None:
    r = parse_file(DATA / "mpirun_native_dedal_latency_64K_ucx_sysv_cma_GOOD.log")
    assert r["kind"] == "osu" and r["verdict"] == "good" and r["suites"] == ["dedal-bench"]
    (t,) = r["tables"]
    assert (t["benchmark"], t["metric"], t["unit"], t["title"]) == (
        "dedal_latency",
        "latency",
        "us",
        "dedal-bench MPI Latency Test",
    )
    assert len(t["rows"]) == 18 and t["rows"][0] == [0, 0.19] and t["rows"][8] == [128, 0.74]
    assert t["rows"][-1] == [65536, 3.35]
    assert r["message_size_option"] == "65536"  # from the command line the runner logs
    assert r["ucx_version"] == "1.18.1" and r["pml"] == "ucx"
    assert sorted(r["transports_by_scope"]["intra-node"]) == ["cma/memory", "sysv/memory"]
    assert not [f for f in r["findings"] if f["severity"] != "info"]


def test_container_bandwidth_log() -> None:
    r = parse_file(DATA / "mpirun_container_dedal_bw_64K_GOOD.log")
    (t,) = r["tables"]
    assert (t["benchmark"], t["metric"], t["unit"]) == ("dedal_bw", "bandwidth", "MB/s")
    assert t["rows"][0] == [1, 3.08] and t["rows"][-1] == [65536, 777.14] and len(t["rows"]) == 17
    assert r["verdict"] == "good"


def test_container_init_log_uses_the_precise_line() -> None:
    r = parse_file(DATA / "mpirun_container_dedal_init_GOOD.log")
    assert r["init"] == {"nprocs": 2, "min_ms": 382.276, "max_ms": 404.885, "avg_ms": 393.581}
    assert r["verdict"] == "good" and r["suites"] == ["dedal-bench"]


def test_allreduce_log() -> None:
    r = parse_file(DATA / "mpirun_native_dedal_allreduce_64K_GOOD.log")
    (t,) = r["tables"]
    assert (t["benchmark"], t["metric"]) == ("dedal_allreduce", "latency")
    assert t["rows"][0] == [4, 0.33] and t["rows"][-1] == [65536, 594.51]
    assert r["verdict"] == "good"


def test_forced_tcp_log_is_bad_with_the_proving_lines() -> None:
    r = parse_file(DATA / "mpirun_container_dedal_latency_UCX_TLS_tcp_BAD.log")
    assert r["verdict"] == "bad"
    assert r["ucx_env"]["UCX_TLS"] == "tcp"
    assert sorted(r["transports_by_scope"]["intra-node"]) == ["tcp/eth0", "tcp/lo"]
    codes = {f["code"]: f for f in r["findings"]}
    tcp = codes["ucx-tcp-intra-node"]
    assert tcp["severity"] == "error" and "(UCX_TLS=tcp)" in tcp["message"]
    assert any("intra-node cfg#1 tag(tcp/lo tcp/eth0)" in e for e in tcp["evidence"])
    assert "latency-tcp-like" in codes and "55.91" in codes["latency-tcp-like"]["message"]


def test_srun_container_per_rank_log() -> None:
    """srun --mpi=pmix (Slurm 22.05, PMIx 4 server) of the image's Open MPI 5, one bubblewrap
    sandbox per rank: the UCX pml over shared memory."""
    r = parse_file(DATA / "srun_pmix_v4_container_per_rank_dedal_latency_GOOD.log")
    assert r["verdict"] == "good" and r["pml"] == "ucx"
    assert sorted(r["transports_by_scope"]["intra-node"]) == ["cma/memory", "sysv/memory"]
    assert r["tables"][0]["rows"][1] == [1, 0.19]


def test_native_vs_container_comparison_from_real_logs() -> None:
    nat = parse_file(DATA / "mpirun_native_dedal_latency_64K_ucx_sysv_cma_GOOD.log")
    con = parse_file(DATA / "srun_pmix_v4_container_per_rank_dedal_latency_GOOD.log")
    chk = compare_osu_runs([nat], [con], "dedal_latency")
    assert chk.metric == "latency" and len(chk.sizes) == 18
    s1 = next(s for s in chk.sizes if s.size == 1)
    assert (s1.native.median, s1.container.median) == (0.2, 0.19) and s1.ok
    s128 = next(s for s in chk.sizes if s.size == 128)  # 0.74 vs 343.67 us: one repetition, an error
    assert not s128.ok and chk.verdict == "bad"


def test_a_cut_dedal_table_is_truncated() -> None:
    lines = (DATA / "mpirun_native_dedal_latency_64K_ucx_sysv_cma_GOOD.log").read_text().splitlines()
    command = next(ln for ln in lines if "/dedal_latency -m 65536" in ln)  # the end of the runner's `$ ...` lines
    table = [
        ln
        for ln in lines
        if ln.startswith("# dedal-bench") or ln.startswith("# Size") or re.match(r"^\d+\s+[\d.]+$", ln)
    ]
    r = parse_text("\n".join([command] + table[:10]) + "\n")  # the command asks for -m 65536, the rows stop at 64 B
    assert r["verdict"] == "failed"
    (cut,) = [f for f in r["findings"] if f["code"] == "truncated"]
    assert "dedal_latency" in cut["message"] and "65536" in cut["message"] and cut["evidence"] == [command, "64 0.21"]


def test_a_table_without_its_command_line_is_judged_on_its_rows() -> None:
    """Without the command line a -m limit and a cut output look alike (issue 36: the H200 runs
    with -m 65536 were called truncated): a note, not a failure."""
    lines = (DATA / "mpirun_native_dedal_latency_64K_ucx_sysv_cma_GOOD.log").read_text().splitlines()
    table = [
        ln
        for ln in lines
        if ln.startswith("# dedal-bench") or ln.startswith("# Size") or re.match(r"^\d+\s+[\d.]+$", ln)
    ]
    r = parse_text("\n".join(table) + "\n")
    assert r["verdict"] == "good" and r["message_size_option"] is None
    (note,) = [f for f in r["findings"] if f["code"] == "table-range-unknown"]
    assert note["severity"] == "info" and "65536" in note["message"] and note["evidence"] == ["65536 3.35"]
    command = next(ln for ln in lines if "/dedal_latency -m 65536" in ln).replace(" -m 65536", "")
    full = parse_text("\n".join([command] + table) + "\n")
    assert full["verdict"] == "failed"  # its command line without -m: 4 MiB expected, the rows stop at 64 KiB
    assert [f["code"] for f in full["findings"] if f["severity"] != "info"] == ["truncated"]


# ---------------------------------------------------------------------------- NCCL


def _c_strings(call: str) -> str:
    return bytes(call, "utf-8").decode("unicode_escape")


def test_nccl_benchmark_output_as_its_source_prints_it() -> None:
    src = (SRC / "dedal_nccl_allreduce.cu").read_text()
    fmts = [_c_strings(m) for m in re.findall(r'printf\("((?:[^"\\]|\\.)*)"', src)]
    head = next(f for f in fmts if f.startswith("# dedal-bench NCCL"))
    columns = [f for f in fmts if f.startswith("#") and ("out-of-place" in f or "size" in f or "(B)" in f)]
    row = next(f for f in fmts if "%12zu" in f).replace("zu", "d")
    oob = next(f for f in fmts if f.startswith("# Out of bounds"))
    avg = next(f for f in fmts if f.startswith("# Avg bus bandwidth"))
    text = head % (2, "gpu01", 2, 21, 5) + "".join(columns)
    busbw = []
    for size, t_us in ((8, 12.5), (1 << 20, 40.1), (1 << 26, 1201.0)):
        alg = size / t_us / 1e3
        busbw.append(alg)
        text += row % (size, size // 4, t_us, alg, alg, t_us, alg, alg)
    text += oob + avg % (sum(busbw) / len(busbw))
    r = parse_text(text)
    assert r["kind"] == "nccl-tests" and r["test"] == "dedal_nccl_allreduce"
    assert r["nranks"] == 2 and r["nccl_version"] == "2.21.5" and r["completed"]
    assert [row["size"] for row in r["rows"]] == [8, 1 << 20, 1 << 26]
    assert r["rows"][1]["oop_busbw"] == round((1 << 20) / 40.1 / 1e3, 2)
    assert r["verdict"] == "good"
    one = parse_text(text.replace("nranks 2", "nranks 1"))
    assert one["verdict"] == "degenerate"


# ---------------------------------------------------------------------------- the CUDA floor


def test_the_cuda_benchmarks_run_on_a_stand_in_driver(trixie_base, tmp_path: Path) -> None:
    """dedal_cuda_floor and dedal_latency -d cuda built with the base's mpicc alone (no CUDA
    toolkit) and run on two ranks against a stand-in libcuda.so.1 (data/cuda/fake_libcuda.c:
    host memory, IPC through shared-memory files): they find the driver at run time, the floor
    opens the peer's buffer once and prints both tables, and dedal reads the facts of each."""
    from dedal.adapters import runtime
    from dedal.stages.verify import expectations

    for src in SRC.iterdir():
        (tmp_path / src.name).write_bytes(src.read_bytes())
    (tmp_path / "fake_libcuda.c").write_bytes((DATA.parent / "cuda" / "fake_libcuda.c").read_bytes())
    work = [runtime.Bind(tmp_path, "/work")]
    for name in ("dedal_cuda_floor", "dedal_latency"):
        runtime.run_in(
            trixie_base.rootfs_dir,
            [
                "mpicc",
                "-O2",
                "-std=c11",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-I/work",
                "-o",
                f"/work/{name}",
                f"/work/{name}.c",
                "-ldl",
            ],
            binds=work,
            what=f"mpicc {name}.c",
        )
    runtime.run_in(
        trixie_base.rootfs_dir,
        ["gcc", "-shared", "-fPIC", "-o", "/work/libcuda.so.1", "/work/fake_libcuda.c"],
        binds=work,
        what="gcc fake_libcuda.c",
    )
    log = tmp_path / "floor.log"
    runtime.run_in(
        trixie_base.rootfs_dir,
        ["mpirun", "-np", "2", "--oversubscribe", "-x", "LD_LIBRARY_PATH", "/work/dedal_cuda_floor", "-m", "65536"],
        binds=work,
        env={"LD_LIBRARY_PATH": "/work"},
        log=log,
        what="dedal_cuda_floor",
        timeout=120,
    )
    r = parse_file(log)
    assert r["verdict"] == "good", r["findings"]
    floor, bw = r["tables"]
    assert (floor["benchmark"], bw["benchmark"]) == ("dedal_cuda_floor", "dedal_cuda_copy_bandwidth")
    assert floor["columns"] == ["Size", "IPC Latency(us)", "D2H+sync(us)", "D2D+sync(us)"]
    assert [row[0] for row in floor["rows"]] == [1 << i for i in range(17)] and all(
        isinstance(v, float) for row in floor["rows"] for v in row[1:]
    )
    assert "GPU 0 of 1: fake GPU (sm_90), CUDA driver 13.0" in floor["meta"]
    assert [row[0] for row in bw["rows"]] == [1 << i for i in range(17)]
    assert {f.key for f in expectations.facts_of(r)} == {"cuda:ipc_latency_us", "cuda:copy_sync_us"}  # < 1 MiB
    assert not list(Path("/dev/shm").glob("dedal-fakecuda.*"))  # the stand-in's IPC files were removed
    # dedal_latency -d cuda: its buffers from the driver (cuMemAlloc), given to MPI as they are
    log = tmp_path / "latency.log"
    runtime.run_in(
        trixie_base.rootfs_dir,
        [
            "mpirun",
            "-np",
            "2",
            "--oversubscribe",
            "-x",
            "LD_LIBRARY_PATH",
            "/work/dedal_latency",
            "-d",
            "cuda",
            "-m",
            "64",
        ],
        binds=work,
        env={"LD_LIBRARY_PATH": "/work"},
        log=log,
        what="dedal_latency -d cuda",
        timeout=120,
    )
    (t,) = parse_file(log)["tables"]
    assert (t["title"], t["benchmark"], t["device"]) == ("dedal-bench MPI-CUDA Latency Test", "dedal_latency", "cuda")
    assert [row[0] for row in t["rows"]] == [0] + [1 << i for i in range(7)]
    assert [f.key for f in expectations.facts_of(parse_file(log))] == ["cuda:latency_small_us"]
