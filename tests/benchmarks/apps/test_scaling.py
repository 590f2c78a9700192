"""benchmarks/apps/scaling.py: an application benchmark at 1..N nodes through dedal verify. The
scaling arithmetic (ideal, normalised, efficiency) on strong and weak series, its table and plot,
and the script run for real at 1 node on the tests' benchmark image (the image's mpirun: outside
Slurm 1 node is all there is; an allocation of N nodes runs the same code with srun)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dedal.model.envfile import AppCheck, AppMetric, AppReference
from tests.conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "apps" / "scaling.py"


@pytest.fixture(scope="module")
def sc():
    spec = importlib.util.spec_from_file_location("scaling", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _point(nodes, native, container, verdict="good"):
    return {
        "nodes": nodes,
        "ranks": 4 * nodes,
        "native": native,
        "container": container,
        "verdict": verdict,
        "problems": [],
        "skip_reason": "",
        "report": f"reports/{nodes}-nodes",
    }


def test_strong_scaling_of_a_time(sc) -> None:
    rows = sc.derive(
        [
            _point(4, [2.6, 2.5, 2.7], [2.8, 2.8, 2.9]),
            _point(1, [10.0, 10.2, 9.8], [10.5, 10.4, 10.6]),
            _point(2, [5.2, 5.1, 5.3], [5.6, 5.5, 5.4]),
        ],
        "strong",
        higher_is_better=False,
    )
    assert [r["nodes"] for r in rows] == [1, 2, 4]
    assert [r["ideal"] for r in rows] == [10.0, 5.0, 2.5]  # the 1-node native median / n
    assert [round(r["ratio"], 3) for r in rows] == [1.05, 1.058, 1.077]
    assert [round(r["native_efficiency"], 3) for r in rows] == [1.0, 0.962, 0.962]
    assert [round(r["container_efficiency"], 3) for r in rows] == [0.952, 0.909, 0.893]
    assert [round(r["container_normalised"], 3) for r in rows] == [1.05, 0.55, 0.28]


def test_weak_scaling_and_rates(sc) -> None:
    """Weak scaling of a time: ideal flat at the base (here the smallest count, 2 nodes); a rate
    (higher is better) grows with the nodes in both modes."""
    weak = sc.derive([_point(2, [10.0], [10.4]), _point(8, [12.5], [13.0])], "weak", higher_is_better=False)
    assert [r["ideal"] for r in weak] == [10.0, 10.0]
    assert [r["native_normalised"] for r in weak] == [1.0, 1.25] and weak[1]["native_efficiency"] == 0.8
    rate = sc.derive([_point(1, [100.0], [95.0]), _point(4, [360.0], [340.0])], "strong", higher_is_better=True)
    assert [r["ideal"] for r in rate] == [100.0, 400.0] and rate[1]["native_efficiency"] == 0.9
    assert rate[1]["container_efficiency"] == 0.85
    # a node count whose runs all failed: no numbers, the others still derived
    gap = sc.derive([_point(1, [10.0], [10.5]), _point(2, [], [], verdict="bad")], "strong", higher_is_better=False)
    assert gap[1]["ratio"] is None and gap[1]["native_efficiency"] is None and gap[1]["ideal"] == 5.0


def test_the_app_at_n_nodes(sc) -> None:
    app = AppCheck(
        name="ringtest",
        command=["special", "-python", "ringtest.py"],
        ranks=4,
        nodes=1,
        metric=AppMetric("runtime=(?P<value>[0-9.]+)", "s"),
        reference=AppReference("spk4.std", "/opt/ringtest/spk1.ref"),
    )
    strong = sc.app_at(app, 2, 4, reference_output="spk{ranks}.std")
    assert (strong.nodes, strong.ranks, strong.command) == (2, 8, ["special", "-python", "ringtest.py"])
    assert strong.reference == AppReference("spk8.std", "/opt/ringtest/spk1.ref")
    weak = sc.app_at(app, 4, 2, command="special -python ringtest.py -nring {ranks}", keep_reference=False)
    assert weak.command == ["/bin/sh", "-c", "special -python ringtest.py -nring 8"] and weak.reference is None
    assert app.nodes == 1 and app.ranks == 4  # the env file's app is left as it was
    assert sc.shown_command(weak.command) == "special -python ringtest.py -nring 8"
    # weak scaling's result grows with the problem: expect as a template, a pattern's own braces kept
    grown = sc.app_at(
        app,
        2,
        2,
        command="ringtest -nring {ranks}",
        keep_reference=False,
        expect=r"^wrote (?P<value>\d{1,9}) spikes of {ranks} ranks",
    )
    assert grown.expect == r"^wrote (?P<value>\d{1,9}) spikes of 4 ranks" and app.expect != grown.expect
    assert sc.shown_command(["arbor-ring", "ring 1.json"]) == "arbor-ring 'ring 1.json'"


def test_table_and_plot(sc, tmp_path: Path) -> None:
    results = {
        "app": "ringtest",
        "mode": "strong",
        "unit": "s",
        "higher_is_better": False,
        "image": "esd-neuro.sif",
        "command": "special -python ringtest.py",
        "ranks_per_node": 4,
        "repetitions": 3,
        "date": "2026-12-01",
        "host": "n01",
        "plot": "ringtest-strong.png",
        "extra_verify_options": [],
    }
    results["rows"] = sc.derive(
        [_point(1, [10.0, 10.2, 9.8], [10.5, 10.4, 10.6]), _point(2, [5.2, 5.1, 5.3], [5.6, 5.5, 5.4], verdict="bad")],
        "strong",
        False,
    )
    results["rows"][1]["problems"] = ["app-overhead"]
    md = sc.markdown(results)
    assert "| 1 | 4 | 10 [9.8..10.2] | 10.5 [10.4..10.6] | 1.05 | 10 | 1 | 1.05 | 1 | 0.952 | - | good |" in md
    assert (
        "| 2 | 8 | 5.2 [5.1..5.3] | 5.5 [5.4..5.6] | 1.06 | 5 | 0.52 | 0.55 | 0.962 | 0.909 | - | bad (app-overhead) |"
    ) in md
    results["rows"][0]["load"] = 1.234  # the load before a node count's runs, when it was measured
    assert "| 0.952 | 1.2 | good |" in sc.markdown(results)
    png = sc.plot_png(results)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    weak = dict(results, mode="weak")
    weak["rows"] = sc.derive(results["rows"], "weak", False)
    assert sc.plot_png(weak)[:8] == b"\x89PNG\r\n\x1a\n"


def test_scaling_runs_dedal_verify_for_real(bench_image, native_cache, isolated_env, tmp_path: Path) -> None:
    """The script at 1 node (the image's mpirun) with dedal_latency's 8-byte latency as the app's
    metric: one dedal verify -b apps whose report it keeps, and its results.json, table and plot
    from that report's numbers."""
    if shutil.which("apptainer") is None:
        pytest.skip("needs Apptainer (the container side of the benchmark image)")
    env_file = tmp_path / "env.yaml"
    env_file.write_text(
        yaml.safe_dump(
            {
                "spack": {"specs": ["zlib"]},
                "dedal": {
                    "verify": {
                        "apps": [
                            {"name": "plain", "command": ["true"]},
                            {
                                "name": "lat",
                                "command": ["dedal_latency", "-m", "8"],
                                "ranks": 2,
                                "metric": {"match": r"^8 +(?P<value>[0-9.]+)$", "unit": "us", "overhead_pct": 1000000},
                            },
                        ]
                    }
                },
            }
        )
    )
    out = tmp_path / "scaling"
    env = {**isolated_env, "DEDAL_CACHE_DIR": str(native_cache), "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            str(bench_image.sif),
            "--env-file",
            str(env_file),
            "--app",
            "lat",
            "--nodes",
            "1",
            "-r",
            "2",
            "-o",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    results = json.loads((out / "results.json").read_text())
    [row] = results["rows"]
    assert (row["nodes"], row["ranks"], row["verdict"]) == (1, 2, "good")
    report = json.loads((out / "reports/1-nodes/verify.json").read_text())
    assert [c["name"] for c in report["checks"]] == ["app lat"]  # the env file's other app is not run
    assert row["native"] == report["measurements"]["app lat"]["native"]["0"] and len(row["native"]) == 2
    assert row["container"] == report["measurements"]["app lat"]["container"]["0"]
    assert row["ideal"] == row["native_median"] and row["native_efficiency"] == 1.0
    assert (out / "lat-strong.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert p.stdout == (out / "results.md").read_text() + "\n" and "\n| 1 | 2 | " in p.stdout
    assert "[1 node(s)] [3/6] native    app lat rep 1/2" in p.stderr


def test_scaling_refuses_more_nodes_than_it_has(tmp_path: Path) -> None:
    env_file = tmp_path / "env.yaml"
    env_file.write_text(
        yaml.safe_dump(
            {
                "spack": {"specs": ["zlib"]},
                "dedal": {
                    "verify": {
                        "apps": [
                            {"name": "plain", "command": ["true"]},
                            {"name": "lat", "command": ["x"], "metric": {"match": "(?P<value>.+)", "unit": "us"}},
                        ]
                    }
                },
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = str(ROOT)
    for args, message in (
        (["--app", "plain", "--nodes", "1,2"], "2 nodes, but this runs outside a Slurm allocation"),
        (["--app", "plain", "--nodes", "1"], "--app plain: no app with a metric of that name"),
        (["--app", "lat", "--nodes", "1", "--mode", "weak"], "--mode weak: the problem must grow with the nodes"),
    ):
        argv = [sys.executable, str(SCRIPT), "image.sif", "--env-file", str(env_file), *args]
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert p.returncode == 2 and message in p.stderr, (args, p.stderr)
