"""recipes/repo's dedal.osu-micro-benchmarks built for real: the smallest image with OSU
(data/osu-demo: OSU and dedal-benchmarks on the debian-trixie base's Open MPI) fetched,
built offline from the archive recipes/gitsrc/archive.py put into the mirror, assembled;
OSU's programs are on the image's PATH and run on two ranks, the SBOM names the
source's origin, and `dedal verify` runs OSU beside dedal's own benchmarks.

About 4 minutes on 2 shared cores (the OSU build about 1, verify 2); skipped without a real
Spack, without root, or where this machine's mirror lacks the OSU archive."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spack, pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(3600)]

ENV_FILE = Path(__file__).parent / "data" / "osu-demo" / "env.yaml"


def test_osu_builds_runs_and_is_verified(run_dedal, real_spack, tmp_path, git_sources_mirror):
    if os.geteuid() != 0:
        pytest.skip("needs root (the base image's root filesystem through bubblewrap)")
    data = tmp_path / "data"
    [osu] = git_sources_mirror(data / "mirror", ["osu-micro-benchmarks"])
    env = {
        "DEDAL_DATA_DIR": str(data),
        "DEDAL_SPACK_ROOT": str(real_spack),
        "DEDAL_CACHE_DIR": os.environ.get("DEDAL_CACHE_DIR", str(Path.home() / ".cache" / "dedal")),
    }
    res = run_dedal("fetch", str(ENV_FILE), "--json", env=env, timeout=1800)
    assert res.returncode == 0, res.stdout + res.stderr
    fetched = json.loads(res.stdout)
    assert fetched["missing"] == [] and fetched["fetched"] == 0  # every source was there: no network used
    for stage in ("build", "assemble"):
        res = run_dedal(stage, str(ENV_FILE), "--json", env=env, timeout=1800)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assembled = json.loads(res.stdout)
    sif = assembled["image"]

    run = run_dedal(
        "exec",
        sif,
        "--",
        "sh",
        "-c",
        "for p in osu_latency osu_bw osu_allreduce osu_init; do command -v $p; done; "
        "mpirun --allow-run-as-root --oversubscribe -np 2 osu_latency -m 64",
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert [p.rsplit("/", 1)[-1] for p in lines[:4]] == ["osu_latency", "osu_bw", "osu_allreduce", "osu_init"]
    assert all("/libexec/osu-micro-benchmarks/mpi/" in p for p in lines[:4])
    assert "# OSU MPI Latency Test v7.4" in run.stdout and any(line.startswith("64 ") for line in lines)

    doc = json.loads(Path(assembled["sbom"]).read_text())
    comp = next(c for c in doc["components"] if c["name"] == "osu-micro-benchmarks")
    assert comp["version"] == osu.version
    props = {p["name"]: p["value"] for p in comp["properties"]}
    assert props["dedal:source_repository"] == osu.repository and props["dedal:source_commit"] == osu.commit
    assert props["dedal:source_sha256"] == osu.sha256
    dist = next(r for r in comp["externalReferences"] if r["type"] == "distribution")
    assert dist["hashes"] == [{"alg": "SHA-256", "content": osu.sha256}] and dist["url"] == osu.url

    # the verdict's timings are not this test's business (2 shared cores); that OSU ran is
    res = run_dedal(
        "verify",
        "run",
        sif,
        "--env-file",
        str(ENV_FILE),
        "--max-size",
        "4096",
        "--repetitions",
        "2",
        "--no-remeasure",
        "--json",
        env=env,
        timeout=1800,
    )
    assert res.returncode in (0, 1), res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads(res.stdout)
    ran = {c["name"] for c in report["checks"] if c.get("verdict") not in ("skipped", None)}
    assert {"osu_init intra-node", "osu_latency intra-node", "osu_bw intra-node", "osu_allreduce intra-node"} <= ran
    assert {"dedal_latency intra-node", "dedal_bw intra-node"} <= ran
