"""A build job checks every dependency layer before unpacking it and unpacks it so that no
earlier layer can redirect it (issue 22, item 1): a squashfs swapped behind its manifest
and a layer holding a symlink where the next package's prefix goes are both refused
before anything is built, and nothing lands outside the stage."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dedal.model.artifacts import sha256_file
from dedal.model.layers import LayerStore
from tests.fixtures.tiny import make_env

pytestmark = pytest.mark.reliability


@pytest.fixture
def built(tmp_path: Path, run_dedal):
    if os.geteuid() != 0:
        pytest.skip("needs root (mount namespaces for the fixed install root)")
    tiny = make_env(tmp_path)
    res = run_dedal("build", str(tiny.env_file), "--json", env=tiny.env, timeout=300)
    assert res.returncode == 0, res.stderr
    return tiny


def _layers(tiny) -> dict:
    store = LayerStore(tiny.store)
    return {m.name: m for m in store.manifests()}


def _rebuild_app(run_dedal, tiny):
    """Remove the root package's layer and build again: its job unpacks the others."""
    LayerStore(tiny.store).remove(_layers(tiny)["dedal-app"].key)
    return run_dedal("build", str(tiny.env_file), "--json", env=tiny.env, timeout=300)


def _resign(store: LayerStore, key: str) -> None:
    """What someone with write access to the store can do: make the manifest match."""
    path = store.manifest_path(key)
    data = json.loads(path.read_text())
    data["sha256"], data["size"] = sha256_file(store.sqfs(key)), store.sqfs(key).stat().st_size
    path.write_text(json.dumps(data))


def _failure(res) -> str:
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.returncode != 0, res.stdout
    return res.stderr + res.stdout


def test_a_squashfs_swapped_behind_its_manifest_is_not_unpacked(built, run_dedal) -> None:
    layers = _layers(built)
    store = LayerStore(built.store)
    shutil.copyfile(store.sqfs(layers["dedal-tool"].key), store.sqfs(layers["libdedal"].key))
    res = _rebuild_app(run_dedal, built)
    text = _failure(res)
    assert "corrupt: sha256" in text and layers["libdedal"].key in text
    assert "dedal-app" not in _layers(built), "nothing built on a corrupt dependency"


def test_a_symlink_at_the_next_prefix_cannot_send_files_outside_the_stage(built, run_dedal, tmp_path) -> None:
    layers = _layers(built)
    store = LayerStore(built.store)
    dep, app = layers["libdedal"], layers["dedal-app"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    src = tmp_path / "evil"
    subprocess.run(
        ["unsquashfs", "-q", "-n", "-d", str(src), str(store.sqfs(dep.key))], check=True, capture_output=True
    )
    os.symlink(elsewhere, src / app.prefix)  # the prefix dedal-app will be installed into
    os.unlink(store.sqfs(dep.key))
    subprocess.run(
        [
            "mksquashfs",
            str(src / dep.prefix),
            str(src / app.prefix),
            str(store.sqfs(dep.key)),
            "-noappend",
            "-all-root",
            "-quiet",
            "-no-progress",
        ],
        check=True,
        capture_output=True,
    )
    _resign(store, dep.key)
    res = _rebuild_app(run_dedal, built)
    text = _failure(res)
    assert f"refused: path '{app.prefix}' is outside its prefix {dep.prefix}/" in text
    assert list(elsewhere.iterdir()) == [], "nothing written through the symlink"
    assert "dedal-app" not in _layers(built)
    assert sorted(os.listdir(built.stage)) == [], "the stage is removed"


def test_the_next_build_removes_a_killed_builds_temporaries(built, run_dedal, tmp_path) -> None:
    """kill -9 during mksquashfs leaves .tmp/<key>~<owner>...sqfs; `layers verify` calls it
    a leftover of a process that is gone, no fault of the store (exit 0: issue 39, item 4),
    and the next build removes it."""
    store = LayerStore(built.store)
    writer = (
        "import sys, time; from dedal.model.layers import LayerStore; "
        "p = LayerStore(sys.argv[1]).temp_path('dedal-app-1.0-jqiwi5f-0'); p.write_bytes(b'half'); "
        "print(p, flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", writer, str(store.root)], stdout=subprocess.PIPE, text=True)
    dead = Path(proc.stdout.readline().strip())  # type: ignore[union-attr]
    proc.kill()
    proc.wait(timeout=30)
    check = run_dedal("layers", "verify", "--json", env=built.env)
    assert check.returncode == 0 and any("gone" in o for o in json.loads(check.stdout)["temporaries"])
    plain = run_dedal("layers", "verify", env=built.env)
    assert plain.returncode == 0 and f"TEMP     .tmp/{dead.name}: left by a dedal process that is gone" in plain.stdout
    again = run_dedal("build", str(built.env_file), "--json", env=built.env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert not dead.exists()
    assert run_dedal("layers", "verify", "--json", env=built.env).returncode == 0


def test_a_package_that_installs_a_setuid_file_fails_before_its_layer_is_stored(tmp_path: Path, run_dedal) -> None:
    """The audit every layer gets before it enters the store (issue 39, item 1) applies to a
    package built here too: it fails there, naming the entry, not later at the assembly."""
    if os.geteuid() != 0:
        pytest.skip("needs root (mount namespaces for the fixed install root)")
    tiny = make_env(tmp_path)
    controls = tiny.spack_root / "standin.json"
    controls.write_text(json.dumps(dict(json.loads(controls.read_text()), setuid=["libdedal"])))
    res = run_dedal("build", str(tiny.env_file), "--json", env=tiny.env, timeout=300)
    assert res.returncode == 1, res.stderr
    summary = json.loads(res.stdout)
    failure = " ".join(str(f) for f in summary["failed"]) if isinstance(summary.get("failed"), list) else res.stdout
    assert "libdedal-helper' is setuid" in failure and "refused" in failure, res.stdout
    store = LayerStore(tiny.store)
    assert "libdedal" not in {m.name for m in store.manifests()}
    assert not list(store.tmp_dir.iterdir()) and store.verify().clean
