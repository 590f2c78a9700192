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

Each grouping is then improved by merging consecutive jobs of its simulated critical
chain (:func:`improve`) while the simulated makespan shrinks, and
:func:`make_schedule` keeps the best by simulated makespan (:func:`simulate`, the
job-level model of the batch scheduler), after a local search (:func:`refine`) from every
starting point (from the best one on large builds): on the jobs of the simulated chain
that ends last, raise the priority of one that waited for cores, merge it with the job it
waited for, split it, give it a core more or less, or lower or reshape the jobs that held
its cores; the first change that shortens the simulated makespan is kept, within a number
of simulations that shrinks with the build's size. Priorities stay bottom levels (plus
what the search added), so a job always outranks the jobs waiting for it and Slurm's
``--nice`` order is the simulated one. One job per package in submission order (the
``spack ci`` baseline) is among the starting points, so the result is never worse in
the model than that baseline.

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

import math
import random
from dataclasses import replace
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from dedal.model.cores import DEFAULT_MODEL, CoreModel
from dedal.schedule.workload import (Job, Schedule, Simulation, TimeLimits, Workload, job_seconds, job_topo, keyed_topo,
                                     package_cores, top_cores)
from dedal.schedule.nodes import Profile
from dedal.schedule.bounds import allot, dag_bound, lower_bound
from dedal.schedule.simulation import afterok, critical_links, simulate, simulate_backfill
from dedal.schedule.grouping import group, reduce_after, set_priorities

__all__ = ["CoreModel", "DEFAULT_MODEL", "Job", "Schedule", "TimeLimits", "Workload", "allot", "anneal", "dag_bound",
           "group", "improve", "job_topo", "lower_bound", "make_schedule", "order_hints", "package_cores", "refine",
           "schedule_plan", "simulate", "simulate_backfill", "tighten", "wants_order_hints"]

MERGE_MODES = ("safe", "backlog", "none")
MOLD_VARIANTS = (("safe", False), ("none", False), ("none", True))
# allot(): critical path at most this fraction of work / capacity, cores raised by one or doubled
ALLOT_VARIANTS = ((0.5, False), (0.9, False), (0.5, True))
SMALL_BUILD = 64  # jobs: below this, improve() tries every merge of a job into one it waits for
# refine(): simulations per starting point (REFINE_WORK // packages, within MIN..MAX);
# every starting point up to REFINE_ALL packages, the best one beyond
REFINE_WORK, REFINE_MIN, REFINE_MAX, REFINE_ALL = 40000, 30, 400, 300
# tighten(): searches, rounds each (TIGHTEN_WORK // jobs**2 within MIN..MAX: a round costs
# about that), the noise added to start times to reorder (cycled), the chance of a merge and
# of a core more or less per round
TIGHTEN_CHAINS, TIGHTEN_WORK, TIGHTEN_MIN, TIGHTEN_MAX = 3, 16_000_000, 20, 2000
TIGHTEN_NOISE_S = (30.0, 100.0, 300.0)
TIGHTEN_MERGE, TIGHTEN_CORES = 0.5, 0.25


# -- local improvement: merge jobs along the simulated critical chain ----------------------

def merge_jobs(jobs: Sequence[Job], a: str, b: str, wl: Workload, model: CoreModel, overhead_s: float,
               cores: int, pos: Optional[Mapping[str, int]] = None) -> Optional[List[Job]]:
    """The jobs with ``b`` (which runs after ``a``) merged into ``a``; None when that would
    create a cycle or exceed a node."""
    by_id = {j.id: j for j in jobs}
    ja, jb = by_id[a], by_id[b]
    # another path a -> ... -> b would make the merged job wait for itself
    dependents: Dict[str, List[str]] = {j.id: [] for j in jobs}
    for j in jobs:
        for x in j.after:
            dependents[x].append(j.id)
    stack = [d for d in dependents[a] if d != b]
    seen: Set[str] = set(stack)
    while stack:
        x = stack.pop()
        if x == b:
            return None
        for d in dependents[x]:
            if d not in seen:
                seen.add(d)
                stack.append(d)
    c = max(ja.cores, jb.cores)
    if c > cores:
        return None
    if pos is None:
        pos = {h: i for i, h in enumerate(wl.topo())}
    hashes = sorted(ja.hashes + jb.hashes, key=pos.__getitem__)
    merged = Job(id=a, hashes=hashes, cores=c, names=[wl.name(h) for h in hashes],
                 after=sorted((set(ja.after) | set(jb.after)) - {a, b}),
                 est_s=job_seconds(wl, hashes, c, model, overhead_s))
    out: List[Job] = []
    for j in jobs:
        if j.id == b:
            continue
        if j.id == a:
            out.append(merged)
            continue
        after = sorted({a if x == b else x for x in j.after})
        out.append(Job(id=j.id, hashes=j.hashes, after=after, est_s=j.est_s, cores=j.cores, names=j.names,
                       priority=j.priority))
    reduce_after(out)
    set_priorities(out)
    return out


def improve(wl: Workload, jobs: List[Job], *, nodes: int, cores: int, overhead_s: float,
            model: CoreModel = DEFAULT_MODEL, rounds: int = 200) -> Tuple[List[Job], Simulation]:
    """Merge consecutive jobs of the critical chain while the simulated makespan shrinks;
    then merge pure chains (B waits only for A, nobody else waits for A) wherever that
    does not lengthen the makespan: one overhead less, no parallelism lost."""
    sim = simulate(jobs, nodes=nodes, cores=cores)
    pos = {h: i for i, h in enumerate(wl.topo())}
    for _ in range(rounds):
        for a, b in critical_links(jobs, sim):
            cand = merge_jobs(jobs, a, b, wl, model, overhead_s, cores, pos)
            if cand is None:
                continue
            csim = simulate(cand, nodes=nodes, cores=cores)
            if csim.makespan_s < sim.makespan_s - 1e-6:
                jobs, sim = cand, csim
                break
        else:
            break
    tried: Set[Tuple[str, str]] = set()
    for _ in range(rounds):
        dependents: Dict[str, List[str]] = {j.id: [] for j in jobs}
        for j in jobs:
            for x in j.after:
                dependents[x].append(j.id)
        pairs = [(j.after[0], j.id) for j in jobs if len(j.after) == 1 and dependents[j.after[0]] == [j.id]
                 and (j.after[0], j.id) not in tried]
        if not pairs and len(jobs) <= SMALL_BUILD:  # small builds: any job with one it waits for
            pairs = [(a, j.id) for j in jobs for a in j.after if (a, j.id) not in tried]
        for a, b in pairs:
            tried.add((a, b))
            cand = merge_jobs(jobs, a, b, wl, model, overhead_s, cores, pos)
            if cand is None:
                continue
            csim = simulate(cand, nodes=nodes, cores=cores)
            if csim.makespan_s <= sim.makespan_s + 1e-6:
                jobs, sim = cand, csim
                break
        else:
            break
    return jobs, sim


# -- local search: moves around the simulated critical chain --------------------------------

def _build(wl: Workload, parts: Sequence[Tuple[str, List[str], int]], bonus: Mapping[str, float],
           model: CoreModel, overhead_s: float) -> Optional[List[Job]]:
    """Jobs from (id, packages in build order, cores) parts: ``after`` from the packages'
    requirements (transitively reduced), priority = bottom level of ``est_s`` + ``bonus``
    (so a job always outranks the jobs that wait for it); None on a cycle."""
    job_of = {h: jid for jid, hs, _ in parts for h in hs}
    jobs = [Job(id=jid, hashes=list(hs), cores=c, names=[wl.name(h) for h in hs],
                after=sorted({job_of[q] for h in hs for q in wl.requires[h] if job_of[q] != jid}),
                est_s=job_seconds(wl, hs, c, model, overhead_s))
            for jid, hs, c in parts]
    try:
        set_priorities(jobs, bonus)
    except ValueError:
        return None
    reduce_after(jobs)
    return jobs


def _chain(jobs: Sequence[Job], sim: Simulation) -> List[Tuple[str, float]]:
    """(job, time it was ready) along the chain that ends last, last job first: each job
    started when one it waits for ended, or when one on its node gave back cores."""
    by_id = {j.id: j for j in jobs}
    ending: Dict[Tuple[int, float], List[str]] = {}
    for x, (s0, e0, n0) in sim.starts.items():
        ending.setdefault((n0, round(e0, 6)), []).append(x)
    cur = max(sim.starts, key=lambda x: (sim.starts[x][1], x))
    out: List[Tuple[str, float]] = []
    seen: Set[str] = set()
    while cur not in seen:
        seen.add(cur)
        start, _, node = sim.starts[cur]
        ready = max((sim.starts[a][1] for a in by_id[cur].after), default=0.0)
        out.append((cur, ready))
        if start <= 1e-9:
            break
        dep = [a for a in by_id[cur].after if abs(sim.starts[a][1] - start) < 1e-6]
        if dep:
            cur = dep[0]
            continue
        same = sorted(ending.get((node, round(start, 6)), []))
        if not same:
            break
        cur = same[0]
    return out


def refine(wl: Workload, jobs: List[Job], *, nodes: int, cores: int, overhead_s: float,
           model: CoreModel = DEFAULT_MODEL, evaluations: int = 400,
           cpus_per_job: int = 0) -> Tuple[List[Job], Simulation]:
    """Local search with :func:`simulate` as the judge, on the jobs of the chain that ends
    last: raise the priority of one that waited for cores (above the jobs that took
    them), merge it with the job it waited for, split it in two, give it a core more
    or less; keep the first change that shortens the makespan, until none does or
    ``evaluations`` simulations were spent."""
    pos = {h: i for i, h in enumerate(wl.topo())}
    parts: Dict[str, Tuple[List[str], int]] = {j.id: (list(j.hashes), j.cores) for j in jobs}
    bonus: Dict[str, float] = {}
    cur = _build(wl, [(k, hs, c) for k, (hs, c) in parts.items()], bonus, model, overhead_s)
    assert cur is not None
    sim = simulate(cur, nodes=nodes, cores=cores)
    spent = 0
    fresh = 0

    def top(hs: Sequence[str]) -> int:
        if cpus_per_job:  # fixed by the settings: every job keeps its cores
            return max(1, min(cpus_per_job, cores))
        return top_cores(wl, hs, cores, model)

    def shape(x: str) -> None:
        """Moves on job ``x`` itself: split it in two, a core more or less."""
        nonlocal fresh
        hs, c = parts[x]
        cuts = range(1, len(hs))
        if len(hs) > 8:
            cuts = sorted({1 + (len(hs) - 2) * k // 6 for k in range(7)})
        for k in cuts:
            fresh += 1
            np = dict(parts)
            np[x] = (hs[:k], min(c, top(hs[:k])))
            np[f"{x}.{fresh}"] = (hs[k:], min(c, top(hs[k:])))
            moves.append((np, bonus))
        for nc in (c - 1, c + 1) if not cpus_per_job else ():
            if 1 <= nc <= top(hs):
                np = dict(parts)
                np[x] = (hs, nc)
                moves.append((np, bonus))

    while spent < evaluations:
        by_id = {j.id: j for j in cur}
        chain = _chain(cur, sim)
        moves: List[Tuple[Dict[str, Tuple[List[str], int]], Dict[str, float]]] = []
        for i, (x, ready) in enumerate(chain):
            j = by_id[x]
            start = sim.starts[x][0]
            if start > ready + 1e-6:
                ahead = [by_id[y].priority for y, (s0, _, _) in sim.starts.items() if ready - 1e-6 <= s0 < start - 1e-6]
                if ahead and max(ahead) >= j.priority:
                    nb = dict(bonus)
                    nb[x] = nb.get(x, 0.0) + max(ahead) - j.priority + 1.0
                    moves.append((parts, nb))
            if i + 1 < len(chain):
                prev = chain[i + 1][0]
                hs = sorted(parts[prev][0] + parts[x][0], key=pos.__getitem__)
                np = dict(parts)
                del np[x]
                np[prev] = (hs, max(parts[prev][1], parts[x][1]))
                nb = dict(bonus)
                nb.pop(x, None)
                moves.append((np, nb))
            shape(x)
            if start > ready + 1e-6:  # the jobs that held its node's cores meanwhile
                node = sim.starts[x][2]
                for y, (s0, e0, n0) in sorted(sim.starts.items(), key=lambda kv: -by_id[kv[0]].priority):
                    if n0 == node and s0 < start - 1e-6 and e0 > ready + 1e-6 and y != x:
                        shape(y)
                        if s0 >= ready - 1e-6 and bonus.get(y, 0.0) > -0.5 * by_id[y].est_s:
                            nb = dict(bonus)
                            nb[y] = nb.get(y, 0.0) - 0.5 * by_id[y].est_s
                            moves.append((parts, nb))
        for np, nb in moves:
            if spent >= evaluations:
                break
            cand = _build(wl, [(k, hs, c) for k, (hs, c) in np.items()], nb, model, overhead_s)
            if cand is None:
                continue
            spent += 1
            csim = simulate(cand, nodes=nodes, cores=cores)
            if csim.makespan_s < sim.makespan_s - 1e-6:
                parts, bonus, cur, sim = np, nb, cand, csim
                break
        else:
            break
    return cur, sim


def anneal(wl: Workload, jobs: Sequence[Job], *, nodes: int, cores: int, overhead_s: float,
           model: CoreModel = DEFAULT_MODEL, evaluations: int = 20000, seed: int = 1,
           temperature: float = 0.001) -> Tuple[List[Job], Simulation]:
    """Simulated annealing from a schedule, :func:`simulate` the judge, the estimates taken
    as exact: random moves (a job's priority up or down, a core more or less, the cores of
    a job that waits for it, so that it holds them until that job can start; merge into a
    job it waits for; split in two), a longer makespan accepted with probability
    exp(-increase / T), T falling linearly from ``temperature`` x the makespan to 0; the
    best schedule seen is returned (never longer than ``jobs``). Deterministic for a seed.

    Not part of :func:`make_schedule`: a probe of how far list scheduling can go when every
    estimate holds (benchmarks/schedule/exact_probe.py). What it gains over :func:`refine`
    comes from timing that exact estimates make look safe: on cscs-prgenv-gnu 1 x 8 it
    reaches 1.052 of the lower bound where dedal's schedule is at 1.060, but with estimates
    off by 10 % the annealed schedule is 0.9 % longer on average (exact_probe.md)."""
    rng = random.Random(seed)
    pos = {h: i for i, h in enumerate(wl.topo())}
    _, _, dependents, _ = afterok(jobs, cores)
    prio = {j.id: j.priority for j in jobs}
    # the priorities as _build makes them: bottom level of est_s plus each job's own bonus
    bonus = {j.id: j.priority - j.est_s - max((prio[d] for d in dependents[j.id]), default=0.0) for j in jobs}
    parts: Dict[str, Tuple[List[str], int]] = {j.id: (list(j.hashes), j.cores) for j in jobs}
    cur = _build(wl, [(k, hs, c) for k, (hs, c) in parts.items()], bonus, model, overhead_s)
    if cur is None or not cur:
        raise ValueError("anneal: the jobs do not form a schedule of their packages")
    sim = simulate(cur, nodes=nodes, cores=cores)
    best = (cur, sim)
    span = sim.makespan_s
    fresh = 0
    for step in range(evaluations):
        ids = list(parts)
        x = ids[rng.randrange(len(ids))]
        hs, c = parts[x]
        new_parts, new_bonus = parts, bonus
        kind = rng.random()
        if kind < 0.65:
            new_bonus = dict(bonus)
            new_bonus[x] = bonus.get(x, 0.0) + rng.choice((-1.0, 1.0)) * rng.expovariate(10.0 / span)
        elif kind < 0.72:
            c2 = c + rng.choice((-1, 1))
            if not 1 <= c2 <= top_cores(wl, hs, cores, model):
                continue
            new_parts = dict(parts)
            new_parts[x] = (hs, c2)
        elif kind < 0.77:
            waiting = [j.id for j in cur if x in j.after and parts[j.id][1] != c]
            if not waiting:
                continue
            new_parts = dict(parts)
            new_parts[x] = (hs, parts[waiting[rng.randrange(len(waiting))]][1])
        elif kind < 0.89:
            job_of = {h: k for k, (group_hs, _) in parts.items() for h in group_hs}
            providers = sorted({job_of[q] for h in hs for q in wl.requires[h] if job_of[q] != x})
            if not providers:
                continue
            y = providers[rng.randrange(len(providers))]
            new_parts = dict(parts)
            del new_parts[x]
            new_parts[y] = (sorted(parts[y][0] + hs, key=pos.__getitem__), max(c, parts[y][1]))
            new_bonus = dict(bonus)
            new_bonus.pop(x, None)
        else:
            if len(hs) < 2:
                continue
            k = rng.randrange(1, len(hs))
            fresh += 1
            new_parts = dict(parts)
            new_parts[x] = (hs[:k], min(c, top_cores(wl, hs[:k], cores, model)))
            new_parts[f"{x}.a{fresh}"] = (hs[k:], min(c, top_cores(wl, hs[k:], cores, model)))
        cand = _build(wl, [(k, group_hs, cc) for k, (group_hs, cc) in new_parts.items()], new_bonus, model,
                      overhead_s)
        if cand is None:
            continue
        csim = simulate(cand, nodes=nodes, cores=cores)
        t = temperature * span * (1.0 - step / evaluations)
        delta = csim.makespan_s - sim.makespan_s
        if delta <= 0 or (t > 0 and rng.random() < math.exp(-delta / t)):
            parts, bonus, cur, sim = new_parts, new_bonus, cand, csim
            if sim.makespan_s < best[1].makespan_s - 1e-9:
                best = (cur, sim)
    return best


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
