"""env.yaml: a Spack environment plus a dedal section; precise one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest
import yaml

from dedal.errors import UserError
from dedal.model.envfile import AppCheck, AppMetric, AppReference, load_env
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
    elsewhere = tmp_path / "abs" / "x.yaml"
    for f in (tmp_path / "externals.yaml", elsewhere, tmp_path / "repo" / "repo.yaml"):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("{}\n")
    spack = {
        "specs": ["zlib", "openmpi@5 +cuda"],
        "packages": {"all": {"require": "target=x86_64_v3"}},
        "config": {"build_jobs": 3},
        "include": ["externals.yaml", str(elsewhere), "$spack/etc/spack/x.yaml"],  # Spack's own: not looked at
        "repos": ["repo"],
    }
    (tmp_path / "env.yaml").write_text(yaml.safe_dump({"spack": spack}))
    env = load_env(tmp_path)
    assert env.name == tmp_path.name and env.tag == "latest"
    out = env.write_spack_yaml(tmp_path / "work")
    written = yaml.safe_load(out.read_text())["spack"]
    assert written["specs"] == spack["specs"] and written["packages"] == spack["packages"]
    assert written["include"] == [str(tmp_path / "externals.yaml"), str(elsewhere), "$spack/etc/spack/x.yaml"]
    assert written["repos"] == [str(tmp_path / "repo")]


BAD_ENVS = sorted((ROOT / "tests" / "fixtures" / "data" / "bad-env").glob("*.yaml"))


def expected_faults(path: Path) -> List[str]:
    """What a bad environment file must be refused with: its ``# expect: ...`` lines, at the top."""
    return [line[len("# expect: ") :] for line in path.read_text().splitlines() if line.startswith("# expect: ")]


@pytest.mark.parametrize("path", BAD_ENVS, ids=lambda p: p.stem)
def test_bad_environment_files(path):
    """One file per fault (tests/fixtures/data/bad-env/, named for it): every fault it expects is
    said, each on a line of its own, and only those."""
    faults = expected_faults(path)
    assert faults, f"{path.name}: no '# expect: ' line"
    with pytest.raises(UserError) as info:
        load_env(path)
    lines = str(info.value).splitlines()
    if len(faults) > 1:  # FILE: N problems:, then one line each
        assert lines[0] == f"{path}: {len(faults)} problems:", lines
        lines = [f"{path}: {line.strip().rstrip(';')}" for line in lines[1:]]
    assert len(lines) == len(faults), lines
    for line, fault in zip(lines, faults):
        assert line.startswith(f"{path}: ") and fault in line, (line, fault)
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
    (tmp_path / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "spack": {"specs": ["zlib"]},
                "dedal": {"base_image": "debian-trixie-cuda", "runtime_base": "debian-trixie-cuda-runtime"},
            }
        )
    )
    env = load_env(tmp_path)
    assert (env.base_image, env.runtime_base) == ("debian-trixie-cuda", "debian-trixie-cuda-runtime")
    (tmp_path / "env.yaml").write_text(yaml.safe_dump({"spack": {"specs": ["zlib"]}}))
    assert load_env(tmp_path).runtime_base is None


def test_verify_apps(tmp_path):
    """dedal.verify.apps: a shell line runs through /bin/sh -c, a list as it is; defaults 2 ranks
    on 1 node, no expected output, 600 s."""
    (tmp_path / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "spack": {"specs": ["zlib"]},
                "dedal": {
                    "verify": {
                        "apps": [
                            {
                                "name": "ring",
                                "command": ["python3", "-c", "print(1)"],
                                "ranks": 4,
                                "nodes": 2,
                                "expect": "^1$",
                                "timeout": 30,
                                "env": {"OMP_NUM_THREADS": "1"},
                            },
                            {"name": "hello", "command": "echo hi | tr a-z A-Z"},
                        ]
                    }
                },
            }
        )
    )
    apps = load_env(tmp_path).verify.apps
    assert [a.to_json() for a in apps] == [
        {
            "name": "ring",
            "command": ["python3", "-c", "print(1)"],
            "ranks": 4,
            "nodes": 2,
            "expect": "^1$",
            "timeout": 30.0,
            "env": {"OMP_NUM_THREADS": "1"},
        },
        {
            "name": "hello",
            "command": ["/bin/sh", "-c", "echo hi | tr a-z A-Z"],
            "ranks": 2,
            "nodes": 1,
            "expect": "",
            "timeout": 600.0,
            "env": {},
        },
    ]
    (tmp_path / "env.yaml").write_text(yaml.safe_dump({"spack": {"specs": ["zlib"]}}))
    assert load_env(tmp_path).verify.apps == []


def test_verify_app_benchmarks(tmp_path):
    """An app with a metric is a benchmark: lower is better and 10 % by default, the repetitions
    those of the verification unless it has its own; an app check's form is what it was (no
    metric or reference keys: the settings digest of its reports stays the same)."""
    (tmp_path / "env.yaml").write_text("""
spack: {specs: [zlib]}
dedal:
  verify:
    apps:
    - name: ringtest
      command: special -python ringtest.py -tstop 100
      ranks: 4
      expect: 'runtime='
      metric:
        match: 'runtime=(?P<value>[0-9.eE+-]+)'
        unit: s
      reference:
        output: spk4.std
        expected: /opt/ringtest/reference_data/spk1.100ms.std.ref
    - name: arbor-ring
      command: [arbor-ring, input.json]
      expect: '(?P<value>\\d+) spikes generated'
      metric: {match: 'model-run +(?P<value>[0-9.]+)', unit: s, better: lower, overhead_pct: 5, repetitions: 3}
    - name: rate
      command: [bench]
      metric: {match: 'rate (?P<value>[0-9.]+)', unit: cells/s, better: higher}
    - name: plain
      command: [/bin/true]
""")
    ring, arbor, rate, plain = load_env(tmp_path).verify.apps
    assert ring.metric == AppMetric("runtime=(?P<value>[0-9.eE+-]+)", "s", "lower", 10.0, None)
    assert ring.reference == AppReference("spk4.std", "/opt/ringtest/reference_data/spk1.100ms.std.ref")
    assert ring.command == ["/bin/sh", "-c", "special -python ringtest.py -tstop 100"]
    assert arbor.metric == AppMetric("model-run +(?P<value>[0-9.]+)", "s", "lower", 5.0, 3)
    assert arbor.expect == "(?P<value>\\d+) spikes generated" and arbor.reference is None
    assert rate.metric is not None and rate.metric.higher_is_better and not ring.metric.higher_is_better
    assert ring.to_json()["metric"] == {
        "match": "runtime=(?P<value>[0-9.eE+-]+)",
        "unit": "s",
        "better": "lower",
        "overhead_pct": 10.0,
        "repetitions": None,
    }
    assert ring.to_json()["reference"] == {
        "output": "spk4.std",
        "expected": "/opt/ringtest/reference_data/spk1.100ms.std.ref",
    }
    assert plain.metric is None and plain.reference is None
    assert set(plain.to_json()) == {"name", "command", "ranks", "nodes", "expect", "timeout", "env"}


def test_bad_app_benchmark_cli_exit_2_one_line(run_dedal, tmp_path):
    """dedal verify --env-file with a metric lacking its value group: one line, exit 2, before
    the image is even looked at."""
    env_file = tmp_path / "env.yaml"
    env_file.write_text(
        yaml.safe_dump(
            {
                "spack": {"specs": ["zlib"]},
                "dedal": {
                    "verify": {
                        "apps": [
                            {"name": "ring", "command": ["ring"], "metric": {"match": "took ([0-9.]+) s", "unit": "s"}}
                        ]
                    }
                },
            }
        )
    )
    image = tmp_path / "image.sif"
    image.write_bytes(b"")
    res = run_dedal("verify", str(image), "--env-file", str(env_file), "-o", str(tmp_path / "out"))
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert res.stderr.startswith(
        f"dedal: error: {env_file}: dedal.verify.apps.0.metric.match: needs a group named value"
    ), res.stderr
    assert not (tmp_path / "out").exists()


def test_a_gpu_app_says_so_and_others_keep_their_form(tmp_path):
    """dedal.verify.apps.N.gpu: an application that needs a GPU per rank. Only a GPU app's
    form carries the key: every other app's form (and so the settings digest of the reports
    written before the key existed) stays as it was."""
    (tmp_path / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "spack": {"specs": ["zlib"]},
                "dedal": {
                    "verify": {
                        "apps": [
                            {"name": "ring-gpu", "command": "busyring ring.json", "ranks": 1, "gpu": True},
                            {"name": "ring", "command": "busyring ring.json", "gpu": False},
                            {"name": "plain", "command": "true"},
                        ]
                    }
                },
            }
        )
    )
    gpu, cpu, plain = load_env(tmp_path).verify.apps
    assert (gpu.gpu, cpu.gpu, plain.gpu) == (True, False, False)
    assert gpu.to_json()["gpu"] is True and "gpu" not in cpu.to_json() and "gpu" not in plain.to_json()
    assert AppCheck.from_json(gpu.to_json()) == gpu
