"""The ETA of a local build from the plan's estimates."""

from __future__ import annotations

import pytest

from dedal.model.plan import make_plan
from dedal.model.spack_lock import load_lock
from dedal.stages.building.executors.common import remaining_s
from tests.conftest import SPACK_DATA


@pytest.fixture
def plan():
    plan = make_plan(
        load_lock(SPACK_DATA / "tiny-dedal.spack.lock"),
        env_name="t",
        install_root="/opt/x",
        base_image="host",
        base_id="test",
    )
    for i, h in enumerate(plan.to_build):
        plan.nodes[h].estimate_s = 10.0 * (i + 1)
    return plan


def test_eta_is_the_critical_path_or_the_work_over_the_slots(plan):
    todo = set(plan.to_build)
    est = {h: plan.nodes[h].estimate_s for h in todo}
    dependents = plan.dependents()

    def longest(h):
        return est[h] + max((longest(d) for d in dependents.get(h, ()) if d in todo), default=0.0)

    critical = max(longest(h) for h in todo)
    assert remaining_s(plan, todo, {}, slots=100) == pytest.approx(critical)
    assert remaining_s(plan, todo, {}, slots=1) == pytest.approx(sum(est.values()))
    assert critical < sum(est.values())


def test_eta_counts_down_with_running_builds_and_ends_at_zero(plan):
    last = plan.to_build[-1]  # dependencies first: nothing depends on the last one
    alone = plan.nodes[last].estimate_s
    assert remaining_s(plan, {last}, {last: alone / 2}, slots=4) == pytest.approx(alone / 2)
    assert remaining_s(plan, {last}, {last: alone * 3}, slots=4) == 0.0
    assert remaining_s(plan, set(), {}, slots=4) == 0.0
