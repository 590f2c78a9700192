"""recipes/gitsrc/archive.py: sources from git repositories into the Spack source mirror,
archived at the pinned commit and checked against the sha256 the manifest records (or
recorded with --record); against repositories made here, cloned through file:// URLs (no
network). Then the committed manifest against the recipes that pin the same files, and
against the mirror the script filled on this machine (skipped where it has not run)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import git
import pytest
import yaml

from dedal.model import git_sources as gs
from dedal.model.config import load_settings
from tests.conftest import ROOT

SCRIPT = ROOT / "recipes" / "gitsrc" / "archive.py"
MANIFEST = ROOT / "recipes" / "repo" / gs.MANIFEST


@pytest.fixture
def origin(tmp_path) -> git.Repo:
    r = git.Repo.init(tmp_path / "origin")
    with r.config_writer() as cw:
        cw.set_value("user", "name", "t")
        cw.set_value("user", "email", "t@example.org")
    (tmp_path / "origin" / "bench.c").write_text("int main(void) { return 0; }\n")
    r.index.add(["bench.c"])
    r.index.commit("first")
    r.create_tag("v1.0")
    return r


def manifest_for(tmp_path: Path, repo: git.Repo, **over) -> Path:
    commit = repo.commit("v1.0").hexsha
    entry = {
        "package": "bench",
        "version": "1.0",
        "repository": Path(repo.working_dir).as_uri(),
        "ref": "v1.0",
        "commit": commit,
        "prefix": "bench-1.0/",
        "url": "https://example.org/bench-1.0.tar.gz",
        "sha256": "",
        "size": 0,
    }
    entry.update(over)
    path = tmp_path / "repo" / gs.MANIFEST
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"format": 1, "namespace": "t", "sources": [entry]}, indent=2) + "\n")
    return path


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEDAL_")}
    env.update(
        DEDAL_CACHE_DIR=str(tmp_path / "cache"),
        DEDAL_DATA_DIR=str(tmp_path / "data"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, text=True, capture_output=True, timeout=120)


def test_record_then_check_against_the_record(tmp_path, origin):
    manifest = manifest_for(tmp_path, origin)
    mirror = tmp_path / "mirror"
    res = run(tmp_path, "--manifest", str(manifest), "--mirror", str(mirror), "--record", "--json")
    assert res.returncode == 0, res.stderr
    [done] = json.loads(res.stdout)
    entry = gs.read(manifest).find("bench", "1.0")
    stored = mirror / entry.storage_path
    assert done["status"] == "added" and done["recorded"] is True and done["path"] == str(stored)
    assert entry.sha256 == hashlib.sha256(stored.read_bytes()).hexdigest() and entry.size == stored.stat().st_size
    link = mirror / "bench" / "bench-1.0.tar.gz"
    assert link.is_symlink() and link.resolve() == stored.resolve() and not os.path.isabs(os.readlink(link))
    # the clone went to dedal's cache; the next run needs no origin at all
    assert list((tmp_path / "cache" / "gitsrc").glob("*.git"))
    recorded = manifest.read_text()
    origin.close()
    os.rename(origin.working_dir, tmp_path / "gone")
    res = run(tmp_path, "--manifest", str(manifest), "--mirror", str(mirror))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("bytes, present)") and manifest.read_text() == recorded
    assert sorted(p.name for p in stored.parent.iterdir()) == [stored.name]  # no temporaries left


def test_an_archive_that_is_not_the_recorded_one_is_refused(tmp_path, origin):
    manifest = manifest_for(tmp_path, origin, sha256="ab" * 32, size=10)
    before = manifest.read_text()
    res = run(
        tmp_path,
        "--manifest",
        str(manifest),
        "--mirror",
        str(tmp_path / "mirror"),
        "--git-dir",
        f"bench={origin.working_dir}",
    )
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.startswith("archive.py: error: bench@1.0: the archive of ") and res.stderr.count("\n") == 1
    assert f"the manifest records {'ab' * 32}" in res.stderr
    assert manifest.read_text() == before
    assert not [p for p in (tmp_path / "mirror").rglob("*") if p.is_file()]  # nothing stored
    # never recorded: says how
    manifest = manifest_for(tmp_path, origin)
    res = run(
        tmp_path,
        "--manifest",
        str(manifest),
        "--mirror",
        str(tmp_path / "mirror"),
        "--git-dir",
        f"bench={origin.working_dir}",
    )
    assert res.returncode == 1 and "records none (run with --record)" in res.stderr


def test_a_tag_that_moved_is_refused(tmp_path, origin):
    manifest = manifest_for(tmp_path, origin)
    (Path(origin.working_dir) / "bench.c").write_text("int main(void) { return 1; }\n")
    origin.index.add(["bench.c"])
    moved = origin.index.commit("second").hexsha
    origin.create_tag("v1.0", force=True)
    res = run(
        tmp_path,
        "--manifest",
        str(manifest),
        "--mirror",
        str(tmp_path / "mirror"),
        "--record",
        "--git-dir",
        f"bench={origin.working_dir}",
    )
    assert res.returncode == 1 and f"v1.0 names {moved}" in res.stderr and res.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "args, says",
    [
        (["--git-dir", "bench"], "--git-dir 'bench': expected PACKAGE=DIR"),
        (["--git-dir", "other=/tmp"], "other is not in"),
        (["--git-dir", "bench=/nonexistent"], "/nonexistent is not a directory"),
        (["nothing"], "nothing: not in"),
    ],
)
def test_bad_input_is_exit_2_in_one_line(tmp_path, origin, args, says):
    manifest = manifest_for(tmp_path, origin)
    res = run(tmp_path, "--manifest", str(manifest), "--mirror", str(tmp_path / "mirror"), *args)
    assert res.returncode == 2 and says in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert not (tmp_path / "mirror").exists()


def test_a_missing_or_broken_manifest_is_exit_2(tmp_path):
    res = run(tmp_path, "--manifest", str(tmp_path / "none.json"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    (tmp_path / "bad.json").write_text('{"format": 1}')
    res = run(tmp_path, "--manifest", str(tmp_path / "bad.json"))
    assert res.returncode == 2 and "namespace" in res.stderr and res.stderr.count("\n") == 1


# ----------------------------------------------------------------------------- the committed manifest


def recipe_versions(package: str) -> Dict[str, Dict[str, Optional[str]]]:
    """version -> {sha256, url} as the dedal recipe of ``package`` pins them (its text)."""
    text = (ROOT / "recipes" / "repo" / "packages" / package / "package.py").read_text()
    found: Dict[str, Dict[str, Optional[str]]] = {}
    for m in re.finditer(r"version\(\s*\"([^\"]+)\"(.*?)\)\n", text, re.S):
        sha = re.search(r"sha256=\"([0-9a-f]{64})\"", m.group(2))
        url = re.search(r"url=((?:\s*\"[^\"]*\")+)", m.group(2))
        found[m.group(1)] = {
            "sha256": sha.group(1) if sha else None,
            "url": "".join(re.findall(r"\"([^\"]*)\"", url.group(1))) if url else None,
        }
    return found


def entries() -> List[gs.GitSource]:
    return gs.read(MANIFEST).sources


@pytest.mark.parametrize("entry", entries(), ids=lambda e: e.spec)
def test_the_recipe_pins_the_recorded_archive(entry):
    pinned = recipe_versions(entry.package)
    assert entry.version in pinned, f"recipes/repo/packages/{entry.package} has no version {entry.version}"
    assert pinned[entry.version]["sha256"] == entry.sha256
    assert pinned[entry.version]["url"] in (None, entry.url)  # None: the builtin's URL, GitHub's tag archive


def test_the_environments_require_the_recorded_versions():
    """An environment that pins one of these packages pins a version the manifest records
    (a version without an archive would send `dedal fetch` to GitHub)."""
    recorded = {}
    for s in entries():
        recorded.setdefault(s.package, set()).add(s.version)
    pinned = {}
    for env_file in sorted((ROOT / "spack-envs").glob("*/env.yaml")):
        packages = yaml.safe_load(env_file.read_text())["spack"].get("packages", {})
        for package in recorded:
            require = packages.get(package, {}).get("require")
            if require is not None:
                pinned[(env_file.parent.name, package)] = require
                assert require.lstrip("@=") in recorded[package], (env_file, package, require)
    assert pinned[("esd-neuro", "neuron-ringtest")] and pinned[("esd-neuro", "arbor-busyring")]
    assert pinned[("esd-cpu", "osu-micro-benchmarks")]


@pytest.mark.parametrize("entry", entries(), ids=lambda e: e.spec)
def test_the_mirror_holds_the_recorded_archive(entry):
    """The mirror this machine's dedal uses, as the script left it: skipped where the
    script has not run (a fresh machine: the sources are not part of this repository)."""
    mirror = Path(load_settings().mirror)
    stored = mirror / entry.storage_path
    if not stored.is_file():
        pytest.skip(
            f"{entry.spec} is not in the mirror {mirror}: run recipes/gitsrc/archive.py (it clones {entry.repository})"
        )
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == entry.sha256
    assert stored.stat().st_size == entry.size
