"""The parsers against every recorded log in ../shared/data/logs and tests/stages/verify/data.

Expected values were read from the files by hand (table rows at given sizes, bus
bandwidths, counts of `via` transports, plugin lists, PMIx versions, verdicts).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dedal.stages.verify.parsers import parse_file

# every file of ../shared/data/logs: (kind, verdict)
EXPECTED = {
    "apptainer/apptainer_oras_sif_media_types_and_gpu_warnings_from_source.txt": ("unknown", "unknown"),
    "apptainer/cuda_driver_insufficient_for_runtime_nccl_tests_and_containers.txt": ("failure", "failed"),
    "nccl_debug/nccl_2.21.5_info_k8s_2node_4rank_NET_Socket_and_SHM_BAD.log": ("nccl-debug", "bad"),
    "nccl_debug/nccl_2.27.5_info_sglang_2node_16rank_roce_ofi_plugin_fallback_to_ib_gdrdma.log": (
        "nccl-debug",
        "suboptimal",
    ),
    "nccl_tests/all_reduce_perf_2.17.1_2nodes_8xGH200_NO_cxi_hook_bad.txt": ("nccl-tests", "bad"),
    "nccl_tests/all_reduce_perf_2.17.1_2nodes_8xGH200_good_aligned.txt": ("nccl-tests", "good"),
    "nccl_tests/all_reduce_perf_single_rank_1xV100_busbw_zero_degenerate.txt": ("nccl-tests", "degenerate"),
    "ompi_btl/ompi_btl_verbose_self_vader_selected_pmix_put_ompi6570.txt": ("ompi-verbose", "good"),
    "osu/osu_barrier_v5.8_openmpi_ucx_192ranks_single_value.txt": ("osu", "good"),
    "osu/osu_bw_v6.2_mpich41_cxi_hook_good.txt": ("osu", "good"),
    "osu/osu_bw_v7.5_cuda_DD_mpich_intranode.txt": ("osu", "suboptimal"),  # libnl loader warnings
    "osu/osu_iallreduce_v7.5_cuda_openmpi509_SEGFAULT.txt": ("osu", "failed"),
    "osu/osu_init_v7.5_and_osu_latency_m1_1_slurm_srun_pmix_vs_mpirun_oci.txt": ("osu", "good"),
    "osu/osu_latency_v7.5_mpich_internode_NO_cxi_hook_tcp_fallback.txt": ("osu", "bad"),
    "osu/osu_latency_v7.5_mpich_internode_slingshot_cxi_validation_warnings.txt": ("osu", "suboptimal"),
    "slurm_pmix/ompi_direct_launch_srun_without_pmi_support_canonical_pr3778.txt": ("failure", "failed"),
    "slurm_pmix/srun_mpi_list_slurm_pmix_v5_oci.txt": ("srun-mpi-list", "good"),
    "slurm_pmix/srun_mpi_pmix_plugin_not_found_geoschem822.txt": ("failure", "failed"),
    "spack/cscs_alps_uenv_prgenv-gnu_26.3_gh200_environments.yaml": ("unknown", "unknown"),
    "spack/e4s_cloud_pipelines_stack_spack.yaml": ("unknown", "unknown"),
    "spack/spack-stack_containers_docker-ubuntu-gcc-openmpi_spack.yaml": ("unknown", "unknown"),
    "ucx/osu_allreduce_v5.8_256nodes_UCX_WARN_mlx5_ib0_not_available_tcp_fallback_azure.txt": ("osu", "bad"),
    "ucx/ucx_info_-d_azure_hbv_connectx6_vf_ib_full.txt": ("ucx-info", "good"),
}

# logs recorded here (tests/stages/verify/data): real Open MPI 5.0.7 + UCX 1.18.1 runs
LOCAL_EXPECTED = {
    "ompi5_ucx_info_proto_intranode_sysv_cma_GOOD.log": ("osu", "good"),
    "ompi5_ucx_posix_intranode_GOOD.log": ("osu", "good"),
    "ompi5_ucx_forced_tcp_lo_intranode_BAD.log": ("osu", "bad"),
    "ompi5_ucx_forced_tcp_lo_eth0_split_BAD.log": ("osu", "bad"),
    "ompi5_ob1_btl_sm_verbose_GOOD.log": ("osu", "good"),
    "ompi5_ob1_btl_tcp_intranode_BAD.log": ("osu", "bad"),
    "ompi5_pml_ucx_no_components_FAILED.log": ("failure", "failed"),
    "ucx_info_-d_ucx1.18_tcp_shm_only.txt": ("ucx-info", "good"),
    "ompi5_ucx_proto_info_interleaved_ranks_GOOD.log": ("osu", "good"),
    # bad for the parser alone (UCX 1.13 logs TCP without placement); judged as the inter-node
    # run it is, on nodes without RDMA, good (tests/stages/verify/test_multinode_units.py)
    "ompi5_ucx1.13_tcp_eth0_internode_netns.log": ("osu", "bad"),
}


def codes(result):
    return [f["code"] for f in result["findings"]]


def row_at(table, size):
    for row in table["rows"]:
        if row[0] == size:
            return row
    raise AssertionError(f"no row for size {size}")


def nccl_row(result, size):
    return next(r for r in result["rows"] if r["size"] == size)


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_every_recorded_log_gets_its_kind_and_verdict(logs: Path, rel: str) -> None:
    result = parse_file(logs / rel)
    assert (result["kind"], result["verdict"]) == EXPECTED[rel]
    assert result["verdict"] != "unknown" or not result["findings"]


def test_no_recorded_log_is_left_out(logs: Path) -> None:
    present = {str(p.relative_to(logs)) for p in logs.rglob("*") if p.is_file()}
    assert present - set(EXPECTED) == set(), "a new recorded log needs an expectation here"


@pytest.mark.parametrize("name", sorted(LOCAL_EXPECTED))
def test_local_recordings(local_data: Path, name: str) -> None:
    result = parse_file(local_data / name)
    assert (result["kind"], result["verdict"]) == LOCAL_EXPECTED[name]


def test_local_recordings_all_listed(local_data: Path) -> None:
    assert {p.name for p in local_data.iterdir() if p.is_file()} == set(LOCAL_EXPECTED)


# ---- OSU ---------------------------------------------------------------------------


def test_osu_barrier_single_value_without_size(logs: Path) -> None:
    r = parse_file(logs / "osu/osu_barrier_v5.8_openmpi_ucx_192ranks_single_value.txt")
    assert r["version"] == "5.8"
    (t,) = r["tables"]
    assert t["benchmark"] == "osu_barrier"
    assert t["columns"] == ["Avg Latency(us)"]
    assert t["rows"] == [[8.94]]
    assert t["unit"] == "us"


def test_osu_bw_v6(logs: Path) -> None:
    r = parse_file(logs / "osu/osu_bw_v6.2_mpich41_cxi_hook_good.txt")
    assert r["version"] == "6.2"
    (t,) = r["tables"]
    assert t["benchmark"] == "osu_bw" and t["metric"] == "bandwidth" and t["unit"] == "MB/s"
    assert t["columns"] == ["Size", "Bandwidth (MB/s)"]
    assert len(t["rows"]) == 23
    assert row_at(t, 1) == [1, 1.21]
    assert row_at(t, 8192) == [8192, 8633.36]
    assert row_at(t, 4194304) == [4194304, 23925.61]
    assert r["findings"] == []


def test_osu_bw_cuda_validation_column_and_loader_noise(logs: Path) -> None:
    r = parse_file(logs / "osu/osu_bw_v7.5_cuda_DD_mpich_intranode.txt")
    (t,) = r["tables"]
    assert t["title"] == "OSU MPI-CUDA Bandwidth Test" and t["device"] == "cuda"
    assert t["columns"] == ["Size", "Bandwidth (MB/s)", "Validation"]
    assert t["meta"] == ["Datatype: MPI_CHAR."]
    assert t["rows"][0] == [1, 0.13, "Pass"]
    assert row_at(t, 1048576) == [1048576, 84566.94, "Pass"]
    assert row_at(t, 4194304) == [4194304, 113955.83, "Pass"]
    assert len(t["rows"]) == 23
    assert [f["code"] for f in r["findings"]] == ["loader-warning"]


def test_osu_segfault_keeps_header_reports_crash(logs: Path) -> None:
    r = parse_file(logs / "osu/osu_iallreduce_v7.5_cuda_openmpi509_SEGFAULT.txt")
    (t,) = r["tables"]
    assert t["benchmark"] == "osu_iallreduce"
    assert t["columns"] == ["Size", "Overall(us)", "Compute(us)", "Pure Comm.(us)", "Overlap(%)"]
    assert t["rows"] == []
    c = codes(r)
    assert "truncated" in c and "segfault" in c and "slurm-task-failure" in c
    seg = next(f for f in r["findings"] if f["code"] == "segfault")
    assert any("Segmentation fault" in e for e in seg["evidence"])


def test_osu_init_and_two_single_size_latencies(logs: Path) -> None:
    r = parse_file(logs / "osu/osu_init_v7.5_and_osu_latency_m1_1_slurm_srun_pmix_vs_mpirun_oci.txt")
    assert r["init"] == {"nprocs": 144, "min_ms": 2032, "max_ms": 2054, "avg_ms": 2048}
    assert [i["avg_ms"] for i in r["inits"]] == [2048, 2182]
    assert r["inits"][1] == {"nprocs": 144, "min_ms": 2163, "max_ms": 2215, "avg_ms": 2182}
    assert [t["benchmark"] for t in r["tables"]] == ["osu_latency", "osu_latency"]
    assert [t["rows"] for t in r["tables"]] == [[[1, 1.51]], [[1, 1.67]]]
    assert r["findings"] == []


def test_osu_latency_tcp_fallback_is_bad(logs: Path) -> None:
    r = parse_file(logs / "osu/osu_latency_v7.5_mpich_internode_NO_cxi_hook_tcp_fallback.txt")
    (t,) = r["tables"]
    assert row_at(t, 1) == [1, 38.25, "Pass"]
    assert row_at(t, 1024) == [1024, 59.6, "Pass"]
    assert row_at(t, 4194304) == [4194304, 1341.79, "Pass"]
    f = next(f for f in r["findings"] if f["code"] == "latency-tcp-like")
    assert f["severity"] == "error" and "38.25" in f["message"]


def test_osu_latency_slingshot_good(logs: Path) -> None:
    r = parse_file(logs / "osu/osu_latency_v7.5_mpich_internode_slingshot_cxi_validation_warnings.txt")
    (t,) = r["tables"]
    assert t["columns"] == ["Size", "Avg Latency(us)", "Validation"]
    assert row_at(t, 1) == [1, 3.0, "Pass"]
    assert row_at(t, 8192) == [8192, 7.92, "Pass"]
    assert row_at(t, 4194304) == [4194304, 181.46, "Pass"]
    assert all(row[2] == "Pass" for row in t["rows"])
    # fast (3 us between nodes) and validated, but the loader warns: host libcxi against the image's libnl
    (f,) = r["findings"]
    assert f["code"] == "loader-warning" and f["severity"] == "warning" and len(f["evidence"]) == 2
    assert "no version information available" in f["evidence"][0]


def test_osu_allreduce_with_ucx_warnings_is_bad(logs: Path) -> None:
    r = parse_file(logs / "ucx/osu_allreduce_v5.8_256nodes_UCX_WARN_mlx5_ib0_not_available_tcp_fallback_azure.txt")
    assert r["sections"] == ["osu", "ucx-log"]
    (t,) = r["tables"]
    assert t["benchmark"] == "osu_allreduce"
    assert len(t["rows"]) == 19
    assert t["rows"][0] == [4, 2522.64]
    assert row_at(t, 1048576) == [1048576, 19045.99]
    dev = next(f for f in r["findings"] if f["code"] == "ucx-device-unavailable")
    assert dev["severity"] == "error"
    assert "mlx5_ib0:1" in dev["message"] and "cluster-256-hpc-42" in dev["message"]
    assert "52" in dev["message"]
    assert "ucx-transport-unavailable" in codes(r)
    assert r["ucx_warnings"] == 104


# ---- nccl-tests ------------------------------------------------------------------------


def test_nccl_tests_good(logs: Path) -> None:
    r = parse_file(logs / "nccl_tests/all_reduce_perf_2.17.1_2nodes_8xGH200_good_aligned.txt")
    assert r["test"] == "all_reduce_perf"
    assert r["nranks"] == 8 and r["nnodes"] == 2
    assert len(r["rows"]) == 25
    assert r["avg_busbw"] == pytest.approx(19.7866)
    assert r["peak_busbw"] == pytest.approx(123.11)
    assert r["peak_busbw_size"] == 134217728
    big = nccl_row(r, 134217728)
    assert (big["oop_busbw"], big["ip_busbw"], big["oop_time_us"]) == (122.57, 123.11, 1916.4)
    assert nccl_row(r, 8) == {**nccl_row(r, 8), "oop_busbw": 0.0, "ip_busbw": 0.0, "oop_time_us": 17.93}
    assert nccl_row(r, 1048576)["oop_busbw"] == 11.17
    assert r["findings"] == []
    assert r["completed"] is True


def test_nccl_tests_bad_is_socket_like(logs: Path) -> None:
    r = parse_file(logs / "nccl_tests/all_reduce_perf_2.17.1_2nodes_8xGH200_NO_cxi_hook_bad.txt")
    assert r["nranks"] == 8 and r["nnodes"] == 2
    assert r["avg_busbw"] == pytest.approx(1.58767)
    assert r["peak_busbw"] == pytest.approx(6.07)
    assert r["peak_busbw_size"] == 8388608
    assert nccl_row(r, 134217728)["oop_busbw"] == 5.43
    assert nccl_row(r, 512)["ip_time_us"] == 357.5
    assert codes(r) == ["busbw-socket-like"]


def test_nccl_tests_single_rank_is_degenerate(logs: Path) -> None:
    r = parse_file(logs / "nccl_tests/all_reduce_perf_single_rank_1xV100_busbw_zero_degenerate.txt")
    assert r["nranks"] == 1
    assert r["avg_busbw"] == 0 and r["peak_busbw"] == 0
    assert len(r["rows"]) == 25
    assert nccl_row(r, 134217728)["ip_algbw"] == 972944.75
    assert r["devices"][0]["name"] == "Tesla V100-SXM2-16GB"
    assert codes(r) == ["degenerate"]


# ---- NCCL_DEBUG=INFO -----------------------------------------------------------------


def test_nccl_debug_socket_and_shm(logs: Path) -> None:
    r = parse_file(logs / "nccl_debug/nccl_2.21.5_info_k8s_2node_4rank_NET_Socket_and_SHM_BAD.log")
    assert r["nccl_version"] == "2.21.5+cuda12.4"
    assert r["network"] == "Socket"
    assert r["transports"] == {"NET/Socket": 8, "SHM/direct/direct": 4}
    assert r["transport_classes"] == {"NET/Socket": 8, "SHM": 4}
    assert r["gdrdma"] is False
    assert (r["nranks"], r["nnodes"]) == (4, 2)
    assert r["socket_interfaces"] == ["eth0:192.168.1.136<0>"]
    sock = next(f for f in r["findings"] if f["code"] == "nccl-socket-transport")
    assert sock["severity"] == "error" and all("via NET/Socket" in e for e in sock["evidence"][:2])
    shm = next(f for f in r["findings"] if f["code"] == "nccl-shm-hop")
    assert any("via SHM/direct/direct" in e for e in shm["evidence"])
    assert "nccl-no-ibverbs" in codes(r)


def test_nccl_debug_ofi_plugin_fallback_to_ib_gdrdma(logs: Path) -> None:
    r = parse_file(logs / "nccl_debug/nccl_2.27.5_info_sglang_2node_16rank_roce_ofi_plugin_fallback_to_ib_gdrdma.log")
    assert r["nccl_version"] == "2.27.5+cuda12.9"
    assert r["network"] == "IB" and r["networks"] == {"IB": 8}
    assert r["transports"] == {"NET/IB/GDRDMA": 64, "P2P/IPC": 240}
    assert r["gdrdma"] is True
    assert (r["nranks"], r["nnodes"]) == (16, 2)
    assert r["ib_link_layers"] == ["RoCE"]
    assert len(r["ib_devices"]) == 8 and r["ib_devices"][0] == "mlx5_0:1/RoCE"
    assert r["plugins"]["failed"] is True
    assert r["plugins"]["aws_ofi_nccl"] == "1.6.0"
    assert r["plugins"]["assigned"] == ["IB"]
    f = next(f for f in r["findings"] if f["code"] == "nccl-plugin-failure")
    assert f["severity"] == "warning"
    assert any("plugin/net.cc:118 -> 2" in e for e in f["evidence"])
    assert "nccl-socket-transport" not in codes(r) and "nccl-shm-hop" not in codes(r)


# ---- UCX, Open MPI, Slurm ------------------------------------------------------------


def test_ucx_info_azure(logs: Path) -> None:
    r = parse_file(logs / "ucx/ucx_info_-d_azure_hbv_connectx6_vf_ib_full.txt")
    assert r["transport_names"] == sorted(
        ["self", "tcp", "sysv", "posix", "dc_mlx5", "rc_verbs", "rc_mlx5", "ud_verbs", "ud_mlx5", "cma", "knem"]
    )
    assert len(r["transports"]) == 12
    assert set(r["devices"]) == {"memory", "eth0", "lo", "mlx5_0:1"}
    assert r["has_rdma"] and r["has_shm"] and not r["has_cuda"]
    rc = next(t for t in r["transports"] if t["transport"] == "rc_mlx5")
    assert (rc["device"], rc["type"], rc["bandwidth_mbs"], rc["latency_ns"]) == ("mlx5_0:1", "network", 23588.47, 600)
    gga = next(d for d in r["memory_domains"] if d["component"] == "gga")
    assert gga["has_devices"] is False
    assert r["connection_managers"] == ["tcp", "rdmacm"]


def test_ucx_info_local_has_no_rdma(local_data: Path) -> None:
    r = parse_file(local_data / "ucx_info_-d_ucx1.18_tcp_shm_only.txt")
    assert not r["has_rdma"] and r["has_shm"]
    assert set(r["transport_names"]) == {"self", "tcp", "sysv", "posix", "cma"}
    assert "ucx-no-rdma" in codes(r)


def test_ompi_btl_verbose_excerpt(logs: Path) -> None:
    r = parse_file(logs / "ompi_btl/ompi_btl_verbose_self_vader_selected_pmix_put_ompi6570.txt")
    assert r["btl_components"] == ["self", "vader"]
    assert r["frameworks"]["btl"]["registered"] == ["self", "vader"]
    assert r["hosts"] == ["verdi000.u-bourgogne.fr"]


def test_srun_mpi_list(logs: Path) -> None:
    r = parse_file(logs / "slurm_pmix/srun_mpi_list_slurm_pmix_v5_oci.txt")
    assert r["plugins"] == ["none", "cray_shasta", "pmi2", "pmix"]
    assert r["pmix_versions"] == ["pmix_v5"]
    assert r["has_pmix"] is True


def test_srun_pmix_plugin_missing(logs: Path) -> None:
    r = parse_file(logs / "slurm_pmix/srun_mpi_pmix_plugin_not_found_geoschem822.txt")
    (f,) = r["findings"]
    assert f["code"] == "srun-pmix-plugin-missing" and f["verdict"] == "failed"
    assert len(f["evidence"]) == 4
    assert r["failures"] == ["srun-pmix-plugin-missing"]


def test_direct_launch_without_pmi(logs: Path) -> None:
    r = parse_file(logs / "slurm_pmix/ompi_direct_launch_srun_without_pmi_support_canonical_pr3778.txt")
    assert r["failures"][0] == "direct-launch-without-pmi"
    assert "mpi-init-failed" in r["failures"]


def test_cuda_driver_too_old(logs: Path) -> None:
    r = parse_file(logs / "apptainer/cuda_driver_insufficient_for_runtime_nccl_tests_and_containers.txt")
    f = next(f for f in r["findings"] if f["code"] == "cuda-driver-too-old")
    assert f["severity"] == "error" and "5 matching lines" in f["message"]


def test_reference_sheet_is_not_a_log(logs: Path) -> None:
    """The Apptainer sheet quotes '--nv' warnings in comments: that is not the warning itself."""
    r = parse_file(logs / "apptainer/apptainer_oras_sif_media_types_and_gpu_warnings_from_source.txt")
    assert r["findings"] == [] and r["sections"] == []


# ---- logs recorded here: Open MPI 5 / UCX 1.18 ---------------------------------------


def test_local_ucx_default_selection(local_data: Path) -> None:
    r = parse_file(local_data / "ompi5_ucx_info_proto_intranode_sysv_cma_GOOD.log")
    assert r["ucx_version"] == "1.18.1"
    assert r["transports_by_scope"]["intra-node"] == ["cma/memory", "sysv/memory"]
    sel = next(s for s in r["selections"] if s["scope"] == "intra-node")
    assert sel["lanes"] == {"tag": ["sysv/memory", "cma/memory"]} and sel["count"] == 2
    eager = next(p for p in r["protocols"] if p["scope"] == "intra-node" and p["range"] == "0..92")
    assert eager["protocol"] == "eager short" and eager["transports"] == ["sysv/memory"]
    (t,) = r["tables"]  # the OSU-style table survives the UCX protocol tables printed between its rows
    assert [row[0] for row in t["rows"]] == [4**i for i in range(12)]
    assert r["ucx_diag"] == 8


def test_local_ucx_forced_tcp_is_flagged_with_evidence(local_data: Path) -> None:
    r = parse_file(local_data / "ompi5_ucx_forced_tcp_lo_intranode_BAD.log")
    assert r["ucx_env"]["UCX_TLS"] == "tcp,self"
    assert r["transports_by_scope"]["intra-node"] == ["tcp/lo"]
    f = next(f for f in r["findings"] if f["code"] == "ucx-tcp-intra-node")
    assert f["severity"] == "error" and "UCX_TLS=tcp,self" in f["message"]
    assert any("intra-node cfg#1 tag(tcp/lo)" in e for e in f["evidence"])


def test_local_ucx_tcp_split_over_two_devices(local_data: Path) -> None:
    r = parse_file(local_data / "ompi5_ucx_forced_tcp_lo_eth0_split_BAD.log")
    assert r["transports_by_scope"]["intra-node"] == ["tcp/eth0", "tcp/lo"]
    rndv = [
        p
        for p in r["protocols"]
        if "52% on tcp/lo and 48% on tcp/eth0" in p.get("line", "") or p["transports"] == ["tcp/lo", "tcp/eth0"]
    ]
    assert rndv


def test_local_ob1_btl(local_data: Path) -> None:
    good = parse_file(local_data / "ompi5_ob1_btl_sm_verbose_GOOD.log")
    assert good["pml"] == "ob1"
    assert good["btl_used"] == {"self": 2, "sm": 2}
    assert good["btl_components"] == ["self", "sm", "tcp"]
    bad = parse_file(local_data / "ompi5_ob1_btl_tcp_intranode_BAD.log")
    assert bad["btl_used"] == {"self": 2, "tcp": 2}
    f = next(f for f in bad["findings"] if f["code"] == "ompi-tcp-intra-node")
    assert len(f["evidence"]) == 2 and "Using tcp btl" in f["evidence"][0]


def test_local_pml_ucx_without_devices_fails(local_data: Path) -> None:
    r = parse_file(local_data / "ompi5_pml_ucx_no_components_FAILED.log")
    assert r["failures"] == ["pml-unavailable", "launcher-abort"]


def test_interleaved_proto_tables_stay_with_their_process(local_data: Path) -> None:
    """UCX pads the pid in its prefix (``[vm:860  :0]``); rows of one rank's table that
    arrive between another rank's header and rows belong to their own rank's table."""
    result = parse_file(local_data / "ompi5_ucx_proto_info_interleaved_ranks_GOOD.log", "ucx-log")
    assert result["transports_by_scope"] == {
        "self": ["cma/memory", "self/memory"],
        "intra-node": ["cma/memory", "sysv/memory"],
    }
    intra = [p for p in result["protocols"] if p["scope"] == "intra-node"]
    assert intra and all("self/memory" not in p["transports"] for p in intra)
