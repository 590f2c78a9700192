"""Where one environment's artifacts live: the work directory a stage writes before it runs.

:class:`~dedal.model.target.Target` says what a command's argument names (pure);
:func:`prepare` writes spack.yaml, spack.lock and plan.json into its work directory, once
per command (fetch writes the first two itself, then :func:`write_plan`): every later
stage of that command takes the :class:`Prepared` value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple, Optional

from dedal.errors import UserError
from dedal.model.plan import Plan
from dedal.model.spack_env import stage_env_dir
from dedal.model.spack_lock import SpackLock
from dedal.model.target import Target


class Prepared(NamedTuple):
    """A plan as written to its plan.json (what build jobs read), and the lock it was made of."""

    plan: Plan
    path: Path
    lock: SpackLock


def prepare(target: Target, lock: Optional[SpackLock] = None, plan: Optional[Plan] = None) -> Prepared:
    """Write spack.yaml, spack.lock and plan.json into the work directory. ``lock``: the
    target's lock when the caller parsed it already (it is parsed here otherwise); ``plan``:
    its :meth:`~dedal.model.target.Target.work_plan` when the caller made it already."""
    if target.given_plan is not None and target.plan_path is not None:
        given = target.given_plan
        if not given.env_dir or not (Path(given.env_dir) / "spack.yaml").is_file():
            raise UserError(f"{target.plan_path}: its environment directory {given.env_dir!r} has no spack.yaml")
        lock = lock if lock is not None else target.read_lock()
        fresh = plan if plan is not None else target.work_plan(lock)  # against today's store, same env dir
        fresh.write(target.plan_path)
        return Prepared(fresh, target.plan_path, lock)
    work = target.workdir
    lock_src = target.find_lock()
    lock = lock if lock is not None else target.read_lock()  # read and checked before anything is written
    work.mkdir(parents=True, exist_ok=True)
    dest_lock = work / "spack.lock"
    same = dest_lock.exists() and os.path.samefile(lock_src, dest_lock)
    stage_env_dir(work, target.manifest(lock), None if same else lock_src)
    return write_plan(target, lock, plan)


def write_plan(target: Target, lock: Optional[SpackLock] = None, plan: Optional[Plan] = None) -> Prepared:
    """plan.json of a work directory whose spack.yaml and spack.lock are written already:
    :func:`prepare`'s last step, and all fetch needs after it staged the directory and
    concretized (staging it again would copy the includes a second time)."""
    lock = lock if lock is not None else target.read_lock()
    plan = plan if plan is not None else target.work_plan(lock)
    return Prepared(plan, plan.write(target.workdir / "plan.json"), lock)
