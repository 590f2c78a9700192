"""`dedal ci generate`: which environments a change touches (on a real git repository)
and the child pipeline for them (golden files); `dedal ci collect`.

These need neither GitLab nor gitlab-ci-local. Regenerate the golden files after an
intended change with ``DEDAL_UPDATE_GOLDEN=1 pytest tests/ci/test_gitlab.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from dedal.ci import gitlab as ci
from dedal.adapters import git as gitad
from dedal.errors import UserError
from tests.conftest import SPACK_DATA
from tests.ci.conftest import GOLDEN, EnvsRepo, write_env
from tests.fixtures.golden import assert_golden

ALL = ["cpu", "esd-gpu", "neuro", "quiet"]


def names(selection: ci.Selection):
    return [e.name for e in selection.envs]


def golden(name: str, text: str) -> None:
    assert_golden(name, text, GOLDEN)


# --------------------------------------------------------------------------- golden files


def test_child_pipeline_of_every_environment_matches_the_golden_file(envs_repo: EnvsRepo, run_dedal):
    res = run_dedal("ci", "generate", "--all", cwd=envs_repo.root)
    assert res.returncode == 0, res.stderr
    golden("all.yml", res.stdout)
    again = run_dedal("ci", "generate", "--all", cwd=envs_repo.root)
    assert again.stdout == res.stdout  # deterministic


def test_child_pipeline_shape(envs_repo: EnvsRepo):
    doc = yaml.safe_load(ci.render(ci.select(envs_repo.root, all_envs=True)))
    assert doc["include"] == [{"local": "ci/templates.yml"}]
    assert doc["stages"] == ["fetch", "build", "assemble", "verify", "publish", "rebuild"]  # esd-gpu rebuilds
    jobs = {k: v for k, v in doc.items() if k not in ("include", "stages")}
    # per environment: fetch -> build -> assemble -> verify -> publish, chained by needs
    assert [k for k in jobs if k.startswith("cpu:")] == [f"cpu:{s}" for s in ci.STAGES]
    assert jobs["cpu:build"]["needs"] == ["cpu:fetch"] and jobs["cpu:assemble"]["needs"] == ["cpu:build"]
    assert jobs["cpu:verify"]["needs"] == ["cpu:assemble"]
    assert jobs["cpu:publish"]["needs"] == ["cpu:assemble", "cpu:verify"]
    assert "needs" not in jobs["cpu:fetch"]
    assert {j["resource_group"] for k, j in jobs.items() if k.startswith("cpu:")} == {"dedal-cpu"}
    for k, j in jobs.items():
        assert j["extends"] == (".dedal-verify-gpu" if k == "esd-gpu:verify" else f".dedal-{k.split(':')[1]}")
        assert j["stage"] == k.split(":")[1]
    # GPU environment: GPU verify template, its nodes, its tag, its own registry
    assert jobs["esd-gpu:verify"]["extends"] == ".dedal-verify-gpu"
    assert jobs["esd-gpu:verify"]["variables"]["DEDAL_CI_VERIFY_NODES"] == "2"
    assert jobs["esd-gpu:verify"]["variables"]["DEDAL_CI_VERIFY_GPU"] == "true"
    assert jobs["esd-gpu:fetch"]["variables"] == {
        "DEDAL_CI_ENV": "esd-gpu",
        "DEDAL_CI_ENV_FILE": "spack-envs/gpu/env.yaml",
        "DEDAL_CI_IMAGE_TAG": "2025.1",
    }
    assert jobs["esd-gpu:publish"]["variables"]["DEDAL_CI_REGISTRY_REPO"] == "oras://registry.example.org/esd/esd-gpu"
    # publish: default branch or tags; without an own registry only when $DEDAL_REGISTRY is set
    assert [r["if"] for r in jobs["esd-gpu:publish"]["rules"]] == [
        "$CI_COMMIT_TAG",
        "$CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH",
    ]
    assert [r["if"] for r in jobs["cpu:publish"]["rules"]] == [
        "$DEDAL_REGISTRY && $CI_COMMIT_TAG",
        "$DEDAL_REGISTRY && $CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH",
    ]
    assert "DEDAL_CI_REGISTRY_REPO" not in jobs["cpu:publish"]["variables"]
    # verification off: no verify job, publish needs only the image
    assert "quiet:verify" not in jobs and jobs["quiet:publish"]["needs"] == ["quiet:assemble"]
    # dedal.rebuild: true: the published image rebuilt after publishing, on the same rules; others none
    assert jobs["esd-gpu:rebuild"]["needs"] == ["esd-gpu:publish"]
    assert jobs["esd-gpu:rebuild"]["rules"] == jobs["esd-gpu:publish"]["rules"]
    assert jobs["esd-gpu:rebuild"]["variables"] == jobs["esd-gpu:publish"]["variables"]
    assert [k for k in jobs if k.endswith(":rebuild")] == ["esd-gpu:rebuild"]
    quiet_only = yaml.safe_load(ci.render(ci.select(envs_repo.root, envs=["spack-envs/quiet"])))
    assert quiet_only["stages"] == list(ci.STAGES)  # no rebuild stage where no environment asks for one


def test_nothing_to_build_gives_a_pipeline_with_one_job_saying_so(envs_repo: EnvsRepo, run_dedal):
    envs_repo.write("README.md", "only the README changed\n")
    sha = envs_repo.repo.head.commit.hexsha
    envs_repo.commit("docs")
    res = run_dedal("ci", "generate", "--changed-since", sha, cwd=envs_repo.root)
    assert res.returncode == 0, res.stderr
    golden("nothing.yml", res.stdout.replace(sha[:12], "<sha>"))
    doc = yaml.safe_load(res.stdout)
    assert [k for k in doc if k not in ("include", "stages")] == ["dedal-nothing-to-build"]


def test_the_golden_child_pipeline_names_only_templates_that_exist():
    templates = yaml.load(
        (Path(__file__).resolve().parents[2] / "ci" / "templates.yml").read_text(), Loader=_ReferenceLoader
    )
    for name in ("all.yml", "nothing.yml"):
        doc = yaml.safe_load((GOLDEN / name).read_text())
        for job, body in doc.items():
            if isinstance(body, dict) and "extends" in body:
                assert body["extends"] in templates, (name, job, body["extends"])


class _ReferenceLoader(yaml.SafeLoader):
    pass


_ReferenceLoader.add_constructor("!reference", lambda loader, node: loader.construct_sequence(node))


# --------------------------------------------------------------------------- which environments


def test_changed_environment_is_selected_and_only_it(envs_repo: EnvsRepo):
    base = envs_repo.repo.head.commit.hexsha
    write_env(envs_repo.root / "spack-envs" / "cpu", {"specs": ["openmpi@5", "hwloc"]}, {"name": "cpu"})
    envs_repo.commit("cpu: hwloc")
    sel = ci.select(envs_repo.root, changed_since=base)
    assert names(sel) == ["cpu"] and sel.changes == {"cpu": ["spack-envs/cpu/env.yaml"]}
    assert sel.reason == f"changed since {base[:12]}" and sel.note == ""


def test_a_recipe_or_included_file_touches_the_environments_using_it(envs_repo: EnvsRepo):
    base = envs_repo.repo.head.commit.hexsha
    envs_repo.write("recipes/repo/packages/arbor/package.py", "# arbor 0.10\n")
    envs_repo.commit("arbor recipe")
    assert names(ci.select(envs_repo.root, changed_since=base)) == ["neuro"]
    base = envs_repo.repo.head.commit.hexsha
    envs_repo.write("spack-envs/neuro/packages.yaml", "packages: {all: {target: [x86_64_v3]}}\n")
    envs_repo.commit("neuro: packages")
    sel = ci.select(envs_repo.root, changed_since=base)
    assert names(sel) == ["neuro"] and sel.changes["neuro"] == ["spack-envs/neuro/packages.yaml"]
    assert ci.watched_paths(envs_repo.root, envs_repo.root / "spack-envs/neuro/env.yaml") == [
        "recipes/repo",
        "spack-envs/neuro",
        "spack-envs/neuro/packages.yaml",
    ]


def test_changes_outside_environments_select_nothing(envs_repo: EnvsRepo):
    base = envs_repo.repo.head.commit.hexsha
    envs_repo.write("README.md", "more words\n")
    envs_repo.write("ci/notes.txt", "pipeline notes\n")
    envs_repo.commit("docs")
    sel = ci.select(envs_repo.root, changed_since=base)
    assert sel.envs == [] and sel.changes == {}


def test_several_commits_renames_and_deletions(envs_repo: EnvsRepo):
    base = envs_repo.repo.head.commit.hexsha
    envs_repo.repo.git.mv("spack-envs/quiet", "spack-envs/silent")  # moved: the new place is built
    envs_repo.commit("rename quiet")
    shutil.rmtree(envs_repo.root / "spack-envs" / "cpu")  # removed: nothing to build
    envs_repo.commit("drop cpu")
    write_env(envs_repo.root / "spack-envs" / "new", {"specs": ["hdf5"]}, {"name": "fresh"})  # added
    envs_repo.commit("add new")
    sel = ci.select(envs_repo.root, changed_since=base)
    assert names(sel) == ["fresh", "quiet"]
    assert [e.env_file for e in sel.envs] == ["spack-envs/new/env.yaml", "spack-envs/silent/env.yaml"]


def test_unknown_previous_commit_takes_every_environment_with_a_note(envs_repo: EnvsRepo):
    for ref in ("0" * 40, "", "1234567890abcdef1234567890abcdef12345678"):
        sel = ci.select(envs_repo.root, changed_since=ref)
        assert names(sel) == ALL
        assert "not a commit of this clone" in sel.note and sel.reason.startswith("every environment")


def test_shallow_clone_without_the_previous_commit_takes_every_environment(envs_repo: EnvsRepo, tmp_path):
    base = envs_repo.repo.head.commit.hexsha
    envs_repo.write("spack-envs/cpu/env.yaml", "spack: {specs: [openmpi@5.0.7]}\ndedal: {name: cpu}\n")
    envs_repo.commit("cpu: pin")
    clone = tmp_path / "shallow"
    gitad.git.Repo.clone_from(f"file://{envs_repo.root}", clone, depth=1)  # what GitLab's GIT_DEPTH does
    assert gitad.changed_paths(clone, base) is None
    assert names(ci.select(clone, changed_since=base)) == ALL
    assert names(ci.select(envs_repo.root, changed_since=base)) == ["cpu"]


def test_named_environments_restrict_the_selection(envs_repo: EnvsRepo):
    base = envs_repo.repo.head.commit.hexsha
    for env in ("cpu", "quiet"):
        envs_repo.write(f"spack-envs/{env}/extra.txt", "x\n")
    envs_repo.commit("touch two")
    root = envs_repo.root
    assert names(ci.select(root, envs=["spack-envs/gpu", "spack-envs/cpu/env.yaml"])) == ["cpu", "esd-gpu"]
    assert names(ci.select(root, envs=["spack-envs/gpu", "spack-envs/cpu"], changed_since=base)) == ["cpu"]
    assert names(ci.select(root, envs=["spack-envs/gpu"], all_envs=True)) == ["esd-gpu"]


def test_a_broken_environment_fails_generation_only_when_it_is_to_be_built(envs_repo: EnvsRepo, run_dedal):
    base = envs_repo.repo.head.commit.hexsha
    envs_repo.write("spack-envs/quiet/env.yaml", "spack: {specs: [zlib]}\ndedal: {name: quiet, verfy: {}}\n")
    envs_repo.commit("typo in quiet")
    res = run_dedal("ci", "generate", "--changed-since", base, cwd=envs_repo.root)
    assert res.returncode == 2
    assert "spack-envs/quiet/env.yaml" in res.stderr and "verfy" in res.stderr and "Traceback" not in res.stderr
    base = envs_repo.repo.head.commit.hexsha
    write_env(envs_repo.root / "spack-envs" / "cpu", {"specs": ["openmpi@5", "ucx"]}, {"name": "cpu"})
    envs_repo.commit("cpu: ucx")
    assert names(ci.select(envs_repo.root, changed_since=base)) == ["cpu"]  # quiet is not read


def test_two_environments_with_one_name_are_refused(envs_repo: EnvsRepo):
    write_env(envs_repo.root / "spack-envs" / "cpu2", {"specs": ["zlib"]}, {"name": "cpu"})
    envs_repo.commit("cpu2")
    with pytest.raises(UserError, match="both named 'cpu'"):
        ci.select(envs_repo.root, all_envs=True)


def test_environment_discovery(tmp_path: Path):
    root = tmp_path / "r"
    write_env(root / "spack-envs" / "a", {"specs": ["zlib"]})
    (root / "spack-envs" / "a" / "sub").mkdir()
    (root / "spack-envs" / "a" / "sub" / "spack.yaml").write_text("spack: {specs: [x]}\n")  # part of a
    (root / "spack-envs" / "group" / "b").mkdir(parents=True)
    (root / "spack-envs" / "group" / "b" / "spack.yaml").write_text("spack: {specs: [zlib]}\n")
    (root / "spack-envs" / ".hidden").mkdir()
    (root / "spack-envs" / ".hidden" / "env.yaml").write_text("spack: {specs: [zlib]}\n")
    (root / "spack-envs" / "empty").mkdir()
    assert [p.relative_to(root).as_posix() for p in ci.env_dirs(root)] == ["spack-envs/a", "spack-envs/group/b"]
    sel = ci.select(root, all_envs=True)
    assert [(e.name, e.env_file) for e in sel.envs] == [
        ("a", "spack-envs/a/env.yaml"),
        ("b", "spack-envs/group/b/spack.yaml"),
    ]
    with pytest.raises(UserError, match="no such directory"):
        ci.env_dirs(root, "nowhere")


# --------------------------------------------------------------------------- the command line


def test_cli_writes_the_pipeline_and_says_what_and_why(envs_repo: EnvsRepo, run_dedal):
    base = envs_repo.repo.head.commit.hexsha
    envs_repo.write("spack-envs/gpu/notes.md", "why\n")
    envs_repo.commit("gpu notes")
    out = envs_repo.root / "out" / "child.yml"
    res = run_dedal("ci", "generate", "--changed-since", base, "-o", str(out), cwd=envs_repo.root / "spack-envs")
    assert res.returncode == 0, res.stderr
    assert f"1 environment(s) (changed since {base[:12]}): esd-gpu" in res.stdout
    assert "spack-envs/gpu/notes.md" in res.stdout
    assert "esd-gpu:fetch:" in out.read_text() and not list(out.parent.glob(".*tmp*"))
    res = run_dedal("ci", "generate", "--changed-since", base, "-o", str(out), "--json", cwd=envs_repo.root)
    data = json.loads(res.stdout)
    assert [e["name"] for e in data["environments"]] == ["esd-gpu"]
    assert data["changes"] == {"esd-gpu": ["spack-envs/gpu/notes.md"]}


def test_cli_unknown_commit_note_and_bad_input(envs_repo: EnvsRepo, run_dedal, tmp_path):
    res = run_dedal("ci", "generate", "--changed-since", "0" * 40, "-o", "c.yml", cwd=envs_repo.root)
    assert res.returncode == 0 and "note:" in res.stderr and "4 environment(s)" in res.stdout
    for args, message in (
        (["--all", "--changed-since", "HEAD"], "exclude each other"),
        ([], "say which environments"),
        (["spack-envs/nothere"], "no env.yaml or spack.yaml"),
        (["--all", "--envs-dir", "elsewhere"], "no such directory"),
        (["--all", "--json"], "give -o FILE"),
    ):
        res = run_dedal("ci", "generate", *args, cwd=envs_repo.root)
        assert res.returncode == 2 and message in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.stderr
    outside = tmp_path / "outside"
    write_env(outside, {"specs": ["zlib"]})
    res = run_dedal("ci", "generate", str(outside), cwd=envs_repo.root)
    assert res.returncode == 2 and "not inside the repository" in res.stderr
    plain = tmp_path / "plain"  # no git: named environments still work, --changed-since does not
    write_env(plain / "spack-envs" / "x", {"specs": ["zlib"]})
    assert run_dedal("ci", "generate", "--all", cwd=plain).returncode == 0
    res = run_dedal("ci", "generate", "--changed-since", "HEAD", cwd=plain)
    assert res.returncode == 2 and "not inside a git repository" in res.stderr


# --------------------------------------------------------------------------- collect


def test_collect_lists_what_a_failed_stage_left_out(run_dedal, tmp_path):
    envdir = tmp_path / "env"
    write_env(envdir, {"specs": ["dedal-app"]}, {"name": "tiny", "base_image": "host"})
    shutil.copyfile(SPACK_DATA / "tiny-dedal.spack.lock", envdir / "spack.lock")
    data = tmp_path / "data"
    logs = data / "work" / "tiny" / "logs"
    logs.mkdir(parents=True)
    (logs / "concretize.log").write_text("==> concretized\n")
    (logs / "libdedal-abcdefg.log").write_text("==> Error: build failed\n")
    (data / "work" / "tiny" / "spack.lock").write_text((envdir / "spack.lock").read_text())
    env = {"DEDAL_DATA_DIR": str(data)}
    res = run_dedal("ci", "collect", "fetch", str(envdir), "--json", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["files"] == ["logs/concretize.log", "spack.lock"]
    assert any(m.endswith("plan.json") for m in got["missing"])
    res = run_dedal("ci", "collect", "build", str(envdir), "--json", cwd=tmp_path, env=env)
    got = json.loads(res.stdout)
    assert "logs/libdedal-abcdefg.log" in got["files"] and "logs/concretize.log" not in got["files"]
    assert got["directory"] == "ci-artifacts/tiny/build"
    assert (tmp_path / "ci-artifacts" / "tiny" / "build" / "logs" / "libdedal-abcdefg.log").is_file()
    res = run_dedal("ci", "collect", "assemble", str(envdir), cwd=tmp_path, env=env)
    assert res.returncode == 0 and "not there" in res.stdout
    assert not (tmp_path / "ci-artifacts" / "tiny" / "assemble" / "image.env").exists()
    res = run_dedal("ci", "collect", "deploy", str(envdir), cwd=tmp_path, env=env)
    assert res.returncode == 2


def test_templates_and_parent_pipeline_are_plain_gitlab_yaml():
    """Every script line a string (an unquoted `echo "a: b"` would be a mapping), every
    hidden template a generated job extends is there, and the parent's two jobs."""
    root = Path(__file__).resolve().parents[2]
    templates = yaml.load((root / "ci" / "templates.yml").read_text(), Loader=_ReferenceLoader)
    parent = yaml.load((root / "ci" / "gitlab-ci.yml").read_text(), Loader=_ReferenceLoader)
    for doc in (templates, parent):
        for job, body in doc.items():
            if not isinstance(body, dict):
                continue
            for key in ("script", "before_script", "after_script"):
                for line in body.get(key) or []:
                    assert isinstance(line, (str, list)), (job, key, line)
    assert {
        ".dedal-fetch",
        ".dedal-build",
        ".dedal-assemble",
        ".dedal-verify",
        ".dedal-verify-gpu",
        ".dedal-publish",
        ".dedal-nothing",
        ".dedal-generate",
    } <= set(templates)
    assert parent["dedal-images"]["trigger"]["include"] == [
        {"artifact": "dedal-child-pipeline.yml", "job": "dedal-generate"}
    ]
    assert parent["dedal-images"]["trigger"]["strategy"] == "depend"
    assert yaml.safe_load((root / ".gitlab-ci.yml").read_text())["include"] == [{"local": "ci/gitlab-ci.yml"}]


def test_report_directories_are_found_by_name_or_by_the_image_their_verify_json_names(tmp_path):
    """CI attaches the reports of an image: named after it, or whose verify.json (read through
    dedal.model.verify_report) names it; an unreadable one names nothing."""
    reports = tmp_path / "reports"
    for rel, data in (
        ("demo/latest", {"verdict": "good"}),
        ("other", {"image": "/x/images/demo/v1.sif"}),
        ("broken", None),
        ("unrelated", {"image": "/x/else.sif"}),
    ):
        (reports / rel).mkdir(parents=True)
        (reports / rel / "verify.json").write_text("{oops" if data is None else json.dumps(data))
    found = ci._report_dirs(reports, "demo", "latest", Path("/y/demo/v1.sif"))
    assert [d.relative_to(reports).as_posix() for d in found] == ["other", "demo/latest"]
