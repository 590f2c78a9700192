"""What each Slurm job of a build is asked for: its name, its time limit, its order hints, and the cluster the schedule plans for.

* Job names: ``dedal:<env>:<main package>[+N]``, readable in squeue, with characters
  Slurm or the shell could stumble on replaced.
* Time limits: each job's ``--time`` is its estimate times ``slurm.time_factor`` (in
  whole minutes), at most ``slurm.time``. Slurm's backfill plans with the limits; with
  one 4-hour limit for every job it cannot start a job ahead of a wider one without
  delaying it, and on full nodes cores stay idle (benchmarks/schedule/cluster.md).
* Order hints: a job may also wait (``afterany``) for jobs whose cores it is planned to
  take over; :func:`live_hints` says which of them still matter (see
  :mod:`dedal.stages.building.executors.slurm.submit` for how they are held and dropped).
* Capacity: the nodes and cores per node the schedule plans for, from ``slurm.*`` and
  ``sinfo``.

Pure functions of settings and jobs (``capacity`` asks the client for the nodes); the
schedule benchmark (benchmarks/schedule/cluster.py) uses them as the executor does.
"""

from __future__ import annotations

import re
from typing import Callable, List, Sequence

from dedal.adapters.slurm import Slurm, time_minutes, time_text
from dedal.errors import UserError
from dedal.model.config import Settings
from dedal.schedule import Job, TimeLimits

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._+@=,-]+")


def safe_name(text: str) -> str:
    """``text`` with runs of characters unfit for job names and file names as ``_``."""
    return _NAME_UNSAFE.sub("_", text).strip("_") or "x"


def job_name(env: str, job: Job) -> str:
    """``dedal:<env>:<main package>[+N]``: what a job builds, readable in squeue."""
    return f"dedal:{safe_name(env)}:{safe_name(job.label)}"


def job_time_limit(est_s: float, factor: float, cap: str) -> str:
    """A job's ``--time``: its estimate times ``factor``, in whole minutes (rounded up),
    or ``cap`` (``slurm.time``) where that is less or ``factor`` is 0. Slurm's backfill plans
    with the limits: with one long limit for every job it cannot start a job early
    without delaying the top one, and cores stay idle (benchmarks/schedule/cluster.md)."""
    if factor <= 0:
        return cap
    try:
        most = time_minutes(cap)
    except ValueError as exc:
        raise UserError(f"slurm.time: {exc}") from None
    minutes = TimeLimits(factor, most).minutes(est_s)
    if minutes is None or minutes == most:
        return cap
    return time_text(minutes)


def live_hints(job: Job, hints: Sequence[str], active: Callable[[str], bool], elapsed: float) -> List[str]:
    """The order hints of ``job`` still worth waiting for: their job is queued or running
    (``active``) and their time (seconds after submission) has not passed at ``elapsed``."""
    return [a for a in hints if active(a) and job.order.get(a, 0.0) > elapsed]


def capacity(settings: Settings, client: Slurm) -> tuple:
    """(nodes, cores per node) the schedule plans for: ``slurm.nodes`` (at most the usable
    nodes of the partition) and ``slurm.cores_per_node`` or the smallest usable node's CPUs."""
    want = max(1, int(settings.get("slurm.nodes") or 1))
    cores = int(settings.get("slurm.cores_per_node") or 0)
    part = settings.get("slurm.partition") or ""
    usable = [n for n in client.nodes(part) if n.usable and n.cpus > 0]
    if not usable:
        where = f"partition {part}" if part else "the default partition"
        raise UserError(f"no usable Slurm nodes in {where} (sinfo); check slurm.partition and the cluster")
    return min(want, len(usable)), cores or min(n.cpus for n in usable)  # a job must fit the smallest node
