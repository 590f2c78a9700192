"""The entry point: the schedule of a workload or of a plan.

:func:`make_schedule` runs the rest of the package (groupings, their improvement,
the local search, fixed start times) and keeps the best; :func:`schedule_plan` does
it for a plan with the settings, :func:`wants_order_hints` reads ``slurm.order_hints``.
The one module that knows the whole pipeline, so none of the others needs to.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Iterable, List, Optional, Sequence, Tuple

from dedal.model.gcpause import collector_paused
from dedal.schedule.workload import Job, Machine, Schedule, Simulation, Workload, job_seconds, package_cores
from dedal.schedule.bounds import allot, dag_bound, lower_bound
from dedal.schedule.simulation import simulate, simulate_unless
from dedal.schedule.grouping import group, per_package
from dedal.schedule.search import (
    IMPROVE_WORK,
    LARGE_BUILD,
    REFINE_ALL,
    REFINE_MAX,
    REFINE_MIN,
    REFINE_WORK,
    REFINE_WORK_LARGE,
    improve,
    improve_runs,
    refine,
)
from dedal.schedule.hints import TIGHTEN_CHAINS, TIGHTEN_MAX, TIGHTEN_MIN, TIGHTEN_WORK, tighten

MERGE_MODES = ("safe", "backlog", "none")
MOLD_VARIANTS = (("safe", False), ("none", False), ("none", True))
# allot(): critical path at most this fraction of work / capacity, cores raised by one or doubled
ALLOT_VARIANTS = ((0.5, False), (0.9, False), (0.5, True))
DEFAULT_CORES = 64  # cores of a build node when neither --cores nor slurm.cores_per_node says


@collector_paused()  # many small objects, no cycles (dedal.model.gcpause)
def make_schedule(wl: Workload, machine: Machine, *, strategy: str = "dedal", hints: bool = False) -> Schedule:
    """Group and simulate. ``strategy``: ``dedal`` (the best by simulated makespan of:
    each merge mode with critical-path priorities, one job per package in submission
    order, everything in one job, and, where cores are scarce, moldable starts and
    packages on the fewest cores that keep the critical path short (:func:`allot`); each
    improved by :func:`improve`, the best then with fixed start times and, with ``hints``,
    order hints, :func:`tighten`), ``per-package`` (one job per package in
    submission order, like ``spack ci``), ``single-node`` (one job, one package at a
    time with ``make -j C`` on one node, like ``spack install -j C``). Beyond
    ``LARGE_BUILD`` packages ``dedal`` starts from critical-path groupings with and without
    merging only (without: :func:`per_package` where :func:`improve` would not run),
    searches from the one that simulates shorter, and its searches stop after fixed
    amounts of work (see :mod:`~dedal.schedule.search`), so that 10,000 packages take
    seconds, not hours."""
    machine = replace(machine, nodes=max(1, int(machine.nodes)), cores=max(1, int(machine.cores)))
    nodes, cores, model = machine.nodes, machine.cores, machine.model
    lb, cp, consumed = lower_bound(wl, machine)
    large = len(wl.order) > LARGE_BUILD
    # group() on this machine; the calls below say the merge mode and start rules
    grouping = functools.partial(group, wl, machine)
    if strategy == "dedal" and large:
        # beyond LARGE_BUILD packages: the two groupings that win there (critical path with
        # and without merging), each search after a fixed amount of work. Where that work
        # affords improve() no more than two merges (IMPROVE_MIN_TRIES), one job per package
        # is simulated as listed in topological order, without the package-level run first:
        # that run costs as much as a simulation, a third of the schedule of 10,000 packages
        candidates = [grouping(merge="safe")]
        if not improve_runs(len(wl.order)):
            candidates.append(per_package(wl, machine))
        else:
            candidates.append(grouping(merge="none"))
    elif strategy == "dedal":
        candidates = [grouping(merge=m) for m in MERGE_MODES]
        # list scheduling by critical path is a heuristic: where plain submission order
        # packs a core-bound build better, start from that
        candidates.append(grouping(merge="none", fifo=True))
        # everything in one job: where the overhead dwarfs the builds (small or measured-fast ones)
        candidates.append(_one_job(wl, machine, max_cores=True))
        if consumed / (nodes * cores) > cp / 2 and not machine.cpus_per_job:
            # cores are scarce: also try starting packages on fewer cores than they could use
            candidates += [grouping(merge=m, fifo=f, mold=True) for m, f in MOLD_VARIANTS]
            # ... or on the fewest cores that keep the critical path short (CPA)
            for target, double in ALLOT_VARIANTS:
                need = allot(wl, cores, nodes * cores, target, model, double)
                candidates += [grouping(merge=m, need=need) for m in ("safe", "none")]
    elif strategy == "per-package":
        candidates = [grouping(merge="none", fifo=True)]
    elif strategy == "single-node":
        candidates = [_one_job(wl, machine, max_cores=False)]
    else:
        raise ValueError(f"unknown strategy {strategy!r}")
    best: Optional[Tuple[List[Job], Simulation]] = None
    done: List[Tuple[List[Job], Simulation]] = []
    if strategy == "dedal" and large and candidates:
        # large: the groupings differ by more than the searches gain (a few seconds in
        # benchmarks/schedule/scale.md): the searches start from the best one only
        # (the first shortest: a later one is dropped once it cannot be shorter)
        k, first = 0, simulate(candidates[0], nodes=nodes, cores=cores)
        for i in range(1, len(candidates)):
            other = simulate_unless(candidates[i], nodes=nodes, cores=cores, at_least=first.makespan_s)
            if other is not None and other.makespan_s < first.makespan_s:
                k, first = i, other
        done.append(improve(wl, candidates[k], machine, work=IMPROVE_WORK, start=first))
        candidates = []
    for jobs in candidates:
        if strategy == "dedal":
            jobs, sim = improve(wl, jobs, machine)
        else:
            sim = simulate(jobs, nodes=nodes, cores=cores)
        done.append((jobs, sim))
    if strategy == "dedal" and wl.order:
        # the local search from every starting point where the build is small, from the
        # best one where it is large (the number of simulations scales with its size)
        done.sort(key=lambda js: js[1].makespan_s)
        n = len(wl.order)
        starts = done if n <= REFINE_ALL else done[:1]
        evaluations = REFINE_WORK_LARGE // n if large else max(REFINE_MIN, min(REFINE_MAX, REFINE_WORK // n))
        if evaluations > 0:
            # large: the groupings are critical-path ones (bottom-level priorities) and
            # improve() simulated them as they are: refine() starts from that simulation
            done = [
                refine(wl, jobs, machine, evaluations=evaluations, start=sim if large else None) for jobs, sim in starts
            ]
    for jobs, sim in done:
        if best is None or sim.makespan_s < best[1].makespan_s - 1e-9:
            best = (jobs, sim)
    assert best is not None
    if strategy == "dedal" and hints:
        # fixed start times with order hints, from the best schedule: a few independent
        # searches (a search stalls on its own plateau), the best kept
        rounds = min(TIGHTEN_MAX, TIGHTEN_WORK // max(1, len(best[0])) ** 2)
        rounds = rounds if large else max(TIGHTEN_MIN, rounds)
        first = best
        for seed in range(TIGHTEN_CHAINS):
            jobs, sim = tighten(wl, *first, machine, rounds=rounds, seed=seed)
            if sim.makespan_s < best[1].makespan_s - 1e-9:
                best = (jobs, sim)
    jobs, sim = _renumber(*best, nodes=nodes, cores=cores, again=not large)
    util = consumed / (nodes * cores * sim.makespan_s) if sim.makespan_s > 0 else 0.0
    return Schedule(
        jobs=jobs,
        nodes=nodes,
        cores=cores,
        overhead_s=machine.overhead_s,
        makespan_s=sim.makespan_s,
        lower_bound_s=lb,
        critical_path_s=cp,
        work_core_s=consumed,
        utilization=util,
        strategy=strategy,
        model=model,
        starts=sim.starts,
        dag_bound_s=dag_bound(wl, machine),
    )


def _one_job(wl: Workload, machine: Machine, max_cores: bool) -> List[Job]:
    """Every package in one job, one after the other: on the whole node (``spack install
    -j C``), or with ``max_cores`` on the most cores any of the packages can use."""
    order = wl.topo()
    if not order:
        return []
    if machine.cpus_per_job:
        c = max(1, min(machine.cpus_per_job, machine.cores))
    elif max_cores:
        c = max(package_cores(wl, machine.cores, machine.model).values())
    else:
        c = machine.cores
    return [
        Job(
            id="j001",
            hashes=order,
            cores=c,
            names=[wl.name(h) for h in order],
            est_s=job_seconds(wl, order, c, machine.model, machine.overhead_s),
        )
    ]


def _renumber(
    jobs: List[Job], sim: Simulation, *, nodes: int, cores: int, again: bool = True
) -> Tuple[List[Job], Simulation]:
    """Ids j001, j002, ... in the order the simulation started the jobs, listed (= submitted)
    in that order where that simulates as well, else in the order that was simulated. The
    simulation is redone on the list returned: equal priorities go by submission order,
    so the makespan reported is the one of the jobs as Slurm gets them. Without ``again``
    (large builds: one simulation less) the jobs keep the order that was simulated."""
    ordered = sorted(jobs, key=lambda j: (sim.starts[j.id][0], -j.priority, j.id))
    width = max(3, len(str(len(jobs))))
    new = {j.id: f"j{i + 1:0{width}d}" for i, j in enumerate(ordered)}

    def renamed(order: Sequence[Job]) -> List[Job]:
        return [
            Job(
                id=new[j.id],
                hashes=j.hashes,
                after=sorted(new[a] for a in j.after),
                est_s=j.est_s,
                priority=j.priority,
                cores=j.cores,
                names=j.names,
                order={new[a]: t for a, t in sorted(j.order.items(), key=lambda at: new[at[0]])},
            )
            for j in order
        ]

    # ``sim`` is the simulation of ``jobs`` as listed; a simulation does not depend on the ids
    same = Simulation(
        makespan_s=sim.makespan_s, starts={new[k]: v for k, v in sim.starts.items()}, busy_core_s=sim.busy_core_s
    )
    if not again:
        return renamed(jobs), same
    out = renamed(ordered)
    osim = simulate(out, nodes=nodes, cores=cores)
    if sim.makespan_s < osim.makespan_s - 1e-9:
        return renamed(jobs), same
    return out, osim


def schedule_plan(
    plan,
    settings,
    *,
    nodes: Optional[int] = None,
    cores: Optional[int] = None,
    hashes: Optional[Iterable[str]] = None,
    strategy: str = "dedal",
) -> Schedule:
    """The schedule of a plan's packages to build (or ``hashes``) with the settings'
    ``job_overhead_s``, ``slurm.nodes``, ``slurm.cores_per_node``, ``slurm.cpus_per_job`` and
    ``slurm.order_hints``."""
    wl = Workload.from_plan(plan, hashes)
    n = nodes if nodes else settings.get("slurm.nodes") or 1
    c = cores if cores else settings.get("slurm.cores_per_node") or DEFAULT_CORES
    machine = Machine(
        nodes=n,
        cores=c,
        overhead_s=float(settings.get("job_overhead_s")),
        cpus_per_job=int(settings.get("slurm.cpus_per_job") or 0),
    )
    return make_schedule(
        wl,
        machine,
        strategy=strategy,
        hints=wants_order_hints(plan, settings.get("slurm.order_hints"), wl.order),
    )


def wants_order_hints(plan, setting: str, hashes: Iterable[str]) -> bool:
    """``slurm.order_hints``: ``true``, ``false``, or ``auto``: on when the duration of
    every package to schedule was measured (an earlier build of its name and version).
    Hints win only while the estimates hold: on real Slurm with a full node they made a
    build 4.5-6 % shorter with exact durations, -3.1 to +2.5 % with durations off by
    10 % and 1-5 % longer off by 20-30 % (benchmarks/schedule/cluster.md); the model's
    own durations are guesses."""
    if setting == "auto":
        hashes = list(hashes)
        return bool(hashes) and all(plan.nodes[h].measured for h in hashes)
    return setting == "true"
