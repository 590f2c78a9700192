"""The Slurm executor: the build jobs of a plan as Slurm batch jobs, ordered by ``afterok``.

(Being split into modules of one concern each.)
"""
from __future__ import annotations

from dedal.stages.build.executors.slurm.jobs import capacity, job_name, job_time_limit, live_hints
from dedal.stages.build.executors.slurm.record import RECORD, Tracked, read_record, record_driver
from dedal.stages.build.executors.slurm.run import build

__all__ = ["RECORD", "Tracked", "build", "capacity", "job_name", "job_time_limit", "live_hints", "read_record",
           "record_driver"]
