"""The transitively reduced requirements (Workload.direct_requires) and what is built on them.

The scheduler builds its job graphs, bottom levels and bounds over the reduced requirements
for speed (benchmarks/schedule/scale.md); these tests hold them to what the full
requirements give, on random DAGs and a real lock.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Dict, FrozenSet, List

import pytest

from dedal.model.cores import DEFAULT_MODEL
from dedal.schedule import Job, Machine, Workload, group, schedule_problems, simulate
from dedal.schedule.grouping import per_package, reduce_after, set_priorities, settle
from dedal.schedule.search import _reprioritized, build_jobs, merge_jobs
from dedal.schedule.simulation import simulate_unless
from tests.schedule.test_schedule import workload


def random_workload(seed: int, n: int = 60) -> Workload:
    rng = random.Random(seed)
    order = [f"p{i:03d}" for i in range(n)]
    requires: Dict[str, FrozenSet[str]] = {}
    for i, h in enumerate(order):
        below = order[:i]
        requires[h] = frozenset(rng.sample(below, min(len(below), rng.randint(0, 6))))
    # the closure of a few, as a plan's build requirements are (link/run closure of the deps)
    for h in order[::3]:
        closure, stack = set(), list(requires[h])
        while stack:
            q = stack.pop()
            if q not in closure:
                closure.add(q)
                stack.extend(requires[q])
        requires[h] = frozenset(closure)
    return Workload(
        order=order, duration={h: rng.choice([5.0, 60.0, 300.0, 900.0, 3600.0]) for h in order}, requires=requires
    )


def ancestors(wl: Workload, reqs, h: str) -> set:
    out, stack = set(), list(reqs[h])
    while stack:
        q = stack.pop()
        if q not in out:
            out.add(q)
            stack.extend(reqs[q])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_direct_requires_is_the_transitive_reduction(seed):
    wl = random_workload(seed)
    direct = wl.direct_requires()
    for h in wl.order:
        assert set(direct[h]) <= set(wl.requires[h])
        # the same packages needed, directly or not
        assert ancestors(wl, direct, h) == ancestors(wl, wl.requires, h)
        # none of the kept ones is needed by another kept one
        for r in direct[h]:
            assert not any(r in ancestors(wl, wl.requires, o) for o in direct[h] if o != r)
    deps = wl.direct_dependents()
    assert {(r, h) for h in wl.order for r in direct[h]} == {(r, d) for r in wl.order for d in deps[r]}


def test_direct_requires_of_a_chain_with_shortcuts():
    wl = Workload(
        order=["a", "b", "c", "d"],
        duration=dict.fromkeys("abcd", 10.0),
        requires={"a": frozenset(), "b": frozenset("a"), "c": frozenset("ab"), "d": frozenset("abc")},
    )
    assert {h: set(r) for h, r in wl.direct_requires().items()} == {"a": set(), "b": {"a"}, "c": {"b"}, "d": {"c"}}
    assert {h: set(d) for h, d in wl.direct_dependents().items()} == {"a": {"b"}, "b": {"c"}, "c": {"d"}, "d": set()}


def random_jobs(seed: int) -> List[Job]:
    rng = random.Random(seed)
    jobs = []
    for i in range(40):
        after = sorted(rng.sample([j.id for j in jobs], min(i, rng.randint(0, 5))))
        jobs.append(Job(id=f"j{i:02d}", hashes=[f"h{i}"], after=after, est_s=rng.uniform(1, 100), cores=1))
    rng.shuffle(jobs)
    return jobs


@pytest.mark.parametrize("seed", range(5))
def test_settle_is_reduce_after_then_set_priorities(seed):
    one, two = random_jobs(seed), random_jobs(seed)
    bonus = {j.id: float(k % 3) for k, j in enumerate(one)}
    reduce_after(one)
    set_priorities(one, bonus)
    settle(two, bonus)
    assert [(j.id, j.after, j.priority) for j in one] == [(j.id, j.after, j.priority) for j in two]


def test_settle_refuses_a_cycle():
    jobs = [Job(id="a", hashes=["x"], after=["b"]), Job(id="b", hashes=["y"], after=["a"])]
    with pytest.raises(ValueError):
        settle(jobs)


@pytest.mark.parametrize("overhead", [0.0, 3.0])
@pytest.mark.parametrize("seed", range(4))
def test_group_jobs_wait_for_every_requirement(seed, overhead):
    """Whatever the job graph is built from, a job waits (directly or not) for the job of
    every requirement of its packages, and the simulation respects it."""
    wl = random_workload(seed)
    for merge in ("safe", "none"):
        jobs = group(wl, Machine(nodes=2, cores=16, overhead_s=overhead), merge=merge)
        job_of = {h: j.id for j in jobs for h in j.hashes}
        by_id = {j.id: j for j in jobs}
        sim = simulate(jobs, nodes=2, cores=16)
        for j in jobs:
            waits, stack = set(), list(j.after)
            while stack:
                a = stack.pop()
                if a not in waits:
                    waits.add(a)
                    stack.extend(by_id[a].after)
            for h in j.hashes:
                for q in wl.requires[h]:
                    if job_of[q] != j.id:
                        assert job_of[q] in waits
                        assert sim.starts[job_of[q]][1] <= sim.starts[j.id][0] + 1e-9


def test_real_lock_reduction_keeps_the_closure():
    wl = workload("jedi-ci.spack.lock")
    direct = wl.direct_requires()
    assert sum(map(len, direct.values())) < sum(map(len, wl.requires.values()))
    for h in wl.order[::7]:
        assert ancestors(wl, direct, h) == ancestors(wl, wl.requires, h)


@pytest.mark.parametrize("kw", [{}, {"fifo": True}, {"mold": True}, {"need_one": True}])
@pytest.mark.parametrize("seed", range(4))
def test_one_job_per_package_needs_no_settle(seed, kw):
    """group(merge="none") leaves out settle() where every job is one package on the cores
    it was given: its after lists and priorities must be what settle() makes of them, to the bit."""
    wl = random_workload(seed)
    kw = dict(kw)
    if kw.pop("need_one", False):
        kw["need"] = dict.fromkeys(wl.order, 1)
    jobs = group(wl, Machine(nodes=2, cores=16, overhead_s=3.0), merge="none", **kw)
    again = [Job(id=j.id, hashes=list(j.hashes), after=list(j.after), est_s=j.est_s, cores=j.cores) for j in jobs]
    settle(again)
    if kw.get("fifo"):
        for i, j in enumerate(again):
            j.priority = float(len(again) - i)
    assert [(j.id, j.after, j.priority) for j in jobs] == [(j.id, j.after, j.priority) for j in again]


def test_package_seconds_are_package_cores_and_model_seconds():
    from dedal.model.cores import DEFAULT_MODEL
    from dedal.schedule.workload import package_cores, package_seconds

    wl = random_workload(7)
    for cores, cpus in ((64, 0), (8, 0), (64, 4)):
        need, t = package_seconds(wl, cores, DEFAULT_MODEL, cpus)
        assert need == package_cores(wl, cores, DEFAULT_MODEL, cpus)
        assert t == {h: DEFAULT_MODEL.seconds(wl.duration[h], need[h]) for h in wl.order}
        assert package_seconds(wl, cores, DEFAULT_MODEL, cpus)[1] is t  # made once


@pytest.mark.parametrize("nodes", [1, 2, 8])
@pytest.mark.parametrize("seed", range(6))
def test_a_bounded_simulation_gives_up_only_where_the_whole_one_reaches_the_bound(seed, nodes):
    """simulate_unless() drops a candidate once a start shows the makespan reaches
    ``at_least``: never where the whole simulation stays below it (then the same
    simulation), always where it does not (the searches keep what simulates shorter, so
    they choose as if every candidate had been simulated to its end)."""
    wl = random_workload(seed)
    for mode in ("safe", "none"):
        jobs = group(wl, Machine(nodes=nodes, cores=16, overhead_s=3.0), merge=mode)
        whole = simulate(jobs, nodes=nodes, cores=16)
        above = simulate_unless(jobs, nodes=nodes, cores=16, at_least=whole.makespan_s * 1.001)
        assert above is not None
        assert (above.makespan_s, above.starts, above.busy_core_s) == (
            whole.makespan_s,
            whole.starts,
            whole.busy_core_s,
        )
        assert list(above.starts) == list(whole.starts)  # the same order: critical_links() reads it
        for at_least in (whole.makespan_s * (1 - 1e-6), whole.makespan_s * 0.99, whole.makespan_s * 0.5, 1.0):
            assert simulate_unless(jobs, nodes=nodes, cores=16, at_least=at_least) is None


@pytest.mark.parametrize("seed", range(4))
def test_a_new_bonus_alone_gives_what_build_jobs_gives(seed):
    """refine() answers a move that changes only priorities without rebuilding the job
    graph: the same jobs, after lists and priorities as build_jobs() makes of the parts."""
    wl = random_workload(seed)
    jobs = group(wl, Machine(nodes=2, cores=16, overhead_s=3.0), merge="safe")
    parts = [(j.id, list(j.hashes), j.cores) for j in jobs]
    rng = random.Random(seed)
    bonus = {j.id: rng.choice([-30.0, 0.0, 45.0, 600.0]) for j in jobs if rng.random() < 0.3}
    built = build_jobs(wl, parts, bonus, DEFAULT_MODEL, 3.0)
    again = _reprioritized(build_jobs(wl, parts, {}, DEFAULT_MODEL, 3.0), bonus)
    assert [j.to_json() for j in again] == [j.to_json() for j in built]


@pytest.mark.parametrize("seed", range(4))
def test_a_merge_of_built_jobs_gives_what_build_jobs_gives(seed):
    """refine() answers a merge by merging the jobs as they are (merge_jobs), not by making
    them anew from their packages: the same jobs, after lists and priorities as
    build_jobs() makes of the merged parts, with the search's bonus, to the bit."""
    wl = random_workload(seed)
    pos = {h: i for i, h in enumerate(wl.topo())}
    rng = random.Random(seed)
    for merge in ("safe", "none"):
        parts = {
            j.id: (list(j.hashes), j.cores) for j in group(wl, Machine(nodes=2, cores=16, overhead_s=3.0), merge=merge)
        }
        bonus = {k: rng.choice([-30.0, 45.0, 600.0]) for k in parts if rng.random() < 0.3}
        jobs = build_jobs(wl, [(k, hs, c) for k, (hs, c) in parts.items()], bonus, DEFAULT_MODEL, 3.0)
        tried = 0
        for j in jobs:
            for prev in j.after[:2]:
                merged = dict(parts)
                del merged[j.id]
                merged[prev] = (
                    sorted(parts[prev][0] + parts[j.id][0], key=pos.__getitem__),
                    max(parts[prev][1], parts[j.id][1]),
                )
                left = {k: v for k, v in bonus.items() if k != j.id}
                built = build_jobs(wl, [(k, hs, c) for k, (hs, c) in merged.items()], left, DEFAULT_MODEL, 3.0)
                again = merge_jobs(jobs, prev, j.id, wl, DEFAULT_MODEL, 3.0, 16, pos, bonus=left)
                assert (again is None) == (built is None)
                if built is not None and again is not None:
                    assert [x.to_json() for x in again] == [x.to_json() for x in built]
                    tried += 1
        assert tried > 20


@pytest.mark.parametrize("seed", range(4))
def test_per_package_jobs_are_reduced_and_ranked_as_settle_would(seed):
    """per_package() (large builds, instead of group(merge="none")): one job per package in
    topological order, its after lists reduced and its priorities the bottom levels, to the
    bit, that settle() makes of them; simulated, a valid schedule."""
    wl = random_workload(seed)
    jobs = per_package(wl, Machine(nodes=1, cores=16, overhead_s=3.0))
    assert [j.hashes for j in jobs] == [[h] for h in wl.topo()]
    again = [Job(id=j.id, hashes=list(j.hashes), after=list(j.after), est_s=j.est_s, cores=j.cores) for j in jobs]
    settle(again)
    assert [(j.id, j.after, j.priority) for j in jobs] == [(j.id, j.after, j.priority) for j in again]
    sim = simulate(jobs, nodes=2, cores=16)
    assert schedule_problems(wl, jobs, sim.starts, nodes=2, cores=16) == []


# the merging groupings of commit c325bc3, which counted every requirement of a waiting
# package, not only the direct ones (sha256 of the jobs' JSON; 2-30 merges each)
MERGED_C325BC3 = {
    "0/1/0/backlog": "ab21ed02c9b5",
    "0/1/0/safe": "8fff802c2851",
    "0/1/3/backlog": "6e0e9aaa699e",
    "0/1/3/safe": "163b7341a738",
    "0/8/0/backlog": "e79f7a22d62d",
    "0/8/0/safe": "e79f7a22d62d",
    "0/8/3/backlog": "0d7c6907cea8",
    "0/8/3/safe": "0d7c6907cea8",
    "1/1/0/backlog": "e7bb6618fa76",
    "1/1/0/safe": "4cee5ccf1e38",
    "1/1/3/backlog": "9b725cf938db",
    "1/1/3/safe": "28bb0a5399f8",
    "1/8/0/backlog": "004da7eb662d",
    "1/8/0/safe": "25068bd8ed24",
    "1/8/3/backlog": "7a2d3f6a74e0",
    "1/8/3/safe": "3a7d41f17393",
    "2/1/0/backlog": "63b8ed4286a4",
    "2/1/0/safe": "390c7c59808c",
    "2/1/3/backlog": "d294442f52af",
    "2/1/3/safe": "074e621e2a76",
    "2/8/0/backlog": "954b1369497e",
    "2/8/0/safe": "475578e2b0cf",
    "2/8/3/backlog": "454a10a0ac51",
    "2/8/3/safe": "b251b95b5d0d",
    "3/1/0/backlog": "6738330f6e82",
    "3/1/0/safe": "d5ba72e23289",
    "3/1/3/backlog": "6dd8e7ae481e",
    "3/1/3/safe": "6a1b2a2ba2db",
    "3/8/0/backlog": "c7434f9321f3",
    "3/8/0/safe": "ef32386258a9",
    "3/8/3/backlog": "d3d0d6d3f797",
    "3/8/3/safe": "cfe8eba9b1d6",
}


@pytest.mark.parametrize("case", sorted(MERGED_C325BC3))
def test_merging_counts_direct_requirements_only_and_groups_as_before(case):
    """group() counts a waiting package's direct requirements only (its last requirement to
    complete, and the last its job builds, is a direct one): the same jobs as when it
    counted every requirement, with and without a job overhead."""
    seed, nodes, overhead, merge = case.split("/")
    wl = random_workload(int(seed), n=80)
    jobs = group(wl, Machine(nodes=int(nodes), cores=16, overhead_s=float(overhead)), merge=merge)
    assert len(jobs) < len(wl.order)  # some packages merged
    got = hashlib.sha256(json.dumps([j.to_json() for j in jobs], sort_keys=True).encode()).hexdigest()[:12]
    assert got == MERGED_C325BC3[case]
