"""make_schedule beyond LARGE_BUILD packages: bounded work, still valid, deterministic, and never
behind a plain critical-path list scheduler (one of its starting points)."""

from __future__ import annotations

from dedal.model.plan import make_plan
from dedal.model.spack_lock import load_lock
from dedal.schedule import Machine, Workload, group, make_schedule, simulate, validate
from dedal.schedule.grouping import per_package
from dedal.schedule.search import IMPROVE_MIN_TRIES, IMPROVE_WORK, LARGE_BUILD
from tests.conftest import SPACK_DATA


def copies(wl: Workload, k: int) -> Workload:
    """``k`` copies of ``wl`` side by side (fresh hashes), as a site builds one stack many ways."""
    order = [f"{h}-{i}" for i in range(k) for h in wl.order]
    return Workload(
        order=order,
        duration={f"{h}-{i}": wl.duration[h] for i in range(k) for h in wl.order},
        requires={f"{h}-{i}": frozenset(f"{r}-{i}" for r in wl.requires[h]) for i in range(k) for h in wl.order},
        names={f"{h}-{i}": wl.name(h) for i in range(k) for h in wl.order},
    )


def test_a_large_build_is_valid_deterministic_and_ahead_of_a_critical_path_list() -> None:
    plan = make_plan(
        load_lock(SPACK_DATA / "jedi-ci.spack.lock"),
        env_name="t",
        install_root="/opt/x",
        base_image="host",
        base_id="test",
    )
    wl = copies(Workload.from_plan(plan), 6)
    assert len(wl.order) > LARGE_BUILD
    for nodes in (1, 16):
        sched = validate(wl, make_schedule(wl, Machine(nodes=nodes, cores=64, overhead_s=3.0)))
        again = make_schedule(wl, Machine(nodes=nodes, cores=64, overhead_s=3.0))
        assert again.to_json() == sched.to_json()
        cp_list = group(wl, Machine(nodes=nodes, cores=64, overhead_s=3.0), merge="none")
        assert sched.makespan_s <= simulate(cp_list, nodes=nodes, cores=64).makespan_s + 1e-6
        assert sched.makespan_s >= sched.dag_bound_s - 1e-6


def test_beyond_a_few_merges_one_job_per_package_is_simulated_as_listed() -> None:
    """Where improve() could try no more than two merges, the starting point without merging
    is per_package() (no package-level run first): still valid, deterministic, and never
    behind that critical-path list schedule (ties by topological order)."""
    plan = make_plan(
        load_lock(SPACK_DATA / "jedi-ci.spack.lock"),
        env_name="t",
        install_root="/opt/x",
        base_image="host",
        base_id="test",
    )
    wl = copies(Workload.from_plan(plan), 19)
    assert len(wl.order) * IMPROVE_MIN_TRIES > IMPROVE_WORK
    for nodes in (1, 16):
        sched = validate(wl, make_schedule(wl, Machine(nodes=nodes, cores=64, overhead_s=3.0)))
        assert make_schedule(wl, Machine(nodes=nodes, cores=64, overhead_s=3.0)).to_json() == sched.to_json()
        listed = simulate(per_package(wl, Machine(nodes=1, cores=64, overhead_s=3.0)), nodes=nodes, cores=64)
        assert sched.makespan_s <= listed.makespan_s + 1e-6
        assert sched.makespan_s >= sched.dag_bound_s - 1e-6
