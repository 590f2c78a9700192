"""`dedal schema env`: the schema an editor gets is the one dedal checks env.yaml with; it
accepts every environment of the project, and `dedal completion` knows the command."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from dedal.model.schema import Validator
from tests.conftest import ROOT, dedal_exe

ENVS = sorted((ROOT / "spack-envs").glob("*/env.yaml"))


@pytest.fixture(scope="module")
def printed() -> dict:
    res = subprocess.run([dedal_exe(), "schema", "env"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    return json.loads(res.stdout)


def test_the_printed_schema_is_draft_07(printed: dict) -> None:
    jsonschema.Draft7Validator.check_schema(printed)  # what an editor's validator requires of it
    assert printed["$schema"] == "http://json-schema.org/draft-07/schema#"


@pytest.mark.parametrize("path", ENVS, ids=lambda p: p.parent.name)
def test_every_project_environment_passes_the_printed_schema(printed: dict, path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert Validator(printed).errors(doc) == []
    assert list(jsonschema.Draft7Validator(printed).iter_errors(doc)) == []  # and an editor's validator agrees


def test_completion_offers_the_command(tmp_path: Path) -> None:
    res = subprocess.run([dedal_exe(), "completion", "bash"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert "schema" in res.stdout


def test_an_unknown_schema_is_exit_2(run_dedal) -> None:
    res = run_dedal("schema", "nope")
    assert res.returncode == 2 and "invalid choice: 'nope'" in res.stderr
