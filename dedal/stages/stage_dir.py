"""A stage: a private directory in node-local memory (``stage_dir``, /dev/shm), always removed.

Builds and assemblies work in one. Each carries an owner record (host, boot, PID
namespace, pid, start time), so that the next stage made on a host removes those whose
dedal was killed outright (the OOM killer, Slurm's KillWait): in /dev/shm they would
hold the node's memory until someone did.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import List, Optional

from dedal.adapters import overlay
from dedal.errors import DedalError, UserError, signals_held
from dedal.model.artifacts import write_atomic
from dedal.model.mounts import mounted_under
from dedal.model.owner import GONE, Owner

STAGE_OWNER = ".dedal-owner"  # in each stage: which process made it (host, boot, PID namespace)


OVERLAY_TYPES = {"overlay": overlay.KERNEL, "fuse.fuse-overlayfs": overlay.FUSE}


def _unmount_overlays(stage: Path) -> bool:
    """Unmount the overlays an assembly killed outright left in its stage; True when
    nothing is mounted below ``stage`` any more. Any other mount stays (and so does the
    stage): removing files through it would reach outside the stage."""
    mounts = mounted_under(stage)
    if any(fstype not in OVERLAY_TYPES for _, fstype in mounts):
        return False
    for point, fstype in mounts:
        try:
            overlay.unmount(Path(point), OVERLAY_TYPES[fstype])
        except DedalError:
            return False
    return not mounted_under(stage)


def stale_stages(parent: Path) -> List[Path]:
    """Stages under ``parent`` whose dedal process is gone without removing them: killed
    by SIGKILL (the OOM killer, Slurm's KillWait, a job's cgroup killed with its batch
    script). In /dev/shm they hold the node's memory until someone removes them. Only
    stages this host made are judged (``stage_dir`` may be shared by nodes), and of those
    made since the last boot only the ones of this PID namespace (a container sharing the
    directory); a directory without a readable owner record (being created, or not
    dedal's) is left alone."""
    stale: List[Path] = []
    for d in sorted(Path(parent).glob("dedal-*")):
        owner = stage_owner(d)
        if owner is not None and owner.state() == GONE:
            stale.append(d)
    return stale


def stage_owner(stage: Path) -> Optional[Owner]:
    """The owner record of ``stage``; None where it has none that can be read (being
    created, or not dedal's)."""
    try:
        return Owner.from_json(json.loads((stage / STAGE_OWNER).read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None


class Stage:
    """A private directory in node-local memory, always removed; entering one also
    removes the stages of dedal processes on this host that were killed outright
    (:func:`stale_stages`, listed in ``reaped``), after unmounting the overlay an
    assembly may have left mounted in one (a stage with any other mount stays)."""

    def __init__(self, parent: Path, label: str) -> None:
        self.parent = Path(parent)
        self.label = label
        self.path: Optional[Path] = None
        self.reaped: List[Path] = []

    def __enter__(self) -> Path:
        try:
            self.parent.mkdir(parents=True, exist_ok=True)
            for old in stale_stages(self.parent):
                if _unmount_overlays(old):
                    remove_stage(old)
                    self.reaped.append(old)
            with signals_held():  # a stage exists only with its owner record
                self.path = Path(tempfile.mkdtemp(prefix=f"dedal-{self.label}-", dir=self.parent))
                write_atomic(self.path / STAGE_OWNER, json.dumps(Owner.me().to_json()) + "\n", mkdir=False)
        except OSError as exc:
            self.__exit__()
            raise UserError(f"stage directory {self.parent}: cannot create a stage ({exc.strerror})") from None
        except BaseException:  # scancel's SIGTERM (Interrupted) while the stage was being made
            self.__exit__()
            raise
        return self.path

    def __exit__(self, *exc: object) -> None:
        path, self.path = self.path, None
        if path is None:
            return
        # scancel signals every process of the job at once: the build tool may die of it
        # first, its failure end the job's work normally, and dedal's own SIGTERM come only
        # now; it waits for the removal (Interrupted after it), never breaks it off
        try:
            with signals_held():
                remove_stage(path)
        except BaseException:
            # Python runs a handler between two bytecodes: the first stop signal's Interrupted
            # can come before the hold is in place, the removal not begun. Signals acts on the
            # first signal only, so nothing breaks this one off (a removed stage: nothing to do)
            remove_stage(path)
            raise


def remove_stage(stage: Path) -> None:
    """Remove a stage, its owner record last: a removal cut short (SIGKILL after Slurm's
    KillWait) leaves a stage that the next one on this host still knows as stale."""
    try:
        entries = [e for e in os.scandir(stage) if e.name != STAGE_OWNER]
    except FileNotFoundError:
        return
    except OSError:
        entries = []
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass
    shutil.rmtree(stage, ignore_errors=True)
