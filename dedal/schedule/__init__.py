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

Fixed start times and order hints (:func:`tighten`, setting ``slurm.order_hints``, on
by default where every duration was measured)
------------------------------------------------------------------------------------
A batch scheduler starts whatever fits (list scheduling); it cannot keep cores free for
a wide job that becomes ready a little later, and some of the best schedules need that.
:func:`tighten` plans start times instead: double justification (every job as late,
then as early as possible), then a search that reorders by start time plus noise, moves
a job's cores by one or merges it into the job it waits for, and keeps what is not
longer. Slurm follows such a plan if each job also waits (``afterany``) for the jobs
whose cores it takes over (a resource flow, :func:`order_hints`); each such hint holds
until the end planned for that job, then the executor drops it, so a late
job never holds the cores idle longer than planned. In :func:`simulate` this is about
1 % shorter on full single nodes with exact estimates; with estimates off by 10 % it
ranges from 0.4 % shorter to 1 % longer than list scheduling, off by 30 % 1.4-1.8 %
longer (benchmarks/schedule/robustness.md). But :func:`simulate` flatters list scheduling
on full nodes, and real Slurm follows a hinted plan closely: on cscs-prgenv-gnu and
jedi-ci 1 x 8 (benchmarks/schedule/cluster.md) hints made the build 6.0 / 4.5 % shorter
with exact durations; with durations off by 10 % 3.1 % shorter on cscs (three draws) and
2.5 % longer on jedi (two draws), off by 20-30 % 1-5 % longer. So
``slurm.order_hints: auto`` (the default) turns them on where every package to build has
a measured duration (:func:`wants_order_hints`); the model's durations are guesses.
"""
from __future__ import annotations

import random
from dataclasses import replace
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from dedal.model.cores import DEFAULT_MODEL, CoreModel
from dedal.schedule.workload import (Job, Schedule, Simulation, TimeLimits, Workload, job_seconds, job_topo, keyed_topo,
                                     package_cores, top_cores)
from dedal.schedule.nodes import Profile
from dedal.schedule.bounds import allot, dag_bound, lower_bound
from dedal.schedule.simulation import simulate, simulate_backfill
from dedal.schedule.grouping import group
from dedal.schedule.search import REFINE_ALL, REFINE_MAX, REFINE_MIN, REFINE_WORK, improve, merge_jobs, refine
from dedal.schedule.annealing import anneal

__all__ = ["CoreModel", "DEFAULT_MODEL", "Job", "Schedule", "TimeLimits", "Workload", "allot", "anneal", "dag_bound",
           "group", "improve", "job_topo", "lower_bound", "make_schedule", "order_hints", "package_cores", "refine",
           "schedule_plan", "simulate", "simulate_backfill", "tighten", "wants_order_hints"]

MERGE_MODES = ("safe", "backlog", "none")
MOLD_VARIANTS = (("safe", False), ("none", False), ("none", True))
# allot(): critical path at most this fraction of work / capacity, cores raised by one or doubled
ALLOT_VARIANTS = ((0.5, False), (0.9, False), (0.5, True))
# tighten(): searches, rounds each (TIGHTEN_WORK // jobs**2 within MIN..MAX: a round costs
# about that), the noise added to start times to reorder (cycled), the chance of a merge and
# of a core more or less per round
TIGHTEN_CHAINS, TIGHTEN_WORK, TIGHTEN_MIN, TIGHTEN_MAX = 3, 16_000_000, 20, 2000
TIGHTEN_NOISE_S = (30.0, 100.0, 300.0)
TIGHTEN_MERGE, TIGHTEN_CORES = 0.5, 0.25


# -- fixed start times: justification and order hints -------------------------------------

def _serial(jobs: Mapping[str, Job], order: Sequence[str], waits: Mapping[str, Sequence[str]],
            node_of: Mapping[str, int], nodes: int, cores: int) -> Dict[str, Tuple[float, float, int]]:
    """Serial schedule generation: each job in ``order`` (every job after those it
    ``waits`` for) at the earliest time its node has its cores free for its whole run."""
    profiles = [Profile(cores) for _ in range(max(1, nodes))]
    starts: Dict[str, Tuple[float, float, int]] = {}
    for jid in order:
        j = jobs[jid]
        p = profiles[node_of[jid]]
        t = p.fit(max((starts[a][1] for a in waits[jid]), default=0.0), j.est_s, j.cores)
        p.add(t, t + j.est_s, j.cores)
        starts[jid] = (t, t + j.est_s, node_of[jid])
    return starts


def _justify(jobs: Mapping[str, Job], starts: Dict[str, Tuple[float, float, int]], waits: Mapping[str, Sequence[str]],
             feeds: Mapping[str, Sequence[str]], nodes: int, cores: int) -> Tuple[Dict[str, Tuple[float, float, int]], float]:
    """Double justification (Valls et al. 2005): every job as late as the makespan
    allows (latest end first), then every job as early as possible in that order; repeat
    while the makespan shrinks. Never makes a schedule longer."""
    node_of = {k: v[2] for k, v in starts.items()}
    best = max(e for _, e, _ in starts.values())
    while True:
        late = _serial(jobs, sorted(starts, key=lambda k: (-starts[k][1], k)), feeds, node_of, nodes, cores)
        early = _serial(jobs, sorted(late, key=lambda k: (-late[k][1], k)), waits, node_of, nodes, cores)
        span = max(e for _, e, _ in early.values())
        if span >= best - 1e-6:
            return starts, best
        starts, best = early, span


def order_hints(jobs: Sequence[Job], starts: Mapping[str, Tuple[float, float, int]],
                cores: int) -> Dict[str, Dict[str, float]]:
    """Which jobs each job should wait for so that a scheduler starting jobs as soon as
    they may reproduces ``starts``: the jobs whose cores it takes over (a resource flow,
    Artigues et al. 2003), unless it already waits for them. Each hint holds until the
    end planned for that job and no longer: any slack past it held cores idle for a late
    job in the replays with noisy durations (benchmarks/schedule/robustness.md)."""
    ancestors: Dict[str, Set[str]] = {}
    for j in job_topo(jobs):
        anc = set(j.after)
        for a in j.after:
            anc |= ancestors[a]
        ancestors[j.id] = anc
    by_id = {j.id: j for j in jobs}
    hints: Dict[str, Dict[str, float]] = {j.id: {} for j in jobs}
    holders: Dict[int, List[List]] = {}  # node -> [free from, job (None: never used), cores]
    for jid in sorted(starts, key=lambda k: (starts[k][0], starts[k][1], k)):
        start, end, node = starts[jid]
        need = by_id[jid].cores
        free = [h for h in holders.setdefault(node, [[0.0, None, cores]]) if h[0] <= start + 1e-6 and h[2] > 0]
        # cores of jobs it waits for anyway first, then of those that ended last
        free.sort(key=lambda h: (h[1] is not None and h[1] not in ancestors[jid], -h[0]))
        for h in free:
            if need == 0:
                break
            take = min(need, h[2])
            h[2] -= take
            need -= take
            if h[1] is not None and h[1] not in ancestors[jid]:
                hints[jid][h[1]] = starts[h[1]][1]
        if need:
            raise ValueError(f"job {jid} does not fit its node at {start:.1f} s")
        holders[node].append([end, jid, by_id[jid].cores])
    return hints


def tighten(wl: Workload, jobs: List[Job], sim: Simulation, *, nodes: int, cores: int, overhead_s: float,
            model: CoreModel = DEFAULT_MODEL, rounds: int = 1000, cpus_per_job: int = 0,
            seed: int = 0) -> Tuple[List[Job], Simulation]:
    """Improve a schedule with its start times fixed rather than left to list scheduling,
    which starts whatever fits and so cannot keep cores free for a job that will need
    them: justify it (:func:`_justify`), then, ``rounds`` times, reorder by start time
    plus noise, and maybe give one job a core more or less or merge it into a job it
    waits for (one overhead less), rebuild (:func:`_serial`) and justify, keeping the
    result when it is no longer. Jobs keep their nodes. Order hints
    (:func:`order_hints`) make the batch scheduler follow; the result is kept only if
    :func:`simulate` of the jobs with their hints beats ``sim``."""
    if len(jobs) < 2:
        return jobs, sim
    rng = random.Random(seed)
    pos = {h: i for i, h in enumerate(wl.topo())}

    def graph(js: Sequence[Job]) -> Tuple[Dict[str, Job], Dict[str, List[str]], Dict[str, List[str]]]:
        by_id = {j.id: j for j in js}
        feeds: Dict[str, List[str]] = {j.id: [] for j in js}
        for j in js:
            for x in j.after:
                feeds[x].append(j.id)
        return by_id, {j.id: j.after for j in js}, feeds

    cur = [replace(j, order={}) for j in jobs]
    by_id, waits, feeds = graph(cur)
    node_of = {k: v[2] for k, v in sim.starts.items()}
    starts, span = _justify(by_id, dict(sim.starts), waits, feeds, nodes, cores)
    for r in range(rounds):
        noise = TIGHTEN_NOISE_S[r % len(TIGHTEN_NOISE_S)]
        key = {k: starts[k][0] + rng.gauss(0.0, noise) for k in by_id}
        trial: Optional[List[Job]] = None
        move = rng.random()
        j = cur[rng.randrange(len(cur))]
        if move < TIGHTEN_MERGE and j.after:
            # into the job it waits for last, if it waits for nothing else by that one's start
            a = max(j.after, key=lambda x: (starts[x][1], x))
            if all(starts[x][1] <= starts[a][0] + 1e-6 for x in j.after if x != a):
                trial = merge_jobs(cur, a, j.id, wl, model, overhead_s, cores, pos)
        elif move < TIGHTEN_MERGE + TIGHTEN_CORES and not cpus_per_job:
            c = j.cores + rng.choice((-1, 1))
            if 1 <= c <= top_cores(wl, j.hashes, cores, model):
                est = job_seconds(wl, j.hashes, c, model, overhead_s)
                trial = [replace(x, cores=c, est_s=est) if x is j else x for x in cur]
        t_by_id, t_waits, t_feeds = graph(trial) if trial else (by_id, waits, feeds)
        order = keyed_topo(sorted(t_by_id), t_waits, key)
        t_starts = _serial(t_by_id, order, t_waits, node_of, nodes, cores)
        t_starts, t_span = _justify(t_by_id, t_starts, t_waits, t_feeds, nodes, cores)
        if t_span <= span + 1e-6:  # equal makespans too: a plateau is where the way down starts
            starts, span = t_starts, t_span
            if trial:
                cur, by_id, waits, feeds = trial, t_by_id, t_waits, t_feeds
    hints = order_hints(cur, starts, cores)
    out = [replace(j, order=hints[j.id]) for j in cur]
    tsim = simulate(out, nodes=nodes, cores=cores)
    if tsim.makespan_s < sim.makespan_s - 1e-6:
        return out, tsim
    return jobs, sim


# -- the entry point -------------------------------------------------------------------------

def make_schedule(wl: Workload, *, nodes: int, cores: int, overhead_s: float, model: CoreModel = DEFAULT_MODEL,
                  cpus_per_job: int = 0, strategy: str = "dedal", hints: bool = False) -> Schedule:
    """Group and simulate. ``strategy``: ``dedal`` (the best by simulated makespan of:
    each merge mode with critical-path priorities, one job per package in submission
    order, everything in one job, and, where cores are scarce, moldable starts and
    packages on the fewest cores that keep the critical path short (:func:`allot`); each
    improved by :func:`improve`, the best then with fixed start times and, with ``hints``,
    order hints, :func:`tighten`), ``per-package`` (one job per package in
    submission order, like ``spack ci``), ``single-node`` (one job, one package at a
    time with ``make -j C`` on one node, like ``spack install -j C``)."""
    nodes, cores = max(1, int(nodes)), max(1, int(cores))
    lb, cp, consumed = lower_bound(wl, nodes, cores, overhead_s, model, cpus_per_job)
    if strategy == "dedal":
        candidates = [group(wl, nodes=nodes, cores=cores, overhead_s=overhead_s, model=model,
                            cpus_per_job=cpus_per_job, merge=m) for m in MERGE_MODES]
        # list scheduling by critical path is a heuristic: where plain submission order
        # packs a core-bound build better, start from that
        candidates.append(group(wl, nodes=nodes, cores=cores, overhead_s=overhead_s, model=model,
                                cpus_per_job=cpus_per_job, merge="none", fifo=True))
        # everything in one job: where the overhead dwarfs the builds (small or measured-fast ones)
        candidates.append(_one_job(wl, cores, overhead_s, model, cpus_per_job, max_cores=True))
        if consumed / (nodes * cores) > cp / 2 and not cpus_per_job:
            # cores are scarce: also try starting packages on fewer cores than they could use
            candidates += [group(wl, nodes=nodes, cores=cores, overhead_s=overhead_s, model=model,
                                 merge=m, fifo=f, mold=True) for m, f in MOLD_VARIANTS]
            # ... or on the fewest cores that keep the critical path short (CPA)
            for target, double in ALLOT_VARIANTS:
                need = allot(wl, cores, nodes * cores, target, model, double)
                candidates += [group(wl, nodes=nodes, cores=cores, overhead_s=overhead_s, model=model,
                                     merge=m, need=need) for m in ("safe", "none")]
    elif strategy == "per-package":
        candidates = [group(wl, nodes=nodes, cores=cores, overhead_s=overhead_s, model=model,
                            cpus_per_job=cpus_per_job, merge="none", fifo=True)]
    elif strategy == "single-node":
        candidates = [_one_job(wl, cores, overhead_s, model, cpus_per_job, max_cores=False)]
    else:
        raise ValueError(f"unknown strategy {strategy!r}")
    best: Optional[Tuple[List[Job], Simulation]] = None
    done: List[Tuple[List[Job], Simulation]] = []
    for jobs in candidates:
        if strategy == "dedal":
            jobs, sim = improve(wl, jobs, nodes=nodes, cores=cores, overhead_s=overhead_s, model=model)
        else:
            sim = simulate(jobs, nodes=nodes, cores=cores)
        done.append((jobs, sim))
    if strategy == "dedal" and wl.order:
        # the local search from every starting point where the build is small, from the
        # best one where it is large (the number of simulations scales with its size)
        done.sort(key=lambda js: js[1].makespan_s)
        n = len(wl.order)
        starts = done if n <= REFINE_ALL else done[:1]
        evaluations = max(REFINE_MIN, min(REFINE_MAX, REFINE_WORK // n))
        done = [refine(wl, jobs, nodes=nodes, cores=cores, overhead_s=overhead_s, model=model,
                       evaluations=evaluations, cpus_per_job=cpus_per_job) for jobs, _ in starts]
    for jobs, sim in done:
        if best is None or sim.makespan_s < best[1].makespan_s - 1e-9:
            best = (jobs, sim)
    assert best is not None
    if strategy == "dedal" and hints:
        # fixed start times with order hints, from the best schedule: a few independent
        # searches (a search stalls on its own plateau), the best kept
        rounds = max(TIGHTEN_MIN, min(TIGHTEN_MAX, TIGHTEN_WORK // max(1, len(best[0])) ** 2))
        first = best
        for seed in range(TIGHTEN_CHAINS):
            jobs, sim = tighten(wl, *first, nodes=nodes, cores=cores, overhead_s=overhead_s, model=model,
                                rounds=rounds, cpus_per_job=cpus_per_job, seed=seed)
            if sim.makespan_s < best[1].makespan_s - 1e-9:
                best = (jobs, sim)
    jobs, sim = _renumber(*best, nodes=nodes, cores=cores)
    util = consumed / (nodes * cores * sim.makespan_s) if sim.makespan_s > 0 else 0.0
    return Schedule(jobs=jobs, nodes=nodes, cores=cores, overhead_s=overhead_s, makespan_s=sim.makespan_s,
                    lower_bound_s=lb, critical_path_s=cp, work_core_s=consumed, utilization=util,
                    strategy=strategy, model=model, starts=sim.starts,
                    dag_bound_s=dag_bound(wl, nodes, cores, overhead_s, model, cpus_per_job))


def _one_job(wl: Workload, cores: int, overhead_s: float, model: CoreModel, cpus_per_job: int,
             max_cores: bool) -> List[Job]:
    """Every package in one job, one after the other: on the whole node (``spack install
    -j C``), or with ``max_cores`` on the most cores any of the packages can use."""
    order = wl.topo()
    if not order:
        return []
    if cpus_per_job:
        c = max(1, min(cpus_per_job, cores))
    elif max_cores:
        c = max(package_cores(wl, cores, model).values())
    else:
        c = cores
    return [Job(id="j001", hashes=order, cores=c, names=[wl.name(h) for h in order],
                est_s=job_seconds(wl, order, c, model, overhead_s))]


def _renumber(jobs: List[Job], sim: Simulation, *, nodes: int, cores: int) -> Tuple[List[Job], Simulation]:
    """Ids j001, j002, ... in the order the simulation started the jobs, listed (= submitted)
    in that order where that simulates as well, else in the order that was simulated. The
    simulation is redone on the list returned: equal priorities go by submission order,
    so the makespan reported is the one of the jobs as Slurm gets them."""
    ordered = sorted(jobs, key=lambda j: (sim.starts[j.id][0], -j.priority, j.id))
    width = max(3, len(str(len(jobs))))
    new = {j.id: f"j{i + 1:0{width}d}" for i, j in enumerate(ordered)}

    def renamed(order: Sequence[Job]) -> List[Job]:
        return [Job(id=new[j.id], hashes=j.hashes, after=sorted(new[a] for a in j.after), est_s=j.est_s,
                    priority=j.priority, cores=j.cores, names=j.names,
                    order={new[a]: t for a, t in sorted(j.order.items(), key=lambda at: new[at[0]])})
                for j in order]

    best: Optional[Tuple[List[Job], Simulation]] = None
    for order in (ordered, jobs):
        out = renamed(order)
        osim = simulate(out, nodes=nodes, cores=cores)
        if best is None or osim.makespan_s < best[1].makespan_s - 1e-9:
            best = (out, osim)
    assert best is not None
    return best


def schedule_plan(plan, settings, *, nodes: Optional[int] = None, cores: Optional[int] = None,
                  hashes: Optional[Iterable[str]] = None, strategy: str = "dedal") -> Schedule:
    """The schedule of a plan's packages to build (or ``hashes``) with the settings'
    ``job_overhead_s``, ``slurm.nodes``, ``slurm.cores_per_node``, ``slurm.cpus_per_job`` and
    ``slurm.order_hints``."""
    wl = Workload.from_plan(plan, hashes)
    n = nodes if nodes else settings.get("slurm.nodes") or 1
    c = cores if cores else settings.get("slurm.cores_per_node") or DEFAULT_CORES
    return make_schedule(wl, nodes=n, cores=c, overhead_s=float(settings.get("job_overhead_s")),
                         cpus_per_job=int(settings.get("slurm.cpus_per_job") or 0), strategy=strategy,
                         hints=wants_order_hints(plan, settings.get("slurm.order_hints"), wl.order))


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


DEFAULT_CORES = 64  # cores of a build node when neither --cores nor slurm.cores_per_node says
