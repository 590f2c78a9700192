"""Lower bounds on any schedule of a workload, and the core allotment of the critical path.

The yardsticks a schedule is measured against (``Schedule.ratio``, the benchmarks),
computed from the workload alone, apart from the schedulers they judge; :func:`allot`
shares their critical-path computation.

Lower bound (same model): no package can finish before its whole chain of build
requirements, each on its best core count, and no schedule can do more than ``N*C``
core-seconds per second; and nothing is built during the first job overhead. So
``LB = overhead + max(critical path of W/min(C, p), sum of consumed core-seconds / (N*C))``
(consumed = ``W`` when each package gets up to ``p`` cores). Every simulated schedule
has ``makespan >= LB``.

A tighter bound that also counts how narrow the DAG is at its start and end
(:func:`dag_bound`) is reported next to it: the gap between the two is the DAG's, not
the scheduler's. Neither counts the overheads of the jobs after the first, nor a DAG
that narrows in its middle (a chain every later package waits for).
"""

from __future__ import annotations

import bisect
from itertools import accumulate, compress, repeat
from operator import add, ge, truediv
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from dedal.model.cores import DEFAULT_MODEL, CoreModel
from dedal.schedule.workload import Machine, Workload, package_cores, package_seconds


def _chains(
    wl: Workload, seconds: Mapping[str, float], order: Sequence[str]
) -> Tuple[Dict[str, float], Dict[str, Optional[str]]]:
    """Earliest finish of each package (its longest chain of requirements, ``seconds``
    each, plus itself) and the requirement that chain comes through; ``order`` topological."""
    finish: Dict[str, float] = {}
    via: Dict[str, Optional[str]] = {}
    for h in order:
        prev = max(wl.requires[h], key=finish.__getitem__, default=None)
        via[h] = prev
        finish[h] = (finish[prev] if prev is not None else 0.0) + seconds[h]
    return finish, via


def allot(
    wl: Workload, cores: int, capacity: int, target: float, model: CoreModel = DEFAULT_MODEL, double: bool = False
) -> Dict[str, int]:
    """Cores per package for builds bound by the cores: every package on one core, then
    the packages of the critical path raised (largest time saved first; by one core, or
    with ``double`` to twice as many) until
    that path is no longer than ``target`` x work / ``capacity`` (CPA, Radulescu & van
    Gemund 2001). Below ``p`` cores a build wastes nothing, and a one-core job never waits
    for a node to drain: only the critical path gets the cores it needs."""
    order = wl.topo()
    top = package_cores(wl, cores, model)
    cores_of = {h: 1 for h in order}
    goal = target * sum(model.work(wl.duration[h]) for h in order) / max(1, capacity)

    def step(c: int, most: int) -> int:
        return min(most, 2 * c if double else c + 1)

    while True:
        finish, via = _chains(wl, {h: model.seconds(wl.duration[h], cores_of[h]) for h in order}, order)
        cur: Optional[str] = max(order, key=finish.__getitem__, default=None)
        if cur is None or finish[cur] <= goal:
            return cores_of
        best: Optional[Tuple[float, str]] = None
        while cur is not None:
            c = cores_of[cur]
            if c < top[cur]:
                gain = model.seconds(wl.duration[cur], c) - model.seconds(wl.duration[cur], step(c, top[cur]))
                if gain > 1e-9 and (best is None or gain > best[0]):
                    best = (gain, cur)
            cur = via[cur]
        if best is None:  # the critical path has every core it can use
            return cores_of
        cores_of[best[1]] = step(cores_of[best[1]], top[best[1]])


def lower_bound(wl: Workload, machine: Machine) -> Tuple[float, float, float]:
    """(lower bound, critical path, consumed core-seconds) of any schedule on ``machine``."""
    nodes, cores = machine.nodes, machine.cores
    need, t = package_seconds(wl, cores, machine.model, machine.cpus_per_job)
    order = wl.topo()
    consumed = sum(t[h] * need[h] for h in order)
    finish: Dict[str, float] = {}
    reqs = wl.direct_requires()  # the same longest paths as _chains(), over fewer edges
    for h in order:
        finish[h] = max([finish[r] for r in reqs[h]], default=0.0) + t[h]
    cp = max(finish.values(), default=0.0)
    if not wl.order:
        return 0.0, 0.0, 0.0
    return machine.overhead_s + max(cp, consumed / (max(1, nodes) * max(1, cores))), cp, consumed


def dag_bound(wl: Workload, machine: Machine, samples: int = 120) -> float:
    """A tighter lower bound in the same model, which also counts that a DAG cannot be
    wide at its start and end: for any set S of packages, no schedule ends before
    ``min head(S) + consumed(S) / (N*C) + min tail(S)``, where head(h) is the earliest
    ``h`` can start (overhead + longest chain of requirements) and tail(h) the longest
    chain after it. Maximized over S = {h: head(h) >= a, tail(h) >= b}; always >=
    :func:`lower_bound` (S = everything, or S = the critical path).

    And the energetic bound of the same numbers: by time ``x`` no schedule has done more
    than ``A(x) = min(N*C*x, sum_h min(W_h, need_h * (x - head(h))+))`` of the work, nor
    more than ``B(y)`` (the same with tails) in its last ``y`` seconds, so wherever
    ``W > A(x) + B(y)`` the makespan is at least ``x + y + (W - A(x) - B(y)) / (N*C)``:
    this one also counts a start where too few packages are ready to fill a node."""
    nodes, cores, overhead_s = machine.nodes, machine.cores, machine.overhead_s
    if not wl.order:
        return 0.0
    need, t = package_seconds(wl, cores, machine.model, machine.cpus_per_job)
    order = wl.topo()
    head: Dict[str, float] = {}
    reqs = wl.direct_requires()  # the same longest paths over fewer edges
    for h in order:
        head[h] = max([head[r] + t[r] for r in reqs[h]], default=overhead_s)
    deps = wl.direct_dependents()
    tail: Dict[str, float] = {}
    for h in reversed(order):
        tail[h] = max([tail[d] + t[d] for d in deps[h]], default=0.0)
    cap = max(1, nodes) * max(1, cores)
    best = max(head[h] + t[h] + tail[h] for h in order)
    heads = sorted(set(head.values()))
    if len(heads) > samples:
        heads = [heads[int(i * (len(heads) - 1) / (samples - 1))] for i in range(samples)]
    by_tail = sorted(order, key=lambda h: -tail[h])
    heads_t, works_t, tails_t = (
        [head[h] for h in by_tail],
        [need[h] * t[h] for h in by_tail],
        [tail[h] for h in by_tail],
    )
    # an upper bound of what each ``a`` can give, from the packages by head: all the work of
    # S and its longest tail (every prefix sum and tail below those, rounding included, with
    # a margin far above it); an ``a`` that cannot beat ``best`` is left out (the same result)
    by_head = sorted(order, key=head.__getitem__)
    head_sorted = [head[h] for h in by_head]
    work_from = list(accumulate(reversed([need[h] * t[h] for h in by_head])))[::-1] + [0.0]
    tail_from = list(accumulate(reversed([tail[h] for h in by_head]), max))[::-1] + [0.0]
    for a in heads:
        k = bisect.bisect_left(head_sorted, a)
        if (a + work_from[k] * (1 + 1e-9) / cap + tail_from[k]) * (1 + 1e-9) < best:
            continue
        # S = {h: head(h) >= a, tail(h) >= b} for every b: packages by falling tail, work summed;
        # a + sum / cap + tail at each, in C-level loops (120 passes over 20,000 packages)
        picked = list(map(ge, heads_t, repeat(a)))
        sums = map(truediv, accumulate(compress(works_t, picked)), repeat(cap))
        best = max(best, max(map(add, map(add, repeat(a), sums), compress(tails_t, picked)), default=best))
    total = sum(need[h] * t[h] for h in order)

    def done_by(start: Mapping[str, float]) -> List[Tuple[float, float]]:
        xs = sorted(set(start.values()) | {start[h] + t[h] for h in order})
        if len(xs) > samples:
            xs = [xs[int(i * (len(xs) - 1) / (samples - 1))] for i in range(samples)]
        # each package does need x (x - start) of its work from its start on, until done: the
        # work done by x is piecewise linear, summed in one sweep over the starts and ends
        steps = sorted([(start[h], need[h]) for h in order] + [(start[h] + t[h], -need[h]) for h in order])
        out: List[Tuple[float, float]] = []
        done, rate, last, i = 0.0, 0, 0.0, 0
        for x in xs:
            while i < len(steps) and steps[i][0] <= x:
                done += rate * (steps[i][0] - last)
                last, rate = steps[i][0], rate + steps[i][1]
                i += 1
            out.append((x, min(cap * x, done + rate * (x - last))))
        return out

    ends = done_by(tail)
    for x, a in done_by(head):
        for y, b in ends:
            if total - a - b > 1e-6:
                best = max(best, x + y + (total - a - b) / cap)
    return best
