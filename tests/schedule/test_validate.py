"""The schedule checker: valid schedules pass, each kind of broken one fails with a reason."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dedal.model.plan import make_plan
from dedal.model.spack_lock import load_lock
from dedal.schedule import InvalidSchedule, Job, Machine, Schedule, Workload, schedule_problems, validate
from tests.conftest import SPACK_DATA
from tests.fixtures.schedules import shared_schedule


def small() -> Workload:
    """a <- b <- c (c needs b needs a), and d on its own."""
    return Workload(
        order=["a", "b", "c", "d"],
        duration={"a": 10.0, "b": 10.0, "c": 10.0, "d": 10.0},
        requires={"a": frozenset(), "b": frozenset({"a"}), "c": frozenset({"a", "b"}), "d": frozenset()},
    )


def two_jobs() -> tuple:
    """a+b in one job, c after it, d on its own; 2 cores each, a node of 4."""
    jobs = [
        Job(id="j1", hashes=["a", "b"], cores=2, est_s=20.0),
        Job(id="j2", hashes=["c"], after=["j1"], cores=2, est_s=10.0),
        Job(id="j3", hashes=["d"], cores=2, est_s=10.0),
    ]
    starts = {"j1": (0.0, 20.0, 0), "j2": (20.0, 30.0, 0), "j3": (0.0, 10.0, 0)}
    return jobs, starts


def problems(jobs, starts, nodes=1, cores=4):
    return schedule_problems(small(), jobs, starts, nodes=nodes, cores=cores)


def test_a_valid_schedule_has_no_problems() -> None:
    jobs, starts = two_jobs()
    assert problems(jobs, starts) == []
    sched = Schedule(
        jobs=jobs,
        nodes=1,
        cores=4,
        overhead_s=0.0,
        makespan_s=30.0,
        lower_bound_s=30.0,
        critical_path_s=30.0,
        work_core_s=80.0,
        utilization=0.7,
        starts=starts,
    )
    assert validate(small(), sched) is sched


@pytest.mark.parametrize("lock_name", ["mpi-cuda.spack.lock", "jedi-ci.spack.lock"])
@pytest.mark.parametrize("nodes, cores", [(1, 8), (4, 64)])
@pytest.mark.parametrize("strategy", ["dedal", "per-package", "single-node"])
def test_every_strategy_is_valid_on_real_locks(lock_name: str, nodes: int, cores: int, strategy: str) -> None:
    plan = make_plan(
        load_lock(SPACK_DATA / lock_name), env_name="t", install_root="/opt/x", base_image="host", base_id="test"
    )
    wl = Workload.from_plan(plan)
    validate(wl, shared_schedule(wl, Machine(nodes=nodes, cores=cores, overhead_s=3.0), strategy=strategy))


def test_a_dependent_that_starts_before_its_requirement_ends_fails() -> None:
    jobs, starts = two_jobs()
    starts["j2"] = (15.0, 25.0, 0)
    found = problems(jobs, starts)
    assert any("j2 starts at 15.000 s" in p and "before job j1 ends" in p for p in found), found
    sched = Schedule(
        jobs=jobs,
        nodes=1,
        cores=4,
        overhead_s=0.0,
        makespan_s=25.0,
        lower_bound_s=25.0,
        critical_path_s=30.0,
        work_core_s=80.0,
        utilization=0.8,
        starts=starts,
    )
    with pytest.raises(InvalidSchedule, match="before job j1 ends"):
        validate(small(), sched)


def test_a_dependency_not_waited_for_fails_even_when_the_times_happen_to_fit() -> None:
    jobs, starts = two_jobs()
    jobs[1] = replace(jobs[1], after=[])
    found = problems(jobs, starts)
    assert found and all("without waiting for job j1" in p for p in found), found


def test_a_requirement_later_in_the_same_job_fails() -> None:
    jobs, starts = two_jobs()
    jobs[0] = replace(jobs[0], hashes=["b", "a"])
    assert any("a after b, which needs it, in job j1" in p for p in problems(jobs, starts))


def test_an_oversubscribed_node_fails() -> None:
    jobs, starts = two_jobs()
    jobs[2] = replace(jobs[2], cores=3)
    found = problems(jobs, starts)
    assert found == ["node 0 runs 5 cores at 0.000 s; it has 4"]
    # on a second node it fits; and a job that ends as another starts frees its cores first
    starts["j3"] = (0.0, 10.0, 1)
    assert problems(jobs, starts, nodes=2) == []
    assert problems(jobs, starts, nodes=1) == ["job j3 runs on node 1; there are 1"]
    starts["j3"] = (20.0, 30.0, 0)
    assert problems(jobs, starts) == ["node 0 runs 5 cores at 20.000 s; it has 4"]
    starts["j3"] = (30.0, 40.0, 0)
    assert problems(jobs, starts) == []


def test_packages_built_twice_or_never_and_bad_jobs_fail() -> None:
    jobs, starts = two_jobs()
    twice = [jobs[0], replace(jobs[1], hashes=["c", "a"]), jobs[2]]
    assert "a built by j1 and j2" in problems(twice, starts)
    never = jobs[:2]
    assert problems(never, starts) == ["d is built by no job"]
    wide = [jobs[0], jobs[1], replace(jobs[2], cores=8)]
    assert "job j3 has 8 cores; a node has 4" in problems(wide, starts)
    unknown = [jobs[0], replace(jobs[1], after=["j9"]), jobs[2]]
    assert "job j2 waits for unknown job j9" in problems(unknown, starts)
    short = dict(starts)
    short["j1"] = (0.0, 5.0, 0)
    assert any("not for its 20.000 s" in p for p in problems(jobs, short))
    missing = {k: v for k, v in starts.items() if k != "j3"}
    assert problems(jobs, missing) == ["job j3 never starts"]


def test_jobs_waiting_for_each_other_in_a_cycle_fail() -> None:
    jobs, starts = two_jobs()
    jobs[0] = replace(jobs[0], after=["j2"])
    assert problems(jobs, starts) == ["the jobs wait for each other in a cycle"]
