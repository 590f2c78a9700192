"""Temporaries of the layer store name their owner: those of a killed process are known
as such, removed by the next build, and do not make `layers verify` fail while a live
build writes its own (issue 22, item 7)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dedal.model.layers import LayerStore, temp_owner
from dedal.model.owner import ALIVE, GONE, UNKNOWN

pytestmark = pytest.mark.reliability

WRITER = """
import sys, time
from dedal.model.layers import LayerStore
path = LayerStore(sys.argv[1]).temp_path("zlib-1.3-aaaaaaa-0123")
path.write_bytes(b"half a squashfs")
print(path, flush=True)
time.sleep(600)
"""


def _killed_writer(store: LayerStore) -> Path:
    """A process that starts writing a layer and is killed with SIGKILL (as in mksquashfs)."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(store.root)], stdout=subprocess.PIPE, text=True)
    try:
        path = Path(proc.stdout.readline().strip())  # type: ignore[union-attr]
        assert temp_owner(path.name) == ALIVE
        assert store.verify().clean, "a live build's temporary is not an orphan"
        assert store.gc(set(), dry_run=True) == [] and store.reap_temporaries() == [], "nor removed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    return path


def test_a_killed_writers_temporary_is_reaped(tmp_path: Path) -> None:
    store = LayerStore(tmp_path / "store")
    dead = _killed_writer(store)
    assert dead.exists() and temp_owner(dead.name) == GONE
    mine = store.temp_path("mine-1-bbbbbbb-0")
    mine.write_bytes(b"in progress")
    foreign = store.tmp_dir / "old-style.12345.678.sqfs"  # no owner in its name
    foreign.write_bytes(b"?")
    check = store.verify()
    assert not check.clean  # the unnamed one: nobody can tell whose it is
    assert check.orphaned == [".tmp/old-style.12345.678.sqfs: leftover temporary file"]
    assert check.temporaries == [
        f".tmp/{dead.name}: left by a dedal process that is gone (killed); the next build "
        "or `dedal layers gc` removes it"
    ]
    assert store.reap_temporaries() == [dead.name]
    assert not dead.exists() and mine.exists() and foreign.exists()
    assert temp_owner(foreign.name) == UNKNOWN


def test_a_dead_owners_temporary_alone_leaves_the_store_clean(tmp_path: Path) -> None:
    """kill -9 of the whole tree during mksquashfs: the store is whole (the layer does not
    exist: its manifest was never written), so verify says so and exits 0 (issue 39, item 4)."""
    store = LayerStore(tmp_path / "store")
    dead = _killed_writer(store)
    check = store.verify()
    assert check.clean and check.orphaned == [] and len(check.temporaries) == 1
    assert check.to_json()["temporaries"] == check.temporaries and dead.exists()


def test_gc_removes_a_dead_owners_temporary_at_once(tmp_path: Path) -> None:
    store = LayerStore(tmp_path / "store")
    dead = _killed_writer(store)
    assert store.gc(set()) == [f".tmp/{dead.name}"] and not dead.exists()


def test_another_hosts_temporary_is_left_alone(tmp_path: Path) -> None:
    store = LayerStore(tmp_path / "store")
    mine = store.temp_path("k-1-ccccccc-0")
    parts = mine.name.split("~")
    parts[1] = "some-other-node"
    other = store.tmp_dir / "~".join(parts)
    other.write_bytes(b"x")
    assert temp_owner(other.name) == UNKNOWN and store.reap_temporaries() == [] and other.exists()
    check = store.verify()  # another node's build may be writing it: no fault, but said
    assert check.clean and len(check.temporaries) == 1 and "on another host" in check.temporaries[0]
