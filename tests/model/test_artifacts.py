"""The one way an artifact is written (whole or not at all), its temporaries' one name
form and their reaper, and the one file digest (issue 40)."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dedal.model import artifacts
from dedal.model.owner import ALIVE, GONE, UNKNOWN


def _leftovers(directory: Path) -> list:
    return sorted(p.name for p in directory.iterdir() if artifacts.TMP_MARK in p.name)


def test_write_atomic_replaces_whole_and_keeps_no_temporary(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "plan.json"
    artifacts.write_atomic(out, "old\n")
    artifacts.write_atomic(out, b"new bytes", mode=0o640, fsync=True)
    assert out.read_bytes() == b"new bytes" and (out.stat().st_mode & 0o777) == 0o640
    assert _leftovers(out.parent) == []


def test_write_atomic_keeps_the_old_file_and_no_temporary_on_failure(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "report.json"
    out.write_text("old")

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(artifacts.os, "replace", refuse)
    with pytest.raises(OSError):
        artifacts.write_atomic(out, "new")
    assert out.read_text() == "old" and _leftovers(tmp_path) == []


def test_atomic_path_of_a_directory_is_removed_when_the_block_raises(tmp_path: Path) -> None:
    final = tmp_path / "tree"
    with pytest.raises(RuntimeError):
        with artifacts.atomic_path(final) as tmp:
            (tmp / "a").mkdir(parents=True)
            raise RuntimeError("half done")
    assert not final.exists() and list(tmp_path.iterdir()) == []
    final.mkdir()
    (final / "stale").write_text("x")
    with artifacts.atomic_path(final) as tmp:
        tmp.mkdir()
        (tmp / "fresh").write_text("y")
    assert sorted(os.listdir(final)) == ["fresh"] and _leftovers(tmp_path) == []


def test_the_reaper_removes_a_dead_writers_temporary_not_a_live_ones(tmp_path: Path) -> None:
    final = tmp_path / "latest.sif"
    code = (
        "import sys; from pathlib import Path; from dedal.model.artifacts import temp_path; "
        "p = temp_path(Path(sys.argv[1]), '.sqfs'); p.write_bytes(b'half'); print(p)"
    )
    dead = Path(
        subprocess.run(
            [sys.executable, "-c", code, str(final)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        ).stdout.strip()
    )
    live = artifacts.temp_path(final, ".sif")
    live.write_bytes(b"being written")
    parts = live.name.split("~")
    parts[1] = "some-other-node"
    foreign = tmp_path / "~".join(parts)
    foreign.write_bytes(b"another node's")
    unnamed = tmp_path / ".latest.sif.tmp-12345"  # an older dedal's name: no owner
    unnamed.write_bytes(b"?")
    other = artifacts.temp_path(tmp_path / "other.sif")
    assert artifacts.temp_state(dead.name) == GONE and artifacts.temp_state(live.name) == ALIVE
    assert artifacts.temp_state(foreign.name) == UNKNOWN and artifacts.temp_state(unnamed.name) == UNKNOWN
    assert artifacts.is_temporary(live.name) and not artifacts.is_temporary(unnamed.name)
    assert artifacts.reap_temporaries(tmp_path, of="other.sif") == []
    assert artifacts.reap_temporaries(tmp_path, of="latest.sif") == [dead.name]
    assert not dead.exists() and live.exists() and foreign.exists() and unnamed.exists() and not other.exists()
    assert artifacts.reap_temporaries(tmp_path) == []


def test_temporaries_of_one_final_name_are_distinct_and_beside_it(tmp_path: Path) -> None:
    final = tmp_path / ("x" * 200 + ".json")
    a, b = artifacts.temp_path(final), artifacts.temp_path(final)
    assert a != b and a.parent == tmp_path and len(a.name) < 255 and a.name.startswith(".xxx")


@pytest.mark.parametrize("size", [0, 1, (1 << 20) + 7])
def test_sha256_file_matches_hashlib(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    f = tmp_path / "blob"
    f.write_bytes(data)
    assert artifacts.sha256_file(f) == hashlib.sha256(data).hexdigest()
    assert artifacts.sha256_file(f, chunk=4096) == hashlib.sha256(data).hexdigest()
    assert (
        artifacts.sha256_file(f, start=size // 3, size=size // 2)
        == hashlib.sha256(data[size // 3 : size // 3 + size // 2]).hexdigest()
    )


def test_inputs_digest_ignores_key_order() -> None:
    assert artifacts.inputs_digest({"a": 1, "b": [2]}) == artifacts.inputs_digest({"b": [2], "a": 1})
    assert artifacts.inputs_digest([1, "x"], length=12) == hashlib.sha256(b'[1, "x"]').hexdigest()[:12]


HOLD_LOCK = (
    "import sys, time; from pathlib import Path; from dedal.model.artifacts import exclusive\n"
    "with exclusive(Path(sys.argv[1]), 'the thing'):\n"
    "    print('held', flush=True); time.sleep(300)\n"
)


def test_exclusive_makes_a_second_process_wait_for_the_first_and_says_for_whom(tmp_path: Path) -> None:
    """Two build-image runs of one environment, two verifications into one report directory:
    the second waits for the first and says who it waits for; a holder killed outright (kill
    -9) leaves no stale lock."""
    guarded = tmp_path / "work" / "demo"
    lock = tmp_path / "work" / ".demo.lock"  # beside it: a report directory is replaced whole
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(guarded)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        said: list = []
        waited = threading.Event()

        def second() -> None:
            with artifacts.exclusive(guarded, "environment demo", said.append):
                waited.set()

        t = threading.Thread(target=second, daemon=True)
        t.start()
        assert not waited.wait(1.0), "the second got the lock while the first held it"
        assert said == [
            f"waiting: dedal pid {holder.pid} on {socket.gethostname()} is working on environment demo (lock {lock})"
        ]
        holder.kill()  # SIGKILL: no clean-up runs; the kernel drops the lock
        holder.wait()
        assert waited.wait(10.0), "the lock of a killed holder was not released"
        t.join(10)
    finally:
        holder.kill()
        holder.wait()
    assert lock.read_text() == f"dedal pid {os.getpid()} on {socket.gethostname()}\n"  # the last holder's name
