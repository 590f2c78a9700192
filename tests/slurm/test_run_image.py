"""slurm/run-image.sbatch, the batch script documented for running a dedal image, submitted to
the Slurm test cluster with the real Apptainer: every rank runs, the ranks of the node share one
container, and scancel ends the job without leaving its processes behind."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from dedal.adapters.runtime.apptainer import process_env
from tests.conftest import ROOT

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer]
SCRIPT = ROOT / "slurm" / "run-image.sbatch"
SHOW = 'echo "rank=$SLURM_PROCID in $(readlink /proc/self/ns/mnt)"'


def job_env(cluster) -> dict:
    """The cluster's environment as the job's (sbatch exports it), with what Apptainer needs as
    root without CAP_SYS_RESOURCE (APPTAINER_DROP_CAPS, as the README says), and Open MPI's
    settings for this cluster's Slurm 22.05 PMIx 4 server and no network devices (the UCX pml
    over any transport), and for running as root."""
    return dict(
        process_env(cluster.env),
        OMPI_MCA_pml="ucx",
        OMPI_MCA_pml_ucx_tls="any",
        OMPI_MCA_pml_ucx_devices="any",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
    )


def test_the_ranks_of_a_node_share_one_container(slurm_cluster, base_sif, mpi_hello, tmp_path, apptainer):
    """A real MPI program (the base's Open MPI; Apptainer binds the working directory, where it
    lies): both ranks run, in one container, and reduce over MPI."""
    out = tmp_path / "job.out"
    res = subprocess.run(
        [
            "sbatch",
            "--wait",
            "-N",
            "1",
            "-n",
            "2",
            "-o",
            str(out),
            str(SCRIPT),
            str(base_sif),
            "/bin/sh",
            "-c",
            SHOW + "; exec ./hello",
        ],
        env=job_env(slurm_cluster),
        cwd=mpi_hello,
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = out.read_text(errors="replace") if out.exists() else ""
    assert res.returncode == 0, res.stderr + text
    ranks = re.findall(r"rank=(\d) in (mnt:\[\d+\])", text)
    assert sorted(r for r, _ in ranks) == ["0", "1"] and len({ns for _, ns in ranks}) == 1, text
    assert sorted(re.findall(r"hello (\d)/2 sum=1 ", text)) == ["0", "1"], text


def test_scancel_ends_the_job_and_its_ranks(slurm_cluster, base_sif, tmp_path, apptainer):
    out = tmp_path / "job.out"
    res = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-N",
            "1",
            "-n",
            "2",
            "-o",
            str(out),
            str(SCRIPT),
            str(base_sif),
            "/bin/sh",
            "-c",
            SHOW + "; exec sleep 601",
        ],
        env=job_env(slurm_cluster),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    job = res.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 120
    while (out.read_text(errors="replace").count("rank=") if out.exists() else 0) < 2:
        assert time.monotonic() < deadline, out.read_text(errors="replace") if out.exists() else "no output"
        time.sleep(0.3)
    subprocess.run(["scancel", job], env=slurm_cluster.env, check=True, timeout=30)
    deadline = time.monotonic() + 60
    while subprocess.run(["pgrep", "-f", "exec sleep 601"], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the ranks outlived scancel"
        time.sleep(0.5)
