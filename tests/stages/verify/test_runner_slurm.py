"""`dedal verify --launcher srun` under the local Slurm test cluster: `srun --mpi=pmix` of the
image's Open MPI 5 (PMIx 5 client) against the host's Slurm 22.05 PMIx 4 server, one sandbox
per rank, native and container, intra-node.

Only intra-node: the plain test cluster's nodes are slurmds on this one machine, and Slurm's
PMIx plugin gives every node of a step the same directory (``/tmp/spmix_appdir_<uid>_<job>.<step>``),
so a two-node PMIx step fails here with "File exists" on the second node; across nodes
verification runs on the namespaced cluster (tests/e2e/test_multinode.py, marker multinode).

With Slurm 22.05's PMIx 4 server Open MPI 5's ob1 pml hangs (../shared/notes/real-components.md
section 5); the runner uses the UCX pml, which works.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.slurm import allocation

pytestmark = pytest.mark.slurm
WIDE = ["-t", "latency_overhead_us=1000000", "-t", "bandwidth_pct=100", "-t", "init_overhead_pct=1000000"]


def test_srun_pmix_launch_of_the_images_open_mpi(
    run_dedal, slurm_cluster, bench_image, native_cache, tmp_path: Path
) -> None:
    out = tmp_path / "srun"
    before = set(Path("/tmp").glob("dedal-rank.*"))
    env = dict(slurm_cluster.env)
    env["DEDAL_CACHE_DIR"] = str(native_cache)
    p = run_dedal(
        "verify",
        str(bench_image.sif),
        "--launcher",
        "srun",
        "-b",
        "init,latency",
        "-r",
        "1",
        "--max-size",
        "4K",
        "--timeout",
        "120",
        "-o",
        str(out),
        *WIDE,
        env=env,
        timeout=400,
    )
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}\n{slurm_cluster.log_tail()}"
    data = json.loads((out / "verify.json").read_text())
    meta = data["meta"]
    assert meta["launcher"] == "srun"
    # how the container's ranks really ran, measured from inside them: with Apptainer (--sharens)
    # the node's ranks share one container, with bwrap they have a sandbox each over one mount
    codes = {f["code"]: f for f in data["findings"]}
    if meta["runtime"].startswith("apptainer"):
        assert "the ranks of a node in one container" in meta["container"]
        assert meta["runtime"] == "apptainer (shared per node)", meta["runtime"]
        assert "2 ranks on" in codes["containers"]["message"] and "in 1 container(s)" in codes["containers"]["message"]
    else:
        assert meta["runtime"] == "bwrap (one per rank)", meta["runtime"]
        assert "reading 1 mount(s) of the image" in codes["containers"]["message"]
    assert meta["scopes"] == "intra-node" and meta["nodes"] == 1
    codes = {f["code"]: f for f in data["findings"]}
    assert "pmix" in codes and "pmix-server-old" in codes  # Debian's Slurm 22.05: pmix_v4

    runs = [e for e in data["logs"] if e.get("side") in ("native", "container")]
    assert {(e["side"], e["scope"], e["program"]) for e in runs} == {
        (side, "intra-node", prog) for side in ("native", "container") for prog in ("dedal_init", "dedal_latency")
    }
    for e in runs:
        assert e["returncode"] == 0 and e["pml"] == "ucx", e["source"]
        assert e["verdict"] == "good", (e["source"], e["findings"])
        text = (out / e["source"]).read_text()
        assert "srun --mpi=pmix" in text
    init = next(
        e
        for e in runs
        if e["program"] == "dedal_init"
        and e["side"] == "container"
        and e["repetition"] == 1
        and e["scope"] == "intra-node"
    )
    assert init["init"]["nprocs"] == 2 and init["init"]["avg_ms"] > 0
    lat = next(
        e for e in runs if e["program"] == "dedal_latency" and e["side"] == "container" and e["scope"] == "intra-node"
    )
    assert [r[0] for r in lat["tables"][0]["rows"]] == [0] + [1 << i for i in range(13)]
    assert set(lat["transports_by_scope"]["intra-node"]) <= {"sysv/memory", "cma/memory", "posix/memory"}
    names = {c["name"] for c in data["checks"]}
    assert {"dedal_latency intra-node", "dedal_init intra-node", "dedal_init intra-node job wall time"} == names
    # the per-rank hand-over files of the launcher's variables are gone
    assert set(Path("/tmp").glob("dedal-rank.*")) <= before


@pytest.mark.apptainer
def test_in_an_allocation_apptainer_runs_join_one_instance_per_node(
    run_dedal, slurm_cluster, bench_image, native_cache, apptainer, tmp_path: Path
) -> None:
    """Inside an allocation, with Apptainer, every container run of the verification joins one
    instance per node (the steady state, as bwrap's runs share dedal's one mount); afterwards no
    instance and no step of it is left."""

    job, env = allocation(slurm_cluster, native_cache)
    out = tmp_path / "inst"
    try:
        p = run_dedal(
            "verify",
            str(bench_image.sif),
            "--runtime",
            "apptainer",
            "--launcher",
            "srun",
            "-b",
            "init",
            "-r",
            "2",
            "--timeout",
            "120",
            "-o",
            str(out),
            *WIDE,
            env=env,
            timeout=400,
        )
        assert p.returncode == 0, f"{p.stdout}\n{p.stderr}\n{slurm_cluster.log_tail()}"
        meta = json.loads((out / "verify.json").read_text())["meta"]
        assert meta["runtime"] == "apptainer (shared per node)", meta["runtime"]
        assert "joined one Apptainer instance per node (dedal-" in meta["container"], meta["container"]
        logs = sorted((out / "raw" / "intra-node" / "dedal_init").glob("container-*.log"))
        namespaces = {
            m for log in logs for m in re.findall(r"^#@ dedal-container: \S+ mntns=(\S+)", log.read_text(), re.M)
        }
        assert len(logs) == 3 and len(namespaces) == 1, namespaces  # warm-up and both repetitions: the same container
        steps = subprocess.run(
            ["squeue", "-h", "-s", "-j", job], env=slurm_cluster.env, capture_output=True, text=True, timeout=30
        ).stdout
        assert steps.strip() == "", steps  # the step that kept the instance ended with the verification
        left = apptainer("instance", "list", "--all", check=False).stdout
        assert "dedal-" not in left, left
    finally:
        subprocess.run(["scancel", job], env=slurm_cluster.env, timeout=60)


@pytest.mark.apptainer
def test_app_benchmark_in_an_allocation(
    run_dedal, slurm_cluster, bench_image, native_cache, apptainer, tmp_path: Path
) -> None:
    """An application benchmark as esd-neuro's run on a cluster: srun --mpi=pmix inside an
    allocation, the container side joining the Apptainer instance kept per node, the native side
    the image's root in a sandbox per rank; every run in its own working directory (bound into the
    instance at its start, and into the sandboxes), where rank 0 writes the file held to the image's."""

    import yaml

    env_file = tmp_path / "env.yaml"
    env_file.write_text(
        yaml.safe_dump(
            {
                "spack": {"specs": ["zlib"]},
                "dedal": {
                    "verify": {
                        "apps": [
                            {
                                "name": "lat",
                                "ranks": 2,
                                "expect": r"^# dedal-bench MPI Latency Test v(?P<value>[0-9.]+)$",
                                "command": 'dedal_latency -m 8 || exit 1; [ "$PMIX_RANK" != 0 ] || tac /etc/shells > shells.txt',
                                "metric": {
                                    "match": r"^8 +(?P<value>[0-9.]+)$",
                                    "unit": "us",
                                    "overhead_pct": 1000000,
                                    "repetitions": 1,
                                },
                                "reference": {"output": "shells.txt", "expected": "/etc/shells"},
                            }
                        ]
                    }
                },
            }
        )
    )
    job, env = allocation(slurm_cluster, native_cache)
    out = tmp_path / "apps"
    try:
        p = run_dedal(
            "verify",
            str(bench_image.sif),
            "--runtime",
            "apptainer",
            "--launcher",
            "srun",
            "-b",
            "apps",
            "--env-file",
            str(env_file),
            "--timeout",
            "120",
            "-o",
            str(out),
            env=env,
            timeout=400,
        )
        assert p.returncode == 0, f"{p.stdout}\n{p.stderr}\n{slurm_cluster.log_tail()}"
        data = json.loads((out / "verify.json").read_text())
        [check] = data["checks"]
        assert check["name"] == "app lat" and check["verdict"] == "good", check["findings"]
        assert "joined one Apptainer instance per node (dedal-" in data["meta"]["container"]
        for name in ("native-warmup", "container-warmup", "native-01", "container-01"):
            assert "srun --mpi=pmix" in (out / "raw/apps/lat" / f"{name}.log").read_text()
            assert (out / "raw/apps/lat" / name / "shells.txt").is_file(), name
        assert all(r["correct"] for r in data["measurements"]["app lat"]["runs"])
    finally:
        subprocess.run(["scancel", job], env=slurm_cluster.env, timeout=60)


def test_the_images_own_test_runs_under_srun(
    run_dedal, slurm_cluster, trixie_image, native_cache, tmp_path: Path
) -> None:
    """An image assembled by dedal carries its own `apptainer test`; verification runs it in the
    container as one rank of an `srun --mpi=pmix` step and judges the image by it."""
    out = tmp_path / "own"
    env = dict(slurm_cluster.env, DEDAL_CACHE_DIR=str(native_cache))
    p = run_dedal(
        "verify",
        trixie_image["image"],
        "--launcher",
        "srun",
        "-b",
        "init",
        "-r",
        "1",
        "--timeout",
        "120",
        "-o",
        str(out),
        *WIDE,
        env=env,
        timeout=600,
    )
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}\n{slurm_cluster.log_tail()}"
    data = json.loads((out / "verify.json").read_text())
    [own] = [c for c in data["checks"] if c["name"] == "app apptainer-test"]
    assert own["verdict"] == "good", own
    log = (out / "raw/apps/apptainer-test.log").read_text()
    assert "launcher srun" in log and "ok    Open MPI v" in log and "tinympi:latest: all 5 checks passed" in log
