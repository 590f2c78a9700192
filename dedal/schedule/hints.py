"""Fixed start times, and the order hints that make Slurm follow them.

The one part of the package that plans start times rather than priorities: it starts
from the best list schedule and runs only where hints are wanted.

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
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

from dedal.schedule.workload import Job, Machine, Simulation, Workload, job_seconds, job_topo, keyed_topo, top_cores
from dedal.schedule.nodes import Profile
from dedal.schedule.simulation import simulate
from dedal.schedule.search import merge_jobs

# tighten(): searches, rounds each (TIGHTEN_WORK // jobs**2 within MIN..MAX: a round costs
# about that), the noise added to start times to reorder (cycled), the chance of a merge and
# of a core more or less per round
TIGHTEN_CHAINS, TIGHTEN_WORK, TIGHTEN_MIN, TIGHTEN_MAX = 3, 16_000_000, 20, 2000
TIGHTEN_NOISE_S = (30.0, 100.0, 300.0)
TIGHTEN_MERGE, TIGHTEN_CORES = 0.5, 0.25


def _serial(
    jobs: Mapping[str, Job],
    order: Sequence[str],
    waits: Mapping[str, Sequence[str]],
    node_of: Mapping[str, int],
    nodes: int,
    cores: int,
) -> Dict[str, Tuple[float, float, int]]:
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


def _justify(
    jobs: Mapping[str, Job],
    starts: Dict[str, Tuple[float, float, int]],
    waits: Mapping[str, Sequence[str]],
    feeds: Mapping[str, Sequence[str]],
    nodes: int,
    cores: int,
) -> Tuple[Dict[str, Tuple[float, float, int]], float]:
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


def order_hints(
    jobs: Sequence[Job], starts: Mapping[str, Tuple[float, float, int]], cores: int
) -> Dict[str, Dict[str, float]]:
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


def tighten(
    wl: Workload,
    jobs: List[Job],
    sim: Simulation,
    machine: Machine,
    *,
    rounds: int = 1000,
    seed: int = 0,
) -> Tuple[List[Job], Simulation]:
    """Improve a schedule with its start times fixed rather than left to list scheduling,
    which starts whatever fits and so cannot keep cores free for a job that will need
    them: justify it (:func:`_justify`), then, ``rounds`` times, reorder by start time
    plus noise, and maybe give one job a core more or less or merge it into a job it
    waits for (one overhead less), rebuild (:func:`_serial`) and justify, keeping the
    result when it is no longer. Jobs keep their nodes. Order hints
    (:func:`order_hints`) make the batch scheduler follow; the result is kept only if
    :func:`simulate` of the jobs with their hints beats ``sim``."""
    nodes, cores, overhead_s, model = machine.nodes, machine.cores, machine.overhead_s, machine.model
    cpus_per_job = machine.cpus_per_job
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
