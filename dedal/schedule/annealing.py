"""Simulated annealing of a schedule: a probe of how far list scheduling can go.

Not part of :func:`~dedal.schedule.make_schedule` (see :func:`anneal`): kept in a
module of its own so that the scheduler proper does not depend on it; its one caller
outside the tests is benchmarks/schedule/exact_probe.py.
"""

from __future__ import annotations

import math
import random
from typing import Dict, List, Sequence, Tuple

from dedal.schedule.workload import Job, Machine, Simulation, Workload, top_cores
from dedal.schedule.simulation import afterok, simulate
from dedal.schedule.search import build_jobs


def anneal(
    wl: Workload,
    jobs: Sequence[Job],
    machine: Machine,
    *,
    evaluations: int = 20000,
    seed: int = 1,
    temperature: float = 0.001,
) -> Tuple[List[Job], Simulation]:
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
    nodes, cores, overhead_s, model = machine.nodes, machine.cores, machine.overhead_s, machine.model
    rng = random.Random(seed)
    pos = {h: i for i, h in enumerate(wl.topo())}
    _, _, dependents, _ = afterok(jobs, cores)
    prio = {j.id: j.priority for j in jobs}
    # the priorities as build_jobs makes them: bottom level of est_s plus each job's own bonus
    bonus = {j.id: j.priority - j.est_s - max((prio[d] for d in dependents[j.id]), default=0.0) for j in jobs}
    parts: Dict[str, Tuple[List[str], int]] = {j.id: (list(j.hashes), j.cores) for j in jobs}
    cur = build_jobs(wl, [(k, hs, c) for k, (hs, c) in parts.items()], bonus, model, overhead_s)
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
        cand = build_jobs(
            wl, [(k, group_hs, cc) for k, (group_hs, cc) in new_parts.items()], new_bonus, model, overhead_s
        )
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
