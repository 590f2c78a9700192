"""The local executor: the build jobs of a plan on this machine, as parallel processes.

Each job is one ``dedal node-build`` child (the very command a Slurm job runs), started
as soon as every layer it needs exists, critical path first. A failure blocks only the
packages that need it; without ``keep_going`` nothing new starts after a failure, but
running builds finish (their layers are good). Ctrl-C / SIGTERM stop every child (each
removes its own stage) before dedal exits; a dedal killed outright (SIGKILL) leaves no
build running either: each child gets SIGTERM when its parent dies.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, Set, Tuple

from dedal.adapters import proc
from dedal.errors import Interrupted, Signals
from dedal.model.config import Settings
from dedal.stages.building.executors.common import (
    BuildSummary,
    blocked_by_failure,
    bottom_levels,
    node_build_command,
    read_result,
    remaining_s,
)
from dedal.model.layers import LayerStore
from dedal.model.plan import Plan
from dedal.ui.progress import BuildProgress

POLL_S = 0.2
STOP_GRACE_S = 30.0


def _terminate(children: Dict[str, Tuple[subprocess.Popen, float]]) -> None:
    for p, _ in children.values():
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_GRACE_S
    for p, _ in children.values():
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def build(
    plan: Plan, plan_path: Path, settings: Settings, *, jobs: int, keep_going: bool, progress: BuildProgress
) -> BuildSummary:
    store = LayerStore(Path(settings.layer_store))
    summary = BuildSummary(env=plan.env_name, executor="local")
    started = time.monotonic()
    work = Path(plan.env_dir)
    results_dir = work / "jobs"
    log_dir = work / "logs"
    results_dir.mkdir(parents=True, exist_ok=True)
    priority = bottom_levels(plan)
    pending: Set[str] = set()
    summary.reused.extend(plan.nodes[h].label for h in plan.cached)
    for h in plan.to_build:
        if store.has(plan.nodes[h].key or ""):
            summary.reused.append(plan.nodes[h].label)
            progress.finished(plan.nodes[h].label, "present")
        else:
            pending.add(h)
    done: Set[str] = {h for h in plan.nodes if store.has(plan.nodes[h].key or "")}
    failed: Set[str] = set()
    running: Dict[str, Tuple[subprocess.Popen, float]] = {}
    stop_new = False
    progress.estimates.update({plan.nodes[h].label: plan.nodes[h].estimate_s for h in pending})
    progress.eta = lambda: remaining_s(
        plan, pending | set(running), {h: time.monotonic() - t0 for h, (_, t0) in running.items()}, jobs
    )
    with Signals("build"):  # SIGTERM/SIGINT/SIGHUP: Interrupted, the first one only
        try:
            while pending or running:
                if not stop_new:
                    ready = [h for h in pending if all(r in done for r in plan.build_requirements.get(h, []))]
                    ready.sort(key=lambda h: (-priority.get(h, 0.0), plan.nodes[h].name))
                    for h in ready[: max(0, jobs - len(running))]:
                        node = plan.nodes[h]
                        result_file = results_dir / f"{node.name}-{h[:7]}.json"
                        result_file.unlink(missing_ok=True)
                        cmd = node_build_command(settings, plan_path, node.label, [h], result_file, log_dir)
                        running[h] = (
                            proc.start(cmd, log=log_dir / f"job-{node.name}-{h[:7]}.out", die_with_parent=True),
                            time.monotonic(),
                        )
                        summary.jobs += 1
                        pending.discard(h)
                        progress.started(node.label)
                for h, (p, t0) in list(running.items()):
                    rc = p.poll()
                    if rc is None:
                        continue
                    del running[h]
                    node = plan.nodes[h]
                    res = read_result(results_dir / f"{node.name}-{h[:7]}.json")
                    pkgs = {r["hash"]: r for r in res.get("packages", [])}
                    entry = pkgs.get(h, {})
                    log = entry.get("log") or str(log_dir / f"job-{node.name}-{h[:7]}.out")
                    summary.logs[node.label] = log
                    if rc == 0 and entry.get("status") in ("built", "present"):
                        done.add(h)
                        summary.built.append(node.label)
                        progress.finished(node.label, "built", time.monotonic() - t0)
                    else:
                        error = (
                            entry.get("error") or res.get("error") or f"node build exited with code {rc}; log: {log}"
                        )
                        failed.add(h)
                        summary.failed[node.label] = error
                        progress.finished(node.label, "failed", time.monotonic() - t0, error)
                        for b in blocked_by_failure(plan, {h}) & pending:
                            pending.discard(b)
                            summary.blocked.append(plan.nodes[b].label)
                            progress.finished(plan.nodes[b].label, "blocked", detail=f"needs {node.label}")
                        if not keep_going:
                            stop_new = True
                if stop_new and not running:
                    for b in sorted(pending):
                        summary.blocked.append(plan.nodes[b].label)
                        progress.finished(
                            plan.nodes[b].label, "not started", detail="stopped after a failure (use --keep-going)"
                        )
                    pending.clear()
                if running:
                    time.sleep(POLL_S)
                    progress.refresh()
        except Interrupted as stop:
            summary.stop_signal = stop.signal_name
            progress.note(f"interrupted: stopping {len(running)} running build(s)")
            _terminate(running)
            running.clear()
    summary.seconds = time.monotonic() - started
    return summary
