"""Variants of real outputs the parsers must survive: truncation, CRLF, missing '#',
noise lines, tabs, extra columns, several tables, one-line pastes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dedal.stages.verify.findings import Finding, verdict_of, worst
from dedal.stages.verify.parsers import clean_lines, detect_kind, parse_text
from dedal.stages.verify.parsers.nccl_debug import normalize_transport
from dedal.stages.verify.parsers.osu import benchmark_name, split_columns

OSU_LAT = "osu/osu_latency_v7.5_mpich_internode_slingshot_cxi_validation_warnings.txt"
NCCL_GOOD = "nccl_tests/all_reduce_perf_2.17.1_2nodes_8xGH200_good_aligned.txt"


def codes(result):
    return [f["code"] for f in result["findings"]]


def test_provenance_lines_crlf_ansi_are_cleaned() -> None:
    lines = clean_lines("#@ source: x\r\n\x1b[33mWARNING:\x1b[0m hi\r\n\r\n")
    assert lines == ["WARNING: hi"]


def test_crlf_and_tabs(logs: Path) -> None:
    text = (logs / OSU_LAT).read_text().replace("\n", "\r\n")
    text = text.replace("                       3.00              Pass", "\t3.00\tPass")
    r = parse_text(text)
    (t,) = r["tables"]
    assert t["rows"][0] == [1, 3.0, "Pass"] and len(t["rows"]) == 23
    assert r["verdict"] == "suboptimal" and codes(r) == ["loader-warning"]


def test_missing_hash_before_headers() -> None:
    text = "OSU MPI Latency Test v5.8\nSize          Latency (us)\n0                       1.20\n1                       1.22\n"
    text += "".join(f"{1 << i:<10}{1.3 + i:>18.2f}\n" for i in range(1, 23))
    r = parse_text(text)
    assert r["kind"] == "osu" and r["version"] == "5.8"
    (t,) = r["tables"]
    assert t["columns"] == ["Size", "Latency (us)"]
    assert t["rows"][0] == [0, 1.2] and t["rows"][-1][0] == 4194304
    assert r["verdict"] == "good"


def test_truncated_table_keeps_rows_and_fails(logs: Path) -> None:
    lines = (logs / OSU_LAT).read_text().splitlines()
    cut = [ln for ln in lines if not ln.startswith(("131072", "262144", "524288", "1048576", "2097152", "4194304"))]
    r = parse_text("\n".join(cut) + "\n")
    (t,) = r["tables"]
    assert len(t["rows"]) == 17 and t["rows"][-1] == [65536, 10.92, "Pass"]
    assert r["verdict"] == "failed"
    f = next(f for f in r["findings"] if f["code"] == "truncated")
    assert "65536" in f["message"]


def test_truncated_mid_line(logs: Path) -> None:
    text = (logs / OSU_LAT).read_text()
    text = text[: text.index("4096                    4.79")] + "4096   "
    r = parse_text(text)
    assert r["verdict"] == "failed"
    assert r["tables"][0]["rows"][-1][0] == 2048


def test_explicit_message_range_is_not_truncation() -> None:
    text = "$ mpirun -n 2 osu_latency -m 1:8192\n# OSU MPI Latency Test v7.5\n# Size       Avg Latency(us)\n" + "".join(
        f"{1 << i:<10}{1.0 + i / 10:>18.2f}\n" for i in range(14)
    )
    r = parse_text(text)
    assert r["verdict"] == "good" and r["message_size_option"] == "1:8192"


def _latency_table(top: int, title: str = "# OSU MPI-CUDA Latency Test v7.4") -> str:
    return f"{title}\n# Datatype: MPI_CHAR.\n# Size       Avg Latency(us)\n" + "".join(
        f"{1 << i:<10}{150.0 + i:>18.2f}\n" for i in range(top.bit_length())
    )


def test_a_table_limited_by_m_without_its_command_line_is_no_truncation() -> None:
    """Issue 36: `osu_latency -d cuda -m 65536 D D` recorded without its command line stops at
    64 KiB; that is a -m limit or a cut output, and the log cannot tell: a note."""
    r = parse_text(_latency_table(65536))
    assert r["verdict"] != "failed" and "truncated" not in codes(r)
    (note,) = [f for f in r["findings"] if f["code"] == "table-range-unknown"]
    assert note["severity"] == "info" and note["evidence"] == ["65536 166.0"]


@pytest.mark.parametrize(
    "command, top, cut",
    [
        ("== prterun -np 2 osu_latency -d cuda -m 4194304 D D", 262144, True),  # asked for 4 MiB, stops at 256 KiB
        ("== prterun -np 2 osu_latency -d cuda -m 65536 D D", 65536, False),  # asked for 64 KiB, has it
        ("$ mpirun -np 2 ./pt2pt/osu_latency -d cuda D D", 65536, True),  # no -m: the default 4 MiB
        ("$ mpirun -np 2 ./pt2pt/osu_latency -d cuda -m 1:100000 D D", 65536, False),  # no power of two above 64 KiB
        ("$ mpirun -np 2 ./pt2pt/osu_latency -m 4M", 4194304, False),
    ],
)
def test_a_table_is_held_to_its_own_command_line(command: str, top: int, cut: bool) -> None:
    r = parse_text(command + "\n" + _latency_table(top))
    assert ("truncated" in codes(r)) is cut and "table-range-unknown" not in codes(r)
    if cut:
        f = next(f for f in r["findings"] if f["code"] == "truncated")
        assert f["evidence"][0] == command and r["verdict"] == "failed"


def test_each_table_of_a_log_is_held_to_the_command_before_it() -> None:
    """The H200 probe's console log: each run's command, then its output cut at 60 lines by
    `head -60`; the last run (-m 65536) is whole."""
    text = (
        "== prterun -np 2 osu_latency -d cuda -m 4194304 D D\n"
        + _latency_table(262144)
        + "-- osu-lat-DD exit 0\n== prterun -np 2 dedal_latency -m 65536\n"
        + _latency_table(65536, "# dedal-bench MPI Latency Test v1.1")
    )
    r = parse_text(text)
    cut = [f for f in r["findings"] if f["code"] == "truncated"]
    assert len(cut) == 1 and cut[0]["message"].startswith("osu_latency:") and "262144" in cut[0]["message"]


def test_full_format_extra_columns_and_noise() -> None:
    text = """
# OSU MPI Allreduce Latency Test v7.1
# Datatype: MPI_CHAR.
# Size       Avg Latency(us)   Min Latency(us)   Max Latency(us)  Iterations
[node1:1234] mca: base: component_find: unable to open mca_btl_openib: libibverbs.so.1: cannot open
1                     174.36            135.35            221.55        1000
2                     171.71            130.58            219.23        1000
libibverbs: Warning: couldn't load driver 'libmlx4-rdmav34.so'
4                     173.35            129.88            221.56        1000
""" + "".join(f"{1 << i:<10}{170.0 + i:>18.2f}{120.0:>18.2f}{230.0:>18.2f}{1000:>12}\n" for i in range(3, 21))
    r = parse_text(text)
    (t,) = r["tables"]
    assert t["columns"] == ["Size", "Avg Latency(us)", "Min Latency(us)", "Max Latency(us)", "Iterations"]
    assert t["rows"][1] == [2, 171.71, 130.58, 219.23, 1000]
    assert t["benchmark"] == "osu_allreduce"
    assert r["verdict"] == "suboptimal" and codes(r) == ["loader-warning"]  # the libibverbs driver warning


def test_single_space_header_is_regrouped() -> None:
    assert split_columns("# Size Avg Latency(us) Min Latency(us) Max Latency(us) Iterations", width=5) == [
        "Size",
        "Avg Latency(us)",
        "Min Latency(us)",
        "Max Latency(us)",
        "Iterations",
    ]


def test_several_tables_in_one_file() -> None:
    text = ""
    for title, col, base in (
        ("Latency", "Avg Latency(us)", 0.5),
        ("Bandwidth", "Bandwidth (MB/s)", 100.0),
        ("Bi-Directional Bandwidth", "Bandwidth (MB/s)", 200.0),
    ):
        text += f"# OSU MPI {title} Test v7.4\n# Size      {col}\n"
        text += "".join(f"{1 << i:<10}{base * (i + 1):>18.2f}\n" for i in range(23))
        text += "\n"
    r = parse_text(text)
    assert [t["benchmark"] for t in r["tables"]] == ["osu_latency", "osu_bw", "osu_bibw"]
    assert [len(t["rows"]) for t in r["tables"]] == [23, 23, 23]
    assert r["tables"][1]["rows"][0] == [1, 100.0]
    assert r["verdict"] == "good"


def test_repeated_run_without_header_starts_new_table() -> None:
    body = "".join(f"{1 << i:<10}{1.0:>18.2f}\n" for i in range(23))
    r = parse_text("# OSU MPI Latency Test v7.5\n# Size       Avg Latency(us)\n" + body + body)
    assert [len(t["rows"]) for t in r["tables"]] == [23, 23]


def test_srun_label_prefix() -> None:
    text = "0: # OSU MPI Bandwidth Test v7.5\n0: # Size      Bandwidth (MB/s)\n" + "".join(
        f"0: {1 << i:<10}{1000.0 * (i + 1):>18.2f}\n" for i in range(23)
    )
    r = parse_text(text)
    assert r["tables"][0]["rows"][-1] == [4194304, 23000.0]


def test_validation_failure_is_bad() -> None:
    text = "# OSU MPI Latency Test v7.5\n# Size       Avg Latency(us)        Validation\n" + "".join(
        f"{1 << i:<10}{1.5:>18.2f}{'Fail' if i == 5 else 'Pass':>18}\n" for i in range(23)
    )
    r = parse_text(text)
    assert r["verdict"] == "bad" and "validation-failed" in codes(r)


def test_high_but_not_tcp_latency_is_suboptimal() -> None:
    text = "# OSU MPI Latency Test v7.5\n# Size       Avg Latency(us)\n" + "".join(
        f"{1 << i:<10}{15.0 + i:>18.2f}\n" for i in range(23)
    )
    assert parse_text(text)["verdict"] == "suboptimal"


def test_osu_init_truncated_and_old_format() -> None:
    assert parse_text("# OSU MPI Init Test v5.4.0\n")["verdict"] == "failed"
    r = parse_text("# OSU MPI Init Test\nnprocs: 2, min: 23, max: 24, avg: 23\n")
    assert r["init"] == {"nprocs": 2, "min_ms": 23, "max_ms": 24, "avg_ms": 23} and r["verdict"] == "good"


def test_crash_after_complete_table(logs: Path) -> None:
    text = (
        (logs / OSU_LAT).read_text() + "[nid1:42] *** Process received signal ***\n"
        "[nid1:42] Signal: Aborted (6)\nsrun: error: nid1: task 1: Aborted (core dumped)\n"
    )
    r = parse_text(text)
    assert r["verdict"] == "failed" and "crash-signal" in codes(r)
    assert len(r["tables"][0]["rows"]) == 23


@pytest.mark.parametrize(
    "title, name",
    [
        ("MPI Latency Test", "osu_latency"),
        ("MPI-CUDA Bandwidth Test", "osu_bw"),
        ("MPI Bi-Directional Bandwidth Test", "osu_bibw"),
        ("MPI Multiple Bandwidth / Message Rate Test", "osu_mbw_mr"),
        ("MPI Allreduce Latency Test", "osu_allreduce"),
        ("MPI Non-blocking Allreduce Latency Test", "osu_iallreduce"),
        ("MPI All-to-All Personalized Exchange Latency Test", "osu_alltoall"),
        ("MPI Broadcast Latency Test", "osu_bcast"),
        ("MPI Allgather Latency Test", "osu_allgather"),
        ("MPI Reduce_scatter Latency Test", "osu_reduce_scatter"),
        ("MPI_Put Latency Test", "osu_put_latency"),
        ("MPI Init Test", "osu_init"),
        ("MPI Multi-threaded Latency Test", "osu_latency_mt"),
        ("MPI Barrier Latency Test", "osu_barrier"),
    ],
)
def test_benchmark_names(title: str, name: str) -> None:
    assert benchmark_name(title) == name


# ---- nccl-tests ----------------------------------------------------------------------


def test_nccl_tests_truncated_keeps_rows(logs: Path) -> None:
    lines = (logs / NCCL_GOOD).read_text().splitlines()
    idx = next(i for i, ln in enumerate(lines) if ln.strip().startswith("2097152 "))
    r = parse_text("\n".join(lines[:idx]) + "\n")
    assert r["kind"] == "nccl-tests" and r["verdict"] == "failed"
    assert len(r["rows"]) == 18 and r["rows"][-1]["size"] == 1048576
    assert r["avg_busbw"] is None and r["peak_busbw"] == 11.17
    assert "truncated" in codes(r)


def test_nccl_tests_header_only() -> None:
    text = (
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20\n"
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
        "Test NCCL failure common.cu:1005 'unhandled system error'\n"
    )
    r = parse_text(text)
    assert r["verdict"] == "failed" and {"truncated", "nccl-failure"} <= set(codes(r))


def test_nccl_tests_with_nccl_info_interleaved(logs: Path) -> None:
    text = (logs / NCCL_GOOD).read_text()
    info = (
        "nid1:1:1 [0] NCCL INFO NCCL version 2.19.3+cuda12.2\n"
        "nid1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
        "nid1:1:1 [0] NCCL INFO Channel 00/0 : 4[0] -> 0[0] [receive] via NET/AWS Libfabric/0/GDRDMA\n"
        "nid1:1:1 [0] NCCL INFO Using network AWS Libfabric\n"
    )
    text = text.replace("#  Rank  0 ", info + "#  Rank  0 ", 1)
    r = parse_text(text)
    assert r["kind"] == "nccl-tests" and r["sections"] == ["nccl-tests", "nccl-debug"]
    assert r["transports"] == {"P2P/CUMEM/read": 1, "NET/AWS Libfabric/GDRDMA": 1}
    assert r["gdrdma"] is True and r["network"] == "AWS Libfabric"
    assert r["nranks"] == 8 and r["peak_busbw"] == 123.11 and r["verdict"] == "good"


def test_nccl_tests_without_hash_and_old_error_column() -> None:
    text = """ nThread 1 nGpus 1 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 5 validation: 1
 Using devices
   Rank  0 Pid 1821213 on gpu-a device  0 [0x00] NVIDIA A100-SXM4-40GB
   Rank  1 Pid 1821214 on gpu-a device  1 [0x00] NVIDIA A100-SXM4-40GB
       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
           8             2   float     sum    12.08    0.00    0.00  1e-07    11.91    0.00    0.00  1e-07
          16             4   float     sum    12.10    0.00    0.00  0e+00    11.95    0.00    0.00  0e+00
 Out of bounds values : 0 OK
 Avg bus bandwidth    : 0.00123
"""
    r = parse_text(text)
    assert r["kind"] == "nccl-tests" and r["nranks"] == 2
    assert r["rows"][0]["oop_error"] == 1e-07 and r["rows"][0]["oop_time_us"] == 12.08
    assert "nccl-wrong-results" not in codes(r)
    assert r["avg_busbw"] == 0.00123 and r["verdict"] == "good"


def test_nccl_tests_wrong_results_are_bad(logs: Path) -> None:
    text = (logs / NCCL_GOOD).read_text().replace("  122.57      0 ", "  122.57      3 ")
    r = parse_text(text)
    assert r["verdict"] == "bad" and "nccl-wrong-results" in codes(r)


def test_nccl_tests_repeated_rank_zero_is_degenerate() -> None:
    text = """# nThread 1 nGpus 1 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#   Rank  0 Pid   1320 on host-a device  0 [0x00] Tesla V100-SXM2-16GB
#   Rank  0 Pid   2066 on host-b device  0 [0x00] Tesla V100-SXM2-16GB
#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error
           8             2     float     sum     4.56    0.00    0.00  0e+00     0.14    0.06    0.00  0e+00
# Avg bus bandwidth    : 0
"""
    r = parse_text(text)
    assert r["nranks"] == 1 and r["verdict"] == "degenerate"
    assert "nccl-independent-ranks" in codes(r)


# ---- NCCL debug, UCX, Slurm variants -------------------------------------------------


@pytest.mark.parametrize(
    "via, norm",
    [
        ("NET/IB/3/GDRDMA", "NET/IB/GDRDMA"),
        ("NET/Socket/0", "NET/Socket"),
        ("P2P/IPC", "P2P/IPC"),
        ("NET/IB/0(1)/GDRDMA", "NET/IB/GDRDMA"),
        ("SHM/direct/direct", "SHM/direct/direct"),
        ("P2P/direct pointer/read", "P2P/direct pointer/read"),
    ],
)
def test_nccl_transport_normalisation(via: str, norm: str) -> None:
    assert normalize_transport(via) == norm


def test_nccl_ib_without_gdrdma_is_suboptimal() -> None:
    text = (
        "h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>\n"
        "h:1:1 [0] NCCL INFO Using network IB\n"
        "h:1:1 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0\n"
        "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0\n"
    )
    r = parse_text(text)
    assert r["gdrdma"] is False and r["transports"] == {"NET/IB": 2}
    assert r["verdict"] == "suboptimal" and "nccl-no-gdrdma" in codes(r)


def test_old_ucx_ep_cfg_format() -> None:
    text = (
        "[1586336889.485760] [gpu4:30970:0]     ucp_worker.c:1539 UCX  INFO  ep_cfg[1]: tag(posix/memory knem/memory); "
        "stream(posix/memory);\n"
        "[1586336889.485760] [gpu4:30970:0]     ucp_worker.c:1539 UCX  INFO  ep_cfg[2]: tag(rc_mlx5/mlx5_0:1 "
        "ud_mlx5/mlx5_0:1); rma(rc_mlx5/mlx5_0:1);\n"
    )
    r = parse_text(text)
    assert r["kind"] == "ucx-log" and r["verdict"] == "good"
    assert r["transports_by_scope"] == {
        "intra-node": ["knem/memory", "posix/memory"],
        "inter-node": ["rc_mlx5/mlx5_0:1", "ud_mlx5/mlx5_0:1"],
    }


def test_ucx_inter_node_tcp_is_bad() -> None:
    text = "[1.0] [n1:7:0] ucp_worker.c:1903 UCX  INFO    ucp_context_0 inter-node cfg#2 tag(tcp/ib0 tcp/eth0)\n"
    r = parse_text(text)
    assert r["verdict"] == "bad" and codes(r) == ["ucx-tcp-inter-node"]


def test_ucx_error_line_is_reported_not_fatal() -> None:
    text = (
        "[1.0] [vm:7:0] ucp_worker.c:1903 UCX  INFO    ucp_context_0 intra-node cfg#1 tag(sysv/memory cma/memory)\n"
        "[1.0] [vm:7:0]     ib_iface.c:123  UCX  ERROR ibv_create_cq(cqe=4096) failed: Cannot allocate memory\n"
    )
    r = parse_text(text)
    assert r["verdict"] == "suboptimal" and codes(r) == ["ucx-error"]


def test_failure_signature_inside_ucx_log() -> None:
    text = (
        "[1.0] [vm:7:0] ucp_worker.c:1903 UCX  INFO    ucp_context_0 intra-node cfg#1 tag(sysv/memory)\n"
        "[vm:7] PMIX ERROR: UNREACHABLE in file server/pmix_server.c at line 2147\n"
    )
    r = parse_text(text)
    assert r["kind"] == "ucx-log" and r["verdict"] == "failed" and "pmix-error" in codes(r)


def test_missing_nv_libraries_warning() -> None:
    r = parse_text(
        "WARNING: Could not find any nv libraries on this host!\n"
        "./all_reduce_perf: error while loading shared libraries: libcuda.so.1: cannot open shared object file\n"
    )
    assert r["kind"] == "failure" and r["verdict"] == "failed" and codes(r) == ["nv-libraries-missing"]


@pytest.mark.parametrize("text", ["", "hello world\n", "\x00\x01binary\xff"])
def test_nothing_recognizable_is_unknown(text: str) -> None:
    r = parse_text(text)
    assert r["verdict"] == "unknown" and r["kind"] == "unknown" and r["findings"] == []


def test_bytes_input_and_forced_kind(logs: Path) -> None:
    data = (logs / NCCL_GOOD).read_bytes()
    assert parse_text(data)["kind"] == "nccl-tests"
    forced = parse_text(data, kind="osu")
    assert forced["kind"] == "osu" and forced["tables"] == []


def test_detect_kind_on_lines() -> None:
    assert detect_kind(["MPI plugin types are...", "\tpmix"]) == "srun-mpi-list"
    assert detect_kind(["# Memory domain: self", "#      Transport: self"]) == "ucx-info"
    assert detect_kind(["nothing"]) == "unknown"


def test_verdict_ordering() -> None:
    assert worst("good", "suboptimal") == "suboptimal"
    assert worst("degenerate", "bad") == "bad"
    assert worst("failed", "bad", "good") == "failed"
    assert worst() == "unknown" and worst("unknown", "good") == "good"
    assert verdict_of([Finding("warning", "x", "m")], "good") == "suboptimal"
    assert verdict_of([Finding("error", "x", "m", verdict="failed")], "good") == "failed"
    with pytest.raises(ValueError):
        Finding("fatal", "x", "m")


def test_ompi_mca_base_select_lines() -> None:
    r = parse_text(
        "[h:1] mca:base:select:(  pml) Querying component [ucx]\n"
        "[h:1] mca:base:select:(  pml) Selected component [ucx]\n"
        "[h:1] mca:base:select:(  mtl) Selected component [ofi]\n"
    )
    assert r["kind"] == "ompi-verbose" and r["pml"] == "ucx" and r["selected"] == {"pml": "ucx", "mtl": "ofi"}


def test_pmi2_singletons_are_a_failure() -> None:
    r = parse_text(
        "No PMIx server was reachable, but a PMI1/2 was detected.\n"
        "If srun is being used to launch application, 4 singletons will be started.\n"
        "Hello from proc 0 of 1\n"
    )
    assert r["kind"] == "failure" and r["verdict"] == "failed" and r["failures"] == ["pmix-singletons"]


def test_old_nccl_without_using_network_line() -> None:
    text = (
        "master:1:2 [0] NCCL INFO NET/Socket : Using [0]ib0:192.168.11.1<0>\n"
        "master:1:2 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so).\n"
        "master:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.11.1<0>\n"
        "NCCL version 2.4.7+cuda10.0\n"
        "master:1:2 [0] NCCL INFO Ring 00 : 3 -> 0 [receive] via NET/IB/0\n"
        "master:1:2 [0] NCCL INFO GPU Direct RDMA Disabled for GPU 0[0] / HCA 0 (distance 4 > 2)\n"
    )
    r = parse_text(text)
    assert r["network"] == "IB" and r["nccl_version"] == "2.4.7+cuda10.0"
    assert r["transports"] == {"NET/IB": 1} and r["gdrdma"] is False
    assert r["ib_link_layers"] == ["IB"] and r["verdict"] == "suboptimal"
    assert "nccl-socket-transport" not in codes(r)  # the bootstrap socket is not a data transport


SIGNATURE_SAMPLES = {
    "segfault": "srun: error: nid1: task 0: Segmentation fault (core dumped)",
    "crash-signal": "[nid1:42] *** Process received signal ***",
    "mpi-abort": "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD",
    "mpi-init-failed": "*** An error occurred in MPI_Init",
    "pml-unavailable": "No components were able to be opened in the pml framework.",
    "launcher-abort": "prterun noticed that process rank 1 with PID 0 on node vm exited on a non-zero status",
    "slurm-task-failure": "srun: error: nid1: task 3: Exited with exit code 1",
    "launcher-lost-daemon": "ORTE was unable to reliably start one or more daemons.",
    "slurm-step-failed": "srun: error: Unable to create step for job 42: Memory required by task is not available",
    "ompi-component-missing": "A requested component was not found, or was unable to be opened.  This",
    "timeout": "slurmstepd: error: *** STEP 42.0 ON nid1 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***",
    "out-of-memory": "slurmstepd: error: Detected 1 oom_kill event in StepId=42.0.",
    "not-enough-slots": "There are not enough slots available in the system to satisfy the 4",
    "pmix-error": "[cn007:24154] PMIX ERROR: UNREACHABLE in file server/pmix_server.c at line 2147",
    "pmix-singletons": "No PMIx server was reachable, but a PMI1/2 was detected.",
    "srun-pmix-plugin-missing": "srun: error: cannot find mpi plugin for mpi/pmix",
    "direct-launch-without-pmi": "but OMPI was not built with SLURM's PMI support and therefore cannot",
    "cuda-driver-too-old": "Cuda failure common.cu:891 'CUDA driver version is insufficient for CUDA runtime version'",
    "nv-libraries-missing": "WARNING: Could not find any nv libraries on this host!",
    "cuda-failure": "Test CUDA failure common.cu:1045 'out of memory'",
    "loader-warning": "./osu_bw: /usr/lib/libnl-3.so.200: no version information available (required by /usr/lib64/libcxi.so.1)",
    "nccl-duplicate-gpu": "[2026-11-22 11:45:40] vm:539:539 [0] init.cc:808 NCCL WARN Duplicate GPU detected : rank 1 "
    "and rank 0 both on CUDA device 60",
    "nccl-failure": "h:1:1 [0] NCCL WARN Failed to initialize any NET plugin",
    # issue 23: real lines, their logs under tests/stages/verify/data/real/
    "srun-pmix-plugin-broken": "srun: error:  mpi/pmix_v5: init: (null) [0]: mpi_pmix.c:193: pmi/pmix: can not load "
    "PMIx library",
    "gpu-runtime-setup-failed": "nvidia-container-cli: initialization error: nvml error: driver not loaded",
    "container-start-failed": "FATAL:   container creation failed: mount /proc/self/fd/3->/var/lib/singularity/mnt/session/"
    "rootfs error: while mounting image /proc/self/fd/3: failed to find loop device: could not "
    "attach image file to loop device: no loop devices available",
    "nvml-driver-mismatch": "Failed to initialize NVML: Driver/library version mismatch",
    "nv-tools-missing": "bash: nvidia-smi: command not found",
    "nccl-net-failure": "ip-1:72593:73427 [7] create_nccl_ofi_component:459 NCCL WARN NET/OFI Couldn't open AV. RC: -22, "
    "ERROR: Invalid argument",
    "ucx-worker-create-failed": "[ip-AC125814:62000] pml_ucx.c:291  Error: Failed to create UCP worker",
    "ucx-endpoint-failed": "[cn0244:260472] pml_ucx.c:421  Error: ucp_ep_create(proc=47) failed: Input/output error",
    "assertion-failed": "[x1004c6s4b1n0:114645:0:114645]  ucp_worker.c:783  Assertion `progress_count == 0' failed",
    "crash-backtrace": "==== backtrace (tid:3549626) ====",
    "shm-single-copy-failed": "process_vm_readv delivered 0 instead of 480960, error message Operation not permitted",
    # issue 38: real lines, their logs under tests/stages/verify/data/real/
    "shm-single-copy-refused": "[v4.radia.run:00192] Read -1, expected 10024, errno = 1",
    "nv-bind-failed": "WARNING: nv files may not be bound with --writable",
    "nv-files-not-bound": "WARNING: Skipping user bind, non existent bind point (file) in container: '/bin/nvidia-smi'",
    "shm-single-copy-unavailable": "WARNING: Open MPI failed to open the /dev/knem device due to a local",
}


@pytest.mark.parametrize("code", sorted(SIGNATURE_SAMPLES))
def test_every_signature_fires(code: str) -> None:
    from dedal.stages.verify.parsers.signatures import SIGNATURES, scan

    assert {s.code for s in SIGNATURES} == set(SIGNATURE_SAMPLES)
    assert code in [f.code for f in scan([SIGNATURE_SAMPLES[code]])]


def test_ucx_posix_proc_denied_under_user_namespaces_is_harmless() -> None:
    text = (
        "[1.0] [vm:7:0] ucp_worker.c:1903 UCX  INFO    ucp_context_0 intra-node cfg#1 tag(sysv/memory cma/memory)\n"
        "[1.0] [vm:7:0]    mm_posix.c:238  UCX  ERROR open(/proc/8/fd/25) failed: Permission denied\n"
    )
    r = parse_text(text)
    assert r["verdict"] == "good" and codes(r) == ["ucx-posix-proc-denied"]
