"""Every input the issue-22 tester found ending in a traceback, through the installed CLI:
exit 2, one line naming the file and what is wrong, nothing written."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Union

import pytest

from tests.conftest import SPACK_DATA

pytestmark = pytest.mark.reliability

LOCK = (SPACK_DATA / "tiny-zlib.spack.lock").read_text()
BAD = b"\xff\xfe\x00bad"


def _lock(mutate) -> str:  # noqa: ANN001
    data = json.loads(LOCK)
    mutate(data)
    return json.dumps(data)


def _virtuals(data: dict) -> None:
    for spec in data["concrete_specs"].values():
        for dep in spec.get("dependencies", []):
            dep["parameters"] = {"deptypes": ["link"], "virtuals": 5}


CASES: Dict[str, tuple] = {
    "non-UTF-8 plan": (["plan", "plan.json"], {"plan.json": BAD}, "not UTF-8"),
    "non-UTF-8 env file": (["plan", "env.yaml"], {"env.yaml": BAD}, "not UTF-8"),
    "non-UTF-8 lock": (["plan", "x.lock"], {"x.lock": BAD}, "not UTF-8"),
    "non-UTF-8 config": (["-c", "c.yaml", "config", "show"], {"c.yaml": BAD}, "not UTF-8"),
    "non-UTF-8 base definition": (["base", "show", "b.yaml"], {"b.yaml": BAD}, "not UTF-8"),
    "deep JSON plan": (["plan", "p.json"], {"p.json": "[" * 100_000 + "]" * 100_000}, "nested deeper"),
    "deep JSON lock": (["plan", "p.lock"], {"p.lock": "[" * 100_000 + "]" * 100_000}, "nested deeper"),
    "deep YAML env file": (["plan", "env.yaml"], {"env.yaml": "spack: " + "[" * 5000 + "]" * 5000}, "nested deeper"),
    "deep YAML config": (["-c", "c.yaml", "config", "show"], {"c.yaml": "jobs: " + "[" * 5000 + "]" * 5000}, "nested deeper"),
    "lock virtuals not a list": (["plan", "v.lock"], {"v.lock": _lock(_virtuals)}, "'virtuals' must be a list"),
    "lock include_concrete specs a list": (["plan", "i.lock"], {"i.lock": _lock(
        lambda d: d.__setitem__("include_concrete", {"x": {"concrete_specs": [1], "roots": []}}))}, "include_concrete"),
    "layers gc --plan DIR": (["layers", "--layers", "L", "gc", "--plan", "d", "--dry-run"], {"d/x": ""}, "is a directory"),
    "file name too long": (["plan", "a" * 300 + ".lock"], {}, "File name too long"),
    "file name too long: inspect": (["inspect", "a" * 300], {}, "file name too long"),
    "file name too long: status": (["status", "a" * 300], {}, "file name too long"),
    "file name too long: -c": (["-c", "a" * 300, "config", "show"], {}, "file name too long"),
    "image ..:x": (["verify", "..:x"], {}, "no such image"),
    "oras port out of range": (["pull", "oras://localhost:99999/x:tag"], {}, "not a TCP port"),
    "plan -o /": (["plan", "g.lock", "-o", "/"], {"g.lock": LOCK}, "is a directory"),
    "-s list=[a": (["-s", "slurm.extra_args=[a", "config", "show"], {}, "slurm.extra_args: not valid YAML"),
    "lock file ..lock": (["plan", "..lock"], {"..lock": LOCK}, "environment name ''"),
    "package name ../x": (["plan", "n.lock"], {"n.lock": _lock(
        lambda d: next(iter(d["concrete_specs"].values())).__setitem__("name", "../x"))}, "cannot be used as a file name"),
    "build without a mirror": (["build", "g.lock", "--layers", "L"], {"g.lock": LOCK}, "source mirror"),
    "build a non-UTF-8 lock": (["-s", "mirror=.", "build", "x.lock", "--layers", "L"], {"x.lock": BAD}, "not UTF-8"),
}


def _files(root: Path) -> List[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_writes_nothing(name: str, run_dedal, tmp_path: Path) -> None:
    argv, files, expect = CASES[name]
    content: Union[str, bytes]
    for rel, content in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = _files(tmp_path)
    r = run_dedal(*argv)
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dedal: error: ") and expect in lines[0], r.stderr
    assert _files(tmp_path) == before
