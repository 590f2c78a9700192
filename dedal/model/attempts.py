"""One record per build attempt of an environment: ``<env dir>/builds/<start>-<pid>.json``.

The executors' own records describe the jobs of the build now in hand (the Slurm
executor's ``slurm-jobs.json`` is replaced by the next build that claims the
environment; the local executor's job results by the next build of the same package),
so after a failed attempt nothing said how the previous one ended. Each attempt gets a
file of its own, written when it starts (status ``running``) and when it ends, never
rewritten by a later attempt: ``dedal status`` reads the last attempt and the last
success from them. The newest ``KEEP`` attempts are kept.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from dedal.model.artifacts import write_atomic
from dedal.model.owner import GONE, Owner

ATTEMPTS_DIR = "builds"
KEEP = 50
ENDED = ("ok", "failed", "interrupted", "detached")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class BuildAttempt:
    """One build attempt: who ran it, when, how it ended, and its summary."""

    id: str
    executor: str
    started_at: str
    driver: Dict[str, Any]  # an Owner's JSON form: the dedal that ran it
    status: str = "running"  # running | ok | failed | interrupted | detached
    finished_at: str = ""
    seconds: float = 0.0
    error: str = ""  # what stopped it before its jobs could tell (planning, setup)
    summary: Dict[str, Any] = field(default_factory=dict)  # the BuildSummary's JSON form
    jobs: List[Dict[str, Any]] = field(default_factory=list)  # the Slurm record's jobs at its end

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "BuildAttempt":
        """Raises KeyError, TypeError or ValueError for a file that is not one."""
        return cls(
            id=str(data["id"]),
            executor=str(data["executor"]),
            started_at=str(data["started_at"]),
            driver=dict(data.get("driver") or {}),
            status=str(data.get("status") or "running"),
            finished_at=str(data.get("finished_at") or ""),
            seconds=float(data.get("seconds") or 0.0),
            error=str(data.get("error") or ""),
            summary=dict(data.get("summary") or {}),
            jobs=[dict(j) for j in data.get("jobs") or [] if isinstance(j, Mapping)],
        )

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def gone(self) -> bool:
        """A ``running`` attempt whose dedal is gone (killed outright): it never ended."""
        if self.status != "running":
            return False
        try:
            return Owner.from_json(self.driver).state() == GONE
        except (KeyError, TypeError, ValueError):
            return False

    def state(self) -> str:
        """The status as a reader wants it: ``running`` only while its dedal is (or may be) alive."""
        return "abandoned" if self.gone() else self.status


class Attempts:
    """The attempt records of one environment directory."""

    def __init__(self, env_dir: Path) -> None:
        self.dir = Path(env_dir) / ATTEMPTS_DIR

    def start(self, executor: str) -> BuildAttempt:
        me = Owner.me()
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        attempt = BuildAttempt(id=f"{stamp}-{me.pid}", executor=executor, started_at=_now(), driver=me.to_json())
        self.save(attempt)
        self._prune()
        return attempt

    def finish(
        self,
        attempt: BuildAttempt,
        status: str,
        *,
        seconds: float,
        summary: Optional[Mapping] = None,
        error: str = "",
        jobs: Optional[List[Dict[str, Any]]] = None,
    ) -> None:
        attempt.status = status
        attempt.finished_at = _now()
        attempt.seconds = round(seconds, 3)
        attempt.summary = dict(summary or {})
        attempt.error = error
        attempt.jobs = list(jobs or [])
        self.save(attempt)

    def discard(self, attempt: BuildAttempt) -> None:
        """Forget an attempt that was refused before it built anything."""
        (self.dir / f"{attempt.id}.json").unlink(missing_ok=True)

    def save(self, attempt: BuildAttempt) -> None:
        """Write (through a temporary file) the attempt's own file, and no other."""
        write_atomic(self.dir / f"{attempt.id}.json", json.dumps(attempt.to_json(), indent=1) + "\n")

    def all(self) -> List[BuildAttempt]:
        """Every readable attempt, oldest first (unreadable files are skipped: a record,
        not an input)."""
        found = []
        for path in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []:
            try:
                found.append(BuildAttempt.from_json(json.loads(path.read_text())))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        found.sort(key=lambda a: (a.started_at, a.id))
        return found

    def last(self) -> Optional[BuildAttempt]:
        found = self.all()
        return found[-1] if found else None

    def last_success(self) -> Optional[BuildAttempt]:
        return next((a for a in reversed(self.all()) if a.ok), None)

    def _prune(self) -> None:
        files = sorted(self.dir.glob("*.json"))
        for old in files[: max(0, len(files) - KEEP)]:
            try:
                old.unlink()
            except OSError:
                pass


def age_text(stamp: str) -> str:
    """How long ago an ISO date was, for a status line ("3 min ago")."""
    try:
        then = datetime.fromisoformat(stamp)
    except ValueError:
        return ""
    if then.tzinfo is None:
        then = then.replace(tzinfo=timezone.utc)
    s = max(0.0, time.time() - then.timestamp())
    if s < 90:
        return f"{s:.0f} s ago"
    if s < 5400:
        return f"{s / 60:.0f} min ago"
    if s < 172800:
        return f"{s / 3600:.0f} h ago"
    return f"{s / 86400:.0f} days ago"
