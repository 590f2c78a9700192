"""The remote layer cache against a real local registry: a build on a machine with an empty
store (here: another store) pulls what an earlier build pushed, each blob checked against its
digest, and builds only what the cache lacks or what fails the checks."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dedal.model.layers import LayerStore
from dedal.adapters.registry import Access
from dedal.stages.building.cache import cache_tag
from tests.fixtures.tiny import TINY_PACKAGES, make_env

pytestmark = [pytest.mark.registry, pytest.mark.usefixtures("as_root")]


def _build(run_dedal, tiny, cache, **env):
    res = run_dedal("build", str(tiny.env_file), "--cache", cache, "--insecure", "--json", env=dict(tiny.env, **env))
    return res, (json.loads(res.stdout) if res.stdout.strip() else {})


def names(labels):
    return sorted(label.split("@")[0] for label in labels)


def test_a_second_machine_pulls_what_the_first_pushed(run_dedal, registry, tmp_path):  # noqa: F811
    cache = registry.ref("esd/layers")
    first = make_env(tmp_path / "a")
    res, summary = _build(run_dedal, first, cache)
    assert res.returncode == 0, res.stderr
    assert names(summary["built"]) == TINY_PACKAGES and names(summary["cache"]["pushed"]) == TINY_PACKAGES
    assert summary["cache"]["pulled"] == [] and summary["cache"]["problems"] == []
    a_store = LayerStore(first.store)
    for m in a_store.manifests():
        art = registry.manifest("esd/layers", cache_tag(m.key)).json()
        assert art["artifactType"] == "application/vnd.dedal.layer.v1"
        assert art["layers"][0]["digest"] == f"sha256:{m.sha256}" and art["layers"][0]["size"] == m.size

    # another machine, its own store, a Spack that would fail every build: all comes from the cache
    second = make_env(tmp_path / "b", fail=TINY_PACKAGES)
    res, summary = _build(run_dedal, second, cache)
    assert res.returncode == 0, res.stderr
    assert summary["built"] == [] and names(summary["cache"]["pulled"]) == TINY_PACKAGES
    assert summary["cache"]["pushed"] == [] and summary["cache"]["bytes_pulled"] == sum(
        m.size for m in a_store.manifests()
    )
    b_store = LayerStore(second.store)
    assert {m.key: m.sha256 for m in b_store.manifests()} == {m.key: m.sha256 for m in a_store.manifests()}
    assert b_store.verify().clean
    # a rerun asks nothing: the layers are in the store now
    res, summary = _build(run_dedal, second, cache)
    assert res.returncode == 0 and summary["cache"]["pulled"] == [] and summary["built"] == []


def test_a_blob_that_does_not_match_its_digest_is_refused_and_built_here(run_dedal, registry, tmp_path):  # noqa: F811
    cache = registry.ref("esd/layers")
    first = make_env(tmp_path / "a")
    res, _ = _build(run_dedal, first, cache)
    assert res.returncode == 0, res.stderr
    victim = next(m for m in LayerStore(first.store).manifests() if m.name == "libdedal")
    data = registry.root / "docker/registry/v2/blobs/sha256" / victim.sha256[:2] / victim.sha256 / "data"
    good = data.read_bytes()
    data.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))  # same size, other bytes
    assert hashlib.sha256(data.read_bytes()).hexdigest() != victim.sha256

    second = make_env(tmp_path / "b")
    res, summary = _build(run_dedal, second, cache, DEDAL_LAYER_CACHE_PUSH="false")
    assert res.returncode == 0, res.stderr
    assert names(summary["built"]) == ["libdedal"]
    assert names(summary["cache"]["pulled"]) == ["dedal-app", "dedal-bootstrap", "dedal-tool", "gcc-runtime"]
    problem = " ".join(summary["cache"]["problems"])
    assert "libdedal" in problem and "sha256" in problem
    assert LayerStore(second.store).verify().clean
    assert summary["cache"]["pushed"] == []  # layer_cache_push=false


def test_an_unreachable_cache_is_reported_and_the_build_goes_on(run_dedal, tmp_path):
    tiny = make_env(tmp_path)
    res, summary = _build(run_dedal, tiny, "oras://127.0.0.1:9/esd/layers")
    assert res.returncode == 0, res.stderr
    assert names(summary["built"]) == TINY_PACKAGES
    assert len(summary["cache"]["problems"]) == 2  # one lookup and one push: the registry is not asked again


def test_a_bad_cache_reference_is_refused_before_anything_is_written(run_dedal, tmp_path):
    tiny = make_env(tmp_path)
    res = run_dedal("build", str(tiny.env_file), "--cache", "https://host/repo", env=tiny.env)
    assert res.returncode == 2 and "https:// references are not supported" in res.stderr
    assert not (Path(tiny.env["DEDAL_DATA_DIR"]) / "work").exists()


def _no_mirror(env, tmp_path):
    return dict(env.env, DEDAL_MIRROR=str(tmp_path / "no-mirror"))


def test_without_a_mirror_every_layer_comes_from_the_cache(run_dedal, registry, tmp_path):  # noqa: F811
    cache = registry.ref("esd/layers")
    first = make_env(tmp_path / "a")
    res, _ = _build(run_dedal, first, cache)
    assert res.returncode == 0, res.stderr

    # another machine with no source mirror at all and a Spack that would fail every build
    second = make_env(tmp_path / "b", fail=TINY_PACKAGES)
    res = run_dedal(
        "build", str(second.env_file), "--cache", cache, "--insecure", "--json", env=_no_mirror(second, tmp_path)
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["built"] == [] and names(summary["cache"]["pulled"]) == TINY_PACKAGES
    assert LayerStore(second.store).verify().clean and len(LayerStore(second.store).keys()) == len(TINY_PACKAGES)
    assert not (tmp_path / "no-mirror").exists()
    # and with every layer in the store, no cache is needed either
    res = run_dedal("build", str(second.env_file), "--json", env=_no_mirror(second, tmp_path))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["built"] == []


def test_without_a_mirror_a_layer_the_cache_lacks_is_refused_by_name_before_anything_is_written(
    run_dedal, registry, tmp_path
):  # noqa: F811
    cache = registry.ref("esd/layers")
    first = make_env(tmp_path / "a")
    res, _ = _build(run_dedal, first, cache)
    assert res.returncode == 0, res.stderr
    app = next(m for m in LayerStore(first.store).manifests() if m.name == "dedal-app")
    digest = registry.api(
        "HEAD",
        f"/v2/esd/layers/manifests/{cache_tag(app.key)}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    ).headers["Docker-Content-Digest"]
    assert registry.api("DELETE", f"/v2/esd/layers/manifests/{digest}").status_code == 202

    second = make_env(tmp_path / "b", fail=TINY_PACKAGES)
    res = run_dedal("build", str(second.env_file), "--cache", cache, "--insecure", env=_no_mirror(second, tmp_path))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dedal: error: source mirror "), res.stderr
    assert f"dedal-app@{app.version}/{app.hash[:7]}" in lines[0] and "1 package(s)" in lines[0]
    assert "lacks them" in lines[0] and "libdedal" not in lines[0]
    assert not second.data.exists()  # no store, no work directory
    assert not (tmp_path / "no-mirror").exists()


def test_without_a_mirror_a_cached_layer_that_fails_its_checks_is_refused_by_name(run_dedal, registry, tmp_path):  # noqa: F811
    cache = registry.ref("esd/layers")
    first = make_env(tmp_path / "a")
    res, _ = _build(run_dedal, first, cache)
    assert res.returncode == 0, res.stderr
    victim = next(m for m in LayerStore(first.store).manifests() if m.name == "libdedal")
    data = registry.blob_file(f"sha256:{victim.sha256}")
    good = data.read_bytes()
    data.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))

    second = make_env(tmp_path / "b", fail=TINY_PACKAGES)
    res = run_dedal("build", str(second.env_file), "--cache", cache, "--insecure", env=_no_mirror(second, tmp_path))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[-1].startswith("dedal: error: source mirror ") and "sha256" in lines[-1], res.stderr
    assert f"libdedal@{victim.version}/{victim.hash[:7]}" in lines[-1] and "1 package(s)" in lines[-1]
    assert "Traceback" not in res.stderr
    # the good layers it pulled stay in the store (checked, whole): the next try needs only libdedal
    assert sorted(m.name for m in LayerStore(second.store).manifests()) == [
        "dedal-app",
        "dedal-bootstrap",
        "dedal-tool",
        "gcc-runtime",
    ]
    assert LayerStore(second.store).verify().clean


# ----------------------------------------------------------------------------- a hostile cache (issue 39, item 1)
# A shared cache is where a bad layer comes from: every pulled layer gets the entry audit the
# assembly applies before it is stored. Each layer of the tiny environment is poisoned in
# its own way in one cache, so that one pair of builds tries every case.


def _repack(store: LayerStore, man, tmp: Path, shape) -> None:
    """Replace ``man``'s layer in ``store`` with its content shaped by ``shape(root, prefix)``
    (``root`` holds the prefix directory; what else lies there goes into the layer too)."""
    root = tmp / f"poison-{man.name}"
    subprocess.run(
        ["unsquashfs", "-q", "-n", "-d", str(root), str(store.sqfs(man.key))], check=True, capture_output=True
    )
    shape(root, root / man.prefix)
    packed = tmp / f"{man.name}.sqfs"
    subprocess.run(
        [
            "mksquashfs",
            *sorted(str(p) for p in root.iterdir()),
            str(packed),
            "-noappend",
            "-all-root",
            "-quiet",
            "-no-progress",
            "-keep-as-directory",
        ]
        if len(list(root.iterdir())) == 1
        else ["mksquashfs", str(root), str(packed), "-noappend", "-all-root", "-quiet", "-no-progress"],
        check=True,
        capture_output=True,
    )
    store.remove(man.key)
    tmp_in_store = store.temp_path(man.key)
    shutil.move(str(packed), tmp_in_store)
    store.add(man, tmp_in_store)


def _setuid(root: Path, prefix: Path) -> None:
    (prefix / "bin" / "su").write_text("#!/bin/sh\n")
    os.chmod(prefix / "bin" / "su", 0o4755)


def _shadow_link(root: Path, prefix: Path) -> None:
    os.symlink("/etc/shadow", prefix / "shadow")


def _world_writable(root: Path, prefix: Path) -> None:
    (prefix / "shared").mkdir()
    os.chmod(prefix / "shared", 0o777)


def _outside(root: Path, prefix: Path) -> None:
    (root / "evil").mkdir()
    (root / "evil" / "x").write_text("outside its prefix\n")


POISON = {  # package: (how, what the one line says)
    "libdedal": (_setuid, "is setuid"),
    "dedal-tool": (_shadow_link, "-> /etc/shadow points outside the install root"),
    "gcc-runtime": (_world_writable, "world-writable without the sticky bit"),
    "dedal-bootstrap": (_outside, "path 'evil' is outside its prefix"),
    "dedal-app": (None, "its manifest names prefix '../../../../tmp/x'"),
}


@pytest.mark.reliability
def test_a_hostile_cache_is_audited_before_anything_is_stored(run_dedal, registry, tmp_path):  # noqa: F811
    from dedal.stages.building.cache import CacheReport, LayerCache

    first = make_env(tmp_path / "a")  # built without the cache: nothing pushed
    res = run_dedal("build", str(first.env_file), "--json", env=first.env)
    assert res.returncode == 0, res.stderr
    poisoned = LayerStore(first.store)
    for man in poisoned.manifests():
        how, _ = POISON[man.name]
        if how is None:
            man.prefix = "../../../../tmp/x"
            tmp = poisoned.temp_path(man.key)
            shutil.copyfile(poisoned.sqfs(man.key), tmp)
            poisoned.remove(man.key)
            poisoned.add(man, tmp)
        else:
            _repack(poisoned, man, tmp_path, how)
    # what an attacker with write access to the cache pushes (with dedal's own push)
    report = CacheReport()
    LayerCache(registry.ref("esd/layers"), access=Access(insecure=True)).push_layers(
        [(m.name, m.key) for m in poisoned.manifests()], poisoned, report
    )
    assert sorted(report.pushed) == TINY_PACKAGES, report

    # `dedal layers verify` flags such layers where they are already in a store
    res = run_dedal("layers", "--layers", str(first.store), "verify", "--json", env=first.env)
    assert res.returncode == 1, res.stderr
    check = json.loads(res.stdout)
    assert check["ok"] == 0 and len(check["refused"]) == len(TINY_PACKAGES) and not check["clean"]
    for name, (_, says) in POISON.items():
        assert any(f"({name}@" in line and says in line for line in check["refused"]), (name, check["refused"])
    assert all("\n" not in line for line in check["refused"])
    # and `dedal layers push` does not offer them to the machines sharing a cache
    res = run_dedal(
        "layers",
        "--layers",
        str(first.store),
        "push",
        registry.ref("esd/seeded"),
        "--insecure",
        "--json",
        env=first.env,
    )
    pushed = json.loads(res.stdout)
    assert res.returncode == 1 and pushed["pushed"] == [] and len(pushed["problems"]) == len(TINY_PACKAGES), res.stdout
    assert all(": not pushed: layer " in line and "refused" in line for line in pushed["problems"])
    assert registry.api("GET", "/v2/esd/seeded/tags/list").status_code == 404

    # a build pulling from that cache takes none of them: each refused in one line, built here
    second = make_env(tmp_path / "b")
    res, summary = _build(run_dedal, second, registry.ref("esd/layers"), DEDAL_LAYER_CACHE_PUSH="false")
    assert res.returncode == 0, res.stderr
    assert summary["cache"]["pulled"] == [] and names(summary["built"]) == TINY_PACKAGES
    assert len(summary["cache"]["problems"]) == len(TINY_PACKAGES)
    for name, (_, says) in POISON.items():
        assert sum(1 for line in summary["cache"]["problems"] if line.startswith(f"{name}@") and says in line) == 1, (
            name,
            summary["cache"]["problems"],
        )
    store = LayerStore(second.store)
    assert store.verify().clean and not list(store.tmp_dir.iterdir())
    assert all("pulled" not in m.log for m in store.manifests())
    res = run_dedal("layers", "--layers", str(second.store), "verify", env=second.env)
    assert res.returncode == 0 and f"{len(TINY_PACKAGES)} layers ok" in res.stdout, res.stdout + res.stderr

    # without a source mirror the build is refused, naming the layers and why
    third = make_env(tmp_path / "c", fail=TINY_PACKAGES)
    res = run_dedal(
        "build",
        str(third.env_file),
        "--cache",
        registry.ref("esd/layers"),
        "--insecure",
        env=_no_mirror(third, tmp_path),
    )
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[-1].startswith("dedal: error: source mirror ") and "5 package(s)" in lines[-1], res.stderr
    notes = [line for line in lines if "not taken" in line]  # one line each, naming the layer and why
    for name, (_, says) in POISON.items():
        assert sum(1 for line in notes if f"{name}@" in line and says in line) == 1, (name, notes)
    assert not LayerStore(third.store).keys()
