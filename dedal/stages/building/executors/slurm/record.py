"""The record of a Slurm build, ``<env dir>/slurm-jobs.json``: its format, its writing and reading.

Every submitted job is recorded (Slurm id, packages, state, node, log, result),
rewritten on each change, for ``dedal status`` and for a later dedal that adopts the
jobs. The record also claims the environment: it names the dedal that plans, submits
or follows its jobs (``driver``, a :class:`dedal.model.owner.Owner`), judged alive by
its pid on the same host, and on another host by the record's age: a following dedal
rewrites it at least every ``HEARTBEAT_S`` (also while a slow sbatch submits), and a
record ``GONE_AFTER_S`` old whose dedal ran elsewhere is taken as abandoned.

:class:`Tracked` is one job as the executor follows it; :func:`job_entry` is how the
record holds it. The record is replaced atomically, so a reader never sees half of it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, List, Mapping, Optional

from dedal.errors import UserError
from dedal.model.artifacts import write_atomic
from dedal.model.owner import Owner
from dedal.schedule import Job

RECORD = "slurm-jobs.json"
RECORD_FORMAT = 1
HEARTBEAT_S = 60.0  # the record is rewritten at least this often while dedal follows the jobs
GONE_AFTER_S = 300.0  # a record this old whose dedal ran on another host: that dedal is gone


def now() -> str:
    """This moment as the record's dates are written (UTC, ISO, whole seconds)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def age_s(stamp: object) -> float:
    """Seconds since an ISO date of a record (infinite when it has none)."""
    try:
        then = datetime.fromisoformat(str(stamp))
    except ValueError:
        return float("inf")
    if then.tzinfo is None:
        then = then.replace(tzinfo=timezone.utc)
    return max(0.0, (datetime.now(timezone.utc) - then).total_seconds())


def heartbeat_due(written: float) -> bool:
    """Whether a record last written at ``written`` (``time.monotonic()``) must be
    rewritten to keep the claim fresh: it is older than ``HEARTBEAT_S``."""
    return time.monotonic() - written > HEARTBEAT_S


@dataclass
class Tracked:
    """One job of this build as the executor follows it (and slurm-jobs.json records it)."""

    job: Job
    name: str
    script: Path
    result: Path
    out_pattern: Path  # --output, with %j
    slurm_id: str = ""
    attempt: int = 1
    status: str = "queued"  # queued | running | done | failed | blocked | cancelled
    slurm_state: str = ""
    reason: str = ""
    node: str = ""
    error: str = ""
    history: List[dict] = field(default_factory=list)  # earlier submissions
    unknown_since: float = 0.0
    cancel_requested: bool = False
    current: int = 0  # index of the package now building
    pkg_started: float = 0.0
    hints: List[str] = field(default_factory=list)  # order hints (job ids) Slurm still holds it to
    hints_dropped: List[str] = field(default_factory=list)  # hints past their planned time, dropped
    time: str = ""  # --time it was submitted with
    extended: bool = False  # resubmitted with slurm.time after running past its estimated limit

    @property
    def log(self) -> str:
        return str(self.out_pattern).replace("%j", self.slurm_id or "%j")

    @property
    def active(self) -> bool:
        return self.status in ("queued", "running")


def job_entry(t: Tracked, label: Callable[[str], str], pkg_status: Mapping[str, str]) -> dict:
    """One job as the record's ``jobs`` list holds it; ``label`` names a package by its
    hash, ``pkg_status`` says how far each package is."""
    return {
        "id": t.job.id,
        "slurm_id": t.slurm_id,
        "name": t.name,
        "status": t.status,
        "state": t.slurm_state,
        "reason": t.reason,
        "node": t.node,
        "attempt": t.attempt,
        "packages": [label(h) for h in t.job.hashes],
        "hashes": list(t.job.hashes),
        "package_status": {label(h): pkg_status.get(h, "queued") for h in t.job.hashes},
        "after": list(t.job.after),
        "order": dict(t.job.order),
        "hints": list(t.hints),
        "hints_dropped": list(t.hints_dropped),
        "cores": t.job.cores,
        "est_s": round(t.job.est_s, 1),
        "time": t.time,
        "log": t.log,
        "result": str(t.result),
        "script": str(t.script),
        "error": t.error,
        "history": t.history,
    }


def save_record(env_dir: Path, data: Mapping) -> None:
    """Replace ``<env_dir>/slurm-jobs.json`` with ``data`` (through a temporary file)."""
    write_atomic(Path(env_dir) / RECORD, json.dumps(data, indent=1) + "\n", mkdir=False)


def read_record(env_dir: Path) -> Optional[dict]:
    path = Path(env_dir) / RECORD
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: unreadable record of Slurm jobs ({exc})") from None
    return data if isinstance(data, dict) else None


def record_driver(record: Mapping) -> Optional[Owner]:
    """The dedal a record names as following its jobs (None in a record without one)."""
    try:
        return Owner.from_json(record["driver"])
    except (KeyError, TypeError, ValueError):
        return None
