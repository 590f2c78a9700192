"""Is a schedule valid? A check apart from the schedulers it judges.

Whatever made a schedule (:func:`~dedal.schedule.make_schedule`, a baseline, a
hand-written plan), it is valid when every package is built exactly once, after every
package it requires (inside a job: earlier in the job; across jobs: the job that
builds the requirement ends before the one that needs it starts, *and* the latter
waits for the former through its ``after`` chain, or Slurm could start it early), and
when no node runs more cores than it has at any moment. Near-linear, so that it runs
on every case of the scale benchmark (benchmarks/schedule/scale.py) and in the tests.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Tuple

from dedal.schedule.workload import Job, Schedule, Workload

EPS = 1e-6


class InvalidSchedule(ValueError):
    """A schedule that breaks a dependency or oversubscribes a node; ``problems`` says how."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        more = f" (and {len(self.problems) - 5} more)" if len(self.problems) > 5 else ""
        super().__init__("invalid schedule: " + "; ".join(self.problems[:5]) + more)


def schedule_problems(
    wl: Workload,
    jobs: Sequence[Job],
    starts: Mapping[str, Tuple[float, float, int]],
    *,
    nodes: int,
    cores: int,
    limit: int = 50,
) -> List[str]:
    """What is wrong with ``jobs`` run at ``starts`` (job id -> (start, end, node index))
    on ``nodes`` nodes of ``cores`` cores, as sentences; empty when the schedule is valid.
    Stops after ``limit`` problems."""
    out: List[str] = []

    def bad(msg: str) -> bool:
        out.append(msg)
        return len(out) >= limit

    by_id: Dict[str, Job] = {}
    for j in jobs:
        if j.id in by_id and bad(f"job id {j.id} used twice"):
            return out
        by_id[j.id] = j
    job_of: Dict[str, str] = {}
    for j in jobs:
        if not 1 <= j.cores <= cores and bad(f"job {j.id} has {j.cores} cores; a node has {cores}"):
            return out
        for h in j.hashes:
            if h in job_of and bad(f"{wl.name(h)} built by {job_of[h]} and {j.id}"):
                return out
            job_of.setdefault(h, j.id)
        for a in list(j.after) + list(j.order):
            if (a not in by_id or a == j.id) and bad(
                f"job {j.id} waits for {'itself' if a == j.id else 'unknown job ' + a}"
            ):
                return out
    wanted = set(wl.order)
    for h in wanted - set(job_of):
        if bad(f"{wl.name(h)} is built by no job"):
            return out
    for h in set(job_of) - wanted:
        if bad(f"job {job_of[h]} builds {h}, which is not in the workload"):
            return out
    if out:
        return out
    for j in jobs:
        if j.id not in starts:
            if bad(f"job {j.id} never starts"):
                return out
            continue
        start, end, node = starts[j.id]
        if not 0 <= node < nodes and bad(f"job {j.id} runs on node {node}; there are {nodes}"):
            return out
        if (start < -EPS or abs(end - start - j.est_s) > EPS * max(1.0, j.est_s)) and bad(
            f"job {j.id} runs {start:.3f}-{end:.3f} s, not for its {j.est_s:.3f} s"
        ):
            return out
    if out:
        return out
    ancestors = _ancestors(jobs, by_id)
    if ancestors is None:
        return ["the jobs wait for each other in a cycle"]
    index = {j.id: i for i, j in enumerate(jobs)}
    for j in jobs:
        place = {h: i for i, h in enumerate(j.hashes)}
        for h in j.hashes:
            for r in wl.requires[h]:
                if r in place:
                    if place[r] > place[h] and bad(f"{wl.name(r)} after {wl.name(h)}, which needs it, in job {j.id}"):
                        return out
                    continue
                k = job_of[r]
                if starts[k][1] > starts[j.id][0] + EPS and bad(
                    f"job {j.id} starts at {starts[j.id][0]:.3f} s and builds {wl.name(h)}, which needs "
                    f"{wl.name(r)}, before job {k} ends at {starts[k][1]:.3f} s"
                ):
                    return out
                if not (ancestors[j.id] >> index[k]) & 1 and bad(
                    f"job {j.id} builds {wl.name(h)}, which needs {wl.name(r)}, without waiting for job {k}"
                ):
                    return out
    for node, load, t in _peaks(jobs, starts, cores):
        if bad(f"node {node} runs {load} cores at {t:.3f} s; it has {cores}"):
            return out
    return out


def _ancestors(jobs: Sequence[Job], by_id: Mapping[str, Job]) -> "Dict[str, int] | None":
    """Every job each one waits for through ``after``, directly or not, as a bit set over
    the jobs' positions; None on a cycle."""
    index = {j.id: i for i, j in enumerate(jobs)}
    feeds: Dict[str, List[str]] = {j.id: [] for j in jobs}
    indeg = {j.id: len(set(j.after)) for j in jobs}
    for j in jobs:
        for a in set(j.after):
            feeds[a].append(j.id)
    order = [j.id for j in jobs if indeg[j.id] == 0]
    for k in order:  # grows while iterating
        for d in feeds[k]:
            indeg[d] -= 1
            if indeg[d] == 0:
                order.append(d)
    if len(order) != len(jobs):
        return None
    anc: Dict[str, int] = {}
    for k in order:
        bits = 0
        for a in by_id[k].after:
            bits |= anc[a] | (1 << index[a])
        anc[k] = bits
    return anc


def _peaks(
    jobs: Sequence[Job], starts: Mapping[str, Tuple[float, float, int]], cores: int
) -> List[Tuple[int, int, float]]:
    """(node, cores in use, when) wherever a node runs more than ``cores``; a job that
    ends at the moment another starts gives its cores back first."""
    events: Dict[int, List[Tuple[float, int]]] = {}
    for j in jobs:
        start, end, node = starts[j.id]
        if end - start <= EPS:
            continue
        events.setdefault(node, []).extend(((start, j.cores), (end - EPS, -j.cores)))
    out = []
    for node in sorted(events):
        load = 0
        for t, c in sorted(events[node], key=lambda e: (e[0], e[1])):
            load += c
            if load > cores:
                out.append((node, load, t))
                break
    return out


def validate(wl: Workload, sched: Schedule) -> Schedule:
    """``sched`` if it is a valid schedule of ``wl`` (see the module doc), else
    :class:`InvalidSchedule` listing what is wrong."""
    problems = schedule_problems(wl, sched.jobs, sched.starts, nodes=sched.nodes, cores=sched.cores)
    if problems:
        raise InvalidSchedule(problems)
    return sched
