"""Build attempt records: one file each, never rewritten by a later attempt."""

from __future__ import annotations

import json

from dedal.model import attempts as at


def test_each_attempt_keeps_its_own_file(tmp_path):
    records = at.Attempts(tmp_path)
    first = records.start("local")
    records.finish(first, "ok", seconds=3.0, summary={"built": ["a@1/abc"]})
    second = records.start("slurm")
    records.finish(second, "failed", seconds=1.0, error="sinfo: no configuration", jobs=[{"id": "j1"}])
    assert first.id != second.id
    files = sorted((tmp_path / "builds").glob("*.json"))
    assert len(files) == 2
    assert json.loads((tmp_path / "builds" / f"{first.id}.json").read_text())["status"] == "ok"
    assert records.last().id == second.id and records.last().error == "sinfo: no configuration"
    assert records.last().jobs == [{"id": "j1"}]
    assert records.last_success().id == first.id and records.last_success().summary == {"built": ["a@1/abc"]}


def test_a_running_attempt_of_a_dedal_that_is_gone_reads_abandoned(tmp_path):
    records = at.Attempts(tmp_path)
    mine = records.start("local")
    assert records.last().state() == "running"
    dead = dict(mine.driver, pid=2**22 + 7, start=1)  # no such process
    records.save(
        at.BuildAttempt(id="20000101T000000Z-1", executor="local", started_at="2000-01-01T00:00:00+00:00", driver=dead)
    )
    old = next(a for a in records.all() if a.id == "20000101T000000Z-1")
    assert old.state() == "abandoned" and records.last().id == mine.id


def test_unreadable_records_are_skipped_and_old_ones_pruned(tmp_path, monkeypatch):
    monkeypatch.setattr(at, "KEEP", 3)
    records = at.Attempts(tmp_path)
    (tmp_path / "builds").mkdir()
    (tmp_path / "builds" / "00000000T000000Z-0.json").write_text("{not json")
    for i in range(4):
        records.save(
            at.BuildAttempt(
                id=f"2026010{i}T000000Z-1",
                executor="local",
                started_at=f"2026-01-0{i + 1}T00:00:00+00:00",
                driver={},
                status="ok",
            )
        )
    assert [a.id for a in records.all()] == [f"2026010{i}T000000Z-1" for i in range(4)]
    records.start("local")
    assert len(list((tmp_path / "builds").glob("*.json"))) == 3
    assert records.last_success().id == "20260103T000000Z-1"


def test_discarded_attempt_leaves_nothing(tmp_path):
    records = at.Attempts(tmp_path)
    records.discard(records.start("slurm"))
    assert records.all() == [] and records.last_success() is None
