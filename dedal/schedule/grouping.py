"""Grouping the packages of a build into jobs: the starting points of every search.

Also the upkeep of a job graph (:func:`reduce_after`, :func:`set_priorities`) that
every later change to the jobs redoes.

Grouping (:func:`group`)
------------------------
A list-scheduling simulation at package level, critical path first (priority = the
longest estimated path from the package to the end of the build, overheads included),
placing jobs best-fit with one backfill reservation for the top job that does not fit
(as Slurm's backfill does), in which a job that finishes a package may go on with
another one instead of ending (saving a job overhead). It goes on only with the
package its cores would go to next anyway (the highest-priority ready one that fits;
no queue jumping), only if that package's other requirements were complete when the
job started (Slurm's ``afterok`` is fixed at submission), only if the job's cores fit
it (a job grows only while the waste of the extra cores stays below one overhead) and
not past a reservation of its node. Then, per mode:

* ``safe``: ending the job would release no other package, and every package still
  waiting for this job is expected to wait for something else at least as long
  (chains of packages, and small packages nobody is waiting for);
* ``backlog``: no package the job releases could start anywhere right now (builds
  bound by the cores, where releasing early gains nothing);
* ``none``: one job per package.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from itertools import compress, filterfalse, islice
from operator import eq
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

from dedal.model.cores import CoreModel
from dedal.schedule.workload import Job, Machine, Workload, job_seconds, package_seconds, seconds_memo
from dedal.schedule.nodes import Nodes, Ready


def _bottom_levels(wl: Workload, t: Mapping[str, float], overhead_s: float) -> Dict[str, float]:
    level: Dict[str, float] = {}
    deps = wl.direct_dependents()  # the same longest paths over fewer edges
    for h in reversed(wl.topo()):
        level[h] = overhead_s + t[h] + max([level[d] for d in deps[h]], default=0.0)
    return level


@dataclass
class _Run:
    idx: int
    node: int
    cores: int
    start: float
    pkgs: List[str]
    end: float = 0.0  # end of the package now running
    # packages waiting for this job -> how many of their direct requirements it builds (made
    # on its first decide(), then kept up to date: only pending packages, the new package's
    # added), and every pending package that waits for it (any requirement; made when a
    # decide() gets that far)
    inside: Optional[Dict[str, int]] = None
    waiting: Optional[Set[str]] = None
    counted: int = 0  # the first ``counted`` packages are in ``inside``
    joined: int = 0  # the first ``joined`` packages' dependents are in ``waiting``


def group(
    wl: Workload,
    machine: Machine,
    *,
    merge: str = "safe",
    fifo: bool = False,
    mold: bool = False,
    priority: Optional[Mapping[str, float]] = None,
    need: Optional[Mapping[str, int]] = None,
) -> List[Job]:
    """Jobs for ``wl`` (see the module doc). ``merge``: ``safe`` (a job goes on only
    when that delays nobody), ``backlog`` (also when its cores would go to a waiting
    package anyway: for builds bound by the cores), ``none`` (one job per package);
    ``fifo=True``: submission order instead of critical-path priorities (the
    baseline of one job per package as ``spack ci`` generates them); ``need``: cores
    per package (default: as many as each can use, :func:`package_cores`)."""
    nodes, cores, overhead_s, model = machine.nodes, machine.cores, machine.overhead_s, machine.model
    cpus_per_job = machine.cpus_per_job
    order = wl.topo()
    pos = {h: i for i, h in enumerate(order)}
    cores = max(1, cores)
    given = need is not None
    if given:
        need = dict(need)
        t: Mapping[str, float] = {h: model.seconds(wl.duration[h], need[h]) for h in order}
    else:  # the numbers every grouping and bound of this workload shares, made once
        need, t = package_seconds(wl, cores, model, cpus_per_job)
    deps = wl.dependents() if merge != "none" else {}  # every dependent: only decide() asks
    if priority is not None:
        prio: Mapping[str, float] = dict(priority)
    elif fifo:
        prio = {h: -float(pos[h]) for h in order}
    elif given:
        prio = _bottom_levels(wl, t, overhead_s)
    else:
        prio = wl._cached(("levels", cores, model, cpus_per_job, overhead_s), lambda: _bottom_levels(wl, t, overhead_s))
    o = overhead_s

    pool = Nodes(nodes, cores)
    pending: Set[str] = set(order)
    # the requirements not completed yet are counted over the direct ones only (a tenth of
    # the edges of a facility stack): a requirement that another of them needs is complete
    # no later than that one (before its job started, or in its job), so a package has
    # every requirement complete exactly when it has every direct one, and the last of its
    # requirements a job builds is a direct one; the same for the requirements in a job and
    # the last completion (see decide(), can_run())
    counted = wl.direct_dependents()
    nmiss = {h: len(reqs) for h, reqs in wl.direct_requires().items()}
    # each package's place in (-priority, position) order: an int key for ``ready``
    at = sorted(order, key=lambda h: (-prio[h], pos[h]))
    keyof = {h: k for k, h in enumerate(at)}
    # the packages ready to start, and the same by the cores they need, highest priority first
    avail: Set[str] = {h for h in order if nmiss[h] == 0}
    ready = Ready()
    for h in avail:
        ready.add(need[h], o + t[h], keyof[h])
    completed_at: Dict[str, float] = {}
    last_done: Dict[str, float] = {}  # when the last requirement completed, per pending package
    run_of: Dict[str, int] = {}
    runs: List[_Run] = []
    heap: List[Tuple[float, int, int]] = []

    secs = seconds_memo(model)

    def dur(h: str, c: int) -> float:
        d = wl.duration[h]
        s = secs.get((d, c))
        if s is None:
            s = secs[(d, c)] = model.seconds(d, c)
        return s

    def take(h: str) -> None:
        pending.discard(h)
        if h in avail:
            avail.discard(h)
            ready.remove(need[h], o + t[h], keyof[h])

    def make_ready(h: str) -> None:
        avail.add(h)
        ready.add(need[h], o + t[h], keyof[h])

    def start_new(now: float) -> None:
        pool.reset()
        if not ready or pool.most() == 0:
            return
        placed: List[str] = []
        fits, on_res, until = pool.limits()

        def hopeless(c: int, shortest: float) -> bool:  # no package of c cores, shortest s or longer, fits
            if mold:  # down to half the cores
                return (c + 1) // 2 > pool.most()
            return c > fits and (c > on_res or now + shortest > until)

        for c, key in ready.in_order(pool, hopeless):  # left as it is until the loop ends
            h = at[key]
            n = None
            if c <= fits or (c <= on_res and now + (o + t[h]) <= until):
                n = pool.fit(c, now, o + t[h])
            elif mold:
                # fewer cores now rather than all of them later (below p the model is
                # work-conserving): down to half of what the package could use
                for c in range(need[h] - 1, (need[h] + 1) // 2 - 1, -1):
                    n = pool.fit(c, now, o + dur(h, c))
                    if n is not None:
                        break
            if n is None:
                if pool.reservation is None:
                    pool.reserve(need[h], now, h)
                    fits, on_res, until = pool.limits()
                continue
            placed.append(h)
            r = _Run(len(runs), n, c, now, [h])
            r.end = now + o + dur(h, c)
            pool.place(r.idx, c, r.end, n)
            runs.append(r)
            run_of[h] = r.idx
            heapq.heappush(heap, (r.end, r.idx, r.idx))
            fits, on_res, until = pool.limits()
        for h in placed:
            take(h)

    def can_run(r: _Run, y: str, built: int, now: float) -> Optional[int]:
        """The job's cores after taking ``y`` (``built`` of whose requirements the job
        builds), or None: its other requirements must all have completed by the job's start
        (none of them is in the job, none completed: ``nmiss`` counts exactly those in the
        job, and the last of the others completed by then)."""
        if nmiss[y] != built or last_done.get(y, -math.inf) > r.start:
            return None
        if need[y] <= r.cores:
            waste = (r.cores - need[y]) * dur(y, r.cores)
            return r.cores if waste <= o * r.cores else None
        grow = need[y] - r.cores
        if pool.free[r.node] >= grow and grow * (now - r.start) <= o * need[y]:
            return need[y]
        return None

    def expected_ready(z: str, inrun: Set[str], now: float, limit: float) -> float:
        """When the requirements of ``z`` outside this job could be complete, at the earliest
        (or any time from ``limit`` on, once that is sure: all the caller asks)."""
        e = now
        for q in filterfalse(completed_at.__contains__, wl.requires[z]):  # skipped in C: most completed long ago
            if q in inrun:
                continue
            if q in pending:
                e = max(e, now + o + t[q])
            else:
                e = max(e, runs[run_of[q]].end)
            if e >= limit:
                return e
        return e

    def decide(r: _Run, now: float) -> Optional[Tuple[str, int]]:
        """The package job ``r`` builds next instead of ending, with its cores then, or None."""
        # the packages waiting for this job, and how many of their direct requirements it
        # builds: one it releases has no other direct requirement left (``nmiss`` counts
        # those not completed), hence no other requirement at all
        inside = r.inside
        if inside is None:
            inside = r.inside = {}
        else:
            for y in list(filterfalse(pending.__contains__, inside)):
                del inside[y]
        for h in r.pkgs[r.counted :]:
            for y in filter(pending.__contains__, counted[h]):
                inside[y] = inside.get(y, 0) + 1
        r.counted = len(r.pkgs)
        releasing = compress(inside, map(eq, map(nmiss.__getitem__, inside), inside.values()))
        if merge == "safe":  # two packages released: one of them is not the next, so the job ends
            released = list(islice(releasing, 2))
            if len(released) == 2:
                return None
        else:
            released = list(releasing)
        # only the package the job's cores would go to next anyway (no queue jumping)
        usable = r.cores + pool.free[r.node]
        choice: Optional[Tuple[str, int]] = None
        key = ready.first(usable)
        first = at[key] if key is not None else None
        fitting = [y for y in released if need[y] <= usable]
        if fitting:
            y = min(fitting, key=keyof.__getitem__)
            if first is None or keyof[y] < keyof[first]:
                first = y
        if first is None:
            return None
        c = can_run(r, first, inside.get(first, 0), now)
        if c is None:
            return None
        y = first
        choice = (y, c)
        res = pool.reservation
        if res is not None and pool.reserved_for != y and res[0] == r.node and now + dur(y, c) > res[1] and c > res[2]:
            return None  # would delay the job the cores of this node are reserved for
        others = [z for z in released if z != y]
        if merge == "backlog":  # ... unless a package it releases could start elsewhere now
            most = pool.most()
            return None if any(need[z] <= most for z in others) else choice
        if others:
            return None
        # every package still waiting for this job, any requirement (made only here: most
        # decisions end before; in C, as a package of the shared core of a facility stack
        # has thousands of dependents)
        waiting = r.waiting
        if waiting is None:
            waiting = r.waiting = set()
        for h in r.pkgs[r.joined :]:
            waiting |= deps[h]
        r.joined = len(r.pkgs)
        waiting &= pending
        new_end = now + dur(y, c)
        inrun = set(r.pkgs)
        for z in waiting:
            if z != y and expected_ready(z, inrun, now, new_end) < new_end:
                return None
        return choice

    start_new(0.0)
    while heap:
        now, _, idx = heapq.heappop(heap)
        r = runs[idx]
        nxt = decide(r, now) if merge != "none" else None
        if nxt is not None:
            y, c = nxt
            take(y)
            r.cores = c
            r.pkgs.append(y)
            run_of[y] = idx
            r.end = now + dur(y, c)
            pool.update(idx, r.node, r.end, c)
            heapq.heappush(heap, (r.end, idx, idx))
            continue
        pool.release(idx, r.node)
        for h in r.pkgs:
            completed_at[h] = now
        for h in r.pkgs:
            # its pending direct dependents (the last requirement to complete is a direct one)
            waiting = list(filter(pending.__contains__, counted[h]))
            if not waiting:
                continue
            last_done.update(dict.fromkeys(waiting, now))
            for d in waiting:
                left = nmiss[d] - 1
                nmiss[d] = left
                if left == 0:
                    make_ready(d)
        start_new(now)
    if pending:  # cannot happen for a DAG; a bug if it does
        raise RuntimeError(f"scheduler left {len(pending)} packages unscheduled")
    # one package per job on the cores it was given: the job graph is the packages' reduced
    # one, and bottom levels of the jobs' estimates are the packages' (``prio``)
    single = all(len(r.pkgs) == 1 and r.cores == need[r.pkgs[0]] for r in runs)
    levels = prio if single and priority is None and not fifo else None
    return _finish_jobs(wl, runs, model, o, fifo, levels=levels, reduced=single)


def per_package(wl: Workload, machine: Machine) -> List[Job]:
    """One job per package on the cores it can use, listed in topological order, each
    waiting for the jobs of its reduced requirements, bottom levels as priorities: what
    :func:`simulate` runs as the critical-path list schedule itself (its ties by that
    order), with no package-level run first (``group(merge="none")``)."""
    cores, overhead_s, model, cpus_per_job = machine.cores, machine.overhead_s, machine.model, machine.cpus_per_job
    need, t = package_seconds(wl, cores, model, cpus_per_job)
    levels = wl._cached(("levels", cores, model, cpus_per_job, overhead_s), lambda: _bottom_levels(wl, t, overhead_s))
    runs = [_Run(i, 0, need[h], float(i), [h]) for i, h in enumerate(wl.topo())]  # listed as started in that order
    return _finish_jobs(wl, runs, model, overhead_s, False, levels=levels, reduced=True)


def _finish_jobs(
    wl: Workload,
    runs: Sequence[_Run],
    model: CoreModel,
    overhead_s: float,
    fifo: bool,
    levels: Optional[Mapping[str, float]] = None,
    reduced: bool = False,
) -> List[Job]:
    """The jobs of the runs, by start. ``reduced``: one package per job (each ``after`` list
    is then transitively reduced as made, from :meth:`Workload.direct_requires`), and
    ``levels``: the packages' bottom levels of ``overhead + seconds`` on the job's cores,
    which are then the jobs' priorities as :func:`settle` would set them, to the bit (the
    same sums in the same order): a grouping of 10,000 jobs skips rebuilding its graph."""
    width = max(3, len(str(len(runs))))
    job_of: Dict[str, str] = {}
    jobs: List[Job] = []
    for r in sorted(runs, key=lambda r: (r.start, r.idx)):
        jid = f"j{len(jobs) + 1:0{width}d}"
        for h in r.pkgs:
            job_of[h] = jid
        jobs.append(
            Job(
                id=jid,
                hashes=list(r.pkgs),
                cores=r.cores,
                names=[wl.name(h) for h in r.pkgs],
                est_s=job_seconds(wl, r.pkgs, r.cores, model, overhead_s),
            )
        )
    by_id = {j.id: j for j in jobs}
    direct = wl.direct_requires()  # the same reduced job graph from fewer edges
    for j in jobs:
        jid = j.id
        j.after = sorted({a for a in (job_of[q] for h in j.hashes for q in direct[h]) if a != jid})
    if levels is not None:
        for j in jobs:
            j.priority = levels[j.hashes[0]]
    elif not (reduced and fifo):  # fifo sets the priorities below
        settle(jobs)
    if fifo:
        for i, j in enumerate(jobs):
            j.priority = float(len(jobs) - i)
    assert all(a in by_id for j in jobs for a in j.after)
    return jobs


def _graph(jobs: Sequence[Job]) -> Tuple[Dict[str, int], List[List[int]], List[int]]:
    """The jobs by index: each one's index, the indices of its ``after``, and an order in
    which every job comes after those it waits for (Kahn's); ValueError on a cycle."""
    index = {j.id: i for i, j in enumerate(jobs)}
    after = [[index[a] for a in j.after] for j in jobs]
    dependents: List[List[int]] = [[] for _ in jobs]
    for i, ai in enumerate(after):
        for a in ai:
            dependents[a].append(i)
    indeg = [len(ai) for ai in after]
    order = [i for i, d in enumerate(indeg) if d == 0]
    for i in order:  # grows while iterating
        for d in dependents[i]:
            indeg[d] -= 1
            if indeg[d] == 0:
                order.append(d)
    if len(order) != len(jobs):
        raise ValueError("dependency cycle among the jobs")
    return index, after, order


def reduce_after(jobs: List[Job]) -> None:
    """Keep in ``after`` only the jobs not already waited for through another one
    (transitive reduction): the same order, shorter ``--dependency`` lists. ValueError on
    a cycle."""
    index, after, order = _graph(jobs)
    _reduce(jobs, index, after, order)


def set_priorities(jobs: List[Job], bonus: Optional[Mapping[str, float]] = None) -> None:
    """Priority = longest estimated chain of jobs from this one to the end (bottom level),
    plus a job's ``bonus`` (the local search raises jobs that waited for cores). ValueError
    on a cycle."""
    _, after, order = _graph(jobs)
    _prioritize(jobs, after, order, bonus or {})


def settle(jobs: List[Job], bonus: Optional[Mapping[str, float]] = None) -> None:
    """:func:`reduce_after`, then :func:`set_priorities`, over one graph of the jobs (what
    every new set of jobs needs; the graph of 10,000 jobs costs as much as either)."""
    index, after, order = _graph(jobs)
    _reduce(jobs, index, after, order)
    _prioritize(jobs, after, order, bonus or {})


def _reduce(jobs: List[Job], index: Mapping[str, int], after: List[List[int]], order: Sequence[int]) -> None:
    """reduce_after() on the graph of :func:`_graph`, whose ``after`` lists it reduces too."""
    anc = [0] * len(jobs)  # bit set of every job this one waits for, directly or not
    for i in order:
        bits = 0
        for a in after[i]:
            bits |= anc[a] | (1 << a)
        anc[i] = bits
    for i, (j, ai) in enumerate(zip(jobs, after)):
        if len(ai) > 1:
            through = 0
            for a in ai:
                through |= anc[a]
            j.after = [a for a in j.after if not (through >> index[a]) & 1]
            after[i] = [a for a in ai if not (through >> a) & 1]


def _prioritize(
    jobs: List[Job], after: Sequence[Sequence[int]], order: Sequence[int], bonus: Mapping[str, float]
) -> None:
    """set_priorities() on the graph of :func:`_graph` (any order that is topological for it)."""
    dependents: List[List[int]] = [[] for _ in jobs]
    for i, ai in enumerate(after):
        for a in ai:
            dependents[a].append(i)
    prio = [0.0] * len(jobs)
    for i in reversed(order):
        j = jobs[i]
        prio[i] = j.est_s + bonus.get(j.id, 0.0) + max([prio[d] for d in dependents[i]], default=0.0)
        j.priority = prio[i]
