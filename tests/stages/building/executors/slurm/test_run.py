"""A Slurm build that fails before submitting anything leaves the last build's record as
it was (no cluster needed: the configuration is missing)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fixtures.tiny import make_env


def test_failed_claim_puts_the_last_record_back(run_dedal, tmp_path):
    tiny = make_env(tmp_path)
    workdir = Path(tiny.env["DEDAL_DATA_DIR"]) / "work" / "tiny"
    workdir.mkdir(parents=True)
    previous = {
        "format": 1,
        "executor": "slurm",
        "env": "tiny",
        "started_at": "2026-11-20T10:00:00+00:00",
        "updated_at": "2026-11-20T10:05:00+00:00",
        "finished": True,
        "submitting": False,
        "jobs": [
            {
                "id": "j1",
                "slurm_id": "41",
                "name": "dedal:tiny:gcc-runtime",
                "status": "done",
                "state": "COMPLETED",
                "packages": ["gcc-runtime@12.2.0/bwhvedy"],
                "package_status": {"gcc-runtime@12.2.0/bwhvedy": "built"},
                "log": "/x/41.out",
            }
        ],
    }
    record = workdir / "slurm-jobs.json"
    record.write_text(json.dumps(previous, indent=1) + "\n")
    before = record.read_bytes()
    env = dict(tiny.env, SLURM_CONF=str(tmp_path / "no-slurm.conf"))
    res = run_dedal("build", str(tiny.env_file), "--executor", "slurm", env=env)
    assert res.returncode == 2 and f"SLURM_CONF={tmp_path / 'no-slurm.conf'}: no such file" in res.stderr
    assert record.read_bytes() == before
    assert not list((workdir / "builds").glob("*.json")), "a refused attempt is not an attempt"
    status = run_dedal("status", str(tiny.env_file), env=env)
    assert status.returncode == 0 and "finished" in status.stdout and "41" in status.stdout
