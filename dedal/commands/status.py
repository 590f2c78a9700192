"""`dedal status`: what is queued, running, done or failed for an environment's build, with log paths."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from rich.table import Table

from dedal.model.attempts import Attempts, age_text
from dedal.model.config import from_args
from dedal.ui.console import human_seconds, out, print_json
from dedal.errors import DedalError, UserError
from dedal.model.layers import LayerStore
from dedal.model.owner import GONE
from dedal.model.plan import Plan

FINAL = ("done", "failed", "blocked", "cancelled", "lost")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="show what is queued, running, done or failed for a build",
        description="Show the jobs of the latest build of an environment: for the Slurm executor "
        "the jobs recorded in <env dir>/slurm-jobs.json with their live state from "
        "squeue/sacct; for the local executor the job results in <env dir>/jobs/. "
        "Every job and failed package comes with its log path. Then the last build "
        "attempt and the last successful one (<env dir>/builds/).",
    )
    p.add_argument(
        "target",
        metavar="PLAN_OR_ENV",
        help="env.yaml (or its directory), plan.json, spack.lock, or the environment's work directory",
    )
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(func=run)


def env_dir_of(arg: str, settings) -> Tuple[str, Path, Optional[Plan]]:
    # the stages' imports (the build stage's are heavy): only when the command runs, not for --help
    from dedal.stages.building.executors.slurm import RECORD
    from dedal.model.target import resolve

    path = Path(arg)
    if (
        path.is_dir()
        and not (path / "env.yaml").exists()
        and any((path / n).exists() for n in (RECORD, "plan.json", "jobs"))
    ):
        plan = _read_plan(path / "plan.json")
        return (plan.env_name if plan else path.name), path, plan
    target = resolve(arg, settings)
    if target.given_plan is not None and target.given_plan.env_dir:
        return target.name, Path(target.given_plan.env_dir), target.given_plan
    return target.name, target.workdir, _read_plan(target.workdir / "plan.json")


def _read_plan(path: Path) -> Optional[Plan]:
    try:
        return Plan.read(path)
    except UserError:
        return None


def _live_states(jobs: List[dict]) -> Tuple[Dict[str, dict], str]:
    """Live Slurm states of the recorded jobs that were still queued or running."""
    ids = [j["slurm_id"] for j in jobs if j.get("slurm_id") and j.get("status") not in FINAL]
    if not ids:
        return {}, ""
    from dedal.adapters.slurm import Slurm

    try:
        return {k: v.to_json() for k, v in Slurm().states(ids).items()}, ""
    except DedalError as exc:
        return {}, f"live state unavailable ({exc.one_line()}); showing the recorded state"


def _status_from_live(job: dict, live: Optional[dict]) -> str:
    if not live:
        return job.get("status", "?")
    state = live["state"]
    if state == "PENDING":
        return "queued"
    if state == "RUNNING":
        return "running"
    if state == "COMPLETED":
        return "done"
    if state == "UNKNOWN":
        return job.get("status", "?")
    if state == "CANCELLED":
        return "cancelled"
    return "failed"


def slurm_status(record: dict) -> dict:
    from dedal.stages.building.executors.slurm import record_driver

    live, note = _live_states(record.get("jobs", []))
    jobs = []
    packages: Dict[str, str] = {}
    errors: Dict[str, dict] = {}
    for j in record.get("jobs", []):
        lv = live.get(j.get("slurm_id", ""))
        status = _status_from_live(j, lv)
        entry = {
            k: j.get(k)
            for k in ("id", "slurm_id", "name", "packages", "node", "log", "result", "attempt", "error", "reason")
        }
        entry["status"] = status
        entry["state"] = (lv or {}).get("state") or j.get("state", "")
        if lv:
            entry["node"] = lv.get("node") or entry["node"]
            entry["reason"] = lv.get("reason") or entry["reason"]
        entry["history"] = j.get("history", [])
        result = _read_json(Path(j["result"])) if j.get("result") else {}
        pkg_logs = {p.get("name"): p for p in result.get("packages", []) if isinstance(p, dict)}
        for label, st in (j.get("package_status") or {}).items():
            if status in ("queued", "running") and st not in ("built", "failed", "blocked"):
                st = "running" if status == "running" else "queued"
            packages[label] = st
            if st == "failed":
                p = pkg_logs.get(label.split("@")[0], {})
                errors[label] = {"error": p.get("error") or j.get("error", ""), "log": p.get("log") or j.get("log", "")}
        jobs.append(entry)
    finished = all(j["status"] in FINAL for j in jobs) and not record.get("submitting")
    followed_by = None
    driver = record_driver(record)
    if not finished and not record.get("detached") and driver:
        followed_by = {"host": driver.host, "pid": driver.pid, "state": driver.state()}
    return {
        "executor": "slurm",
        "started_at": record.get("started_at"),
        "updated_at": record.get("updated_at"),
        "finished": finished,
        "interrupted": record.get("interrupted", False),
        "followed_by": followed_by,
        "submitting": bool(record.get("submitting")),
        "detached": bool(record.get("detached")),
        "jobs": jobs,
        "packages": packages,
        "errors": errors,
        "note": note,
    }


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def local_status(results: List[Path]) -> dict:
    jobs = []
    packages: Dict[str, str] = {}
    errors: Dict[str, dict] = {}
    for path in sorted(results):
        res = _read_json(path)
        if not res:
            continue
        pkgs = [p for p in res.get("packages", []) if isinstance(p, dict)]
        status = {"ok": "done", "failed": "failed", "interrupted": "cancelled"}.get(
            res.get("status", ""), res.get("status", "?")
        )
        log = next((p.get("log") for p in pkgs if p.get("status") == "failed"), None) or next(
            (p.get("log") for p in pkgs if p.get("log")), ""
        )
        jobs.append(
            {
                "id": res.get("job") or path.stem,
                "node": res.get("host", ""),
                "status": status,
                "packages": [p.get("name", "") for p in pkgs],
                "log": log,
                "result": str(path),
                "error": res.get("error", ""),
            }
        )
        for p in pkgs:
            label = res.get("job") if len(pkgs) == 1 and res.get("job") else p.get("name", "")
            packages[label] = {"present": "built"}.get(p.get("status", ""), p.get("status", "?"))
            if p.get("status") == "failed":
                errors[label] = {"error": p.get("error", ""), "log": p.get("log", "")}
        if not pkgs and status == "failed":
            errors[res.get("job") or path.stem] = {"error": res.get("error", ""), "log": ""}
    return {"executor": "local", "jobs": jobs, "packages": packages, "errors": errors, "finished": True, "note": ""}


def collect(env_dir: Path) -> Optional[dict]:
    from dedal.stages.building.executors.slurm import RECORD, read_record

    record = read_record(env_dir)
    results = list((env_dir / "jobs").glob("*.json")) if (env_dir / "jobs").is_dir() else []
    newest_local = max((p.stat().st_mtime for p in results), default=0.0)
    if record is not None and (env_dir / RECORD).stat().st_mtime >= newest_local:
        return slurm_status(record)
    if results:
        return local_status(results)
    return None


def run(args: argparse.Namespace) -> int:
    settings = from_args(args)
    name, env_dir, plan = env_dir_of(args.target, settings)
    data = collect(env_dir) or {
        "executor": None,
        "jobs": [],
        "packages": {},
        "errors": {},
        "finished": True,
        "note": f"no build recorded in {env_dir}",
    }
    data.update(env=name, env_dir=str(env_dir))
    attempts = Attempts(env_dir)
    last, success = attempts.last(), attempts.last_success()
    data["last_attempt"] = dict(last.to_json(), state=last.state()) if last else None
    data["last_success"] = success.to_json() if success else None
    counts: Dict[str, int] = {}
    for st in data["packages"].values():
        counts[st] = counts.get(st, 0) + 1
    data["counts"] = counts
    if plan is not None and plan.to_build:
        store = LayerStore(Path(settings.layer_store))
        data["layers"] = {
            "to_build": len(plan.to_build),
            "present": sum(1 for h in plan.to_build if store.has(plan.nodes[h].key or "")),
        }
    if args.json:
        print_json(data)
        return 0
    show(data)
    return 0


def attempt_line(a: dict) -> str:
    """One attempt as `dedal status` shows it: when, where, how it ended, what it built."""
    state = a.get("state") or a.get("status", "?")
    when = f"{a['started_at']} ({age_text(a['started_at'])})" if age_text(a["started_at"]) else a["started_at"]
    text = f"{when}, {a['executor']}: {state}"
    if state == "abandoned":
        text += " (its dedal is gone)"
    elif state == "running":
        text += f" (dedal pid {a.get('driver', {}).get('pid', '?')} on {a.get('driver', {}).get('host', '?')})"
    s = a.get("summary") or {}
    if s:
        parts = [
            f"{len(s.get(k) or [])} {word}"
            for k, word in (("built", "built"), ("reused", "reused"), ("failed", "failed"), ("blocked", "not built"))
            if s.get(k)
        ]
        text += ": " + (", ".join(parts) or "nothing to build")
    if a.get("seconds"):
        text += f" in {human_seconds(float(a['seconds']))}"
    return text


def show(data: dict) -> None:
    last, success = data.get("last_attempt"), data.get("last_success")
    if data["executor"] is None:
        out.print(f"{data['env']}: {data['note']}")
        _show_attempts(last, success)
        return
    head = f"{data['env']}: {data['executor']} build"
    if data.get("started_at"):
        head += f" started {data['started_at']}"
    state = "interrupted" if data.get("interrupted") else ("finished" if data.get("finished") else "in progress")
    if data["executor"] == "slurm" and not data["jobs"] and state == "finished":
        state = "no jobs recorded"
    if data.get("submitting"):
        state = "planning and submitting its jobs"
    out.print(f"{head}, {state} ({data['env_dir']})")
    who = data.get("followed_by")
    if data.get("detached") and not data.get("finished"):
        out.print("detached: no dedal follows these jobs; `dedal build` of this environment follows them")
    if who:
        line = f"followed by dedal (pid {who['pid']}) on {who['host']}, updated {data.get('updated_at')}"
        if who["state"] == GONE:
            line += "; that dedal is gone: `dedal build` of this environment follows the jobs from here"
        out.print(line)
    table = Table()
    cols = (
        ("job", "slurm id", "status", "node", "packages", "log")
        if data["executor"] == "slurm"
        else ("job", "status", "host", "packages", "log")
    )
    for c in cols:
        table.add_column(c, overflow="fold")
    for j in data["jobs"]:
        status = j["status"]
        if j.get("reason") and status == "queued":
            status += f" ({j['reason']})"
        if j.get("attempt", 1) and j.get("attempt", 1) > 1:
            status += f" [attempt {j['attempt']}]"
        pkgs = " ".join(j.get("packages") or [])
        if data["executor"] == "slurm":
            table.add_row(j.get("id", ""), j.get("slurm_id", ""), status, j.get("node") or "", pkgs, j.get("log") or "")
        else:
            table.add_row(j.get("id", ""), status, j.get("node") or "", pkgs, j.get("log") or "")
    out.print(table)
    counts = data["counts"]
    out.print(", ".join(f"{n} {st}" for st, n in sorted(counts.items())) + f" ({sum(counts.values())} packages)")
    if "layers" in data:
        out.print(f"layers in the store: {data['layers']['present']} of {data['layers']['to_build']} to build")
    for label, e in data["errors"].items():
        out.print(
            f"  FAILED {label}: {e['error']}"
            + (f" (log: {e['log']})" if e.get("log") and e["log"] not in e["error"] else "")
        )
    if data.get("note"):
        out.print(data["note"])
    _show_attempts(last, success)


def _show_attempts(last: Optional[dict], success: Optional[dict]) -> None:
    if last is None:
        return
    out.print(f"last attempt  {attempt_line(last)}", markup=False, highlight=False)
    if last.get("error"):
        out.print(f"              error: {last['error']}", markup=False, highlight=False)
    if success is None:
        out.print("last success  none recorded", markup=False, highlight=False)
    elif success["id"] != last["id"]:
        out.print(f"last success  {attempt_line(success)}", markup=False, highlight=False)
