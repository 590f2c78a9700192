"""Fixtures for the CI tests.

* ``envs_repo``: a throwaway git repository of environments (``spack-envs/``, a package
  recipe directory the environments point at) with helpers to change and commit, for
  the unit tests of ``dedal ci generate`` (no gitlab-ci-local needed);
* ``ci_repo``: the same kind of repository holding this project's pipeline definition
  (``.gitlab-ci.yml``, ``ci/``) and a test environment built by the Spack stand-in,
  with an ``origin`` remote whose ``main`` is the commit before the change, and the
  CI/CD variables (paths under tmp_path, the local Slurm cluster, the local registry)
  in ``.gitlab-ci-local-variables.yml``; ``ci_repo.gcl(...)`` runs gitlab-ci-local there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import git
import pytest
import yaml

from tests.conftest import ROOT, SPACK_DATA
from tests.fixtures.registry import Registry, start_registry
from tests.standin import install_standin

GOLDEN = Path(__file__).resolve().parent / "golden"
GCL_TIMEOUT_S = 600
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def write_env(directory: Path, spack: dict, dedal: Optional[dict] = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    data = {"spack": spack}
    if dedal is not None:
        data["dedal"] = dedal
    path = directory / "env.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@dataclass
class EnvsRepo:
    root: Path
    repo: git.Repo

    def commit(self, message: str) -> str:
        self.repo.git.add(A=True)
        self.repo.index.commit(message)
        return self.repo.head.commit.hexsha

    def write(self, rel: str, text: str) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path


@pytest.fixture
def envs_repo(tmp_path: Path) -> EnvsRepo:
    """Environments cpu (defaults), gpu (GPU verify, own registry, tag, CI rebuild), quiet (no verify)
    and neuro (uses the recipes in recipes/repo), one commit."""
    root = tmp_path / "envs-repo"
    root.mkdir()
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "dedal tests")
        cw.set_value("user", "email", "tests@dedal.invalid")
    envs = root / "spack-envs"
    write_env(envs / "cpu", {"specs": ["openmpi@5"]}, {"name": "cpu"})
    write_env(
        envs / "gpu",
        {"specs": ["openmpi@5 +cuda", "nccl-tests"]},
        {
            "name": "esd-gpu",
            "tag": "2025.1",
            "registry": "oras://registry.example.org/esd/esd-gpu",
            "verify": {"gpu": True, "nodes": 2},
            "rebuild": True,
        },
    )
    write_env(envs / "quiet", {"specs": ["zlib"]}, {"name": "quiet", "verify": {"enabled": False}})
    write_env(
        envs / "neuro",
        {"specs": ["arbor"], "repos": ["../../recipes/repo"], "include": ["packages.yaml"]},
        {"name": "neuro"},
    )
    (envs / "neuro" / "packages.yaml").write_text("packages: {}\n")
    (root / "recipes" / "repo" / "packages" / "arbor").mkdir(parents=True)
    (root / "recipes" / "repo" / "packages" / "arbor" / "package.py").write_text("# arbor\n")
    (root / "recipes" / "repo" / "repo.yaml").write_text("repo: {namespace: site}\n")
    (root / "README.md").write_text("environments\n")
    r = EnvsRepo(root, repo)
    r.commit("environments")
    return r


# --------------------------------------------------------------------------- gitlab-ci-local


def need_gitlab_ci_local() -> str:
    exe = shutil.which("gitlab-ci-local")
    if not exe:
        pytest.skip("gitlab-ci-local is not installed (./setup.sh installs 4.73.0 with npm)")
    if not shutil.which("rsync"):
        pytest.skip("rsync is not installed (gitlab-ci-local needs it; ./setup.sh installs it)")
    return exe


@dataclass
class GclRun:
    returncode: int
    output: str  # stdout + stderr, without colours
    seconds: float

    def results(self) -> Dict[str, str]:
        """{job name: PASS|FAIL|WARN} from the summary lines; child jobs as in the parent
        run (``[dedal-images] -> tiny:build``) are named by the job alone."""
        found: Dict[str, str] = {}
        for line in self.output.splitlines():
            m = re.match(r"^\s*(PASS|FAIL|WARN)\s+(?:\[[^\]]+\]\s+->\s+)?(\S+)\s*$", line)
            if m:
                found[m.group(2)] = m.group(1)
        return found

    def job_lines(self, job: str) -> List[str]:
        return [line for line in self.output.splitlines() if re.search(rf"(^|-> ){re.escape(job)}\s+[>$]", line)]


@dataclass
class CiRepo:
    root: Path
    base: Path  # tmp directory of everything else
    env: Dict[str, str]  # environment of the gitlab-ci-local process
    variables: Dict[str, str]  # CI/CD variables (.gitlab-ci-local-variables.yml)
    before: str  # origin/main: the commit before the change
    head: str
    registry: Registry
    data: Path
    sifs: List[Path] = field(default_factory=list)

    def gcl(self, *args: str, timeout: float = GCL_TIMEOUT_S, stderr: bool = True) -> GclRun:
        """gitlab-ci-local with the shell executor, each job in its own copy of the tracked
        files (--shell-isolation); ``stderr=False`` leaves warnings out of ``output``."""
        exe = need_gitlab_ci_local()
        started = time.monotonic()
        proc = subprocess.run(
            [exe, "--no-color", "--shell-isolation", *args],
            cwd=self.root,
            env=self.env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if stderr else subprocess.DEVNULL,
            timeout=timeout,
        )
        return GclRun(proc.returncode, _ANSI.sub("", proc.stdout), time.monotonic() - started)

    def set_variables(self, **changes: str) -> None:
        self.variables.update(changes)
        write_variables(self.root, self.variables)

    @property
    def artifacts(self) -> Path:
        return self.root / "ci-artifacts"


def write_variables(root: Path, variables: Dict[str, str]) -> None:
    # dotenv format on purpose: in the YAML format gitlab-ci-local 4.73.0 turns every value
    # that is an existing path into a file variable (a copy; a directory makes it crash)
    lines = []
    for key, value in variables.items():
        assert "\n" not in value, (key, value)
        lines.append(f"{key}={value}\n")
    (root / ".gitlab-ci-local-variables.yml").write_text("".join(lines))


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


TINY_SPACK = {"specs": ["dedal-app"], "repos": [str(SPACK_DATA / "tiny-repo" / "repo")], "concretizer": {"unify": True}}
# The verification runner (dedal.stages.verify.runner) is not part of dedal yet: the test
# environment turns verification off, so its pipeline has no verify job (the generated
# verify jobs are covered by the golden files and `gitlab-ci-local --list`).
TINY_DEDAL = {"name": "tiny", "base_image": "host", "install_root": "/opt/esd/software", "verify": {"enabled": False}}


def make_ci_repo(base: Path, cluster, registry: Registry, fail: Iterable[str] = ()) -> CiRepo:
    """A repository with the pipeline definition and two environments, ``tiny`` (the test
    environment) and ``other`` (never built: the change does not touch it); ``origin/main``
    is the first commit, ``main`` adds a change to ``spack-envs/tiny``."""
    root = base / "repo"
    root.mkdir(parents=True)
    shutil.copy2(ROOT / ".gitlab-ci.yml", root / ".gitlab-ci.yml")
    shutil.copytree(ROOT / "ci", root / "ci", ignore=shutil.ignore_patterns("*.md"))
    write_env(root / "spack-envs" / "tiny", TINY_SPACK, TINY_DEDAL)
    write_env(root / "spack-envs" / "other", {"specs": ["zlib"]}, {"name": "other", "base_image": "host"})
    (root / ".gitignore").write_text(
        ".gitlab-ci-local/\n.gitlab-ci-local-variables.yml\nci-artifacts/\ndedal-image.env\ndedal-child-pipeline.yml\n"
    )
    _git(root, "init", "-q", "-b", "main")
    _git(root, "config", "user.name", "dedal tests")
    _git(root, "config", "user.email", "tests@dedal.invalid")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "pipeline and environments")
    before = _git(root, "rev-parse", "HEAD")
    origin = base / "origin.git"
    _git(base, "init", "-q", "--bare", str(origin))
    _git(root, "remote", "add", "origin", str(origin))
    _git(root, "push", "-q", "origin", "main")
    _git(root, "remote", "set-head", "origin", "main")
    write_env(root / "spack-envs" / "tiny", TINY_SPACK, dict(TINY_DEDAL, description="tiny test image, changed"))
    _git(root, "commit", "-q", "-a", "-m", "tiny: new description")
    head = _git(root, "rev-parse", "HEAD")

    spack = install_standin(base / "spack", fail=fail)
    data = base / "data"
    stage = base / "stage"
    stage.mkdir()
    home = base / "home"
    home.mkdir()
    variables = {
        # what GitLab predefines and gitlab-ci-local does not (CI_COMMIT_BEFORE_SHA) or not
        # as GitLab does (its CI_COMMIT_TIMESTAMP is the time of the run, not the commit's)
        "CI_COMMIT_BEFORE_SHA": before,
        "CI_COMMIT_TIMESTAMP": _git(root, "log", "-1", "--format=%cI"),
        # how the jobs find dedal: the virtualenv running these tests
        "DEDAL_CI_VENV": str(Path(sys.executable).parent.parent),
        # dedal's settings: shared storage (here: under tmp_path), Spack, Slurm, registry
        "DEDAL_DATA_DIR": str(data),
        "DEDAL_CI_PIPELINE_ROOT": str(base / "pipelines"),  # work, images, reports per pipeline
        "DEDAL_CACHE_DIR": str(base / "cache"),
        "DEDAL_BASE_CACHE": os.environ.get("DEDAL_BASE_CACHE", str(Path.home() / ".cache" / "dedal" / "base")),
        "DEDAL_SPACK_ROOT": str(spack),
        "DEDAL_STAGE_DIR": str(stage),
        "DEDAL_EXECUTOR": "slurm",
        "SLURM_CONF": cluster.env["SLURM_CONF"],
        "DEDAL_SLURM_PARTITION": cluster.partition,
        "DEDAL_SLURM_POLL_S": "0.3",
        # assembly on a compute node through srun, as a site with a busy login node would do
        "DEDAL_CI_ASSEMBLE_LAUNCHER": f"srun --nodes=1 --ntasks=1 --partition={cluster.partition}",
        "DEDAL_REGISTRY": f"oras://{registry.host}/ci",
        "DEDAL_REGISTRY_INSECURE": "true",
    }
    write_variables(root, variables)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEDAL_", "CI_", "GITLAB_", "SLURM_"))}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_CACHE_HOME=str(home / ".cache"))
    env.pop("SOURCE_DATE_EPOCH", None)
    # set on purpose (above; CI_PIPELINE_SOURCE by gitlab-ci-local itself for a child): no warning
    env["GCL_IGNORE_PREDEFINED_VARS"] = "CI_COMMIT_TIMESTAMP,CI_PIPELINE_SOURCE"
    return CiRepo(root, base, env, variables, before, head, registry, data)


@pytest.fixture
def ci_registry(tmp_path: Path):
    reg = start_registry(tmp_path / "registry")
    yield reg
    reg.stop()
