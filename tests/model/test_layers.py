"""The layer store: atomic adds, concurrent builders of one key, verify, gc, the CLI."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from dedal.adapters import squashfs
from dedal.model.layers import LAYER_FORMAT, TMP_GRACE_S, LayerManifest, LayerStore, layer_key


def _manifest(key: str, name: str = "zlib") -> LayerManifest:
    return LayerManifest(
        key=key,
        name=name,
        version="1.3",
        hash="a" * 32,
        namespace="builtin",
        prefix=f"{name}-1.3-{'a' * 32}",
        install_root="/opt/esd/software",
        base_id="b",
    )


def _pack(tmp: Path, store: LayerStore, key: str, payload: str) -> Path:
    prefix = tmp / f"src-{payload}" / f"zlib-1.3-{'a' * 32}"
    (prefix / "lib").mkdir(parents=True, exist_ok=True)
    (prefix / "lib" / "libz.so").write_text(payload)
    out = store.temp_path(key)
    squashfs.pack([prefix], out, keep_as_directory=True)
    return out


def test_key_covers_hash_install_root_and_base():
    k = layer_key("zlib", "1.3", "a" * 32, "/opt/esd/software", "debian-trixie-1")
    assert k.startswith("zlib-1.3-aaaaaaa-")
    assert k != layer_key("zlib", "1.3", "b" * 32, "/opt/esd/software", "debian-trixie-1")
    assert k != layer_key("zlib", "1.3", "a" * 32, "/opt/other", "debian-trixie-1")
    assert k != layer_key("zlib", "1.3", "a" * 32, "/opt/esd/software", "debian-trixie-2")
    assert "/" not in layer_key("x", "git.abc/def=main", "a" * 32, "/r", "b")


def test_add_is_whole_and_second_builder_keeps_the_first(tmp_path):
    store = LayerStore(tmp_path / "store")
    key = "zlib-1.3-aaaaaaa-0000"
    first = store.add(_manifest(key), _pack(tmp_path, store, key, "one"))
    assert store.has(key) and first.sha256 and first.size == store.sqfs(key).stat().st_size
    again = store.add(_manifest(key), _pack(tmp_path, store, key, "two"))
    assert again.sha256 == first.sha256  # same key, same content: the first copy stays
    assert list(store.tmp_dir.iterdir()) == [] and store.verify().clean


def _race(args):
    root, tmp, key, payload = args
    store = LayerStore(Path(root))
    packed = _pack(Path(tmp), store, key, payload)
    return store.add(_manifest(key), packed).sha256


def test_concurrent_builders_of_one_key_do_not_corrupt(tmp_path):
    store = LayerStore(tmp_path / "store")
    key = "zlib-1.3-aaaaaaa-race"
    with multiprocessing.get_context("fork").Pool(4) as pool:
        digests = pool.map(_race, [(str(store.root), str(tmp_path / f"w{i}"), key, f"p{i}") for i in range(8)])
    assert len(set(digests)) == 1, "every builder sees the one layer that won"
    check = store.verify()
    assert check.clean and check.ok == [key]


def test_verify_reports_corrupt_and_orphaned(tmp_path):
    store = LayerStore(tmp_path / "store")
    for i in range(3):
        key = f"zlib-1.3-aaaaaaa-{i}"
        store.add(_manifest(key), _pack(tmp_path, store, key, f"x{i}"))
    with open(store.sqfs("zlib-1.3-aaaaaaa-0"), "r+b") as fh:  # flip a byte
        fh.seek(100)
        b = fh.read(1)
        fh.seek(100)
        fh.write(bytes([b[0] ^ 0xFF]))
    store.manifest_path("zlib-1.3-aaaaaaa-1").unlink()  # squashfs without manifest
    (store.tmp_dir / "half.sqfs").write_bytes(b"partial")  # leftover of a killed writer
    check = store.verify()
    assert check.corrupt == ["zlib-1.3-aaaaaaa-0: sha256 mismatch"]
    assert "zlib-1.3-aaaaaaa-1.sqfs: squashfs without manifest" in check.orphaned
    assert ".tmp/half.sqfs: leftover temporary file" in check.orphaned
    assert check.ok == ["zlib-1.3-aaaaaaa-2"] and not check.clean
    assert store.keys() == ["zlib-1.3-aaaaaaa-0", "zlib-1.3-aaaaaaa-2"]  # a layer without manifest does not exist


def test_gc_keeps_referenced_and_young_temporaries(tmp_path):
    store = LayerStore(tmp_path / "store")
    for i in range(3):
        key = f"zlib-1.3-aaaaaaa-{i}"
        store.add(_manifest(key), _pack(tmp_path, store, key, f"x{i}"))
    young = store.tmp_dir / "building.sqfs"
    young.write_bytes(b"in progress")
    old = store.tmp_dir / "stale.sqfs"
    old.write_bytes(b"old")
    past = time.time() - TMP_GRACE_S - 60
    os.utime(old, (past, past))
    dry = store.gc({"zlib-1.3-aaaaaaa-0"}, dry_run=True)
    assert set(dry) == {"zlib-1.3-aaaaaaa-1", "zlib-1.3-aaaaaaa-2", ".tmp/stale.sqfs"}
    assert len(store.keys()) == 3 and old.exists()
    assert set(store.gc({"zlib-1.3-aaaaaaa-0"})) == set(dry)
    assert store.keys() == ["zlib-1.3-aaaaaaa-0"] and young.exists() and not old.exists()


def test_layers_cli(run_dedal, tmp_path):
    store = LayerStore(tmp_path / "store")
    key = "zlib-1.3-aaaaaaa-cli"
    store.add(_manifest(key), _pack(tmp_path, store, key, "cli"))
    env = {"DEDAL_LAYER_STORE": str(store.root), "DEDAL_DATA_DIR": str(tmp_path / "data")}
    listed = json.loads(run_dedal("layers", "list", "--json", env=env).stdout)
    assert [m["key"] for m in listed] == [key]
    shown = json.loads(run_dedal("layers", "show", "zlib-1.3", "--json", env=env).stdout)
    assert shown["name"] == "zlib" and shown["sha256"] == listed[0]["sha256"]
    missing = run_dedal("layers", "show", "nope", env=env)
    assert missing.returncode == 2 and "matches 0 layers" in missing.stderr
    assert run_dedal("layers", "verify", env=env).returncode == 0
    store.sqfs(key).write_bytes(b"broken")
    bad = run_dedal("layers", "verify", "--json", env=env)
    assert bad.returncode == 1 and json.loads(bad.stdout)["corrupt"]
    gone = json.loads(run_dedal("layers", "gc", "--dry-run", "--json", env=env).stdout)
    assert gone == {"removed": [key], "dry_run": True} and store.has(key)
    assert run_dedal("layers", "gc", env=env).returncode == 0 and not store.has(key)


def test_build_records_beside_the_layer(tmp_path):
    """Spack's build records move in with the layer, go with it, and an orphan is collected."""
    store = LayerStore(tmp_path / "store")
    key = "zlib-1.3-aaaaaaa-0001"
    records = tmp_path / "stage" / "records"
    (records / "archived-files").mkdir(parents=True)
    (records / "spack-build-out.txt.gz").write_bytes(b"log")
    (records / "archived-files" / "config.log").write_text("x")
    man = store.add(_manifest(key), _pack(tmp_path, store, key, "one"), records)
    assert man.records == ["archived-files", "spack-build-out.txt.gz"] and not records.exists()
    assert (store.records_dir(key) / "spack-build-out.txt.gz").read_bytes() == b"log"
    assert store.manifest(key).records == man.records and store.verify().clean
    loser = tmp_path / "stage" / "loser"
    loser.mkdir()
    (loser / "install_times.json").write_text("{}")
    store.add(_manifest(key), _pack(tmp_path, store, key, "two"), loser)  # the key is there: ours are dropped
    assert sorted(os.listdir(store.records_dir(key))) == man.records
    store.remove(key)
    assert not store.records_dir(key).exists()
    orphan = store.records_dir("gone-1.0-bbbbbbb-0002")
    orphan.mkdir()
    assert store.gc(set(), dry_run=True) == [orphan.name] and orphan.exists()
    assert store.gc(set()) == [orphan.name] and not orphan.exists()


@pytest.mark.parametrize(
    "dag_hash, root, base",
    [
        ("a" * 32, "/opt/esd/software", "debian-trixie-1"),
        ("b" * 32, '/opt/\u00e9t\u00e9 "quoted"\\path', "base with \u2603 and \\"),
        ("c" * 32, "/r", None),
    ],
)
def test_layer_key_digest_is_that_of_the_json_payload(dag_hash, root, base):
    """layer_key() spells the payload out for speed: the digest stays that of json.dumps."""
    payload = json.dumps({"format": LAYER_FORMAT, "hash": dag_hash, "install_root": root, "base": base}, sort_keys=True)
    digest = hashlib.sha256(payload.encode()).hexdigest()[:16]
    assert layer_key("zlib", "1.3", dag_hash, root, base).endswith("-" + digest)


def test_current_is_none_for_a_whole_layer_else_says_what_is_missing(tmp_path: Path) -> None:
    store = LayerStore(tmp_path)
    assert "no layer k-1" in store.current("k-1") and not store.has("k-1")
    store.manifest_path("k-1").write_text("{}")
    assert "has no squashfs" in store.current("k-1") and not store.has("k-1")
    store.sqfs("k-1").write_bytes(b"sqsh")
    assert store.current("k-1") is None and store.has("k-1")
