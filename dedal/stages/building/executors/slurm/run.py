"""The Slurm executor's run: from a plan to its built layers, and :func:`build`.

A run reports the layers already present, then adopts the jobs of an earlier dedal
that is gone (:mod:`.adopt`) and follows them, or claims the environment in the record
before planning (so no other dedal submits meanwhile); then it plans the jobs
(:func:`~dedal.stages.building.executors.slurm.jobs.capacity`,
:func:`dedal.schedule.schedule_plan`), submits them and follows them to their end
(:mod:`.submit`, :mod:`.follow`). ``slurm.detach`` (``dedal build --detach``) submits
and returns, the record saying that no dedal follows the jobs, so the next build
follows them at once. A failure while planning or submitting cancels what was
submitted and releases the claim; when nothing was submitted, the record of the build
before is put back (a failed attempt never hides how the last one ended).

Ctrl-C / SIGTERM (and SIGHUP): ``scancel`` of every job of this build (a running node
build removes its stage on the signal), ``summary.interrupted``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional, Sequence

from dedal.adapters.slurm import Slurm
from dedal.errors import Interrupted, Signals, UserError
from dedal.model.config import Settings
from dedal.model.plan import Plan
from dedal.schedule import Schedule, schedule_plan
from dedal.stages.building.executors.common import BuildSummary
from dedal.stages.building.executors.slurm.adopt import Adopting
from dedal.stages.building.executors.slurm.jobs import capacity
from dedal.stages.building.executors.slurm.record import RECORD, read_record, save_record
from dedal.ui.progress import BuildProgress


class _Build(Adopting):
    """One run of the Slurm executor (see the module doc)."""

    def detach(self) -> BuildSummary:
        """Leave the jobs to Slurm: the record says no dedal follows them, so the next
        build follows them at once, wherever it runs."""
        self.summary.detached = True
        self.write_record()
        self.summary.seconds = time.monotonic() - self.started
        return self.summary

    def plan_jobs(self, todo: Sequence[str]) -> Schedule:
        nodes, cores = capacity(self.settings, self.client)
        schedule = schedule_plan(self.plan, self.settings, nodes=nodes, cores=cores, hashes=todo)
        # the live display: each package's estimate, and the ETA the schedule's simulation gives
        self.progress.estimates.update({self.label(h): self.plan.nodes[h].estimate_s for h in todo})
        self.progress.eta = lambda: schedule.makespan_s - (time.monotonic() - self.submitted)
        return schedule

    def run(self) -> BuildSummary:
        plan = self.plan
        self.summary.reused.extend(self.label(h) for h in plan.cached)
        todo: List[str] = []
        for h in plan.to_build:
            if self.has_layer(h):
                self.summary.reused.append(self.label(h))
                self.progress.finished(self.label(h), "present")
            else:
                todo.append(h)
        if not todo:
            self.summary.seconds = time.monotonic() - self.started
            return self.summary
        previous = read_record(self.work)
        adopted = self.adopt(todo)
        if not adopted:
            self.submitting = True  # the environment claimed, with this dedal's name, before planning
            self.write_record()
        poll_s = max(0.05, float(self.settings.get("slurm.poll_s")))
        with Signals("build"):  # SIGTERM/SIGINT/SIGHUP: Interrupted, the first one only
            try:
                if adopted and self.settings.get("slurm.detach"):
                    return self.detach()
                if adopted:
                    self.follow(poll_s)
                    left = []
                    for h in todo:
                        if self.has_layer(h):  # reported once (also one built by a job that had ended before adoption)
                            self.finish_pkg(h, "built", log=self.pkg_log(h))
                        elif self.pkg_status.get(h) not in ("failed", "blocked"):
                            left.append(h)
                    todo = left
                    if todo and not self.stopped_after_failure:
                        self.progress.note(
                            f"the earlier build's jobs have ended; building the {len(todo)} package(s) it left"
                        )
                        self.tracked, self.order, self.job_of = {}, [], {}
                        self.submitting = True
                        self.write_record()
                    else:
                        todo = []
                if todo:
                    try:
                        self.schedule = self.plan_jobs(todo)
                        self.submit_all(self.schedule.jobs)
                    except BaseException:
                        self.submitting = False
                        submitted = [t for t in self.tracked.values() if t.slurm_id and t.active]
                        if submitted:
                            self.client.cancel([t.slurm_id for t in submitted])
                            for t in submitted:
                                t.status, t.slurm_state = "cancelled", "CANCELLED"
                        if adopted or any(t.slurm_id for t in self.tracked.values()):
                            self.write_record()
                        elif previous is not None:
                            save_record(self.work, previous)  # nothing submitted: the last build's record stays
                        else:
                            (self.work / RECORD).unlink(missing_ok=True)
                        raise
                    if self.settings.get("slurm.detach"):
                        return self.detach()
                    self.follow(poll_s)
            except Interrupted as stop:
                self.interrupted = True
                self.summary.stop_signal = stop.signal_name
                active = [t for t in self.tracked.values() if t.active]
                self.progress.note(f"interrupted: cancelling {len(active)} Slurm job(s) of this build")
                try:
                    self.cancel(active, status="cancelled")
                finally:
                    self.write_record()
        self.summary.seconds = time.monotonic() - self.started
        self.write_record()
        return self.summary


def build(
    plan: Plan,
    plan_path: Path,
    settings: Settings,
    *,
    keep_going: bool,
    progress: BuildProgress,
    client: Optional[Slurm] = None,
) -> BuildSummary:
    """Build the plan's missing layers through Slurm jobs (see the module doc)."""
    if not plan.env_dir:
        raise UserError(
            f"{plan_path}: the plan has no environment directory (env_dir); run `dedal build` on the environment"
        )
    return _Build(plan, plan_path, settings, keep_going, progress, client or Slurm()).run()
