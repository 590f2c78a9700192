"""env.yaml: a Spack environment plus a dedal section; precise one-line errors."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dedal.model.envfile import load_env
from tests.conftest import ROOT


@pytest.mark.parametrize("path", sorted((ROOT / "spack-envs").glob("*/env.yaml")), ids=lambda p: p.parent.name)
def test_project_environments_are_valid(path):
    env = load_env(path)
    assert env.name == path.parent.name
    assert env.spack["specs"]
    for repo in env.spack_yaml()["spack"].get("repos", []):
        assert Path(repo).is_absolute() and (Path(repo) / "repo.yaml").is_file()
    for include in env.spack_yaml()["spack"].get("include", []):  # e.g. ../debian-trixie-externals.yaml
        assert Path(include).is_absolute() and "packages" in yaml.safe_load(Path(include).read_text())


def test_spack_section_is_passed_untouched_and_written(tmp_path):
    spack = {"specs": ["zlib", "openmpi@5 +cuda"], "packages": {"all": {"require": "target=x86_64_v3"}},
             "config": {"build_jobs": 3}, "include": ["externals.yaml", "/abs/x.yaml"], "repos": ["repo"]}
    (tmp_path / "env.yaml").write_text(yaml.safe_dump({"spack": spack}))
    env = load_env(tmp_path)
    assert env.name == tmp_path.name and env.tag == "latest"
    out = env.write_spack_yaml(tmp_path / "work")
    written = yaml.safe_load(out.read_text())["spack"]
    assert written["specs"] == spack["specs"] and written["packages"] == spack["packages"]
    assert written["include"] == [str(tmp_path / "externals.yaml"), "/abs/x.yaml"]
    assert written["repos"] == [str(tmp_path / "repo")]


@pytest.mark.parametrize("doc, message", [
    ({"dedal": {"name": "x"}}, "missing 'spack:' section"),
    ({"spack": {"specs": []}, "dedl": {}}, "unknown key 'dedl'"),
    ({"spack": {}, "dedal": {"colour": "red"}}, "dedal: unknown key 'colour'"),
    ({"spack": {}, "dedal": {"verify": {"repetitions": "five"}}}, "dedal.verify.repetitions: expected integer, got 'five'"),
    ({"spack": {}, "dedal": {"install_root": "opt/x"}}, "dedal.install_root: expected an absolute path"),
    ({"spack": {}, "dedal": {"verify": {"launcher": "ssh"}}}, "dedal.verify.launcher: expected one of auto, mpirun, srun"),
    ({"spack": {}, "dedal": {"verify": {"thresholds": {"latency_overhead_us": -1}}}}, "must be at least 0"),
    ({"spack": {}, "dedal": {"registry": "docker://x"}}, "dedal.registry: invalid value"),
    ({"spack": []}, "spack: expected object"),
    ({"spack": {}, "dedal": {"runtime_base": ""}}, "dedal.runtime_base: must not be empty"),
    ({"spack": {}, "dedal": {"runtime_base": ["a"]}}, "dedal.runtime_base: expected string, got ['a']"),
    ({"spack": {}, "dedal": {"verify": {"apps": [{"name": "x"}]}}}, "dedal.verify.apps.0: missing key 'command'"),
    ({"spack": {}, "dedal": {"verify": {"apps": [{"name": "x", "command": []}]}}},
     "dedal.verify.apps.0.command: expected a non-empty string or list of strings, got []"),
    ({"spack": {}, "dedal": {"verify": {"apps": [{"name": "x", "command": "true", "expect": "("}]}}},
     "dedal.verify.apps.0.expect: not a regular expression"),
    ({"spack": {}, "dedal": {"verify": {"apps": [{"name": "x", "command": "a"}, {"name": "x", "command": "b"}]}}},
     "dedal.verify.apps.1.name: 'x' is used twice"),
    ({"spack": {}, "dedal": {"verify": {"apps": [{"name": "x", "command": "a", "ranks": 0}]}}},
     "dedal.verify.apps.0.ranks: must be at least 1"),
    ({"spack": {}, "dedal": {"verify": {"apps": [{"name": "x", "command": "a", "timeout": 0}]}}},
     "dedal.verify.apps.0.timeout: must be more than 0"),
    ({"spack": {}, "dedal": {"verify": {"apps": [{"name": "x", "command": "a", "rank": 2}]}}},
     "dedal.verify.apps.0: unknown key 'rank'"),
])
def test_bad_environment_files(tmp_path, doc, message):
    (tmp_path / "env.yaml").write_text(yaml.safe_dump(doc))
    from dedal.errors import UserError
    with pytest.raises(UserError) as info:
        load_env(tmp_path / "env.yaml")
    assert message in str(info.value)
    assert "\n" not in info.value.one_line()


def test_bad_environment_cli_exit_2_nothing_written(run_dedal, tmp_path):
    env_file = tmp_path / "env.yaml"
    env_file.write_text("dedal:\n  name: x\n")
    data = tmp_path / "data"
    res = run_dedal("plan", str(env_file), env={"DEDAL_DATA_DIR": str(data)})
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "missing 'spack:' section" in res.stderr
    assert not data.exists()
    env_file.write_text("spack: {specs: [zlib]\n")
    res = run_dedal("fetch", str(env_file), env={"DEDAL_DATA_DIR": str(data)})
    assert res.returncode == 2 and "not valid YAML" in res.stderr and not data.exists()


def test_runtime_base_key(tmp_path):
    """dedal.runtime_base: the base the image is assembled on; absent, nothing changes (None:
    the build base, base_image or the setting)."""
    (tmp_path / "env.yaml").write_text(yaml.safe_dump({"spack": {"specs": ["zlib"]}, "dedal": {
        "base_image": "debian-trixie-cuda", "runtime_base": "debian-trixie-cuda-runtime"}}))
    env = load_env(tmp_path)
    assert (env.base_image, env.runtime_base) == ("debian-trixie-cuda", "debian-trixie-cuda-runtime")
    (tmp_path / "env.yaml").write_text(yaml.safe_dump({"spack": {"specs": ["zlib"]}}))
    assert load_env(tmp_path).runtime_base is None


def test_verify_apps(tmp_path):
    """dedal.verify.apps: a shell line runs through /bin/sh -c, a list as it is; defaults 2 ranks
    on 1 node, no expected output, 600 s."""
    (tmp_path / "env.yaml").write_text(yaml.safe_dump({"spack": {"specs": ["zlib"]}, "dedal": {"verify": {"apps": [
        {"name": "ring", "command": ["python3", "-c", "print(1)"], "ranks": 4, "nodes": 2, "expect": "^1$",
         "timeout": 30, "env": {"OMP_NUM_THREADS": "1"}},
        {"name": "hello", "command": "echo hi | tr a-z A-Z"}]}}}))
    apps = load_env(tmp_path).verify.apps
    assert [a.to_json() for a in apps] == [
        {"name": "ring", "command": ["python3", "-c", "print(1)"], "ranks": 4, "nodes": 2, "expect": "^1$",
         "timeout": 30.0, "env": {"OMP_NUM_THREADS": "1"}},
        {"name": "hello", "command": ["/bin/sh", "-c", "echo hi | tr a-z A-Z"], "ranks": 2, "nodes": 1, "expect": "",
         "timeout": 600.0, "env": {}}]
    (tmp_path / "env.yaml").write_text(yaml.safe_dump({"spack": {"specs": ["zlib"]}}))
    assert load_env(tmp_path).verify.apps == []
