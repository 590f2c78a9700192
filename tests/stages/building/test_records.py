"""Spack's build records moved beside the layer; the install manifest describing the layer."""

from __future__ import annotations

import json
import os

from dedal.stages.building.records import RECORDS, split_records


def _prefix(tmp_path, uid: int, when: float):
    prefix = tmp_path / "pkg-1.0-abc"
    meta = prefix / ".spack"
    (meta / "archived-files" / "src").mkdir(parents=True)
    (meta / "archived-files" / "src" / "config.log").write_text("built on host-x\n")
    (prefix / "bin").mkdir()
    (prefix / "bin" / "tool").write_text("#!/bin/sh\n")
    (meta / "spec.json").write_text("{}")
    for name in ("spack-build-out.txt.gz", "spack-build-env.txt", "install_times.json", "install_environment.json"):
        (meta / name).write_text(f"{name} at {when}\n")
    sp = "/opt/sw/pkg-1.0-abc"
    manifest = {}
    for rel in (
        "",
        "/bin",
        "/bin/tool",
        "/.spack",
        "/.spack/spec.json",
        "/.spack/spack-build-out.txt.gz",
        "/.spack/spack-build-env.txt",
        "/.spack/install_times.json",
        "/.spack/install_environment.json",
        "/.spack/archived-files",
        "/.spack/archived-files/src",
        "/.spack/archived-files/src/config.log",
    ):
        entry = {"mode": 33188, "owner": uid, "group": uid}
        if "." in rel.rsplit("/", 1)[-1] or rel.endswith("tool"):
            entry.update(hash="H" + rel, time=when, size=3)
        manifest[sp + rel] = entry
    (meta / "install_manifest.json").write_text(json.dumps(dict(reversed(list(manifest.items())))))
    os.chmod(meta / "install_manifest.json", 0o644)
    return prefix, sp


def test_records_move_and_the_manifest_is_the_same_for_every_build(tmp_path):
    outs = []
    for n, (uid, when) in enumerate(((1000, 1764000000.5), (0, 1764999999.25))):
        prefix, sp = _prefix(tmp_path / str(n), uid, when)
        dest = tmp_path / f"records-{n}"
        moved = split_records(prefix, dest, sp)
        assert moved == [r for r in RECORDS if r not in ("spack-build-out.txt", "spack-build-env-mods.txt")]
        assert sorted(p.name for p in (prefix / ".spack").iterdir()) == ["install_manifest.json", "spec.json"]
        assert (dest / "archived-files" / "src" / "config.log").read_text() == "built on host-x\n"
        assert (dest / "install_times.json").read_text() == f"install_times.json at {when}\n"
        manifest = json.loads((prefix / ".spack" / "install_manifest.json").read_text())
        assert list(manifest) == sorted(manifest)
        assert sorted(manifest) == sorted(sp + r for r in ("", "/bin", "/bin/tool", "/.spack", "/.spack/spec.json"))
        assert manifest[sp + "/bin/tool"] == {
            "mode": 33188,
            "owner": 0,
            "group": 0,
            "hash": "H/bin/tool",
            "time": 0,
            "size": 3,
        }
        outs.append((prefix / ".spack" / "install_manifest.json").read_bytes())
    assert outs[0] == outs[1]


def test_nothing_to_move(tmp_path):
    prefix = tmp_path / "p"
    (prefix / ".spack").mkdir(parents=True)
    (prefix / ".spack" / "install_manifest.json").write_text("not json")
    assert split_records(prefix, tmp_path / "rec", "/opt/p") == []
    assert not (tmp_path / "rec").exists()  # no empty records directory
    assert (prefix / ".spack" / "install_manifest.json").read_text() == "not json"  # not Spack's: left alone
