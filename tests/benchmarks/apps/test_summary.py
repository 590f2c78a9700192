"""benchmarks/apps/summary.py: one table of every scaling figure figures.sh wrote."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tests.conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "apps" / "summary.py"


def _load():
    spec = importlib.util.spec_from_file_location("apps_summary", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _figure(app: str, mode: str, runtime: str, ratios) -> dict:
    rows = [
        {
            "nodes": n,
            "ranks": n,
            "native_median": 1.0,
            "container_median": r,
            "ratio": r,
            "native_efficiency": 1.0,
            "container_efficiency": 1 / r,
            "load": 1.5,
            "verdict": "good",
            "problems": [],
        }
        for n, r in enumerate(ratios, start=1)
    ]
    return {"app": app, "mode": mode, "unit": "s", "extra_verify_options": ["--runtime", runtime], "rows": rows}


def test_every_figure_in_one_table(tmp_path: Path) -> None:
    mod = _load()
    for name, fig in {
        "ringtest-strong-apptainer": _figure("ringtest", "strong", "apptainer", [1.02, 0.95]),
        "busyring-weak-bwrap": _figure("busyring", "weak", "bwrap", [1.1]),
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(fig))
    assert mod.main([str(tmp_path)]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert "| ringtest | strong | apptainer | 2 | 2 | 1 s | 0.95 s | 0.95 | 1 | 1.05 | 1.5 | good |" in text
    assert "| busyring | weak | bwrap | 1 | 1 | 1 s | 1.1 s | 1.1 | 1 | 0.909 | 1.5 | good |" in text
    assert "over all 3 rows: median 1.020, range 0.950..1.100" in text


def test_nothing_to_summarise_is_one_line(tmp_path: Path, capsys) -> None:
    assert _load().main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"summary.py: no */results.json under {tmp_path}"
