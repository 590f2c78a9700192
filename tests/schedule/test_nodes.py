"""The node bookkeeping of the list schedulers (dedal.schedule.nodes): the nodes kept sorted by
free cores and the ready lists by cores and duration answer exactly what a pass over every
node, or over one sorted list of everything ready, answers."""

from __future__ import annotations

import random
from typing import List, Optional, Tuple

import pytest

from dedal.schedule.nodes import Nodes, Ready


def scan_fit(pool: Nodes, need: int, now: float, seconds: float) -> Optional[int]:
    """The rule of Nodes.fit as a pass over every node: fewest free cores that suffice, the
    first such node; the reserved node only where the job does not delay the reservation."""
    best = None
    res = pool.reservation
    for i, f in enumerate(pool.free):
        if f < need:
            continue
        if res is not None and i == res[0] and now + seconds > res[1] and need > res[2]:
            continue
        if best is None or f < pool.free[best]:
            best = i
    return best


def scan_limits(pool: Nodes) -> Tuple[int, int, float]:
    res = pool.reservation
    if res is None:
        return max(pool.free), -1, 0.0
    other = max((f for i, f in enumerate(pool.free) if i != res[0]), default=-1)
    return max(other, min(pool.free[res[0]], res[2])), pool.free[res[0]], res[1]


def scan_reserve(pool: Nodes, need: int, now: float) -> Tuple[int, float, int]:
    """Where ``need`` cores free up first: (node, time, spare cores then), the first node on a tie."""
    best = None
    for i, f in enumerate(pool.free):
        when, free = now, f
        for end, c in pool.ends[i]:
            if free >= need:
                break
            when, free = max(now, end), free + c
        if free >= need and (best is None or when < best[0]):
            best = (when, i, free - need)
    assert best is not None
    return best[1], best[0], best[2]


@pytest.mark.parametrize("nodes, cores", [(1, 8), (3, 16), (16, 64), (64, 4)])
def test_fit_limits_and_reserve_agree_with_a_pass_over_every_node(nodes: int, cores: int) -> None:
    rnd = random.Random(nodes * 1000 + cores)
    pool = Nodes(nodes, cores)
    running: List[Tuple[int, int]] = []  # (who, node)
    now = 0.0
    for who in range(3000):
        now += rnd.random()
        if running and rnd.random() < 0.45:
            gone, node = running.pop(rnd.randrange(len(running)))
            pool.release(gone, node)
        if rnd.random() < 0.2:
            pool.reset()
        need, seconds = rnd.randint(1, cores), rnd.uniform(0.5, 40.0)
        assert pool.limits() == scan_limits(pool)
        assert pool.most() == max(pool.free)
        if pool.reservation is None and need > max(pool.free):
            expected = scan_reserve(pool, need, now)
            pool.reserve(need, now, who)
            assert pool.reservation == expected and pool.reserved_for == who
            continue
        expected = scan_fit(pool, need, now, seconds)
        node = pool.fit(need, now, seconds)
        assert node == expected
        if node is not None:
            pool.place(who, need, now + seconds, node)
            running.append((who, node))
        assert sorted((f, i) for i, f in enumerate(pool.free)) == pairs(pool)
        assert all(f >= 0 for f in pool.free)


def pairs(pool: Nodes) -> list:
    """The sorted nodes as (free cores, node): what ``by_free`` encodes as ints."""
    return [divmod(k, pool.span) for k in pool.by_free]


def test_update_keeps_the_free_cores_and_the_sorted_nodes_together() -> None:
    pool = Nodes(2, 8)
    pool.place("a", 2, 10.0, 0)
    pool.update("a", 0, 12.0, 5)
    assert pool.free == [3, 8] and pairs(pool) == [(3, 0), (8, 1)] and pool.ends[0] == [(12.0, 5)]
    pool.update("a", 0, 15.0, 5)  # the same cores, a later end
    assert pool.free == [3, 8] and pool.ends[0] == [(15.0, 5)]
    pool.release("a", 0)
    assert pool.free == [8, 8] and pairs(pool) == [(8, 0), (8, 1)] and pool.most() == 8


def test_ready_gives_everything_in_key_order_without_a_reservation() -> None:
    rnd = random.Random(7)
    ready = Ready()
    keys = rnd.sample(range(100_000), 500)  # ints, the smaller first
    items = [(rnd.randint(1, 16), rnd.uniform(0.0, 5000.0), keys[i]) for i in range(500)]
    for c, s, key in items:
        ready.add(c, s, key)
    assert len(ready) == 500
    got = list(ready.in_order(Nodes(1, 64), lambda c, s: True))  # never asked: no reservation
    assert got == sorted(((c, key) for c, _, key in items), key=lambda ck: ck[1])
    assert ready.first(4) == min(key for c, _, key in items if c <= 4)
    for c, s, key in items[:250]:
        ready.remove(c, s, key)
    assert len(ready) == 250
    assert [k for _, k in ready.in_order(Nodes(1, 64), lambda c, s: True)] == sorted(k for _, _, k in items[250:])
    assert ready.first(0) is None


def test_ready_stops_at_full_nodes_and_leaves_out_what_cannot_start() -> None:
    ready = Ready()
    items = [(1, 10.0, 0), (8, 100.0, 1), (2, 3000.0, 2), (2, 5.0, 3), (1, 2000.0, 4)]
    for c, s, key in items:
        ready.add(c, s, key)
    pool = Nodes(1, 8)
    pool.place("x", 4, 50.0, 0)
    asked = []

    def hopeless(c: int, shortest: float) -> bool:  # nothing that takes 1000 s or longer fits
        asked.append((c, shortest))
        return shortest >= 1000.0

    got = []
    for c, key in ready.in_order(pool, hopeless):
        got.append(key)
        if key == 1:  # the job of 8 cores cannot fit: reserve for it, as the schedulers do
            pool.reserve(8, 0.0)
    # the two long ones are left out once there is a reservation, the rest in key order
    assert got == [0, 1, 3] and (2, 3000.0) in asked and (1, 2000.0) in asked
    pool.place("y", 4, 60.0, 0)  # the node is full: nothing more is looked at
    assert list(ready.in_order(pool, lambda c, s: False)) == []


def test_ready_asks_about_the_shortest_duration_a_list_holds_now() -> None:
    """A list whose short ones have started is left out as a whole once nothing it still
    holds can start (with the shortest ever added it was looked at item by item)."""
    ready = Ready()
    for key, seconds in ((0, 600.0), (1, 1000.0), (2, 900.0)):  # one class: 512 to 1024 s
        ready.add(2, seconds, key)
    ready.remove(2, 600.0, 0)
    pool = Nodes(1, 8)
    pool.reserve(8, 0.0)
    asked = []

    def hopeless(c: int, shortest: float) -> bool:  # nothing of 700 s or longer can start
        asked.append(shortest)
        return shortest >= 700.0

    assert list(ready.in_order(pool, hopeless)) == [] and asked == [900.0]
    ready.add(2, 650.0, 3)
    assert [k for _, k in ready.in_order(pool, hopeless)] == [1, 2, 3]
    assert ready.first(2) == 1 and ready.first(1) is None and len(ready) == 3
