"""Scheduling: group the packages of a build into jobs, and simulate the schedule.

One code path for the Slurm executor and ``dedal plan --simulate``: :func:`make_schedule`
groups the packages to build into :class:`Job` s (each job runs its packages one after
the other on one node, with ``cores`` CPUs) and simulates how a batch scheduler runs
them on ``nodes`` nodes of ``cores`` CPUs each. Pure Python over a :class:`Workload`
(which :meth:`Workload.from_plan` derives from a Plan, and benchmarks generate).

The machine model
-----------------
* A node has ``C`` cores; jobs share a node when their cores fit (Slurm's cons_tres).
* How a package build uses cores: a package has an amount of work ``W`` (core-seconds)
  and a parallelism cap ``p`` (``make -j`` stops helping beyond ``p`` cores: configure
  steps, linking and test suites are serial); on ``c`` cores it takes
  ``W / min(c, p)`` seconds. Durations (``PlanNode.estimate_s``, from earlier manifests
  or ``dedal.model.durations``' model) are taken as wall times at ``ref_cores`` = 2 cores (the
  machine the model table was measured on; a manifest's wall time at ``make -j c`` is
  converted, :meth:`CoreModel.reference_seconds`), and ``p`` grows with the size of the build:
  ``p = clamp(floor(d / unit_s), 1, p_max)`` with ``unit_s`` = 60 s and ``p_max`` = 16.
  So a 5 s package (zlib) uses 1 core, a 60 s one 1, a 780 s one (Open MPI) 13 cores
  and takes 120 s, gcc (3600 s) 16 cores and 450 s. ``W = d * min(ref_cores, p)``.
* Each package is given ``min(p, C)`` cores (``slurm.cpus_per_job`` fixes it instead);
  below ``p`` cores the model is work-conserving, so this wastes nothing and finishes
  each package as early as the node allows.
* A job pays ``overhead_s`` (setting ``job_overhead_s``: queue wait, materializing its
  dependency layers, Spack start-up; 2-5 s measured) at its start, holding its cores;
  then it builds its packages one after the other on ``cores`` = the most any of them
  needs (a job never exceeds a node). A job starts when every job it depends on
  (``after``: the jobs producing the layers its packages need, i.e. their
  ``build_requirements``) has completed: Slurm's ``afterok``.

The package, one concern a module, each importing only the ones above it:

* :mod:`~dedal.schedule.workload`: the data (:class:`Workload`, :class:`Job`,
  :class:`Schedule`, ...) and the model's numbers for a package or a job;
* :mod:`~dedal.schedule.nodes`: the cores of the nodes, now and over time;
* :mod:`~dedal.schedule.bounds`: lower bounds on any schedule (:func:`lower_bound`,
  :func:`dag_bound`) and the core allotment of the critical path (:func:`allot`);
* :mod:`~dedal.schedule.simulation`: the two models of the batch scheduler
  (:func:`simulate`, :func:`simulate_backfill`);
* :mod:`~dedal.schedule.grouping`: packages into jobs (:func:`group`);
* :mod:`~dedal.schedule.search`: local search on a grouping (:func:`improve`,
  :func:`refine`);
* :mod:`~dedal.schedule.annealing`: simulated annealing, a probe (:func:`anneal`);
* :mod:`~dedal.schedule.hints`: fixed start times and order hints (:func:`tighten`,
  :func:`order_hints`);
* :mod:`~dedal.schedule.make`: the entry point (:func:`make_schedule`,
  :func:`schedule_plan`, :func:`wants_order_hints`);
* :mod:`~dedal.schedule.validate`: is a schedule valid (:func:`validate`,
  :func:`schedule_problems`): dependencies respected, no node over its cores.

This module only re-exports the names used from outside the package. No module is
named after a function it re-exports, so that ``dedal.schedule.simulate`` and the like
stay the functions (``import dedal.schedule.simulate as m`` would otherwise give the
function, not the module).
"""

from __future__ import annotations

from dedal.model.cores import DEFAULT_MODEL, CoreModel
from dedal.schedule.workload import Job, Machine, Schedule, TimeLimits, Workload, job_topo, package_cores
from dedal.schedule.bounds import allot, dag_bound, lower_bound
from dedal.schedule.simulation import simulate, simulate_backfill
from dedal.schedule.grouping import group
from dedal.schedule.search import improve, refine
from dedal.schedule.annealing import anneal
from dedal.schedule.hints import order_hints, tighten
from dedal.schedule.make import make_schedule, schedule_plan, wants_order_hints
from dedal.schedule.validate import InvalidSchedule, schedule_problems, validate

__all__ = [
    "CoreModel",
    "DEFAULT_MODEL",
    "InvalidSchedule",
    "Job",
    "Machine",
    "Schedule",
    "TimeLimits",
    "Workload",
    "allot",
    "anneal",
    "dag_bound",
    "group",
    "improve",
    "job_topo",
    "lower_bound",
    "make_schedule",
    "order_hints",
    "package_cores",
    "refine",
    "schedule_plan",
    "schedule_problems",
    "simulate",
    "simulate_backfill",
    "tighten",
    "validate",
    "wants_order_hints",
]
