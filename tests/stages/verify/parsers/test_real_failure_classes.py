"""Issue 23: real outputs of the failure classes `dedal verify parse` used to misjudge.

Every file under ``data/real/<class>/`` was copied verbatim from a public issue thread or
site (its ``#@ source:`` line names it); its name ends in the verdict a person reading it
gives (GOOD, SUBOPTIMAL, BAD, FAILED). Each must get that verdict, with the finding that
says why, quoting lines of the file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dedal.stages.verify.transports import HostFacts, check_transports
from dedal.stages.verify.parsers import parse_file

REAL = Path(__file__).resolve().parents[1] / "data" / "real"  # tests/stages/verify/data/real

# file -> the finding code that proves the verdict (the verdict is in the file name)
EXPECTED = {
    # the container runtime's GPU set-up
    "gpu_runtime/nvccli_libnvidia_ml_missing_FAILED.log": "nv-libraries-missing",
    "gpu_runtime/nvccli_nvml_driver_not_loaded_FAILED.log": "gpu-runtime-setup-failed",
    "gpu_runtime/nvccli_requirement_cuda_driver_too_old_FAILED.log": "cuda-driver-too-old",
    "gpu_runtime/nvidia_smi_not_in_container_FAILED.log": "nv-tools-missing",
    "gpu_runtime/nvml_driver_library_mismatch_FAILED.log": "nvml-driver-mismatch",
    "gpu_runtime/nvml_unknown_error_device_cgroup_FAILED.log": "gpu-runtime-setup-failed",
    "gpu_runtime/singularity_info_no_nv_files_FAILED.log": "nv-libraries-missing",
    "gpu_runtime/singularity_nv_container_creation_failed_FAILED.log": "gpu-runtime-setup-failed",
    "gpu_runtime/singularity_nvccli_missing_FAILED.log": "gpu-runtime-setup-failed",
    # issue 38, class 1: --nv could not bind the driver's files into the container
    "gpu_runtime/apptainer_nv_writable_nv_files_not_bound_FAILED.log": "nv-bind-failed",
    "gpu_runtime/singularity_nv_skipping_nvidia_smi_bind_FAILED.log": "nv-tools-missing",
    "gpu_runtime/singularity_nv_skipping_nvidia_smi_bind_library_dir_missing_FAILED.log": "nv-bind-failed",
    # NCCL network plugin failures
    "nccl_plugin/nccl_message_transfer_ofi_couldnt_open_av_FAILED.log": "nccl-net-failure",
    "nccl_plugin/nccl_ofi_couldnt_open_av_multinode_FAILED.log": "nccl-net-failure",
    "nccl_plugin/nccl_ofi_init_failed_socket_fallback_BAD.log": "nccl-plugin-failure",
    "nccl_plugin/nccl_ofi_register_memory_system_error_FAILED.log": "nccl-net-failure",
    "nccl_plugin/nccl_ib_plugin_completion_error_status12_FAILED.log": "nccl-net-failure",
    "nccl_plugin/nccl_ib_plugin_completion_error_app_crash_FAILED.log": "nccl-net-failure",
    "nccl_plugin/nccl_net_ib_completion_error4_all_reduce_5nodes_FAILED.log": "nccl-net-failure",
    # issue 38, class 2: the fabric's network missing, NCCL on TCP sockets
    "nccl_plugin/nccl_ib_device_unopenable_in_docker_socket_fallback_BAD.log": "nccl-fabric-unused",
    "nccl_plugin/rccl_ofi_plugin_missing_slingshot_socket_BAD.log": "nccl-fabric-unused",
    # issue 38, class 3: NCCL_DEBUG=INFO lines among an nccl-tests table (mpirun --tag-output)
    "nccl_tests_debug/nccl_tests_efa_tagged_output_debug_info_interleaved_GOOD.log": "nccl-no-gdrdma",
    "nccl_tests_debug/nccl_tests_p4d_efa_tagged_output_tail_GOOD.log": "",
    # srun --mpi=list, every format
    "srun_mpi_list/srun_mpi_list_charliecloud_faq_mpi_prefix_BAD.txt": "pmix-missing",
    "srun_mpi_list/srun_mpi_list_one_line_pmix_v2_GOOD.txt": "pmix-available",
    "srun_mpi_list/srun_mpi_list_pmix_cannot_load_FAILED.txt": "srun-pmix-plugin-broken",
    "srun_mpi_list/srun_mpi_list_pmix_v3_aws_GOOD.txt": "pmix-available",
    "srun_mpi_list/srun_mpi_list_slurm19_no_pmix_BAD.txt": "pmix-missing",
    "srun_mpi_list/srun_mpi_list_slurm19_pmix_v3_GOOD.txt": "pmix-available",
    "srun_mpi_list/srun_mpi_list_slurm2.6_mpi_prefix_no_pmix_BAD.txt": "pmix-missing",
    "srun_mpi_list/srun_mpi_list_slurm22_no_pmix_BAD.txt": "pmix-missing",
    "srun_mpi_list/srun_mpi_list_slurm17.11_no_pmix_BAD.txt": "pmix-missing",
    "srun_mpi_list/srun_mpi_list_llnl_pmi2_none_openmpi_BAD.txt": "pmix-missing",
    "srun_mpi_list/srun_mpi_list_aws_pcluster_echoed_command_pmix_v3_GOOD.txt": "pmix-available",
    # UCX fatal errors at start-up
    "ucx_fatal/ompi_pml_ucx_failed_to_create_ucp_worker_FAILED.log": "ucx-worker-create-failed",
    "ucx_fatal/ompi_pml_ucx_worker_ibv_query_gid_FAILED.log": "ucx-worker-create-failed",
    "ucx_fatal/ucx_assertion_worker_iface_init_in_mpi_init_FAILED.log": "assertion-failed",
    "ucx_fatal/ucx_devx_event_channel_pml_ucx_not_found_FAILED.log": "ompi-component-missing",
    "ucx_fatal/ucx_devx_qp_create_ep_create_failed_FAILED.log": "ucx-endpoint-failed",
    # UCX protocol tables over fast transports: nothing to flag
    "ucx_proto_fast/ucx_info_e_proto_table_rc_mlx5_GOOD.txt": "ucx-protocols",
    "ucx_proto_fast/ucx_perftest_internode_two_rails_GOOD.log": "ucx-protocols",
    "ucx_proto_fast/ucx_proto_table_ep_cfg_rc_mlx5_GOOD.log": "ucx-protocols",
    "ucx_proto_fast/ucx_proto_table_host_to_cuda_rc_mlx5_paths_GOOD.log": "ucx-protocols",
    "ucx_proto_fast/ucx_faq_proto_info_host_and_cuda_rc_mlx5_GOOD.log": "ucx-protocols",
    "ucx_proto_fast/ucx_perftest_proto_info_two_rails_256K_unit_GOOD.log": "ucx-protocols",
    # shared-memory single copy inside containers
    "ompi_single_copy/ompi_knem_open_failed_fallback_SUBOPTIMAL.log": "shm-single-copy-unavailable",
    "ompi_single_copy/ompi_vader_cma_read_errno1_in_docker_BAD.log": "shm-single-copy-refused",
    # issue 38, class 4: the same refusal behind a CI's time stamps and mpirun's --tag-output labels
    "ompi_single_copy/ompi_vader_cma_read_errno1_azure_ci_timestamps_BAD.log": "shm-single-copy-refused",
    "ompi_single_copy/ompi_vader_cma_read_errno1_tagged_output_BAD.log": "shm-single-copy-refused",
    "ompi_single_copy/ompi_xpmem_segment_failed_fallback_SUBOPTIMAL.log": "shm-single-copy-unavailable",
    "ompi_single_copy/ucx_cma_bad_address_in_singularity_FAILED.log": "shm-single-copy-failed",
    "ompi_single_copy/ucx_cma_eperm_in_apptainer_FAILED.log": "shm-single-copy-failed",
    "ompi_single_copy/ucx_cma_process_vm_readv_delivered_0_FAILED.log": "shm-single-copy-failed",
}


def _wanted(rel: str) -> str:
    return re.search(r"_(GOOD|SUBOPTIMAL|BAD|FAILED)\.\w+$", rel).group(1).lower()


def test_every_real_example_has_an_expectation_and_a_source() -> None:
    # data/real/gpu/ holds recordings made for dedal on a real GPU, verbatim, their source in its
    # README.md: test_real_gpu.py
    present = {
        p.relative_to(REAL).as_posix() for p in REAL.rglob("*") if p.is_file() and p.relative_to(REAL).parts[0] != "gpu"
    }
    assert present == set(EXPECTED)
    for rel in present:
        head = (REAL / rel).read_text().splitlines()[0]
        assert re.match(r"#@ source: https?://\S+", head), rel


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_real_example_is_judged_as_an_expert_would(rel: str) -> None:
    result = parse_file(REAL / rel)
    assert result["verdict"] == _wanted(rel), [(f["code"], f["verdict"]) for f in result["findings"]]
    if not EXPECTED[rel]:  # a clean run: nothing to say but its verdict
        assert _wanted(rel) == "good" and not [f for f in result["findings"] if f["severity"] != "info"]
        return
    proof = [f for f in result["findings"] if f["code"] == EXPECTED[rel]]
    assert proof, [f["code"] for f in result["findings"]]
    assert proof[0]["verdict"] == _wanted(rel) or _wanted(rel) == "good"
    text = (REAL / rel).read_text()
    assert proof[0]["evidence"] and all(line.strip() in text for line in proof[0]["evidence"])


@pytest.mark.parametrize(
    "rel, plugins",
    [
        (
            "srun_mpi_list/srun_mpi_list_slurm2.6_mpi_prefix_no_pmix_BAD.txt",
            ["mvapich", "pmi2", "mpich1_shmem", "mpich1_p4", "none", "lam", "openmpi", "mpichmx", "mpichgm"],
        ),
        ("srun_mpi_list/srun_mpi_list_slurm19_pmix_v3_GOOD.txt", ["none", "openmpi", "pmi2", "pmix_v3", "pmix"]),
        ("srun_mpi_list/srun_mpi_list_one_line_pmix_v2_GOOD.txt", ["openmpi", "none", "pmi2", "pmix_v2", "pmix"]),
    ],
)
def test_old_srun_mpi_list_formats_give_the_plugins(rel: str, plugins) -> None:
    result = parse_file(REAL / rel)
    assert result["kind"] == "srun-mpi-list" and result["plugins"] == plugins


def test_a_broken_pmix_plugin_is_not_called_missing() -> None:
    result = parse_file(REAL / "srun_mpi_list/srun_mpi_list_pmix_cannot_load_FAILED.txt")
    codes = [f["code"] for f in result["findings"]]
    assert "srun-pmix-plugin-broken" in codes and "srun-pmix-plugin-missing" not in codes
    assert result["has_pmix"] is True


@pytest.mark.parametrize(
    "rel, scope",
    [
        ("ucx_proto_fast/ucx_proto_table_ep_cfg_rc_mlx5_GOOD.log", "inter-node"),
        ("ucx_proto_fast/ucx_info_e_proto_table_rc_mlx5_GOOD.txt", "self"),
        ("ucx_proto_fast/ucx_perftest_internode_two_rails_GOOD.log", "inter-node"),
        ("ucx_proto_fast/ucx_proto_table_host_to_cuda_rc_mlx5_paths_GOOD.log", "intra-node"),
    ],
)
def test_protocol_tables_give_their_transports(rel: str, scope: str) -> None:
    result = parse_file(REAL / rel)
    assert result["kind"] == "ucx-log"
    assert any(t.startswith("rc_mlx5/mlx5_") for t in result["transports_by_scope"][scope])
    assert not any(t.startswith("tcp") for tls in result["transports_by_scope"].values() for t in tls)


def test_fast_protocol_tables_pass_the_transport_rules_on_an_infiniband_host() -> None:
    host = HostFacts(has_infiniband=True, multi_node=True, gpus=1)
    for rel in EXPECTED:
        if rel.startswith("ucx_proto_fast/"):
            found = check_transports([parse_file(REAL / rel)], host)
            assert all(f.severity == "info" for f in found), (rel, [(f.code, f.severity) for f in found])


def test_error_completions_are_quoted_before_the_error_chain() -> None:
    result = parse_file(REAL / "nccl_plugin/nccl_ib_plugin_completion_error_status12_FAILED.log")
    (proof,) = [f for f in result["findings"] if f["code"] == "nccl-net-failure"]
    assert "Got completion from peer" in proof["evidence"][0] and proof["verdict"] == "failed"


def test_a_plugin_that_falls_back_to_sockets_stays_an_error_in_the_transport_rules() -> None:
    parsed = parse_file(REAL / "nccl_plugin/nccl_ofi_init_failed_socket_fallback_BAD.log")
    found = {f.code: f for f in check_transports([parsed], HostFacts(has_infiniband=True, multi_node=True, gpus=8))}
    assert found["nccl-plugin-failure"].severity == "error"
    assert any("initialization failed" in e for e in found["nccl-plugin-failure"].evidence)
