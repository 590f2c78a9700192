"""The Slurm executor: the build jobs of a plan as Slurm batch jobs, ordered by ``afterok``.

The packages to build are grouped into jobs by :mod:`dedal.schedule` (the same code
``dedal plan --simulate`` runs) and submitted at once with ``sbatch --parsable``,
dependencies first, critical path first (submission order and ``--nice``), each job
depending (``--dependency=afterok:...`` with ``--kill-on-invalid-dep=yes``) on the jobs
that produce the layers it needs. A job runs ``dedal node-build`` for its packages in
the node's ``stage_dir`` (/dev/shm): the plan, the layer store, the mirror and the work
directory must be on storage the nodes share.

Then the executor polls ``squeue``/``sacct`` (``slurm.poll_s``) and reports progress
like the local executor: a package has started when its job runs (with the node
name) and the package before it in the job has its layer; it is built when its layer
appears; a finished job's ``--result`` file says what failed and where the logs are.

* A job lost to the machine (NODE_FAIL, PREEMPTED, BOOT_FAIL; jobs are submitted with
  ``--no-requeue`` so this is visible) is resubmitted up to ``slurm.retries`` times,
  together with the jobs waiting for it (which ``--kill-on-invalid-dep`` cancels, or
  would): they are cancelled and resubmitted against the new job id.
* Time limits: each job's ``--time`` is its estimate times ``slurm.time_factor`` (in
  whole minutes), at most ``slurm.time``. Slurm's backfill plans with the limits; with
  one 4-hour limit for every job it cannot start a job ahead of a wider one without
  delaying it, and on full nodes cores stay idle (benchmarks/schedule/cluster.md). A job
  killed at such a limit (TIMEOUT) has not failed its build: it is resubmitted once with
  ``slurm.time``, together with the jobs waiting for it; packages it had packed already
  are not built again.
* A genuine failure (FAILED, TIMEOUT at ``slurm.time``, OUT_OF_MEMORY, a killed batch
  script) is never retried: the packages that need the failed one are reported blocked and their jobs
  cancelled; independent jobs go on. Without ``keep_going`` the jobs that have not
  started yet are cancelled (running ones finish, their layers are good), as the
  local executor stops starting new builds; with it, packages of a cancelled job that
  do not need the failure are resubmitted in a job of their own.
* Order hints (``slurm.order_hints``; by default where every duration was measured,
  :func:`dedal.schedule.wants_order_hints`, :func:`dedal.schedule.tighten`): a job may also
  wait (``afterany``) for jobs whose cores it is planned to take over, so that Slurm
  follows a schedule with fixed start times; each hint holds until its planned time
  (seconds after submission) and is then dropped (``scontrol update Dependency=``), so
  a wrong estimate never holds cores idle for longer than the plan said.
* Ctrl-C / SIGTERM: ``scancel`` of every job of this build (a running node build
  removes its stage on the signal), ``summary.interrupted``.
* A dedal killed outright leaves its jobs queued and running. The next build of the
  environment follows them (``summary.adopted``) as if it were that dedal, then submits
  what they left. It refuses while that dedal may still plan, submit (the record claims
  the environment from before planning) or follow them: the record names
  it (:class:`dedal.model.owner.Owner`), judged alive by its pid on the same host, and on
  another host by the record's age (rewritten at least every ``HEARTBEAT_S``; gone after
  ``GONE_AFTER_S``). ``slurm.detach`` (``dedal build --detach``) submits and returns,
  the record saying that no dedal follows the jobs, so the next build follows them at once.

Every submitted job is recorded in ``<env dir>/slurm-jobs.json`` (Slurm id, packages,
state, node, log, result), rewritten on each change, for ``dedal status``.
"""
from __future__ import annotations

import shlex
import signal
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set

from dedal.adapters.slurm import JobState, Slurm, State, default_template, render_job_script
from dedal.model.config import Settings
from dedal.errors import UserError
from dedal.stages.build.executors.common import BuildSummary, blocked_by_failure, node_build_command, read_result
from dedal.stages.build.executors.slurm.jobs import capacity, job_name, job_time_limit, live_hints, safe_name
from dedal.stages.build.executors.slurm.record import (
    GONE_AFTER_S, RECORD_FORMAT, Tracked, age_s, heartbeat_due, job_entry, now, read_record, record_driver,
    save_record)
from dedal.model.layers import LayerStore
from dedal.model.owner import ALIVE, GONE, UNKNOWN, Owner
from dedal.model.plan import Plan
from dedal.ui.progress import BuildProgress
from dedal.schedule import Job, Schedule, job_topo, schedule_plan

UNKNOWN_GRACE_S = 60.0  # a job neither squeue nor sacct knows for this long is lost


class _Stop(Exception):
    pass


def _raise_stop(signum, frame):  # noqa: ANN001
    raise _Stop(signal.Signals(signum).name)


class _Build:
    def __init__(self, plan: Plan, plan_path: Path, settings: Settings, keep_going: bool,
                 progress: BuildProgress, client: Slurm) -> None:
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
        self.order: List[str] = []            # job ids in submission order
        self.job_of: Dict[str, str] = {}      # package -> id of the job that builds it now
        self.pkg_status: Dict[str, str] = {}  # package -> queued | running | built | failed | blocked
        self.schedule: Optional[Schedule] = None
        self.started = time.monotonic()
        self.submitted = self.started       # time 0 of the schedule (order hints count from it)
        self.submitted_at = now()          # the same, as a date (the record's, for a dedal that adopts the jobs)
        self.written = 0.0                  # when the record was last written (heartbeat)
        self.submitting = False             # planning and submitting: the record claims the environment
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

    def write_record(self) -> None:
        jobs = [job_entry(self.tracked[jid], self.label, self.pkg_status) for jid in self.order]
        sched = self.schedule
        data = {
            "format": RECORD_FORMAT, "executor": "slurm", "env": self.plan.env_name, "plan": str(self.plan_path),
            "started_at": self.started_at, "submitted_at": self.submitted_at, "updated_at": now(),
            "driver": self.driver.to_json(),
            "finished": not self.submitting and not any(t.active for t in self.tracked.values()),
            "submitting": self.submitting, "detached": self.summary.detached,
            "interrupted": self.interrupted,
            "simulated": sched.to_json(with_jobs=False) if sched else None,
            "jobs": jobs,
        }
        save_record(self.work, data)
        self.written = time.monotonic()

    # -- submission -----------------------------------------------------------------------
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
        t = Tracked(job=job, name=name, script=self.job_dir / f"{stem}.sh", result=self.job_dir / f"{stem}.json",
                    out_pattern=self.log_dir / f"slurm-%j-{name.replace(':', '_')}.out")
        return t

    def submit(self, t: Tracked, text: str, source: Path, nice: int) -> None:
        job = t.job
        values = dict(self.settings.values)
        if not values.get("build_jobs"):
            values["build_jobs"] = job.cores  # make -j the job's CPUs
        node_settings = Settings(values, dict(self.settings.sources))
        cmd = node_build_command(node_settings, self.plan_path, t.name, self.run_order(job.hashes), t.result,
                                 self.log_dir)
        script = render_job_script(text, {
            "job_name": t.name,
            "packages": " ".join(safe_name(self.label(h)) for h in self.run_order(job.hashes)),
            "command": shlex.join(cmd),
            "log": _shell_path(t.out_pattern),
            "stage_dir": shlex.quote(str(self.settings.stage_dir)),
        }, source=str(source))
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
            script, name=t.name, dependencies=deps, kill_on_invalid_dep=True,
            after_any=[self.tracked[a].slurm_id for a in t.hints],
            partition=s.get("slurm.partition"), account=s.get("slurm.account"), qos=s.get("slurm.qos"),
            time=t.time, constraint=s.get("slurm.constraint"), nodes=1,
            cpus=int(s.get("slurm.cpus_per_job") or job.cores), mem=s.get("slurm.mem"),
            extra_args=list(s.get("slurm.extra_args") or []), output=t.out_pattern, nice=nice,
            workdir=self.work,
        )
        t.status, t.slurm_state, t.reason, t.node, t.error = "queued", "PENDING", "", "", ""
        t.unknown_since = 0.0
        t.cancel_requested = False
        self.summary.jobs += 1

    def live_hints(self, job: Job, hints: Sequence[str]) -> List[str]:
        return live_hints(job, hints, lambda a: a in self.tracked and self.tracked[a].active
                          and bool(self.tracked[a].slurm_id), time.monotonic() - self.submitted)

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
                deps = [self.tracked[a].slurm_id for a in t.job.after
                        if self.tracked[a].active and self.tracked[a].slurm_id]
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
            t = self.prepare(job)
            self.tracked[job.id] = t
            self.order.append(job.id)
            for h in job.hashes:
                self.job_of[h] = job.id
                self.pkg_status[h] = "queued"
            self.submit(t, text, source, nice=rank)
            if (rank + 1) % 100 == 0 and rank + 1 < len(jobs):
                self.progress.note(f"submitting: {rank + 1} of {len(jobs)} Slurm jobs")
            if heartbeat_due(self.written):  # a slow sbatch: the claim stays fresh
                self.write_record()
        self.submitting = False
        self.write_record()
        self.progress.note(f"submitted {len(jobs)} Slurm job(s) for {sum(len(j.hashes) for j in jobs)} package(s)"
                           + (f"; simulated makespan {self.schedule.makespan_s:.0f} s on {self.schedule.nodes} "
                              f"node(s) x {self.schedule.cores} cores" if self.schedule else ""))

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
            log = str(self.log_dir / f"{self.plan.nodes[h].name}-{h[:7]}.log")
            self.finish_pkg(h, "built", time.monotonic() - t.pkg_started, log=log)
            t.current += 1
        return changed

    # -- job outcomes --------------------------------------------------------------------------
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
                        self.finish_pkg(h, "built", log=str(self.log_dir / f"{self.plan.nodes[h].name}-{h[:7]}.log"))
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
            after = sorted({self.job_of[r] for h in hashes for r in self.plan.build_requirements.get(h, [])
                            if r in self.job_of and r not in own and not self.has_layer(r)})
            old = self.tracked[old_id].job
            job = Job(id=f"{old_id}r{self.serial}", hashes=hashes, after=after, cores=old.cores,
                      names=[self.plan.nodes[h].name for h in hashes], priority=old.priority,
                      est_s=old.est_s)
            t = self.prepare(job)
            self.tracked[job.id] = t
            self.order.append(job.id)
            for h in hashes:
                self.job_of[h] = job.id
                self.pkg_status[h] = "queued"
            self.submit(t, text, source, nice=0)
            self.progress.note(f"resubmitted {len(hashes)} package(s) of {old_id} that do not need the failure "
                               f"as {job.id} (Slurm job {t.slurm_id})")

    def node_failure(self, t: Tracked, st: JobState) -> None:
        """Resubmit a job lost to the machine, and every job waiting for it."""
        retries = int(self.settings.get("slurm.retries"))
        how = _describe(st)
        lost = t.attempt - int(t.extended)  # submissions that ended with the machine's failure
        if lost > retries:
            self.progress.note(f"{t.job.id} ({t.name}) lost to {how} {lost} time(s); not retrying "
                               f"(slurm.retries = {retries})")
            self.job_done(t, st)
            return
        node = st.node or t.node
        self.resubmit(t, st, f"lost to {how}{' on ' + node if node else ''}: resubmitting "
                             f"(attempt {lost + 1} of {retries + 1})")

    def past_limit(self, t: Tracked, st: JobState) -> None:
        """A job killed at the limit taken from its estimate has not failed its build:
        resubmit it once (and the jobs waiting for it) with ``slurm.time``."""
        was = t.time
        t.time = self.settings.get("slurm.time") or ""
        t.extended = True
        self.resubmit(t, st, f"ran past its time limit of {was} (estimate x slurm.time_factor): resubmitting "
                             f"with slurm.time ({t.time or 'no limit'})")

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
            job_t.history.append({"slurm_id": job_t.slurm_id, "state": job_t.slurm_state if job_t is not t
                                  else st.state.value, "node": job_t.node, "log": job_t.log,
                                  "resubmitted_at": now()})
            for h in job_t.job.hashes:
                if self.pkg_status.get(h) == "running":
                    if self.has_layer(h):
                        self.finish_pkg(h, "built", time.monotonic() - job_t.pkg_started)
                    else:
                        self.pkg_status[h] = "queued"
                        self.progress.running.pop(self.label(h), None)
            job_t.current = 0
        t.attempt += 1
        self.progress.note(f"{t.job.id} ({t.name}, Slurm job {t.slurm_id}) {what}"
                           + (f", with {len(closure)} job(s) waiting for it" if closure else ""))
        text, source = self.template()
        t.status = "resubmitting"
        for d in closure:
            d.status = "resubmitting"
        for job_t in [t] + sorted(closure, key=lambda x: self.order.index(x.job.id)):
            # dependencies first: order is a topological order of the jobs
            job_t.status = "queued"
            self.submit(job_t, text, source, nice=self.order.index(job_t.job.id))

    def adopt(self) -> bool:
        """Jobs of an earlier build of this environment still queued or running: followed
        from here as if their dedal had never stopped, when it is gone (killed, its login
        node rebooted); refused while it still follows them, as two would build the same
        layers twice. True when jobs were adopted."""
        old = read_record(self.work)
        if not old or old.get("finished"):
            return False
        driver = record_driver(old)
        state = GONE if old.get("detached") else (driver.state() if driver else UNKNOWN)
        age = age_s(old.get("updated_at"))
        recorded = [j for j in old.get("jobs", []) if isinstance(j, dict)]
        active = [j for j in recorded if j.get("slurm_id") and j.get("status") in ("queued", "running", "resubmitting")]
        states = self.client.states([j["slurm_id"] for j in active]) if active else {}
        live = {j["slurm_id"] for j in active if states.get(j["slurm_id"]) and states[j["slurm_id"]].state.is_active}
        if not live and not old.get("submitting"):
            return False
        if live:
            ids = ", ".join(sorted(live)[:10]) + (" ..." if len(live) > 10 else "")
            refused = (f"{self.plan.env_name}: Slurm jobs of an earlier build are still queued or running ({ids}; "
                       f"see `dedal status`)")
        else:
            refused = f"{self.plan.env_name}: an earlier build is submitting its jobs"
        if state == ALIVE:
            assert driver is not None
            raise UserError(f"{refused}, by dedal (pid {driver.pid}) on this host: wait for it, or stop it "
                            f"(Ctrl-C cancels its jobs)")
        if state == UNKNOWN and age < GONE_AFTER_S:
            where = f" on {driver.host} (pid {driver.pid})" if driver else ""
            raise UserError(f"{refused}; the dedal that follows them{where} updated their record {age:.0f} s ago: "
                            f"wait for it, or scancel them; if that dedal is gone, this command follows them "
                            f"once the record is {GONE_AFTER_S:.0f} s old")
        if not live:
            return False
        missing = sorted({h for j in recorded for h in j.get("hashes", []) if h not in self.plan.nodes})
        if missing:
            raise UserError(f"{refused}, for a plan that is not this one (packages {', '.join(m[:7] for m in missing[:5])} "
                            f"are not in it): wait for them or scancel them, then build again")
        for j in recorded:
            hashes = [str(h) for h in j.get("hashes", [])]
            job = Job.from_json({**j, "names": [self.plan.nodes[h].name for h in hashes]})
            t = self.prepare(job)
            t.slurm_id, t.attempt, t.time = str(j.get("slurm_id") or ""), int(j.get("attempt") or 1), str(j.get("time") or "")
            t.hints, t.history = [str(a) for a in j.get("hints") or []], list(j.get("history") or [])
            t.hints_dropped = [str(a) for a in j.get("hints_dropped") or []]
            t.status, t.slurm_state, t.node = str(j.get("status") or ""), str(j.get("state") or ""), str(j.get("node") or "")
            if t.slurm_id in live:
                t.status = "queued"  # poll() says whether it runs
            elif t.status in ("queued", "running", "resubmitting"):
                # it ended while no dedal followed it: poll() reads how where Slurm still knows
                # (not for one its dedal was resubmitting: what it left is built afresh)
                st = states.get(t.slurm_id)
                known = st is not None and st.state is not State.UNKNOWN and t.status != "resubmitting"
                t.status = "queued" if known else ("done" if all(self.has_layer(h) for h in job.hashes) else "lost")
            self.tracked[job.id] = t
            self.order.append(job.id)
            if t.active:
                for h in job.hashes:
                    self.job_of[h] = job.id
                    # a layer already there was reported present, and is not reported again
                    self.pkg_status[h] = "built" if self.has_layer(h) else "queued"
        # order hints count from the earlier build's submission
        self.submitted = time.monotonic() - age_s(old.get("submitted_at") or old.get("started_at"))
        self.submitted_at = str(old.get("submitted_at") or old.get("started_at") or now())
        self.summary.adopted = len(live)
        self.write_record()
        gone = f"its dedal (pid {driver.pid} on {driver.host}) is gone" if driver else "its dedal is gone"
        if old.get("detached"):
            gone = "it was detached"
        doing = "leaving to themselves (detached)" if self.settings.get("slurm.detach") else "following"
        self.progress.note(f"{doing} {len(live)} Slurm job(s) of an earlier build of this environment "
                           f"({gone}); nothing is submitted twice")
        return True

    # -- the loop ----------------------------------------------------------------------------------
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

    def detach(self) -> BuildSummary:
        """Leave the jobs to Slurm: the record says no dedal follows them, so the next
        build follows them at once, wherever it runs."""
        self.summary.detached = True
        self.write_record()
        self.summary.seconds = time.monotonic() - self.started
        return self.summary

    def plan_jobs(self, todo: Sequence[str]) -> Schedule:
        nodes, cores = capacity(self.settings, self.client)
        return schedule_plan(self.plan, self.settings, nodes=nodes, cores=cores, hashes=todo)

    def follow(self, poll_s: float) -> None:
        while any(t.active for t in self.tracked.values()):
            time.sleep(poll_s)
            self.poll()
            self.progress.refresh()

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
        adopted = self.adopt()
        if not adopted:
            self.submitting = True  # the environment claimed, with this dedal's name, before planning
            self.write_record()
        old = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGHUP)}
        poll_s = max(0.05, float(self.settings.get("slurm.poll_s")))
        try:
            if adopted and self.settings.get("slurm.detach"):
                return self.detach()
            if adopted:
                self.follow(poll_s)
                todo = [h for h in todo if not self.has_layer(h) and self.pkg_status.get(h) not in ("failed", "blocked")]
                if todo and not self.stopped_after_failure:
                    self.progress.note(f"the earlier build's jobs have ended; building the {len(todo)} package(s) "
                                       f"it left")
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
                    self.write_record()
                    raise
                if self.settings.get("slurm.detach"):
                    return self.detach()
                self.follow(poll_s)
        except (KeyboardInterrupt, _Stop):
            self.interrupted = True
            self.summary.interrupted = True
            active = [t for t in self.tracked.values() if t.active]
            self.progress.note(f"interrupted: cancelling {len(active)} Slurm job(s) of this build")
            try:
                self.cancel(active, status="cancelled")
            finally:
                self.write_record()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        self.summary.seconds = time.monotonic() - self.started
        self.write_record()
        return self.summary


def _shell_path(pattern: Path) -> str:
    """A shell word for ``pattern`` with Slurm's ``%j`` as ``${SLURM_JOB_ID}``."""
    parts = str(pattern).split("%j")
    return '"${SLURM_JOB_ID}"'.join(shlex.quote(p) if p else "" for p in parts)


def _describe(st: JobState) -> str:
    text = st.state.value
    if st.signal:
        text += f" (killed by signal {st.signal})"
    elif st.exit_code is not None and st.state is not State.COMPLETED:
        text += f" (exit code {st.exit_code})"
    if st.reason and st.reason not in ("None", "NonZeroExitCode"):
        text += f", reason {st.reason}"
    return text


def build(plan: Plan, plan_path: Path, settings: Settings, *, keep_going: bool, progress: BuildProgress,
          client: Optional[Slurm] = None) -> BuildSummary:
    """Build the plan's missing layers through Slurm jobs (see the module doc)."""
    if not plan.env_dir:
        raise UserError(f"{plan_path}: the plan has no environment directory (env_dir); run `dedal build` on the environment")
    return _Build(plan, plan_path, settings, keep_going, progress, client or Slurm()).run()
