"""Submission of a Slurm build's jobs: job scripts, ``sbatch``, order hints, resubmission.

The packages to build are grouped into jobs by :mod:`dedal.schedule` (the same code
``dedal plan --simulate`` runs) and submitted at once with ``sbatch --parsable``,
dependencies first, critical path first (submission order and ``--nice``), each job
depending (``--dependency=afterok:...`` with ``--kill-on-invalid-dep=yes``) on the jobs
that produce the layers it needs. A job runs ``dedal node-build`` for its packages in
the node's ``stage_dir`` (/dev/shm): the plan, the layer store, the mirror and the work
directory must be on storage the nodes share. Its script is rendered from the
job-script template (``slurm.template``, by default the one dedal ships), its
``--time`` comes from :func:`~dedal.stages.building.executors.slurm.jobs.job_time_limit`.

Order hints (``slurm.order_hints``; by default where every duration was measured,
:func:`dedal.schedule.wants_order_hints`, :func:`dedal.schedule.tighten`): a job may also
wait (``afterany``) for jobs whose cores it is planned to take over, so that Slurm
follows a schedule with fixed start times; each hint holds until its planned time
(seconds after submission) and is then dropped (``scontrol update Dependency=``), so
a wrong estimate never holds cores idle for longer than the plan said.

Resubmission (of a job lost to the machine or killed at its estimated time limit, as
:mod:`.follow` decides): the job is submitted again together with the jobs waiting for
it (which ``--kill-on-invalid-dep`` cancels, or would): they are cancelled and
resubmitted against the new job id.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Dict, List, Sequence

from dedal.adapters.slurm import JobState, default_template, render_job_script
from dedal.errors import UserError
from dedal.model.config import Settings
from dedal.schedule import Job, job_topo
from dedal.stages.building.executors.common import node_build_command
from dedal.stages.building.executors.slurm.jobs import job_name, job_time_limit, live_hints, safe_name
from dedal.stages.building.executors.slurm.record import Tracked, heartbeat_due, now
from dedal.stages.building.executors.slurm.tracking import Tracking


class Submitting(Tracking):
    """A build that submits its jobs (and submits them again)."""

    def template(self) -> tuple:
        path = self.settings.get("slurm.template")
        path = Path(path) if path else default_template()
        try:
            return path.read_text(), path
        except OSError as exc:
            raise UserError(f"slurm.template {path}: cannot read ({exc.strerror})") from None

    def prepare(self, job: Job) -> Tracked:
        name = job_name(self.plan.env_name, job)
        stem = f"{job.id}-{safe_name(job.label)}"
        t = Tracked(
            job=job,
            name=name,
            script=self.job_dir / f"{stem}.sh",
            result=self.job_dir / f"{stem}.json",
            out_pattern=self.log_dir / f"slurm-%j-{name.replace(':', '_')}.out",
        )
        return t

    def track(self, job: Job) -> Tracked:
        """Take on a new job, last in submission order, as the job that builds its
        packages (queued); submitting it is the caller's next step."""
        t = self.prepare(job)
        self.tracked[job.id] = t
        self.order.append(job.id)
        for h in job.hashes:
            self.job_of[h] = job.id
            self.pkg_status[h] = "queued"
        return t

    def submit(self, t: Tracked, text: str, source: Path, nice: int) -> None:
        job = t.job
        values = dict(self.settings.values)
        if not values.get("build_jobs"):
            values["build_jobs"] = job.cores  # make -j the job's CPUs
        node_settings = Settings(values, dict(self.settings.sources))
        cmd = node_build_command(
            node_settings, self.plan_path, t.name, self.run_order(job.hashes), t.result, self.log_dir
        )
        script = render_job_script(
            text,
            {
                "job_name": t.name,
                "packages": " ".join(safe_name(self.label(h)) for h in self.run_order(job.hashes)),
                "command": shlex.join(cmd),
                "log": _shell_path(t.out_pattern),
                "stage_dir": shlex.quote(str(self.settings.stage_dir)),
            },
            source=str(source),
        )
        t.script.write_text(script)
        t.result.unlink(missing_ok=True)
        deps = []
        for a in job.after:
            dep = self.tracked[a]
            if dep.status == "done":
                continue  # completed: nothing to wait for (and it may be purged soon)
            if not dep.active or not dep.slurm_id:
                raise AssertionError(f"job {job.id} would wait for {a} ({dep.status})")
            deps.append(dep.slurm_id)
        t.hints = self.live_hints(job, list(job.order))
        s = self.settings
        if not t.time:
            t.time = job_time_limit(job.est_s, float(s.get("slurm.time_factor")), s.get("slurm.time") or "")
        t.slurm_id = self.client.submit(
            script,
            name=t.name,
            dependencies=deps,
            kill_on_invalid_dep=True,
            after_any=[self.tracked[a].slurm_id for a in t.hints],
            partition=s.get("slurm.partition"),
            account=s.get("slurm.account"),
            qos=s.get("slurm.qos"),
            time=t.time,
            constraint=s.get("slurm.constraint"),
            nodes=1,
            cpus=int(s.get("slurm.cpus_per_job") or job.cores),
            mem=s.get("slurm.mem"),
            extra_args=list(s.get("slurm.extra_args") or []),
            output=t.out_pattern,
            nice=nice,
            workdir=self.work,
        )
        t.status, t.slurm_state, t.reason, t.node, t.error = "queued", "PENDING", "", "", ""
        t.unknown_since = 0.0
        t.cancel_requested = False
        self.summary.jobs += 1

    def live_hints(self, job: Job, hints: Sequence[str]) -> List[str]:
        return live_hints(
            job,
            hints,
            lambda a: a in self.tracked and self.tracked[a].active and bool(self.tracked[a].slurm_id),
            time.monotonic() - self.submitted,
        )

    def expire_hints(self) -> bool:
        """A queued job stops waiting for an order hint once its planned time has passed:
        the estimates it came from proved wrong, and holding cores idle for them would
        make the build slower than plain list scheduling. True when a job changed."""
        changed = False
        for jid in self.order:
            t = self.tracked[jid]
            if t.status != "queued" or not t.hints:
                continue
            live = self.live_hints(t.job, t.hints)
            if live == t.hints:
                continue
            if any(a not in live and self.tracked[a].active for a in t.hints):
                deps = [
                    self.tracked[a].slurm_id for a in t.job.after if self.tracked[a].active and self.tracked[a].slurm_id
                ]
                if not self.client.set_dependencies(t.slurm_id, deps, [self.tracked[a].slurm_id for a in live]):
                    continue  # it started meanwhile
            t.hints_dropped += [a for a in t.hints if a not in live and self.tracked[a].active]
            t.hints = live
            changed = True
        return changed

    def submit_all(self, jobs: Sequence[Job]) -> None:
        self.submitted, self.submitted_at = time.monotonic(), now()
        text, source = self.template()
        self.job_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for rank, job in enumerate(job_topo(jobs)):
            t = self.track(job)
            self.submit(t, text, source, nice=rank)
            if (rank + 1) % 100 == 0 and rank + 1 < len(jobs):
                self.progress.note(f"submitting: {rank + 1} of {len(jobs)} Slurm jobs")
            if heartbeat_due(self.written):  # a slow sbatch: the claim stays fresh
                self.write_record()
        self.submitting = False
        self.write_record()
        self.progress.note(
            f"submitted {len(jobs)} Slurm job(s) for {sum(len(j.hashes) for j in jobs)} package(s)"
            + (
                f"; simulated makespan {self.schedule.makespan_s:.0f} s on {self.schedule.nodes} "
                f"node(s) x {self.schedule.cores} cores"
                if self.schedule
                else ""
            )
        )

    def resubmit(self, t: Tracked, st: JobState, what: str) -> None:
        """Submit ``t`` again, and every job waiting for it (cancelled first: Slurm would
        cancel them through kill-on-invalid-dep), against its new id."""
        # the jobs waiting (transitively) for it: Slurm cancels them (kill-on-invalid-dep)
        dependents: Dict[str, List[str]] = {}
        for other in self.tracked.values():
            for a in other.job.after:
                dependents.setdefault(a, []).append(other.job.id)
        closure: List[Tracked] = []
        stack = [t.job.id]
        seen = {t.job.id}
        while stack:
            for d in dependents.get(stack.pop(), []):
                if d not in seen and self.tracked[d].active:
                    seen.add(d)
                    stack.append(d)
                    closure.append(self.tracked[d])
        if closure:
            self.client.cancel([d.slurm_id for d in closure])
        for job_t in [t] + closure:
            job_t.history.append(
                {
                    "slurm_id": job_t.slurm_id,
                    "state": job_t.slurm_state if job_t is not t else st.state.value,
                    "node": job_t.node,
                    "log": job_t.log,
                    "resubmitted_at": now(),
                }
            )
            for h in job_t.job.hashes:
                if self.pkg_status.get(h) == "running":
                    if self.has_layer(h):
                        self.finish_pkg(h, "built", time.monotonic() - job_t.pkg_started)
                    else:
                        self.pkg_status[h] = "queued"
                        self.progress.running.pop(self.label(h), None)
            job_t.current = 0
        t.attempt += 1
        self.progress.note(
            f"{t.job.id} ({t.name}, Slurm job {t.slurm_id}) {what}"
            + (f", with {len(closure)} job(s) waiting for it" if closure else "")
        )
        text, source = self.template()
        t.status = "resubmitting"
        for d in closure:
            d.status = "resubmitting"
        for job_t in [t] + sorted(closure, key=lambda x: self.order.index(x.job.id)):
            # dependencies first: order is a topological order of the jobs
            job_t.status = "queued"
            self.submit(job_t, text, source, nice=self.order.index(job_t.job.id))


def _shell_path(pattern: Path) -> str:
    """A shell word for ``pattern`` with Slurm's ``%j`` as ``${SLURM_JOB_ID}``."""
    parts = str(pattern).split("%j")
    return '"${SLURM_JOB_ID}"'.join(shlex.quote(p) if p else "" for p in parts)
