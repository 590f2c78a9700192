"""Improving a grouping by local search, :func:`~dedal.schedule.simulate` the judge.

The searches that start from a grouping (:func:`~dedal.schedule.group`) and that
:func:`~dedal.schedule.make_schedule` runs on each; :func:`build_jobs` (jobs from
their packages, priorities as bottom levels) serves :func:`~dedal.schedule.anneal` too.

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

Beyond ``LARGE_BUILD`` packages (facility stacks of thousands; the largest case before
was 805) every search stops after a fixed amount of work counted in jobs simulated
(``IMPROVE_WORK``, ``REFINE_WORK_LARGE``), never after a time, so the same workload gives
the same schedule on every machine, and the cost grows like a few simulations
(n log n) instead of n^2 (benchmarks/schedule/scale.md).
"""

from __future__ import annotations

import bisect
import math
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from dedal.model.cores import CoreModel
from dedal.schedule.workload import Job, Machine, Simulation, Workload, job_seconds, top_cores
from dedal.schedule.simulation import critical_links, simulate, simulate_unless
from dedal.schedule.grouping import set_priorities, settle

SMALL_BUILD = 64  # jobs: below this, improve() tries every merge of a job into one it waits for
# packages: beyond this, every search stops after a fixed amount of work, counted in jobs
# simulated (a simulation of J jobs costs J), so that its cost grows like one simulation
# (n log n) rather than n^2; the same count gives the same schedule on every machine
LARGE_BUILD = 900
IMPROVE_WORK = 10_000  # per starting point
# improve() with ``work`` starts only where that affords this many candidates: one or two
# merges along the chain (5,000 jobs and more) never found a shorter schedule on the locks
# of benchmarks/schedule/scale.md, and refine() tries merges along the chain too
IMPROVE_MIN_TRIES = 3


def improve_runs(jobs: int, work: Optional[int] = IMPROVE_WORK) -> bool:
    """Whether :func:`improve` with ``work`` searches ``jobs`` jobs at all."""
    return work is None or jobs * IMPROVE_MIN_TRIES <= work


REFINE_WORK_LARGE = 20_000  # refine(): simulations = this // packages
# refine(): simulations per starting point (REFINE_WORK // packages, within MIN..MAX);
# every starting point up to REFINE_ALL packages, the best one beyond
REFINE_WORK, REFINE_MIN, REFINE_MAX, REFINE_ALL = 40000, 30, 400, 300


def _if_shorter(cand: Sequence[Job], sim: Simulation, *, nodes: int, cores: int) -> Optional[Simulation]:
    """The simulation of ``cand`` if it ends more than a microsecond before ``sim``, else
    None (given up as soon as it cannot: :func:`simulate_unless`)."""
    csim = simulate_unless(cand, nodes=nodes, cores=cores, at_least=sim.makespan_s - 1e-6)
    return csim if csim is not None and csim.makespan_s < sim.makespan_s - 1e-6 else None


# -- local improvement: merge jobs along the simulated critical chain ----------------------


def merge_jobs(
    jobs: Sequence[Job],
    a: str,
    b: str,
    wl: Workload,
    model: CoreModel,
    overhead_s: float,
    cores: int,
    pos: Optional[Mapping[str, int]] = None,
    bonus: Optional[Mapping[str, float]] = None,
) -> Optional[List[Job]]:
    """The jobs with ``b`` (which runs after ``a``) merged into ``a``, priorities their
    bottom levels plus ``bonus``; None when that would create a cycle or exceed a node.
    Where ``jobs`` are what :func:`build_jobs` makes of their parts, the same as it makes
    of the parts merged (the merged graph reduced has the same closure either way)."""
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
    merged = Job(
        id=a,
        hashes=hashes,
        cores=c,
        names=[wl.name(h) for h in hashes],
        after=sorted((set(ja.after) | set(jb.after)) - {a, b}),
        est_s=job_seconds(wl, hashes, c, model, overhead_s),
    )
    out: List[Job] = []
    for j in jobs:
        if j.id == b:
            continue
        if j.id == a:
            out.append(merged)
            continue
        after = sorted({a if x == b else x for x in j.after})
        out.append(
            Job(id=j.id, hashes=j.hashes, after=after, est_s=j.est_s, cores=j.cores, names=j.names, priority=j.priority)
        )
    settle(out, bonus)
    return out


def improve(
    wl: Workload,
    jobs: List[Job],
    machine: Machine,
    *,
    rounds: int = 200,
    work: Optional[int] = None,
    start: Optional[Simulation] = None,
) -> Tuple[List[Job], Simulation]:
    """Merge consecutive jobs of the critical chain while the simulated makespan shrinks;
    then merge pure chains (B waits only for A, nobody else waits for A) wherever that
    does not lengthen the makespan: one overhead less, no parallelism lost. ``work``: stop
    once that many jobs were simulated (None: no limit but ``rounds``), and start only if
    that affords ``IMPROVE_MIN_TRIES`` candidates; ``start``: the
    simulation of ``jobs`` as they are, where the caller has it."""
    nodes, cores, overhead_s, model = machine.nodes, machine.cores, machine.overhead_s, machine.model
    sim = start if start is not None else simulate(jobs, nodes=nodes, cores=cores)
    if not improve_runs(len(jobs), work):
        return jobs, sim
    pos = {h: i for i, h in enumerate(wl.topo())}
    spent = 0

    def over() -> bool:  # would one more simulation go past ``work``?
        return work is not None and spent + len(jobs) > work

    for _ in range(rounds):
        if over():
            break
        for a, b in critical_links(jobs, sim):
            if over():
                break
            cand = merge_jobs(jobs, a, b, wl, model, overhead_s, cores, pos)
            if cand is None:
                continue
            spent += len(cand)
            csim = _if_shorter(cand, sim, nodes=nodes, cores=cores)
            if csim is not None:
                jobs, sim = cand, csim
                break
        else:
            break
    tried: Set[Tuple[str, str]] = set()
    for _ in range(rounds):
        if over():
            break
        dependents: Dict[str, List[str]] = {j.id: [] for j in jobs}
        for j in jobs:
            for x in j.after:
                dependents[x].append(j.id)
        pairs = [
            (j.after[0], j.id)
            for j in jobs
            if len(j.after) == 1 and dependents[j.after[0]] == [j.id] and (j.after[0], j.id) not in tried
        ]
        if not pairs and len(jobs) <= SMALL_BUILD:  # small builds: any job with one it waits for
            pairs = [(a, j.id) for j in jobs for a in j.after if (a, j.id) not in tried]
        for a, b in pairs:
            if over():
                break
            tried.add((a, b))
            cand = merge_jobs(jobs, a, b, wl, model, overhead_s, cores, pos)
            if cand is None:
                continue
            spent += len(cand)
            csim = simulate_unless(
                cand, nodes=nodes, cores=cores, at_least=math.nextafter(sim.makespan_s + 1e-6, math.inf)
            )
            if csim is not None and csim.makespan_s <= sim.makespan_s + 1e-6:
                jobs, sim = cand, csim
                break
        else:
            break
    return jobs, sim


# -- local search: moves around the simulated critical chain --------------------------------


def build_jobs(
    wl: Workload,
    parts: Sequence[Tuple[str, List[str], int]],
    bonus: Mapping[str, float],
    model: CoreModel,
    overhead_s: float,
) -> Optional[List[Job]]:
    """Jobs from (id, packages in build order, cores) parts: ``after`` from the packages'
    requirements (transitively reduced), priority = bottom level of ``est_s`` + ``bonus``
    (so a job always outranks the jobs that wait for it); None on a cycle."""
    job_of = {h: jid for jid, hs, _ in parts for h in hs}
    direct = wl.direct_requires()  # the same reduced job graph from fewer edges
    jobs = [
        Job(
            id=jid,
            hashes=list(hs),
            cores=c,
            names=[wl.name(h) for h in hs],
            after=sorted({job_of[q] for h in hs for q in direct[h] if job_of[q] != jid}),
            est_s=job_seconds(wl, hs, c, model, overhead_s),
        )
        for jid, hs, c in parts
    ]
    try:
        settle(jobs, bonus)  # reduced first: the same bottom levels over fewer edges
    except ValueError:  # a cycle
        return None
    return jobs


def _reprioritized(jobs: Sequence[Job], bonus: Mapping[str, float]) -> List[Job]:
    """What :func:`build_jobs` makes of the parts of ``jobs`` (made by it, or reduced by
    :func:`settle` in the same order) with another ``bonus``, without making their graph
    anew: the same ``after`` lists, priorities set again (a third of the cost)."""
    out = [Job(id=j.id, hashes=j.hashes, after=j.after, est_s=j.est_s, cores=j.cores, names=j.names) for j in jobs]
    set_priorities(out, bonus)
    return out


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


def refine(
    wl: Workload,
    jobs: List[Job],
    machine: Machine,
    *,
    evaluations: int = 400,
    start: Optional[Simulation] = None,
) -> Tuple[List[Job], Simulation]:
    """Local search with :func:`simulate` as the judge, on the jobs of the chain that ends
    last: raise the priority of one that waited for cores (above the jobs that took
    them), merge it with the job it waited for, split it in two, give it a core more
    or less; keep the first change that shortens the makespan, until none does or
    ``evaluations`` simulations were spent. ``start``: the simulation of ``jobs`` as they
    are, where their priorities are their bottom levels already (as :func:`improve` leaves
    them), so that they need not be rebuilt and simulated again."""
    nodes, cores, overhead_s, model = machine.nodes, machine.cores, machine.overhead_s, machine.model
    cpus_per_job = machine.cpus_per_job
    pos = {h: i for i, h in enumerate(wl.topo())}
    parts: Dict[str, Tuple[List[str], int]] = {j.id: (list(j.hashes), j.cores) for j in jobs}
    bonus: Dict[str, float] = {}
    if start is not None:
        cur: Optional[List[Job]] = list(jobs)
        sim = start
    else:
        cur = build_jobs(wl, [(k, hs, c) for k, (hs, c) in parts.items()], bonus, model, overhead_s)
        assert cur is not None
        sim = simulate(cur, nodes=nodes, cores=cores)
    spent = 0
    # the ids of new jobs (splits): ``base`` counts those of the rounds before this one that
    # were counted, ``uncounted`` holds the others' (chain, simulation, parts), counted
    # when a split next needs an id (a large build's last kept move never does, and
    # counting costs a pass over every job), ``taken`` those of this round so far
    base, taken = 0, 0
    uncounted: List[Tuple[Sequence[Tuple[str, float]], Simulation, Mapping[str, Tuple[List[str], int]]]] = []

    def next_id() -> int:
        nonlocal base, taken
        if uncounted:
            base += sum(new_ids(*r) for r in uncounted)
            uncounted.clear()
        taken += 1
        return base + taken

    def top(hs: Sequence[str]) -> int:
        if cpus_per_job:  # fixed by the settings: every job keeps its cores
            return max(1, min(cpus_per_job, cores))
        return top_cores(wl, hs, cores, model)

    def cuts_of(n: int) -> List[int]:  # where a job of n packages is split
        if n > 8:
            return sorted({1 + (n - 2) * k // 6 for k in range(7)})
        return list(range(1, n))

    Move = Callable[[], Tuple[Dict[str, Tuple[List[str], int]], Dict[str, float]]]

    def shape(x: str) -> Iterator[Move]:
        """Moves on job ``x`` itself: split it in two, a core more or less."""
        hs, c = parts[x]
        for k in cuts_of(len(hs)):
            yield (
                lambda x=x, hs=hs, c=c, k=k, new=f"{x}.{next_id()}", ps=parts, b=bonus: (
                    dict(ps, **{x: (hs[:k], min(c, top(hs[:k]))), new: (hs[k:], min(c, top(hs[k:])))}),
                    b,
                )
            )
        for nc in (c - 1, c + 1) if not cpus_per_job else ():
            if 1 <= nc <= top(hs):
                yield lambda x=x, hs=hs, nc=nc, ps=parts, b=bonus: (dict(ps, **{x: (hs, nc)}), b)

    def held(
        x: str, ready: float, on_node: Mapping[int, Sequence[Tuple[str, Tuple[float, float, int]]]]
    ) -> Iterator[Tuple[str, float]]:
        """The jobs that held the cores of ``x``'s node while it waited (from ``ready`` to
        its start), with their starts, in the order of ``on_node``."""
        start, _, node = sim.starts[x]
        for y, (s0, e0, n0) in on_node.get(node, []):
            if s0 < start - 1e-6 and e0 > ready + 1e-6 and y != x:
                yield y, s0

    def moves_of(chain: Sequence[Tuple[str, float]], by_id: Mapping[str, Job]) -> Iterator[Move]:
        """The moves of a round in the order they are tried, each made only when tried
        (new parts, new bonus); made one by one, as the search asks (a large build tries
        a few of a chain of thousands)."""
        by_start = sorted((s0, y) for y, (s0, _, _) in sim.starts.items())
        first_start = [s0 for s0, _ in by_start]
        on_node: Dict[int, List[Tuple[str, Tuple[float, float, int]]]] = {}
        for y, st in sorted(sim.starts.items(), key=lambda kv: -by_id[kv[0]].priority):
            on_node.setdefault(st[2], []).append((y, st))
        for i, (x, ready) in enumerate(chain):
            j = by_id[x]
            start = sim.starts[x][0]
            if start > ready + 1e-6:
                lo, hi = bisect.bisect_left(first_start, ready - 1e-6), bisect.bisect_left(first_start, start - 1e-6)
                ahead = [by_id[y].priority for _, y in by_start[lo:hi]]
                if ahead and max(ahead) >= j.priority:
                    nb = dict(bonus)
                    nb[x] = nb.get(x, 0.0) + max(ahead) - j.priority + 1.0
                    yield lambda nb=nb, ps=parts: (ps, nb)
            if i + 1 < len(chain):
                prev = chain[i + 1][0]

                def merged(
                    prev: str = prev,
                    x: str = x,
                    ps: Dict[str, Tuple[List[str], int]] = parts,
                    b: Dict[str, float] = bonus,
                ) -> Tuple[Dict[str, Tuple[List[str], int]], Dict[str, float]]:
                    np = dict(ps)
                    del np[x]
                    np[prev] = (sorted(ps[prev][0] + ps[x][0], key=pos.__getitem__), max(ps[prev][1], ps[x][1]))
                    nb = dict(b)
                    nb.pop(x, None)
                    return np, nb

                yield merged
            yield from shape(x)
            if start > ready + 1e-6:  # the jobs that held its node's cores meanwhile
                for y, s0 in held(x, ready, on_node):
                    yield from shape(y)
                    if s0 >= ready - 1e-6 and bonus.get(y, 0.0) > -0.5 * by_id[y].est_s:
                        nb = dict(bonus)
                        nb[y] = nb.get(y, 0.0) - 0.5 * by_id[y].est_s
                        yield lambda nb=nb, ps=parts: (ps, nb)

    def new_ids(chain: Sequence[Tuple[str, float]], sim: Simulation, parts: Mapping[str, Tuple[List[str], int]]) -> int:
        """How many new job ids every move of the round (of ``chain``, ``sim`` and ``parts``)
        takes (the ids of the splits stay those of making every move of a round, as the
        search once did)."""
        per_node: Dict[int, Tuple[List[float], List[Tuple[float, float, str]], float]] = {}
        for y, (s0, e0, n0) in sorted(sim.starts.items(), key=lambda kv: kv[1][0]):
            got = per_node.setdefault(n0, ([], [], 0.0))
            got[0].append(s0)
            got[1].append((s0, e0, y))
            per_node[n0] = (got[0], got[1], max(got[2], e0 - s0))
        count = 0
        for x, ready in chain:
            count += len(cuts_of(len(parts[x][0])))
            start, _, node = sim.starts[x]
            if start > ready + 1e-6:
                s0s, entries, longest = per_node[node]
                # a job that ends after ``ready`` started at most ``longest`` before it
                lo = bisect.bisect_left(s0s, ready - longest - 1.0)
                hi = bisect.bisect_left(s0s, start - 1e-6)
                for s0, e0, y in entries[lo:hi]:
                    if s0 < start - 1e-6 and e0 > ready + 1e-6 and y != x:
                        count += len(cuts_of(len(parts[y][0])))
        return count

    while spent < evaluations:
        by_id = {j.id: j for j in cur}
        chain = _chain(cur, sim)
        for move in moves_of(chain, by_id):
            if spent >= evaluations:
                break
            np, nb = move()
            if np is parts:  # a new bonus only: the same jobs, priorities anew
                cand = _reprioritized(cur, nb)
            elif len(np) == len(parts) - 1:
                # a merge, the one move that leaves a part fewer (x gone, prev made of both): the
                # jobs merged as they are, not made anew from their packages (a third less)
                x = next(k for k in parts if k not in np)
                prev = next(k for k in np if np[k] is not parts[k])
                cand = merge_jobs(cur, prev, x, wl, model, overhead_s, cores, pos, bonus=nb)
            else:
                cand = build_jobs(wl, [(k, hs, c) for k, (hs, c) in np.items()], nb, model, overhead_s)
            if cand is None:
                continue
            spent += 1
            csim = _if_shorter(cand, sim, nodes=nodes, cores=cores)
            if csim is not None:
                uncounted.append((chain, sim, parts))
                taken = 0
                parts, bonus, cur, sim = np, nb, cand, csim
                break
        else:
            break
    return cur, sim
