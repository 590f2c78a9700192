"""Adoption of the Slurm jobs of a dedal that was killed outright.

A dedal killed outright leaves its jobs queued and running. The next build of the
environment follows them (``summary.adopted``) as if it were that dedal, then submits
what they left; nothing is submitted twice. It refuses while that dedal may still
plan, submit (the record claims the environment from before planning) or follow them:
the record names it (:class:`dedal.model.owner.Owner`), judged alive by its pid on the
same host, and on another host by the record's age (rewritten at least every
``HEARTBEAT_S``; gone after ``GONE_AFTER_S``). A detached build (``slurm.detach``,
``dedal build --detach``) leaves a record saying that no dedal follows the jobs, so the
next build follows them at once. Jobs of a plan that is not this one are refused.
"""

from __future__ import annotations

import time
from typing import Sequence

from dedal.adapters.slurm import State
from dedal.errors import UserError
from dedal.model.owner import ALIVE, GONE, UNKNOWN
from dedal.schedule import Job
from dedal.stages.building.executors.slurm.follow import Following
from dedal.stages.building.executors.slurm.record import GONE_AFTER_S, age_s, now, read_record, record_driver


class Adopting(Following):
    """A build that may take over the jobs of an earlier, vanished dedal."""

    def adopt(self, todo: Sequence[str]) -> bool:
        """Jobs of an earlier build of this environment still queued or running: followed
        from here as if their dedal had never stopped, when it is gone (killed, its login
        node rebooted); refused while it still follows them, as two would build the same
        layers twice. ``todo``: the packages whose layers were missing when this build
        looked (the others were reported present). True when jobs were adopted."""
        missing_before = set(todo)
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
            refused = (
                f"{self.plan.env_name}: Slurm jobs of an earlier build are still queued or running ({ids}; "
                f"see `dedal status`)"
            )
        else:
            refused = f"{self.plan.env_name}: an earlier build is submitting its jobs"
        if state == ALIVE:
            assert driver is not None
            raise UserError(
                f"{refused}, by dedal (pid {driver.pid}) on this host: wait for it, or stop it "
                f"(Ctrl-C cancels its jobs)"
            )
        if state == UNKNOWN and age < GONE_AFTER_S:
            where = f" on {driver.host} (pid {driver.pid})" if driver else ""
            raise UserError(
                f"{refused}; the dedal that follows them{where} updated their record {age:.0f} s ago: "
                f"wait for it, or scancel them; if that dedal is gone, this command follows them "
                f"once the record is {GONE_AFTER_S:.0f} s old"
            )
        if not live:
            return False
        missing = sorted({h for j in recorded for h in j.get("hashes", []) if h not in self.plan.nodes})
        if missing:
            raise UserError(
                f"{refused}, for a plan that is not this one (packages {', '.join(m[:7] for m in missing[:5])} "
                f"are not in it): wait for them or scancel them, then build again"
            )
        for j in recorded:
            hashes = [str(h) for h in j.get("hashes", [])]
            job = Job.from_json({**j, "names": [self.plan.nodes[h].name for h in hashes]})
            t = self.prepare(job)
            t.slurm_id, t.attempt, t.time = (
                str(j.get("slurm_id") or ""),
                int(j.get("attempt") or 1),
                str(j.get("time") or ""),
            )
            t.hints, t.history = [str(a) for a in j.get("hints") or []], list(j.get("history") or [])
            t.hints_dropped = [str(a) for a in j.get("hints_dropped") or []]
            t.status, t.slurm_state, t.node = (
                str(j.get("status") or ""),
                str(j.get("state") or ""),
                str(j.get("node") or ""),
            )
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
                    # a layer reported present is not reported again; one that appeared since
                    # this build looked is reported built when followed
                    self.pkg_status[h] = "queued" if h in missing_before else "built"
        # order hints count from the earlier build's submission
        self.submitted = time.monotonic() - age_s(old.get("submitted_at") or old.get("started_at"))
        self.submitted_at = str(old.get("submitted_at") or old.get("started_at") or now())
        self.summary.adopted = len(live)
        self.write_record()
        gone = f"its dedal (pid {driver.pid} on {driver.host}) is gone" if driver else "its dedal is gone"
        if old.get("detached"):
            gone = "it was detached"
        doing = "leaving to themselves (detached)" if self.settings.get("slurm.detach") else "following"
        self.progress.note(
            f"{doing} {len(live)} Slurm job(s) of an earlier build of this environment "
            f"({gone}); nothing is submitted twice"
        )
        return True
