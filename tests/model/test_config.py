"""Settings: defaults < config file < DEDAL_* environment < command line, with sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dedal.model.config import load_settings
from dedal.errors import UserError


def test_precedence_and_sources(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "site.yaml"
    cfg.write_text("layer_store: /from/file\nmirror: /mirror/file\nslurm:\n  partition: batch\n  retries: 4\n")
    s = load_settings(
        cfg,
        overrides={"mirror": "/mirror/flag"},
        environ={"DEDAL_LAYER_STORE": "/from/env", "DEDAL_SLURM_QOS": "high", "HOME": str(tmp_path)},
    )
    assert s.layer_store == Path("/from/env") and s.sources["layer_store"] == "env DEDAL_LAYER_STORE"
    assert s.mirror == Path("/mirror/flag") and s.sources["mirror"] == "flag"
    assert s.get("slurm.partition") == "batch" and s.sources["slurm.partition"] == f"file {cfg}"
    assert s.get("slurm.retries") == 4 and s.get("slurm.qos") == "high"
    assert s.sources["stage_dir"] == "default" and s.stage_dir == Path("/dev/shm")
    assert s.section("slurm")["partition"] == "batch"


def test_defaults_follow_data_dir(tmp_path):
    s = load_settings(None, environ={"DEDAL_DATA_DIR": str(tmp_path / "d")})
    assert s.layer_store == tmp_path / "d" / "layers" and s.work_dir == tmp_path / "d" / "work"


@pytest.mark.parametrize(
    "content, message",
    [
        ("layer_store: 3\n", "layer_store: expected a directory path, got 3"),
        ("jobs: many\n", "jobs: expected an integer, got 'many'"),
        ("executor: pbs\n", "executor: expected one of local, slurm, got 'pbs'"),
        ("slurm:\n  extra_args: --exclusive\n", "slurm.extra_args: expected a list of strings"),
        ("slurm:\n  time_factor: -1\n", "slurm.time_factor: expected a non-negative number, got -1"),
        ("slurm:\n  time_factor: .nan\n", "slurm.time_factor: expected a non-negative number, got nan"),
        ("colour: blue\n", "unknown setting 'colour'"),
        ("- a\n- b\n", "expected a mapping of settings"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_bad_config_files_name_the_setting(tmp_path, content, message):
    cfg = tmp_path / "dedal.yaml"
    cfg.write_text(content)
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_settings(cfg, environ={})


def test_order_hints_takes_auto_and_yaml_booleans(tmp_path):
    assert load_settings(None, environ={}).get("slurm.order_hints") == "auto"
    cfg = tmp_path / "dedal.yaml"
    for text, value in (("true", "true"), ("false", "false"), ("auto", "auto")):
        cfg.write_text(f"slurm:\n  order_hints: {text}\n")
        assert load_settings(cfg, environ={}).get("slurm.order_hints") == value
    assert load_settings(None, environ={"DEDAL_SLURM_ORDER_HINTS": "false"}).get("slurm.order_hints") == "false"
    with pytest.raises(UserError, match="slurm.order_hints: expected one of auto, true, false, got 'sometimes'"):
        load_settings(None, environ={"DEDAL_SLURM_ORDER_HINTS": "sometimes"})


def test_bad_environment_values(tmp_path):
    with pytest.raises(UserError, match="keep_going: expected true or false, got 'maybe'"):
        load_settings(None, environ={"DEDAL_KEEP_GOING": "maybe"})
    assert load_settings(None, environ={"DEDAL_KEEP_GOING": "yes", "DEDAL_JOBS": "3"}).jobs == 3


def test_config_show_cli(run_dedal, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("mirror: /srv/mirror\n")
    res = run_dedal("-c", str(cfg), "-s", "jobs=7", "config", "show", "--json", env={"DEDAL_STAGE_DIR": "/scratch/x"})
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["mirror"] == {"value": "/srv/mirror", "source": f"file {cfg}", "env": "DEDAL_MIRROR"}
    assert data["jobs"]["value"] == 7 and data["jobs"]["source"] == "flag"
    assert data["stage_dir"]["source"] == "env DEDAL_STAGE_DIR"
    human = run_dedal("config", "show")
    assert "layer_store" in human.stdout and "default" in human.stdout
    # which runtime `auto` stands for here, and why (the first backend found on PATH)
    from dedal.adapters import runtime

    backend, why = runtime.choose_runtime("auto")
    assert f"runtime: {backend} ({why})" in human.stdout
    assert data["runtime"]["resolved"] == backend and data["runtime"]["why"] == why
    asked = json.loads(run_dedal("-s", "runtime=bwrap", "config", "show", "--json").stdout)["runtime"]
    assert asked["resolved"] == "bwrap" and asked["why"] == "runtime bwrap was asked for"
    bad = run_dedal("-s", "jobs=x", "config", "show")
    assert bad.returncode == 2 and bad.stderr.strip() == "dedal: error: jobs: expected an integer, got 'x'"


def test_user_config_file_is_read(run_dedal, isolated_env):
    cfg = Path(isolated_env["XDG_CONFIG_HOME"]) / "dedal" / "config.yaml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text("base_image: host\n")
    data = json.loads(run_dedal("config", "show", "--json").stdout)
    assert data["base_image"]["value"] == "host" and data["base_image"]["source"] == f"file {cfg}"
