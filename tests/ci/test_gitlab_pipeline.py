"""The GitLab pipeline of ci/ run by gitlab-ci-local 4.73.0 (shell executor, offline)
against the local Slurm test cluster and a local registry, on a throwaway repository
where a commit changed ``spack-envs/tiny`` (the test environment, built by the Spack
stand-in on base ``host``) and left ``spack-envs/other`` alone.

What gitlab-ci-local does and does not do here (checked with 4.73.0):

* It runs dynamic child pipelines (``trigger: include: - artifact:``, "experimental"),
  but a failed child job fails neither the trigger job nor the parent pipeline (exit 0
  even with ``strategy: depend``). So the success test runs the parent pipeline and
  reads every job's PASS line, and the failure test runs the generate job, then the
  generated child pipeline directly (``--file dedal-child-pipeline.yml``), whose exit code
  is the pipeline's.
* ``--variable`` values do not reach a child pipeline; the project variables file
  (``.gitlab-ci-local-variables.yml``, read again for the child) does, as project CI/CD
  variables do on GitLab. It is written in dotenv form: in YAML form existing paths
  become file variables.
* ``rules: changes:`` is ``git diff --name-only origin/<default branch>``: the repository
  has an ``origin`` whose ``main`` is the commit before the change.
* GitLab's ``CI_COMMIT_BEFORE_SHA`` is not predefined, and ``CI_COMMIT_TIMESTAMP`` is the
  time of the run rather than the commit's: the variables file sets both.
* Artifacts of a job whose name has a ``:`` are stored under a mangled name, which
  ``trigger: include: artifact: job:`` does not find (the child pipeline then comes out
  empty, silently): the parent's jobs are named ``dedal-generate`` and ``dedal-images``.
* With ``--shell-isolation`` every job runs in its own copy of the tracked files and
  gets the artifacts of its ``needs:`` (as on GitLab); ``after_script`` starts from a
  fresh copy (files ``script`` wrote are gone; on GitLab they stay), which is why the
  artifacts are collected from dedal's work directories in ``after_script``.

The test environment ``tiny`` is built on base ``host`` (no operating system in the
image: nothing to run benchmarks with), so its ``dedal.verify.enabled`` is false and its
pipeline has no verify job. The verify job (and publish with the report attached) is run
on its own on an image that has Open MPI and the benchmarks (``bench_image`` of
tests/fixtures/bench.py: the debian-trixie base with dedal's microbenchmarks), with ``mpirun``
on this machine; the GPU verify job is only listed (no GPU here).
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import dedal_exe
from tests.ci.conftest import CiRepo, make_ci_repo, need_gitlab_ci_local

pytestmark = [
    pytest.mark.gitlab,
    pytest.mark.slurm,
    pytest.mark.registry,
    pytest.mark.e2e,
    pytest.mark.usefixtures("as_root"),
]

TINY_JOBS = ["tiny:fetch", "tiny:build", "tiny:assemble", "tiny:publish"]
TINY_LAYERS = 5  # gcc-runtime, libdedal, dedal-app, dedal-bootstrap, dedal-tool (glibc is external)


@pytest.fixture
def repo(tmp_path: Path, slurm_cluster, ci_registry) -> CiRepo:
    need_gitlab_ci_local()
    return make_ci_repo(tmp_path, slurm_cluster, ci_registry)


def sacct(cluster) -> list:
    out = subprocess.run(
        ["sacct", "-c", "-n", "-P", "--format=JobID,JobName,State,NodeList"],
        env=cluster.env,
        text=True,
        capture_output=True,
        timeout=60,
    ).stdout
    return [line.split("|") for line in out.splitlines() if line.strip()]


def registry_tags(repo: CiRepo, name: str) -> list:
    r = requests.get(f"{repo.registry.url}/v2/ci/{name}/tags/list", timeout=30)
    return sorted(r.json().get("tags") or []) if r.status_code == 200 else []


def test_pipeline_builds_the_changed_environment_end_to_end(repo: CiRepo, slurm_cluster, tmp_path):
    before_jobs = {row[0] for row in sacct(slurm_cluster)}
    run = repo.gcl()
    results = run.results()
    assert run.returncode == 0, run.output[-6000:]
    # generate -> trigger -> the child pipeline of the changed environment, every job passed
    assert results.get("dedal-generate") == "PASS" and results.get("dedal-images") == "PASS", run.output[-6000:]
    for job in TINY_JOBS:
        assert results.get(job) == "PASS", f"{job}: {results}\n{run.output[-6000:]}"
    assert "FAIL" not in results.values()
    assert not [j for j in results if j.startswith(("other:", "tiny:verify"))]

    child = yaml.safe_load((repo.root / "dedal-child-pipeline.yml").read_text())
    assert [k for k in child if ":" in k] == TINY_JOBS
    assert f"changed since {repo.before[:12]}" in (repo.root / "dedal-child-pipeline.yml").read_text()

    # artifacts: plan and lock, logs, one manifest per layer, image manifest, SBOM, image.env
    art = repo.artifacts / "tiny"
    plan = json.loads((art / "fetch" / "plan.json").read_text())
    assert plan["env_name"] == "tiny" and (art / "fetch" / "spack.lock").is_file()
    assert (art / "fetch" / "logs" / "concretize.log").is_file()
    layers = sorted((art / "build" / "layers").glob("*.json"))
    assert len(layers) == TINY_LAYERS
    record = json.loads((art / "build" / "slurm-jobs.json").read_text())  # built by Slurm jobs
    assert record["jobs"]
    assert list((art / "build" / "logs").glob("*.log"))
    image_json = json.loads((art / "assemble" / "image.json").read_text())
    sif = Path((art / "assemble" / "image.env").read_text().strip().split("=", 1)[1])
    assert sif.is_file() and image_json["sha256"] and (art / "assemble" / "sbom.cdx.json").is_file()
    # this pipeline's plan and image in its own directory, the layers in the shared store
    pipeline_dir = sif.parents[2]
    assert pipeline_dir.parent == repo.base / "pipelines" and sif == pipeline_dir / "images" / "tiny" / "latest.sif"
    assert (pipeline_dir / "work" / "tiny" / "plan.json").is_file()
    assert len(list((repo.data / "layers").glob("*.sqfs"))) == TINY_LAYERS

    # the build ran as Slurm jobs, the assembly through srun on a node
    new = [row for row in sacct(slurm_cluster) if row[0] not in before_jobs]
    assert [r for r in new if r[1].startswith("dedal:tiny:") and r[2] == "COMPLETED"]
    assert [r for r in new if r[1] == "dedal" and r[2] == "COMPLETED"], new

    # published under <tag> and <tag>-<short sha>, the SBOM attached (registry 2.8 has no
    # referrers API: the attachment hangs on a sha256-<digest> tag); what one pulls is the image
    tags = registry_tags(repo, "tiny")
    assert [t for t in tags if not t.startswith("sha256-")] == ["latest", f"latest-{repo.head[:8]}"]
    assert len([t for t in tags if t.startswith("sha256-")]) == 1
    assert registry_tags(repo, "other") == []
    pulled = tmp_path / "pulled.sif"
    res = subprocess.run(
        [dedal_exe(), "pull", f"oras://{repo.registry.host}/ci/tiny:latest", "-o", str(pulled), "--insecure"],
        env=repo.env,
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert pulled.read_bytes() == sif.read_bytes()

    # a second pipeline (the child pipeline run directly): the layer store is the cache
    again = repo.gcl("--file", "dedal-child-pipeline.yml")
    assert again.returncode == 0, again.output[-6000:]
    assert [again.results().get(j) for j in TINY_JOBS] == ["PASS"] * 4
    assert any(f"0 built, {TINY_LAYERS} reused" in line for line in again.job_lines("tiny:build")), "\n".join(
        again.job_lines("tiny:build")
    )
    sif2 = Path((art / "assemble" / "image.env").read_text().strip().split("=", 1)[1])
    # its own pipeline directory, and the same bytes: the image carries the commit's date
    assert sif2 != sif and sif2.read_bytes() == sif.read_bytes()
    assert image_json["created"] == datetime.fromtimestamp(
        int(
            subprocess.run(
                ["git", "log", "-1", "--format=%ct"], cwd=repo.root, text=True, capture_output=True, check=True
            ).stdout
        ),
        timezone.utc,
    ).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"\ngitlab-ci-local: parent pipeline {run.seconds:.1f} s, cached rerun of the child {again.seconds:.1f} s")


def test_a_failing_package_fails_the_pipeline(tmp_path: Path, slurm_cluster, ci_registry):
    need_gitlab_ci_local()
    repo = make_ci_repo(tmp_path, slurm_cluster, ci_registry, fail=["libdedal"])
    gen = repo.gcl("dedal-generate")
    assert gen.returncode == 0 and gen.results().get("dedal-generate") == "PASS", gen.output[-4000:]
    # gitlab-ci-local does not pass a child pipeline's failure up to the parent: the
    # generated child pipeline is run directly, as GitLab runs it for the trigger job
    run = repo.gcl("--file", "dedal-child-pipeline.yml")
    results = run.results()
    assert run.returncode != 0, run.output[-6000:]
    assert results.get("tiny:fetch") == "PASS" and results.get("tiny:build") == "FAIL", results
    assert "tiny:assemble" not in results and "tiny:publish" not in results
    build = "\n".join(run.job_lines("tiny:build"))
    assert "libdedal" in build and "FAILED" in build
    # the failed job kept its logs and the layers that could be built
    logs = repo.artifacts / "tiny" / "build" / "logs"
    failed_log = [p for p in logs.glob("libdedal*.log") if "fails on request" in p.read_text()]
    assert failed_log, sorted(p.name for p in logs.iterdir())
    built = {json.loads(p.read_text())["name"] for p in (repo.artifacts / "tiny" / "build" / "layers").glob("*.json")}
    assert "gcc-runtime" in built and not built & {"libdedal", "dedal-app"}, built
    assert registry_tags(repo, "tiny") == []


def test_no_environment_changed_gives_a_pipeline_that_says_so(tmp_path: Path, slurm_cluster, ci_registry):
    need_gitlab_ci_local()
    repo = make_ci_repo(tmp_path, slurm_cluster, ci_registry)
    repo.set_variables(CI_COMMIT_BEFORE_SHA=repo.head)  # the push changed nothing under spack-envs/
    run = repo.gcl()
    assert run.returncode == 0, run.output[-4000:]
    assert run.results() == {"dedal-generate": "PASS", "dedal-nothing-to-build": "PASS", "dedal-images": "PASS"}
    assert "no environment to build" in run.output


def test_generated_jobs_as_gitlab_ci_local_sees_them(tmp_path: Path, slurm_cluster, ci_registry):
    """Schema, templates, rules: the child pipeline of a GPU and a CPU environment as
    `gitlab-ci-local --list` expands it (nothing runs)."""
    need_gitlab_ci_local()
    repo = make_ci_repo(tmp_path, slurm_cluster, ci_registry)
    (repo.root / "spack-envs" / "gpu").mkdir()
    (repo.root / "spack-envs" / "gpu" / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "spack": {"specs": ["nccl-tests"]},
                "dedal": {"name": "gpu", "registry": "oras://registry.example.org/esd/gpu", "verify": {"gpu": True}},
            }
        )
    )
    subprocess.run(["git", "add", "-A"], cwd=repo.root, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "gpu"], cwd=repo.root, check=True)
    res = subprocess.run(
        [dedal_exe(), "ci", "generate", "--all", "-o", "child.yml"],
        cwd=repo.root,
        env=repo.env,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr

    def listed(**variables: str) -> dict:
        repo.set_variables(**variables)
        run = repo.gcl("--file", "child.yml", "--list-json", stderr=False)
        assert run.returncode == 0, run.output[-3000:]
        return {j["name"]: j for j in json.loads(run.output)}

    jobs = listed(DEDAL_REGISTRY="oras://127.0.0.1:1/ci")
    assert {"gpu:verify", "other:verify", "tiny:publish", "gpu:publish", "other:publish"} <= set(jobs)
    assert "tiny:verify" not in jobs
    assert {j for j in jobs if j.endswith(":publish") and jobs[j]["when"] == "on_success"} == {
        "gpu:publish",
        "other:publish",
        "tiny:publish",
    }
    assert [n["job"] for n in jobs["gpu:publish"]["needs"]] == ["gpu:assemble", "gpu:verify"]
    # without DEDAL_REGISTRY only the environment with its own registry publishes
    jobs = listed(DEDAL_REGISTRY="")
    assert {j for j in jobs if j.endswith(":publish") and jobs[j]["when"] != "never"} == {"gpu:publish"}
    expanded = yaml.safe_load((repo.root / ".gitlab-ci-local" / "expanded-gitlab-ci.yml").read_text())
    assert expanded["gpu:verify"]["tags"] == ["$DEDAL_CI_RUNNER_GPU"]
    assert expanded["gpu:verify"]["variables"]["DEDAL_CI_RUNNER_GPU"] == "gpu"
    assert expanded["tiny:build"]["retry"] == {
        "max": 2,
        "when": ["runner_system_failure", "stuck_or_timeout_failure", "scheduler_failure"],
    }
    assert expanded["tiny:assemble"]["artifacts"]["reports"]["dotenv"] == "dedal-image.env"
    assert expanded["tiny:fetch"]["artifacts"]["when"] == "always"


def test_verify_and_publish_jobs_on_an_image_with_the_benchmarks(
    tmp_path: Path, slurm_cluster, ci_registry, bench_image, native_cache
):
    """The generated verify job runs `dedal verify` with the environment file's
    dedal.verify section, its report becomes an artifact, publish attaches it."""
    need_gitlab_ci_local()
    repo = make_ci_repo(tmp_path, slurm_cluster, ci_registry)
    labels = bench_image.labels
    (repo.root / "spack-envs" / "bench").mkdir()
    (repo.root / "spack-envs" / "bench" / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "spack": {"specs": ["dedal-benchmarks"]},
                "dedal": {
                    "name": labels["dedal.env"],
                    "tag": labels["dedal.tag"],
                    "verify": {
                        "ranks": 2,
                        "repetitions": 1,
                        "benchmarks": ["latency"],
                        # a busy 2-core VM is no place for timing verdicts (docs/CONVENTIONS.md)
                        "thresholds": {
                            "latency_overhead_us": 1000000,
                            "bandwidth_pct": 100,
                            "init_overhead_pct": 1000000,
                        },
                    },
                },
            },
            sort_keys=False,
        )
    )
    subprocess.run(["git", "add", "-A"], cwd=repo.root, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "bench"], cwd=repo.root, check=True)
    res = subprocess.run(
        [dedal_exe(), "ci", "generate", "spack-envs/bench", "-o", "child.yml"],
        cwd=repo.root,
        env=repo.env,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    name = f"{labels['dedal.env']}"
    # the image as the assemble job would hand it over (its image.env), the native root cached
    repo.set_variables(
        DEDAL_CI_IMAGE=str(bench_image.sif), DEDAL_CACHE_DIR=str(native_cache), DEDAL_CI_VERIFY_ARGS="--max-size 8K"
    )
    run = repo.gcl("--file", "child.yml", f"{name}:verify", f"{name}:publish")
    results = run.results()
    assert run.returncode == 0 and results == {f"{name}:verify": "PASS", f"{name}:publish": "PASS"}, run.output[-6000:]
    report = repo.artifacts / name / "verify" / "report"
    data = json.loads((report / "verify.json").read_text())
    assert data["image"] == f"{name}-{labels['dedal.tag']}" and data["verdict"] in ("good", "suboptimal")
    assert data["meta"]["repetitions"] == 1  # from the environment file, through --env-file
    assert {c["name"] for c in data["checks"]} == {"dedal_latency intra-node"}
    assert (report / "report.md").is_file() and list(report.glob("raw/**/*.log"))
    # published with the verification report attached: `dedal images` shows its verdict
    listing = subprocess.run(
        [dedal_exe(), "images", f"oras://{repo.registry.host}/ci/{name}", "--insecure", "--json"],
        env=repo.env,
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert listing.returncode == 0, listing.stderr
    images = json.loads(listing.stdout)
    entries = images if isinstance(images, list) else images.get("images", images.get("tags", []))
    assert {e["tag"]: e["verdict"] for e in entries}[labels["dedal.tag"]] == data["verdict"], images
