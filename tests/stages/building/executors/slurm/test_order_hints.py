"""The Slurm executor's order hints (``slurm.order_hints``): which hints a job is
submitted with and when they are dropped. Pure Python with a recording client; the
real ``afterany`` / ``scontrol update`` behaviour is tested against the test cluster in
tests/adapters/slurm/test_cluster.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Tuple

from dedal.stages.building.executors.slurm import Tracked
from dedal.stages.building.executors.slurm.run import _Build
from dedal.schedule import Job


class RecordingSlurm:
    """Plays ``set_dependencies``: records each call; jobs in ``started`` have left the queue."""

    def __init__(self, started=()) -> None:
        self.calls: List[Tuple[str, List[str], List[str]]] = []
        self.started = set(started)

    def set_dependencies(self, job_id, dependencies=(), after_any=()) -> bool:
        self.calls.append((job_id, list(dependencies), list(after_any)))
        return job_id not in self.started


def build_with(jobs: List[Tuple[Job, str, str, List[str]]], elapsed: float, client: RecordingSlurm) -> _Build:
    """An executor state after ``elapsed`` seconds: (job, slurm id, status, live hints) each."""
    b = _Build.__new__(_Build)
    b.client = client
    b.submitted = time.monotonic() - elapsed
    b.tracked, b.order = {}, []
    for job, slurm_id, status, hints in jobs:
        b.tracked[job.id] = Tracked(
            job=job,
            name=job.id,
            script=Path("/nonexistent"),
            result=Path("/nonexistent"),
            out_pattern=Path("/nonexistent"),
            slurm_id=slurm_id,
            status=status,
            hints=list(hints),
        )
        b.order.append(job.id)
    return b


def test_hints_dropped_when_their_time_passed() -> None:
    client = RecordingSlurm(started={"17"})
    b = build_with(
        [
            (Job(id="a", hashes=["a"]), "11", "running", []),
            (Job(id="done", hashes=["x"]), "10", "done", []),
            # a's planned end (10 s) passed while a still runs: drop, nothing else to wait for
            (Job(id="b", hashes=["b"], order={"a": 10.0}), "12", "queued", ["a"]),
            # still within the plan: untouched
            (Job(id="c", hashes=["c"], order={"a": 100.0}), "13", "queued", ["a"]),
            # the hinted job ended: Slurm counts the afterany as met, no call needed
            (Job(id="d", hashes=["d"], order={"done": 5.0}), "14", "queued", ["done"]),
            # an expired hint beside a live one and an afterok that must stay
            (Job(id="e", hashes=["e"], after=["a"], order={"a2": 5.0, "c": 100.0}), "15", "queued", ["a2", "c"]),
            (Job(id="a2", hashes=["a2"]), "16", "running", []),
            # started between the poll and the update: scontrol refuses, nothing to change
            (Job(id="f", hashes=["f"], order={"a": 1.0}), "17", "queued", ["a"]),
            # running jobs are left alone
            (Job(id="g", hashes=["g"], order={"a": 1.0}), "18", "running", ["a"]),
        ],
        elapsed=30.0,
        client=client,
    )
    assert b.expire_hints() is True
    assert client.calls == [("12", [], []), ("15", ["11"], ["13"]), ("17", [], [])]
    hints = {jid: t.hints for jid, t in b.tracked.items()}
    assert hints["b"] == [] and hints["c"] == ["a"] and hints["d"] == [] and hints["e"] == ["c"]
    assert hints["f"] == ["a"] and hints["g"] == ["a"]
    # the next poll: f has started meanwhile (its status follows from squeue), nothing left to do
    b.tracked["f"].status = "running"
    client.calls.clear()
    assert b.expire_hints() is False and client.calls == []


def test_live_hints_at_submission() -> None:
    """A job is submitted with only the hints that can still matter."""
    b = build_with(
        [
            (Job(id="a", hashes=["a"]), "11", "queued", []),
            (Job(id="old", hashes=["o"]), "9", "done", []),
            (Job(id="lost", hashes=["l"]), "", "resubmitting", []),
        ],
        elapsed=50.0,
        client=RecordingSlurm(),
    )
    job = Job(id="n", hashes=["n"], order={"a": 60.0, "old": 60.0, "lost": 60.0, "unknown": 60.0})
    assert b.live_hints(job, list(job.order)) == ["a"]
    assert b.live_hints(Job(id="m", hashes=["m"], order={"a": 40.0}), ["a"]) == []
