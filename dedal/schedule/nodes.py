"""The cores of the nodes, as the schedulers here keep track of them.

:class:`Nodes`: free cores now, best-fit placement and one backfill reservation, the
rule the package-level list scheduler (:func:`~dedal.schedule.group`) and the job
simulation (:func:`~dedal.schedule.simulate`) share, so that a grouping is made by
the rule it is judged by. :class:`Profile`: cores in use over time, for plans with
start times (Slurm's backfill in :func:`~dedal.schedule.simulate_backfill`, fixed
start times in :func:`~dedal.schedule.tighten`).
"""
from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Tuple


class Nodes:
    """Free cores per node, what runs where (estimated end, cores), best-fit placement and
    one backfill reservation, as Slurm's backfill scheduler does for its top job."""

    def __init__(self, nodes: int, cores: int) -> None:
        self.free = [cores] * max(1, nodes)
        self.running: List[Dict[object, Tuple[float, int]]] = [dict() for _ in self.free]
        # the same (end, cores) pairs per node, kept sorted: a reservation walks them in order
        self.ends: List[List[Tuple[float, int]]] = [[] for _ in self.free]
        self.reservation: Optional[Tuple[int, float, int]] = None  # node, time, spare cores then
        self.reserved_for: object = None

    def place(self, who: object, need: int, end: float, node: int) -> None:
        self.free[node] -= need
        self.running[node][who] = (end, need)
        bisect.insort(self.ends[node], (end, need))

    def update(self, who: object, node: int, end: float, need: int) -> None:
        old = self.running[node][who]
        self.free[node] -= need - old[1]
        self.running[node][who] = (end, need)
        ends = self.ends[node]
        del ends[bisect.bisect_left(ends, old)]
        bisect.insort(ends, (end, need))

    def release(self, who: object, node: int) -> None:
        old = self.running[node].pop(who)
        self.free[node] += old[1]
        ends = self.ends[node]
        del ends[bisect.bisect_left(ends, old)]

    def limits(self) -> Tuple[int, int, float]:
        """(a, r, t): a job of ``need`` cores and ``seconds`` fits now (:meth:`fit` finds it a
        node) exactly when ``need <= a``, or ``need <= r`` and it ends by ``t`` (``now +
        seconds <= t``). Three numbers for every job tried until the next placement: once
        many jobs wait, most of them are tried on every event."""
        res = self.reservation
        if res is None:
            return max(self.free), -1, 0.0
        other = max((f for i, f in enumerate(self.free) if i != res[0]), default=-1)
        on_res = self.free[res[0]]
        return max(other, min(on_res, res[2])), on_res, res[1]

    def fit(self, need: int, now: float, seconds: float) -> Optional[int]:
        """The node for a job of ``need`` cores and ``seconds`` starting now, or None; a job
        goes onto the reserved node only if it does not delay the reservation."""
        best = None
        res = self.reservation
        for i, f in enumerate(self.free):
            if f < need:
                continue
            if res is not None and i == res[0] and now + seconds > res[1] and need > res[2]:
                continue
            if best is None or f < self.free[best]:
                best = i
        if best is not None and res is not None and best == res[0] and now + seconds > res[1]:
            self.reservation = (res[0], res[1], res[2] - need)
        return best

    def reset(self) -> None:
        self.reservation = None
        self.reserved_for = None

    def reserve(self, need: int, now: float, who: object = None) -> None:
        """Reserve the node where ``need`` cores free up first (only if none is reserved)."""
        if self.reservation is not None:
            return
        best: Optional[Tuple[float, int, int]] = None
        for i, f in enumerate(self.free):
            when, free = now, f
            for end, c in self.ends[i]:
                if free >= need:
                    break
                when, free = max(now, end), free + c
            if free >= need and (best is None or when < best[0]):
                best = (when, i, free - need)
        if best is not None:
            self.reservation = (best[1], best[0], best[2])
            self.reserved_for = who
    

class Profile:
    """Cores in use on one node over time, a step function: ``used[i]`` on
    ``[times[i], times[i+1])``."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.times: List[float] = [0.0]
        self.used: List[int] = [0]

    def fit(self, t0: float, seconds: float, need: int) -> float:
        """The earliest time from ``t0`` on at which ``need`` cores stay free for ``seconds``."""
        times, used, limit = self.times, self.used, self.cores - need
        n = len(times)
        i = bisect.bisect_right(times, t0) - 1
        t = t0
        while True:
            end = t + seconds - 1e-9
            while i < n and times[i] < end:
                if used[i] > limit:
                    break
                i += 1
            else:
                return t
            i += 1  # segment i is too full: try from its end
            t = times[i] if i < n else times[-1]

    def _cut(self, x: float) -> int:
        i = bisect.bisect_right(self.times, x) - 1
        if abs(self.times[i] - x) < 1e-9:
            return i
        self.times.insert(i + 1, x)
        self.used.insert(i + 1, self.used[i])
        return i + 1

    def add(self, start: float, end: float, need: int) -> None:
        for i in range(self._cut(start), self._cut(end)):
            self.used[i] += need
