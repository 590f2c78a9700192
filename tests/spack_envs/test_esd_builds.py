"""The ESD environments built for real, end to end, as a maintainer's first
`dedal build-image spack-envs/esd-cpu/env.yaml` does it: a real Spack, offline after fetch
(every source from Debian's archive through recipes/debsrc), the build spread over the
namespaced three-node test cluster, the image verified with `srun --mpi=pmix` across two
of its nodes.

Marker ``slow``: about 40 minutes on 2 shared cores (Open MPI alone 15-20), so out of the
default run; `-m slow` (with DEDAL_SPACK_ROOT) runs it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fixtures.slurm import SlurmCluster

pytestmark = [pytest.mark.spack, pytest.mark.slow, pytest.mark.e2e, pytest.mark.multinode, pytest.mark.slurm]

ENVS = ROOT / "spack-envs"


def test_esd_cpu_build_image_on_the_cluster(run_dedal, real_spack, netns_cluster: SlurmCluster, tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("needs root (base image through bubblewrap, the test cluster)")
    data = tmp_path / "data"  # under the session's temporary directory: shared by the nodes
    env = dict(netns_cluster.env, DEDAL_DATA_DIR=str(data), DEDAL_SPACK_ROOT=str(real_spack),
               DEDAL_CACHE_DIR=os.environ.get("DEDAL_CACHE_DIR", str(Path.home() / ".cache" / "dedal")),
               DEDAL_EXECUTOR="slurm", DEDAL_SLURM_NODES="3", DEDAL_STAGE_DIR="/dev/shm/dedal-esd",
               DEDAL_SLURM_POLL_S="1",
               # modelled durations x2 are too short on a machine shared by three nodes and more
               DEDAL_SLURM_TIME_FACTOR="0")
    res = run_dedal("build-image", str(ENVS / "esd-cpu" / "env.yaml"), "--json", env=env, timeout=4 * 3600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    summary = json.loads(res.stdout)
    stages = {s["name"]: s["status"] for s in summary["stages"]}
    assert [stages[s] for s in ("fetch", "build", "assemble", "verify")] == ["done"] * 4, stages
    assert summary["layers_built"] == 10 and summary["ok"]
    # the build went over the cluster's nodes
    jobs = json.loads((data / "work" / "esd-cpu" / "slurm-jobs.json").read_text())
    nodes = {j["node"] for j in jobs["jobs"] if j["status"] == "done"}
    assert len(nodes) >= 2, nodes

    sif = summary["image"]
    # Open MPI 5 with Slurm support, its bundled PMIx, over UCX
    info = run_dedal("exec", sif, "--", "ompi_info", "--parsable", env=env, timeout=300)
    assert info.returncode == 0, info.stderr
    assert "ident:5.0.7" in info.stdout and "mca:pml:ucx:version" in info.stdout
    assert "'--with-slurm'" in info.stdout and "'--with-pmix=internal'" in info.stdout
    labels = run_dedal("inspect", sif, env=env, timeout=300).stdout
    assert "dedal.version.pmix: 5.0.5" in labels and "bundled with openmpi@5.0.7" in labels
    # UCX with its InfiniBand/RoCE transports built, against the image's own rdma-core
    ucx = run_dedal("exec", sif, "--", "sh", "-c", "ucx_info -b; ldd /opt/view/lib/ucx/libuct_ib.so.0 "
                    "/opt/view/lib/ucx/libuct_rdmacm.so.0", env=env, timeout=300)
    assert ucx.returncode == 0, ucx.stderr
    for define in ("HAVE_TL_RC", "HAVE_TL_UD", "HAVE_TL_DC", "HAVE_MLX5_DV"):
        assert f"#define {define} " in ucx.stdout, define
    assert "libibverbs.so.1 => /" in ucx.stdout and "librdmacm.so.1 => /" in ucx.stdout
    assert "not found" not in ucx.stdout

    # verified across two nodes with Slurm's PMIx
    report = json.loads((Path(summary["report"]).parent / "verify.json").read_text())
    assert summary["verdict"] in ("good", "suboptimal"), summary["verdict"]
    text = Path(summary["report"]).read_text()
    assert "srun --mpi=pmix" in json.dumps(report) + text


def test_esd_gpu_builds_and_assembles_on_its_runtime_base(run_dedal, real_spack, tmp_path: Path):
    """CUDA-aware UCX and Open MPI built by Spack against Debian's CUDA 12.4 (no GPU needed),
    assembled on the CUDA runtime base (no toolkit, no dev tree), with the proofs the image
    can give without a GPU: Open MPI says it was built with CUDA, UCX has its CUDA
    transports, and every ELF file finds its libraries in the image except the driver's
    (the assembly's closure check)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (base images through bubblewrap)")
    env = {"DEDAL_DATA_DIR": str(tmp_path / "data"), "DEDAL_SPACK_ROOT": str(real_spack),
           "DEDAL_CACHE_DIR": os.environ.get("DEDAL_CACHE_DIR", str(Path.home() / ".cache" / "dedal"))}
    env_file = str(ENVS / "esd-gpu" / "env.yaml")
    for stage in ("fetch", "build"):
        res = run_dedal(stage, env_file, "--json", env=env, timeout=4 * 3600)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    res = run_dedal("assemble", env_file, "--json", env=env, timeout=3600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    sif = json.loads(res.stdout)["image"]
    assert os.path.getsize(sif) < 2.5e9  # the runtime base, not the 3.5 GB build base

    info = run_dedal("exec", sif, "--", "ompi_info", "--parsable", "--all", env=env, timeout=600)
    assert info.returncode == 0, info.stderr
    assert "mpi_built_with_cuda_support:value:true" in info.stdout
    ucx = run_dedal("exec", sif, "--", "sh", "-c", "ucx_info -v; ls /opt/view/lib/ucx", env=env, timeout=300)
    assert ucx.returncode == 0, ucx.stderr
    assert "--with-cuda=" in ucx.stdout and "libuct_cuda.so" in ucx.stdout
    labels = run_dedal("inspect", sif, env=env, timeout=300).stdout
    for label in ("dedal.version.cuda: 12.4.131", "dedal.version.nccl: 2.22.3", "dedal.version.openmpi: 5.0.7",
                  "dedal.version.ucx: 1.13.1", "dedal.version.pmix: 5.0.5"):
        assert label in labels, label
    bench = run_dedal("exec", sif, "--", "sh", "-c", "command -v dedal_nccl_allreduce", env=env, timeout=300)
    assert bench.returncode == 0 and bench.stdout.strip(), bench.stderr
