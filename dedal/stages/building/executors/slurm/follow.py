"""Following a Slurm build's jobs: polling, per-package progress, and what each job's end means.

The executor polls ``squeue``/``sacct`` (``slurm.poll_s``) and reports progress like
the local executor: a package has started when its job runs (with the node name) and
the package before it in the job has its layer; it is built when its layer appears; a
finished job's ``--result`` file says what failed and where the logs are. A job that
neither squeue nor sacct knows for ``UNKNOWN_GRACE_S`` is lost (failed).

* A job lost to the machine (NODE_FAIL, PREEMPTED, BOOT_FAIL; jobs are submitted with
  ``--no-requeue`` so this is visible) is resubmitted up to ``slurm.retries`` times,
  together with the jobs waiting for it (which ``--kill-on-invalid-dep`` cancels, or
  would): they are cancelled and resubmitted against the new job id.
* A job killed at a time limit taken from its estimate (TIMEOUT; see
  :mod:`.jobs`) has not failed its build: it is resubmitted once with ``slurm.time``,
  together with the jobs waiting for it; packages it had packed already are not built
  again.
* A genuine failure (FAILED, TIMEOUT at ``slurm.time``, OUT_OF_MEMORY, a killed batch
  script) is never retried: the packages that need the failed one are reported blocked and their jobs
  cancelled; independent jobs go on. Without ``keep_going`` the jobs that have not
  started yet are cancelled (running ones finish, their layers are good), as the
  local executor stops starting new builds; with it, packages of a cancelled job that
  do not need the failure are resubmitted in a job of their own.

The record is rewritten on each change, and at least every ``HEARTBEAT_S`` (:mod:`.record`).
"""

from __future__ import annotations

import time
from typing import Dict, List, Sequence, Set

from dedal.adapters.slurm import JobState, State
from dedal.schedule import Job
from dedal.stages.building.executors.common import blocked_by_failure, read_result
from dedal.stages.building.executors.slurm.record import Tracked, heartbeat_due
from dedal.stages.building.executors.slurm.submit import Submitting

UNKNOWN_GRACE_S = 60.0  # a job neither squeue nor sacct knows for this long is lost


class Following(Submitting):
    """A build that follows its jobs to their end."""

    def poll(self) -> None:
        active = [t for t in self.tracked.values() if t.active]
        if not active:
            return
        states = self.client.states([t.slurm_id for t in active])
        changed = False
        for jid in list(self.order):
            t = self.tracked[jid]
            if not t.active or t.slurm_id not in states:
                continue  # (re)submitted during this poll
            st = states[t.slurm_id]
            if st.state is State.UNKNOWN:
                if not t.unknown_since:
                    t.unknown_since = time.monotonic()
                elif time.monotonic() - t.unknown_since > UNKNOWN_GRACE_S:
                    t.slurm_state = "UNKNOWN"
                    self.job_done(t, JobState(State.FAILED, reason="unknown to squeue and sacct"))
                    changed = True
                continue
            t.unknown_since = 0.0
            if st.state.value != t.slurm_state or st.reason != t.reason or (st.node and st.node != t.node):
                changed = True
            t.slurm_state, t.reason = st.state.value, st.reason
            if st.node:
                t.node = st.node
            if st.state is State.PENDING:
                continue
            if st.state is State.RUNNING:
                t.status = "running"
                changed = self.follow_running(t) or changed
                continue
            # finished
            changed = True
            if st.state.is_node_failure:
                self.node_failure(t, st)
            elif st.state is State.TIMEOUT and not t.extended and t.time != (self.settings.get("slurm.time") or ""):
                self.past_limit(t, st)
            elif st.state is State.CANCELLED and t.cancel_requested:
                t.status = "cancelled"
            else:
                self.job_done(t, st)
        self.settle_leftovers()
        changed = self.expire_hints() or changed
        if changed or heartbeat_due(self.written):
            self.write_record()

    def follow(self, poll_s: float) -> None:
        while any(t.active for t in self.tracked.values()):
            time.sleep(poll_s)
            self.poll()
            self.progress.refresh()

    def follow_running(self, t: Tracked) -> bool:
        """Per-package progress of a running job, from the layers appearing in the store;
        True when something changed."""
        order = self.run_order(t.job.hashes)
        changed = False
        while t.current < len(order):
            h = order[t.current]
            if self.pkg_status.get(h) in ("built", "failed", "blocked"):
                t.current += 1
                continue
            if self.pkg_status.get(h) != "running":
                self.pkg_status[h] = "running"
                t.pkg_started = time.monotonic()
                self.progress.started(self.label(h), t.node)
                changed = True
            if not self.has_layer(h):
                return changed
            log = self.pkg_log(h)
            self.finish_pkg(h, "built", time.monotonic() - t.pkg_started, log=log)
            t.current += 1
        return changed

    def job_done(self, t: Tracked, st: JobState) -> None:
        """A job ended (COMPLETED or a genuine failure): account for each of its packages."""
        res = read_result(t.result)
        entries = {e.get("hash"): e for e in res.get("packages", []) if isinstance(e, dict)}
        ok = st.state is State.COMPLETED
        failed_here: Set[str] = set()
        where = f" on {st.node or t.node}" if (st.node or t.node) else ""
        how = _describe(st)
        for h in self.run_order(t.job.hashes):
            e = entries.get(h, {})
            log = e.get("log") or t.log
            if self.pkg_status.get(h) in ("built", "failed", "blocked"):
                continue
            if e.get("status") in ("built", "present") or self.has_layer(h):
                secs = float(e.get("seconds") or 0.0) or (time.monotonic() - t.pkg_started if t.pkg_started else 0.0)
                self.finish_pkg(h, "built", secs, log=log)
                continue
            if e.get("status") == "failed" or (not failed_here and not e.get("status")):
                error = e.get("error") or res.get("error") or ""
                if not ok or not error:
                    job_part = f"Slurm job {t.slurm_id} ({t.name}) {how}{where}; log: {t.log}"
                    error = f"{error}; {job_part}" if error else job_part
                failed_here.add(h)
                self.finish_pkg(h, "failed", float(e.get("seconds") or 0.0), error, log=log)
                continue
            if e.get("status") == "skipped" and e.get("error") == "job set-up failed":
                # materializing layers or Spack's start-up failed: nothing of this job could build
                error = f"job set-up failed: {res.get('error') or '?'}; Slurm job {t.slurm_id}; log: {log}"
                failed_here.add(h)
                self.finish_pkg(h, "failed", 0.0, error, log=log)
                continue
            self.pending_leftover(t, h, failed_here)
        t.status = "done" if ok and not failed_here else "failed"
        if failed_here:
            t.error = "; ".join(self.summary.failed[self.label(h)] for h in failed_here)[:2000]
            self.after_failure(failed_here)
        elif not ok:
            t.error = f"Slurm job {t.slurm_id} {how}; log: {t.log}"

    def pending_leftover(self, t: Tracked, h: str, failed: Set[str]) -> None:
        """A package of a job that stopped early: blocked if it needs a failed one; else
        left for resubmission (keep_going) or reported as not built."""
        if blocked_by_failure(self.plan, failed) & {h}:
            needs = ", ".join(self.label(f) for f in failed)
            self.finish_pkg(h, "blocked", detail=f"needs {needs}")
            return
        self.pkg_status[h] = "leftover"

    def after_failure(self, failed: Set[str]) -> None:
        """Block what needs the failure, cancel jobs that can no longer build anything,
        and without keep_going cancel every job that has not started."""
        all_failed = {h for h, s in self.pkg_status.items() if s == "failed"} | failed
        blocked = blocked_by_failure(self.plan, all_failed)
        names = {h: ", ".join(sorted(self.label(f) for f in all_failed)) for h in blocked}
        for h in [x for x in self.plan.to_build if x in blocked]:
            if self.pkg_status.get(h) in ("queued", "running", "leftover"):
                self.finish_pkg(h, "blocked", detail=f"needs {names[h]}")
        to_cancel: List[Tracked] = []
        for t in self.tracked.values():
            if not t.active:
                continue
            needs_failed = any(self.pkg_status.get(h) == "blocked" for h in t.job.hashes)
            if needs_failed or (not self.keep_going and t.status == "queued"):
                to_cancel.append(t)
        if not self.keep_going:
            self.stopped_after_failure = True
        self.cancel(to_cancel, status="cancelled")

    def cancel(self, jobs: Sequence[Tracked], status: str) -> None:
        """scancel ``jobs``; their packages that are not built become leftovers (resubmitted
        with keep_going) or 'not started'."""
        jobs = [t for t in jobs if t.active]
        if not jobs:
            return
        self.client.cancel([t.slurm_id for t in jobs])
        for t in jobs:
            t.cancel_requested = True
            t.status = status
            t.slurm_state = "CANCELLED"
            for h in t.job.hashes:
                if self.pkg_status.get(h) in ("queued", "running"):
                    if self.has_layer(h):
                        self.finish_pkg(h, "built", log=self.pkg_log(h))
                    else:
                        self.pkg_status[h] = "leftover"
        self.settle_leftovers()

    def settle_leftovers(self) -> None:
        """Packages of stopped jobs: with keep_going resubmit the buildable ones in a job of
        their own; otherwise they were not started."""
        left = [h for h, s in self.pkg_status.items() if s == "leftover"]
        if not left:
            return
        if not self.keep_going or self.interrupted:
            detail = "stopped after a failure (use --keep-going)" if self.stopped_after_failure else "not started"
            if self.interrupted:
                detail = "interrupted"
            for h in left:
                self.finish_pkg(h, "not started", detail=detail)
            return
        # keep going: one job per group of leftovers that came from the same job, in the
        # (topological) order of those jobs
        groups: Dict[str, List[str]] = {}
        for h in left:
            groups.setdefault(self.job_of[h], []).append(h)
        text, source = self.template()
        for old_id in sorted(groups, key=self.order.index):
            hashes = groups[old_id]
            self.serial += 1
            hashes = self.run_order(hashes)
            own = set(hashes)
            after = sorted(
                {
                    self.job_of[r]
                    for h in hashes
                    for r in self.plan.build_requirements.get(h, [])
                    if r in self.job_of and r not in own and not self.has_layer(r)
                }
            )
            old = self.tracked[old_id].job
            job = Job(
                id=f"{old_id}r{self.serial}",
                hashes=hashes,
                after=after,
                cores=old.cores,
                names=[self.plan.nodes[h].name for h in hashes],
                priority=old.priority,
                est_s=old.est_s,
            )
            t = self.track(job)
            self.submit(t, text, source, nice=0)
            self.progress.note(
                f"resubmitted {len(hashes)} package(s) of {old_id} that do not need the failure "
                f"as {job.id} (Slurm job {t.slurm_id})"
            )

    def node_failure(self, t: Tracked, st: JobState) -> None:
        """Resubmit a job lost to the machine, and every job waiting for it."""
        retries = int(self.settings.get("slurm.retries"))
        how = _describe(st)
        lost = t.attempt - int(t.extended)  # submissions that ended with the machine's failure
        if lost > retries:
            self.progress.note(
                f"{t.job.id} ({t.name}) lost to {how} {lost} time(s); not retrying (slurm.retries = {retries})"
            )
            self.job_done(t, st)
            return
        node = st.node or t.node
        self.resubmit(
            t, st, f"lost to {how}{' on ' + node if node else ''}: resubmitting (attempt {lost + 1} of {retries + 1})"
        )

    def past_limit(self, t: Tracked, st: JobState) -> None:
        """A job killed at the limit taken from its estimate has not failed its build:
        resubmit it once (and the jobs waiting for it) with ``slurm.time``."""
        was = t.time
        t.time = self.settings.get("slurm.time") or ""
        t.extended = True
        self.resubmit(
            t,
            st,
            f"ran past its time limit of {was} (estimate x slurm.time_factor): resubmitting "
            f"with slurm.time ({t.time or 'no limit'})",
        )


def _describe(st: JobState) -> str:
    text = st.state.value
    if st.signal:
        text += f" (killed by signal {st.signal})"
    elif st.exit_code is not None and st.state is not State.COMPLETED:
        text += f" (exit code {st.exit_code})"
    if st.reason and st.reason not in ("None", "NonZeroExitCode"):
        text += f", reason {st.reason}"
    return text
