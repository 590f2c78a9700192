"""An image without dedal-benchmarks (the plain base) is verified with the bundled
benchmarks, built by the image's own mpicc and run as the same binaries on both sides."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.fixtures import base as helpers


def test_image_without_benchmarks_gets_the_bundled_ones(run_dedal, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (bubblewrap, squashfs mounts)")
    base = helpers.trixie_base()
    env = {"DEDAL_DATA_DIR": str(tmp_path / "data"), "DEDAL_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "report"
    res = run_dedal(
        "verify",
        str(base.squashfs),
        "-r",
        "1",
        "--max-size",
        "1024",
        "-b",
        "init,latency",
        "-t",
        "init_overhead_pct=1000",
        "-t",
        "latency_overhead_us=1000",
        "-o",
        str(out),
        "--json",
        env=env,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    report = json.loads((out / "verify.json").read_text())
    codes = {f["code"]: f for f in report["findings"]}
    assert "bundled-benchmarks" in codes and "mpicc" in codes["bundled-benchmarks"]["message"]
    built = list((tmp_path / "cache" / "verify-bench").glob("*/dedal_latency"))
    assert len(built) == 1 and os.access(built[0], os.X_OK)
    latency = [c for c in report["checks"] if "dedal_latency" in c.get("name", json.dumps(c))]
    assert latency, report["checks"]
    # both sides ran the same program path (bound into the image and the native root)
    logs = list((out / "raw" / "intra-node" / "dedal_latency").glob("*.log"))
    assert {p.name.split("-")[0] for p in logs} == {"native", "container"}
    assert all("/opt/dedal-verify/bin/dedal_latency" in p.read_text() for p in logs)
