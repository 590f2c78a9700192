"""`dedal assemble` on layers built with the Spack stand-in on base ``host``: real
squashfs, real siftool, real sandboxes; the image holds the software only (no OS), so
these tests look at its structure, its provenance, the audit and reproducibility."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from dedal.model import sif
from dedal.adapters import siftool, squashfs
from dedal.model.artifacts import sha256_file
from dedal.model.layers import LayerStore
from tests.fixtures.images import SDE, TINY_BUILD_ONLY, TINY_RUNTIME, partition_tree
from tests.fixtures import base as helpers

IR = "opt/esd/software"


def leftovers(*dirs: Path):
    found = []
    for d in dirs:
        if d.is_dir():
            found += [str(p) for p in d.iterdir()]
    return found


@pytest.fixture(scope="module")
def host_image(host_env, tmp_path_factory):
    out = tmp_path_factory.mktemp("host-image") / "tiny.sif"
    result = host_env.assemble_json("-o", str(out), env={"SOURCE_DATE_EPOCH": SDE})
    tree = partition_tree(out, tmp_path_factory.mktemp("host-tree") / "root")
    return result, out, tree


def test_sif_layout_as_apptainer_builds_it(host_image):
    result, out, _tree = host_image
    assert result["status"] == "assembled" and result["image"] == str(out)
    rows = siftool.list_objects(out)  # the real siftool reads what dedal wrote
    types = [r["type"] for r in rows]
    assert types == ["Def.FILE", "JSON.Generic", "JSON.Labels", "SBOM (cyclonedx-json)", "FS (Squashfs/*System/amd64)"]
    assert {r["group"] for r in rows} == {"1"}
    info = sif.read_sif(out)
    assert info.launch_script.startswith("#!/usr/bin/env run-singularity")
    assert info.created == int(SDE) and info.primary_arch == "amd64"
    meta = sif.read_json_object(out, info.by_name("inspect-metadata.json"))
    assert meta["type"] == "container" and meta["data"]["attributes"]["labels"] == result["labels"]
    assert "91-environment.sh" in "".join(meta["data"]["attributes"]["environment"])
    assert sorted(layer["name"] for layer in meta["dedal"]["layers"]) == sorted(TINY_RUNTIME)


def test_labels_carry_provenance(host_env, host_image):
    result, out, tree = host_image
    info = sif.read_sif(out)
    labels = sif.read_json_object(out, info.by_type(sif.DATA_LABELS)[0])
    assert labels == result["labels"]
    assert json.loads((tree / ".singularity.d/labels.json").read_text()) == labels  # the same inside the image
    plan = json.loads((host_env.data / "work" / "tiny" / "plan.json").read_text())
    assert labels["dedal.env"] == "tiny" and labels["org.label-schema.name"] == "tiny"
    assert labels["dedal.lock.sha256"] == plan["lock_sha256"]
    assert labels["dedal.spack.commit"] == plan["spack_commit"] == "e8f8cf8543b31ff6ba81a5ab0e515bc9a4856384"
    assert labels["dedal.base.id"] == plan["base_id"] and labels["dedal.base.image"] == "host"
    assert labels["org.label-schema.build-date"] == "2023-11-14T22:13:20Z"  # SOURCE_DATE_EPOCH
    assert labels["maintainer"] == "dedal tests"  # the environment file's labels
    assert labels["org.label-schema.description"] == "tiny stand-in image"
    layers = json.loads(labels["dedal.layers"])
    store = LayerStore(host_env.store)
    assert sorted(layer["name"] for layer in layers) == sorted(TINY_RUNTIME)
    for layer in layers:
        man = store.manifest(layer["key"])
        assert layer["sha256"] == man.sha256 == sha256_file(store.sqfs(layer["key"]))
        assert layer["hash"] == man.hash and layer["version"] == man.version
    assert all(isinstance(v, str) for v in labels.values())


def test_image_tree(host_env, host_image):
    _result, _out, tree = host_image
    for d in (
        ".singularity.d/actions",
        ".singularity.d/env",
        ".singularity.d/libs",
        "dev",
        "proc",
        "sys",
        "tmp",
        "etc",
        "home",
        "root",
        "var/tmp",
    ):
        assert (tree / d).is_dir(), d
    for f in (
        "actions/exec",
        "actions/run",
        "actions/shell",
        "env/01-base.sh",
        "env/90-environment.sh",
        "env/91-environment.sh",
        "env/99-base.sh",
        "env/99-runtimevars.sh",
        "runscript",
        "startscript",
        "runscript.help",
        "test",
    ):
        assert (tree / ".singularity.d" / f).is_file(), f
    env91 = (tree / ".singularity.d/env/91-environment.sh").read_text()
    assert 'export PATH=/opt/view/bin"${PATH:+:$PATH}"' in env91 and "SPACK_ENV" not in env91
    assert "exec dedal-app" in (tree / ".singularity.d/runscript").read_text()
    # apptainer run-help: the environment file's text, then dedal's; apptainer test: dedal's checks, then its test
    assert (
        (tree / ".singularity.d/runscript.help").read_text().startswith("Runs dedal-app.\n\ntiny:latest: tiny stand-in")
    )
    assert (tree / "opt/dedal/env-test").read_text() == "#!/bin/sh\ndedal-app | grep -q ok\n"
    assert 'if /opt/dedal/env-test "$@"; then' in (tree / ".singularity.d/test").read_text()
    # the view at its final path, pointing into the install root; build-only packages absent
    view = tree / "opt/view"
    assert view.is_symlink()
    target = str(view.readlink())
    assert target.startswith("/opt/._view/")
    real_view = tree / target.lstrip("/")
    app = real_view / "bin" / "dedal-app"
    assert app.is_symlink() and str(app.readlink()).startswith("/opt/esd/software/dedal-app-1.0-")
    prefixes = sorted(p.name.rsplit("-", 2)[0] for p in (tree / IR).iterdir() if not p.name.startswith("."))
    assert prefixes == sorted(TINY_RUNTIME)
    assert not any(n in prefixes for n in TINY_BUILD_ONLY)
    # Spack's database: every layer indexed, install times the image's SOURCE_DATE_EPOCH (when each
    # layer was built is in its manifest); Spack's build records beside the layers, not in the image
    db = json.loads((tree / IR / ".spack-db/index.json").read_text())["database"]["installs"]
    store = LayerStore(host_env.store)
    for man in store.manifests():
        if man.name in TINY_RUNTIME:
            assert db[man.hash]["installed"] is True
            assert db[man.hash]["installation_time"] == float(SDE) and man.built_at
            meta = tree / IR / man.prefix / ".spack"
            assert (meta / "spec.json").is_file() and not (meta / "spack-build-out.txt.gz").exists()
            assert {"spack-build-out.txt.gz", "spack-build-env.txt", "install_times.json"} <= set(man.records)
            assert (store.records_dir(man.key) / "spack-build-out.txt.gz").is_file()
            manifest = json.loads((meta / "install_manifest.json").read_text())
            assert list(manifest) == sorted(manifest) and f"/{IR}/{man.prefix}/bin" in manifest
            assert not any(k.endswith((".gz", "install_times.json")) for k in manifest)
            assert {(e["owner"], e.get("time", 0)) for e in manifest.values()} == {(0, 0)}
    # provenance of the environment and the SBOM inside the image
    assert (tree / "opt/dedal/env/spack.lock").read_bytes() == (host_env.root / "spack.lock").read_bytes()
    assert "/opt/view" in (tree / "opt/dedal/env/spack.yaml").read_text()
    assert sorted(p.name for p in (tree / "opt/dedal/env").iterdir()) == ["env.yaml", "spack.lock", "spack.yaml"]
    # what `dedal rebuild` builds from: the environment file, every value that decides the image explicit
    rebuild = yaml.safe_load((tree / "opt/dedal/env/env.yaml").read_text())
    assert rebuild["spack"]["specs"] == ["dedal-app"]
    keys = ("name", "tag", "base_image", "install_root", "view", "runscript", "help", "test")
    assert {k: rebuild["dedal"][k] for k in keys} == {
        "name": "tiny",
        "tag": "latest",
        "base_image": "host",
        "install_root": "/opt/esd/software",
        "view": "/opt/view",
        "runscript": 'exec dedal-app "$@"',
        "help": "Runs dedal-app.",
        "test": "dedal-app | grep -q ok",
    }
    assert rebuild["dedal"]["labels"] == {"maintainer": "dedal tests"}
    assert str(host_env.root) not in (tree / "opt/dedal/env/env.yaml").read_text()
    assert sorted(p.name for p in (tree / "tmp").iterdir()) == []


def test_sbom_everywhere_the_same(host_image):
    result, out, tree = host_image
    beside = Path(result["sbom"]).read_bytes()
    info = sif.read_sif(out)
    assert sif.read_object(out, info.by_type(sif.DATA_SBOM)[0]) == beside
    assert (tree / "opt/dedal/sbom.cdx.json").read_bytes() == beside
    doc = json.loads(beside)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.5"
    assert sorted(c["name"] for c in doc["components"]) == sorted(TINY_RUNTIME + ("glibc",))
    for c in doc["components"]:
        assert c["purl"].startswith(f"pkg:spack/{c['name']}@{c['version']}?")
    by_key = {layer["key"]: layer["sha256"] for layer in result["layers"]}
    hashed = [c for c in doc["components"] if "hashes" in c]
    assert len(hashed) == 3 and all(any(h["content"] in by_key.values() for h in c["hashes"]) for c in hashed)


def test_image_manifest(host_image):
    result, out, _tree = host_image
    manifest = json.loads(Path(result["image_json"]).read_text())
    assert Path(result["image_json"]).name == "tiny.image.json" and Path(result["sbom"]).name == "tiny.sbom.cdx.json"
    assert manifest["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest() == result["sha256"]
    assert manifest["size"] == out.stat().st_size
    assert manifest["base_id"] == result["base_id"] and manifest["sbom"] == result["sbom"]
    assert [layer["key"] for layer in manifest["layers"]] == [layer["key"] for layer in result["layers"]]
    assert manifest["created"] == "2023-11-14T22:13:20Z"


def test_inspect_shows_layers_and_sbom(host_env, host_image):
    _result, out, _tree = host_image
    r = host_env.dedal("inspect", str(out), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert sorted(layer["name"] for layer in info["layers"]) == sorted(TINY_RUNTIME)
    assert info["sbom"]["valid"] and info["sbom"]["components"] == 4
    text = host_env.dedal("inspect", str(out)).stdout
    assert "FS (Squashfs/*System/amd64)" in text and "dedal.lock.sha256" in text and "layers: 3" in text


def test_reproducible_bytes(host_env, host_image, tmp_path):
    result, out, _tree = host_image
    again = host_env.assemble_json("-o", str(tmp_path / "again.sif"), env={"SOURCE_DATE_EPOCH": SDE})
    assert again["sha256"] == result["sha256"]
    assert (tmp_path / "again.sif").read_bytes() == out.read_bytes()
    assert (tmp_path / "again.sbom.cdx.json").read_bytes() == Path(result["sbom"]).read_bytes()
    later = host_env.assemble_json("-o", str(tmp_path / "later.sif"), env={"SOURCE_DATE_EPOCH": "1700000001"})
    assert later["sha256"] != result["sha256"]  # the build date is an input


def test_default_path_up_to_date_and_force(host_env):
    first = host_env.assemble_json()
    assert first["image"] == str(host_env.images / "tiny" / "latest.sif")
    assert Path(first["image_json"]).name == "latest.image.json"
    mtime = Path(first["image"]).stat().st_mtime_ns
    second = host_env.assemble_json()
    assert second["status"] == "present" and second["sha256"] == first["sha256"]
    assert Path(first["image"]).stat().st_mtime_ns == mtime
    forced = host_env.assemble_json("--force")
    assert forced["status"] == "assembled"
    assert leftovers(host_env.stage) == []
    assert sorted(p.name for p in (host_env.images / "tiny").iterdir()) == [
        "latest.image.json",
        "latest.sbom.cdx.json",
        "latest.sif",
    ]


def test_only_subset(host_env, tmp_path):
    res = host_env.assemble_json("--only", "libdedal", env={"SOURCE_DATE_EPOCH": SDE})
    assert Path(res["image"]).name == "latest-only-libdedal.sif"
    assert sorted(layer["name"] for layer in res["layers"]) == ["gcc-runtime", "libdedal"]
    assert res["labels"]["dedal.only"] == "libdedal" and res["only"] == ["libdedal"]
    tree = partition_tree(Path(res["image"]), tmp_path / "root")
    view = tree / str((tree / "opt/view").readlink()).lstrip("/")
    assert (view / "bin" / "libdedal").is_symlink() and not (view / "bin" / "dedal-app").exists()
    doc = json.loads(Path(res["sbom"]).read_text())
    assert sorted(c["name"] for c in doc["components"]) == ["gcc-runtime", "glibc", "libdedal"]


def test_keep_build_deps(host_env, tmp_path):
    res = host_env.assemble_json("--keep-build-deps", "-o", str(tmp_path / "all.sif"))
    assert sorted(layer["name"] for layer in res["layers"]) == sorted(TINY_RUNTIME + TINY_BUILD_ONLY)
    assert res["labels"]["dedal.keep_build_deps"] == "true"


# ----------------------------------------------------------------------------- refused input
def _store_copy(host_env, tmp_path: Path) -> Path:
    dest = tmp_path / "layers"
    shutil.copytree(host_env.store, dest)
    return dest


def _manifest_of(store: Path, name: str):
    return next(m for m in LayerStore(store).manifests() if m.name == name)


def _replace_layer(store: Path, name: str, make_tree) -> None:
    """Repack a layer with a modified tree and a consistent manifest (size, sha256), so
    that only the content rules can refuse it."""
    man = _manifest_of(store, name)
    work = store.parent / f"evil-{name}"
    squashfs.extract(store / f"{man.key}.sqfs", work)
    make_tree(work, man.prefix)
    out = store / f"{man.key}.sqfs"
    squashfs.pack([work], out)
    data = json.loads((store / f"{man.key}.json").read_text())
    data["sha256"] = sha256_file(out)
    data["size"] = out.stat().st_size
    (store / f"{man.key}.json").write_text(json.dumps(data))


def _missing(store: Path) -> None:
    (store / f"{_manifest_of(store, 'libdedal').key}.sqfs").unlink()


def _corrupt(store: Path) -> None:
    path = store / f"{_manifest_of(store, 'libdedal').key}.sqfs"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _outside(store: Path) -> None:
    _replace_layer(store, "libdedal", lambda w, p: (w / "evil.sh").write_text("#!/bin/sh\n"))


def _abs_symlink(store: Path) -> None:
    _replace_layer(store, "libdedal", lambda w, p: (w / p / "lib" / "shadow").symlink_to("/etc/shadow"))


def _rel_escape(store: Path) -> None:
    _replace_layer(store, "libdedal", lambda w, p: (w / p / "lib" / "up").symlink_to("../../../../etc"))


@pytest.mark.parametrize(
    "damage,message",
    [
        (_missing, "missing from the layer store"),
        (_corrupt, "corrupt: sha256"),
        (_outside, "outside its prefix"),
        (_abs_symlink, "points outside the install root"),
        (_rel_escape, "escapes the install root"),
    ],
)
def test_bad_layers_are_refused(host_env, tmp_path, damage, message):
    store = _store_copy(host_env, tmp_path)
    damage(store)
    out = tmp_path / "out" / "bad.sif"
    r = host_env.dedal("assemble", str(host_env.env_file), "--layers", str(store), "-o", str(out))
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("dedal: error:") and "libdedal" in last and message in last
    assert not out.parent.exists() or leftovers(out.parent) == [], "no image written"
    assert leftovers(host_env.stage) == []


@pytest.mark.parametrize(
    "args,message",
    [
        (["--only", "nosuch"], "--only nosuch: no such package"),
        (["--only", "dedal-tool"], "no such package"),  # build-only: never in the image
        (
            ["--runtime-base", "debian-trixie"],
            "runtime_base debian-trixie: a runtime base goes with a base image, not with base host",
        ),
    ],
)
def test_bad_arguments(host_env, args, message):
    r = host_env.dedal("assemble", str(host_env.env_file), *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_output_is_a_directory(host_env, tmp_path):
    r = host_env.dedal("assemble", str(host_env.env_file), "-o", str(tmp_path))
    assert r.returncode == 2 and "is a directory" in r.stderr


def test_spack_failure_leaves_nothing(host_env, tmp_path):
    broken = tmp_path / "broken-spack"
    (broken / "bin").mkdir(parents=True)
    (broken / "bin" / "spack").write_text("#!/bin/sh\necho '==> Error: database is locked' >&2\nexit 3\n")
    (broken / "bin" / "spack").chmod(0o755)
    out = tmp_path / "out" / "x.sif"
    r = host_env.dedal("assemble", str(host_env.env_file), "-o", str(out), env={"DEDAL_SPACK_ROOT": str(broken)})
    assert r.returncode == 1, r.stderr
    assert "spack reindex" in r.stderr and "exited with code 3" in r.stderr and "log:" in r.stderr
    assert leftovers(out.parent) == [] and leftovers(host_env.stage) == []
    assert helpers.mounts_under(str(host_env.stage)) == []


def test_audits_are_remembered_by_sha256(host_env, tmp_path, monkeypatch):
    """A layer's entry audit is remembered by its sha256: the listing is skipped next time,
    the sha256 is not (a corrupt layer is still refused)."""
    from dedal.stages import assemble as asm
    from dedal.model.target import resolve

    settings = host_env.settings()
    plan = resolve(str(host_env.env_file), settings).plan()
    _roots, hashes = asm.select_packages(plan)
    store = LayerStore(host_env.store)
    memo = tmp_path / "memo"
    first = asm.audit_layers(plan, hashes, store, lambda m: None, memo=memo)
    assert len(list(memo.glob("*.json"))) == 3

    def no_listing(_image):
        raise AssertionError("listed again")

    monkeypatch.setattr(squashfs, "entries", no_listing)
    again = asm.audit_layers(plan, hashes, store, lambda m: None, memo=memo)
    assert [(i.key, i.sha256, i.files) for i in again] == [(i.key, i.sha256, i.files) for i in first]
    copy = _store_copy(host_env, tmp_path)
    _corrupt(copy)
    with pytest.raises(Exception, match="corrupt: sha256"):
        asm.audit_layers(plan, hashes, LayerStore(copy), lambda m: None, memo=memo)


def test_from_the_plan_json(host_env, tmp_path):
    """A later stage on another machine: the plan.json the build wrote is enough."""
    plan_json = host_env.data / "work" / "tiny" / "plan.json"
    r = host_env.dedal("assemble", str(plan_json), "-o", str(tmp_path / "p.sif"), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert sorted(layer["name"] for layer in res["layers"]) == sorted(TINY_RUNTIME)
    assert "maintainer" not in res["labels"]  # the environment file's extras are not in a plan
    assert res["labels"]["dedal.env"] == "tiny"
