"""The cores of the nodes, as the schedulers here keep track of them.

:class:`Nodes`: free cores now, best-fit placement and one backfill reservation, the
rule the package-level list scheduler (:func:`~dedal.schedule.group`) and the job
simulation (:func:`~dedal.schedule.simulate`) share, so that a grouping is made by
the rule it is judged by. :class:`Profile`: cores in use over time, for plans with
start times (Slurm's backfill in :func:`~dedal.schedule.simulate_backfill`, fixed
start times in :func:`~dedal.schedule.tighten`). :class:`Ready`: what waits for them,
by the cores it needs.
"""

from __future__ import annotations

import bisect
import heapq
import math
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple


class Nodes:
    """Free cores per node, what runs where (estimated end, cores), best-fit placement and
    one backfill reservation, as Slurm's backfill scheduler does for its top job. The
    nodes are also kept sorted by (free cores, index), so that the most free cores, the
    best fit and the limits cost a bisection, not a pass over every node (256 nodes): as
    ints ``free * span + node`` (``span``: the number of nodes), which sort as the pairs
    would and compare without a tuple made for each bisection."""

    def __init__(self, nodes: int, cores: int) -> None:
        self.free = [cores] * max(1, nodes)
        self.span = span = len(self.free)
        self.by_free: List[int] = [cores * span + i for i in range(span)]
        self.running: List[Dict[object, Tuple[float, int]]] = [dict() for _ in self.free]
        # the same (end, cores) pairs per node, kept sorted: a reservation walks them in order
        self.ends: List[List[Tuple[float, int]]] = [[] for _ in self.free]
        self.reservation: Optional[Tuple[int, float, int]] = None  # node, time, spare cores then
        self.reserved_for: object = None

    def _set(self, node: int, free: int) -> None:
        by_free, span = self.by_free, self.span
        del by_free[bisect.bisect_left(by_free, self.free[node] * span + node)]
        bisect.insort(by_free, free * span + node)
        self.free[node] = free

    def most(self) -> int:
        """The most free cores of any node."""
        return self.by_free[-1] // self.span

    def place(self, who: object, need: int, end: float, node: int) -> None:
        self._set(node, self.free[node] - need)
        self.running[node][who] = (end, need)
        bisect.insort(self.ends[node], (end, need))

    def update(self, who: object, node: int, end: float, need: int) -> None:
        old = self.running[node][who]
        if need != old[1]:
            self._set(node, self.free[node] - (need - old[1]))
        self.running[node][who] = (end, need)
        ends = self.ends[node]
        del ends[bisect.bisect_left(ends, old)]
        bisect.insort(ends, (end, need))

    def release(self, who: object, node: int) -> None:
        old = self.running[node].pop(who)
        self._set(node, self.free[node] + old[1])
        ends = self.ends[node]
        del ends[bisect.bisect_left(ends, old)]

    def limits(self) -> Tuple[int, int, float]:
        """(a, r, t): a job of ``need`` cores and ``seconds`` fits now (:meth:`fit` finds it a
        node) exactly when ``need <= a``, or ``need <= r`` and it ends by ``t`` (``now +
        seconds <= t``). Three numbers for every job tried until the next placement: once
        many jobs wait, most of them are tried on every event."""
        res = self.reservation
        by_free, span = self.by_free, self.span
        if res is None:
            return by_free[-1] // span, -1, 0.0
        top = by_free[-1]
        if top % span != res[0]:
            other = top // span
        else:
            other = by_free[-2] // span if len(by_free) > 1 else -1
        on_res = self.free[res[0]]
        return max(other, min(on_res, res[2])), on_res, res[1]

    def fit(self, need: int, now: float, seconds: float) -> Optional[int]:
        """The node for a job of ``need`` cores and ``seconds`` starting now, or None: the
        one with the fewest free cores that suffice (the first such); a job goes onto the
        reserved node only if it does not delay the reservation."""
        by_free, span = self.by_free, self.span
        k = bisect.bisect_left(by_free, need * span)
        if k == len(by_free):
            return None
        best = by_free[k] % span
        res = self.reservation
        if res is not None and best == res[0] and now + seconds > res[1]:
            if need > res[2]:
                if k + 1 == len(by_free):
                    return None
                return by_free[k + 1] % span
            self.reservation = (res[0], res[1], res[2] - need)
        return best

    def reset(self) -> None:
        self.reservation = None
        self.reserved_for = None

    def reserve(self, need: int, now: float, who: object = None) -> None:
        """Reserve the node where ``need`` cores free up first (only if none is reserved;
        the first such node on a tie)."""
        if self.reservation is not None:
            return
        # the earliest such time so far, its node and the cores to spare then (a loop run on
        # most events of a full machine: plain comparisons, no tuples)
        best_when, best_node, spare = math.inf, -1, 0
        ends = self.ends
        for i, f in enumerate(self.free):
            when, free = now, f
            if free < need:
                for end, c in ends[i]:  # by end: cores given back until enough are free
                    if when >= best_when:
                        break
                    when = end if end > now else now
                    free += c
                    if free >= need:
                        break
            if free >= need and when < best_when:
                best_when, best_node, spare = when, i, free - need
        if best_node >= 0:
            self.reservation = (best_node, best_when, spare)
            self.reserved_for = who


class Ready:
    """What is ready to start (jobs or packages), in lists by the cores it needs and its
    duration (classes a factor of 2 wide), each list sorted by key (an int: the smaller,
    the higher the priority). :meth:`in_order` gives them in key order across the lists,
    as one sorted list would, but, once the nodes have a reservation, stops looking at a
    list where nothing can start any more: the list schedulers try every ready job on
    every event, and with thousands waiting for cores most cannot fit, or only by ending
    before the reservation (the cost was events x waiting; now it is what starts, plus
    the lists looked at).

    Each list knows the durations it holds now, sorted: with the shortest ever added
    instead, a list whose short ones had started was still looked at, item by item, on
    every event (on one node of the 10,000-spec lock, 99.6 % of what was looked at)."""

    def __init__(self) -> None:
        # (cores, duration class) -> [sorted keys, sorted durations]
        self.lists: Dict[Tuple[int, int], List[List[Any]]] = {}
        self.count = 0

    def __len__(self) -> int:
        return self.count

    @staticmethod
    def _where(cores: int, seconds: float) -> Tuple[int, int]:
        return cores, (math.frexp(seconds)[1] if seconds > 0 else -1075)

    def add(self, cores: int, seconds: float, key: int) -> None:
        where = self._where(cores, seconds)
        entry = self.lists.get(where)
        if entry is None:
            self.lists[where] = [[key], [seconds]]
        else:
            bisect.insort(entry[0], key)
            bisect.insort(entry[1], seconds)
        self.count += 1

    def remove(self, cores: int, seconds: float, key: int) -> None:
        where = self._where(cores, seconds)
        keys, durations = self.lists[where]
        del keys[bisect.bisect_left(keys, key)]
        if not keys:
            del self.lists[where]
        else:
            del durations[bisect.bisect_left(durations, seconds)]
        self.count -= 1

    def first(self, most: int) -> Optional[int]:
        """The smallest key of what needs at most ``most`` cores, or None."""
        return min((entry[0][0] for (c, _), entry in self.lists.items() if c <= most), default=None)

    def in_order(self, pool: Nodes, hopeless: Callable[[int, float], bool]) -> Iterator[Tuple[int, int]]:
        """(cores, key) in key order while some node has a core free; once ``pool`` has a
        reservation, without the lists for which ``hopeless(cores, shortest duration)``
        says that nothing of theirs can start any more in this pass (the caller places
        jobs between two steps, which only takes cores: what cannot start stays so). The
        caller changes the lists only once done."""
        by_free, span = pool.by_free, pool.span
        if by_free[-1] < span:  # no core free: nothing to look at
            return
        heads = [(entry[0][0], where, 0) for where, entry in self.lists.items()]
        heapq.heapify(heads)
        lists = self.lists
        while heads:
            if by_free[-1] < span:
                return
            key, where, k = heapq.heappop(heads)
            keys, durations = lists[where]
            if pool.reservation is not None and hopeless(where[0], durations[0]):
                continue
            yield where[0], key
            if k + 1 < len(keys):
                heapq.heappush(heads, (keys[k + 1], where, k + 1))


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
