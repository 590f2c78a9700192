"""What both executors share: the node-build command line, priorities, the summary."""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set

from dedal.errors import Interrupted
from dedal.model.config import Settings
from dedal.model.plan import Plan

# settings a node build needs; passed explicitly so a job sees what the submitter saw
NODE_SETTINGS = (
    "layer_store",
    "mirror",
    "stage_dir",
    "cache_dir",
    "base_cache",
    "runtime",
    "build_jobs",
    "debian_mirror",
    "spack_ref",
)


def node_build_command(
    settings: Settings,
    plan_path: Path,
    job_id: str,
    hashes: Sequence[str],
    result: Path,
    log_dir: Path,
    python: str = sys.executable,
) -> List[str]:
    cmd = [python, "-m", "dedal"]
    for key in NODE_SETTINGS:
        value = settings.get(key)
        if value not in (None, ""):
            cmd += ["-s", f"{key}={value}"]
    if settings.spack_root:
        cmd += ["-s", f"spack_root={settings.spack_root}"]
    cmd += [
        "node-build",
        str(plan_path),
        "--job",
        job_id,
        "--hashes",
        ",".join(hashes),
        "--result",
        str(result),
        "--log-dir",
        str(log_dir),
    ]
    return cmd


def bottom_levels(plan: Plan) -> Dict[str, float]:
    """Longest estimated path from each package to the end of the build: the
    critical-path-first priority (larger first)."""
    dependents = plan.dependents()
    level: Dict[str, float] = {}
    for h in reversed(plan.to_build):  # plan.to_build is dependencies-first
        level[h] = plan.nodes[h].estimate_s + max((level[d] for d in dependents[h] if d in level), default=0.0)
    return level


def remaining_s(plan: Plan, unfinished: Set[str], running_for: Dict[str, float], slots: int) -> float:
    """Seconds until the packages ``unfinished`` are built, from the plan's estimates: the
    longer of the critical path through them and their work spread over ``slots``
    parallel builds (``running_for``: seconds each running one has run so far). What the
    live display shows as the ETA of a local build."""
    dependents = plan.dependents()
    left = {h: max(0.0, plan.nodes[h].estimate_s - running_for.get(h, 0.0)) for h in unfinished}
    level: Dict[str, float] = {}
    for h in reversed(plan.to_build):  # dependencies first: reversed, dependents are done before
        if h in left:
            level[h] = left[h] + max((level[d] for d in dependents.get(h, ()) if d in level), default=0.0)
    return max(max(level.values(), default=0.0), sum(left.values()) / max(1, slots))


def blocked_by_failure(plan: Plan, failed: Set[str]) -> Set[str]:
    """Every to-build package that needs (transitively) one of ``failed``."""
    dependents = plan.dependents()
    blocked: Set[str] = set()
    stack = list(failed)
    while stack:
        h = stack.pop()
        for d in dependents.get(h, ()):
            if d not in blocked:
                blocked.add(d)
                stack.append(d)
    return blocked


@dataclass
class BuildSummary:
    env: str
    executor: str
    built: List[str] = field(default_factory=list)
    reused: List[str] = field(default_factory=list)
    failed: Dict[str, str] = field(default_factory=dict)  # label -> error line
    blocked: List[str] = field(default_factory=list)
    logs: Dict[str, str] = field(default_factory=dict)  # label -> log path
    seconds: float = 0.0
    jobs: int = 0
    adopted: int = 0  # Slurm jobs of an earlier build whose dedal was gone, followed to their end
    detached: bool = False  # Slurm jobs left queued and running for a later dedal build to follow
    stop_signal: str = ""  # the signal that interrupted it: SIGINT (Ctrl-C), SIGTERM (scancel), SIGHUP
    cache: Dict[str, object] = field(default_factory=dict)  # the layer cache's report (pulled, pushed, problems)

    @property
    def interrupted(self) -> bool:
        return bool(self.stop_signal)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.blocked and not self.interrupted

    def interruption(self) -> Optional[Interrupted]:
        """What the command raises once the summary is shown, when a signal stopped the
        build: its one line and the exit code of that signal (130 for Ctrl-C)."""
        return Interrupted.by(signal.Signals[self.stop_signal], "build") if self.stop_signal else None

    def to_json(self) -> dict:
        data = asdict(self)
        data["interrupted"] = self.interrupted
        data["ok"] = self.ok
        return data


def read_result(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
