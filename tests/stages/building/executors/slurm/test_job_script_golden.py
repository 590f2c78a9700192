"""The batch script the Slurm executor writes for a build job, against a golden file.

The script comes from the executor's own submission path (``Submitting.submit``, the
shipped template) with a client that records ``sbatch`` instead of running it, so no
cluster is needed. Every input that would vary is fixed: the settings (an empty config
file, no environment variables, paths under /shared), the plan's directory and the
Python interpreter the job runs. ``DEDAL_UPDATE_GOLDEN=1`` rewrites the golden file.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from dedal.model.config import load_settings
from dedal.model.plan import make_plan
from dedal.model.spack_lock import load_lock
from dedal.schedule import Job
from dedal.stages.building.executors import common
from dedal.stages.building.executors.slurm import submit
from dedal.stages.building.executors.slurm.run import _Build
from tests.conftest import SPACK_DATA
from tests.fixtures.golden import assert_golden

SHARED = Path("/shared/dedal")


class RecordingSlurm:
    """Takes ``sbatch``'s part: records each submission and answers a job id."""

    def __init__(self) -> None:
        self.submitted = []

    def submit(self, script: str, **options) -> str:
        self.submitted.append((script, options))
        return str(1000 + len(self.submitted))


def test_build_job_script_matches_the_golden_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(
        submit, "node_build_command", functools.partial(common.node_build_command, python="/usr/bin/python3")
    )
    config = tmp_path / "config.yaml"
    config.write_text("")
    settings = load_settings(
        config,
        {
            "data_dir": str(SHARED / "data"),
            "cache_dir": str(SHARED / "cache"),
            "work_dir": str(SHARED / "work"),
            "mirror": str(SHARED / "mirror"),
            "base_cache": str(SHARED / "base"),
            "stage_dir": "/dev/shm",
            "spack_root": str(SHARED / "spack"),
        },
        environ={},
    )
    lock = load_lock(SPACK_DATA / "tiny-dedal.spack.lock")
    plan = make_plan(lock, env_name="tiny", install_root="/opt/t", base_image="host", base_id="host:test")
    plan = dataclasses.replace(plan, env_dir=str(SHARED / "work" / "tiny"))
    client = RecordingSlurm()
    b = _Build(plan, SHARED / "work" / "tiny" / "plan.json", settings, False, None, client)
    hashes = list(plan.to_build)
    job = Job(id="j1", hashes=hashes, est_s=600.0, cores=8, names=[plan.nodes[h].name for h in hashes])
    t = b.track(job)
    t.script = tmp_path / t.script.name  # the script's own path is not in its text
    text, source = b.template()
    b.submit(t, text, source, nice=0)
    script = t.script.read_text()
    assert client.submitted[0][0] == script
    assert_golden("slurm-build-job.sh", script)
