"""The Slurm executor: the build jobs of a plan as Slurm batch jobs, ordered by ``afterok``.

The packages to build are grouped into jobs by :mod:`dedal.schedule` and submitted at
once with ``sbatch``, each job depending on the jobs that produce the layers it needs;
a job runs ``dedal node-build`` for its packages on a node. The executor then follows
the jobs until they end: resubmitting jobs lost to the machine or killed at a time
limit taken from their estimate, cancelling what a genuine failure blocks, cancelling
everything on Ctrl-C, and taking over the jobs of an earlier dedal that was killed.
Every submitted job is recorded in ``<env dir>/slurm-jobs.json`` (Slurm id, packages,
state, node, log, result), rewritten on each change, for ``dedal status``.

One concern per module, each relying only on those before it:

* :mod:`.jobs`: job names, time limits (``--time``), order hints, capacity;
* :mod:`.record`: the record (slurm-jobs.json) and its claim on the environment,
  :class:`Tracked` (one job as followed);
* :mod:`.tracking`: the state of one build (jobs, packages, record writing);
* :mod:`.submit`: job scripts, ``sbatch``, order hints held and dropped, resubmission;
* :mod:`.follow`: polling, progress, what each job's end means (retry, failure, leftovers);
* :mod:`.adopt`: following the jobs of a dedal that is gone;
* :mod:`.run`: the run from plan to layers, detaching, Ctrl-C, and :func:`build`.

Callers import from here.
"""

from __future__ import annotations

from dedal.stages.building.executors.slurm.jobs import capacity, job_name, job_time_limit, live_hints
from dedal.stages.building.executors.slurm.record import RECORD, Tracked, read_record, record_driver
from dedal.stages.building.executors.slurm.run import build

__all__ = [
    "RECORD",
    "Tracked",
    "build",
    "capacity",
    "job_name",
    "job_time_limit",
    "live_hints",
    "read_record",
    "record_driver",
]
