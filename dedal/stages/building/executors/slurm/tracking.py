"""The state of one Slurm build: its jobs, its packages, its record.

:class:`Tracking` holds what the executor knows while it submits and follows the jobs:
each job as :class:`~dedal.stages.building.executors.slurm.record.Tracked`, in
submission order (a topological order of the jobs), the job that builds each package
now, and how far each package is (queued, running, built, failed, blocked, or a
leftover of a stopped job). Everything that changes goes to the record
(:meth:`Tracking.write_record`, ``<env dir>/slurm-jobs.json``) and, per package, to the
progress display and the :class:`~dedal.stages.building.executors.common.BuildSummary`.

The executor is this class and the layers built on it, each in its own module:
submission (:mod:`.submit`), following the jobs (:mod:`.follow`), adoption of an
earlier dedal's jobs (:mod:`.adopt`) and the run itself (:mod:`.run`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from dedal.adapters.slurm import Slurm
from dedal.model.config import Settings
from dedal.model.layers import LayerStore
from dedal.model.owner import Owner
from dedal.model.plan import Plan
from dedal.schedule import Schedule
from dedal.stages.building.executors.common import BuildSummary
from dedal.stages.building.executors.slurm.record import RECORD_FORMAT, Tracked, job_entry, now, save_record
from dedal.stages.building.node import package_log
from dedal.ui.progress import BuildProgress


class Tracking:
    """One build's jobs and packages, and the record of them."""

    def __init__(
        self, plan: Plan, plan_path: Path, settings: Settings, keep_going: bool, progress: BuildProgress, client: Slurm
    ) -> None:
        self.plan = plan
        self.plan_path = Path(plan_path)
        self.settings = settings
        self.keep_going = keep_going
        self.progress = progress
        self.client = client
        self.store = LayerStore(Path(settings.layer_store))
        self.summary = BuildSummary(env=plan.env_name, executor="slurm")
        self.work = Path(plan.env_dir)
        self.log_dir = self.work / "logs"
        self.job_dir = self.work / "slurm"
        self.tracked: Dict[str, Tracked] = {}
        self.order: List[str] = []  # job ids in submission order
        self.job_of: Dict[str, str] = {}  # package -> id of the job that builds it now
        self.pkg_status: Dict[str, str] = {}  # package -> queued | running | built | failed | blocked
        self.schedule: Optional[Schedule] = None
        self.started = time.monotonic()
        self.submitted = self.started  # time 0 of the schedule (order hints count from it)
        self.submitted_at = now()  # the same, as a date (the record's, for a dedal that adopts the jobs)
        self.written = 0.0  # when the record was last written (heartbeat)
        self.submitting = False  # planning and submitting: the record claims the environment
        self.driver = Owner.me()
        self.started_at = now()
        self.stopped_after_failure = False
        self.interrupted = False
        self.serial = 0

    # -- helpers --------------------------------------------------------------------------
    def label(self, h: str) -> str:
        return self.plan.nodes[h].label

    def has_layer(self, h: str) -> bool:
        return self.store.has(self.plan.nodes[h].key or "")

    def run_order(self, hashes: Sequence[str]) -> List[str]:
        """The order ``dedal node-build`` builds a job's packages in (plan order)."""
        want = set(hashes)
        return [h for h in self.plan.to_build if h in want] + [h for h in hashes if h not in self.plan.to_build]

    def pkg_log(self, h: str) -> str:
        """The build log ``dedal node-build`` writes for package ``h``."""
        return str(package_log(self.log_dir, self.plan.nodes[h].name, h))

    def write_record(self) -> None:
        jobs = [job_entry(self.tracked[jid], self.label, self.pkg_status) for jid in self.order]
        sched = self.schedule
        data = {
            "format": RECORD_FORMAT,
            "executor": "slurm",
            "env": self.plan.env_name,
            "plan": str(self.plan_path),
            "started_at": self.started_at,
            "submitted_at": self.submitted_at,
            "updated_at": now(),
            "driver": self.driver.to_json(),
            "finished": not self.submitting and not any(t.active for t in self.tracked.values()),
            "submitting": self.submitting,
            "detached": self.summary.detached,
            "interrupted": self.interrupted,
            "simulated": sched.to_json(with_jobs=False) if sched else None,
            "jobs": jobs,
        }
        save_record(self.work, data)
        self.written = time.monotonic()

    # -- package bookkeeping -----------------------------------------------------------------
    def finish_pkg(self, h: str, status: str, seconds: float = 0.0, detail: str = "", log: str = "") -> None:
        if self.pkg_status.get(h) in ("built", "failed", "blocked"):
            return
        label = self.label(h)
        if log:
            self.summary.logs[label] = log
        if status == "built":
            self.summary.built.append(label)
        elif status == "failed":
            self.summary.failed[label] = detail
        else:
            self.summary.blocked.append(label)
        self.pkg_status[h] = "built" if status == "built" else ("failed" if status == "failed" else "blocked")
        self.progress.finished(label, status, seconds, detail)
