"""dedal.model.git_sources: the manifest of sources archived from git repositories (its
checks, one line each), its mirror paths, and the origins it gives a plan's nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dedal.errors import UserError
from dedal.model import git_sources as gs
from tests.conftest import ROOT

SHA = "4d0b9ee6069db92422452f8bdfe0470853a4daf477b578a31ecf555c224883c7"
COMMIT = "bed60f564c2908a6123315f49f6dd0c0ff5440a3"


def entry(**over) -> dict:
    raw = {
        "package": "osu-micro-benchmarks",
        "version": "7.4-bed60f5",
        "repository": "https://github.com/example/osu",
        "ref": "bed60f5",
        "commit": COMMIT,
        "prefix": f"osu-{COMMIT}/",
        "url": f"https://github.com/example/osu/archive/{COMMIT}.tar.gz",
        "sha256": SHA,
        "size": 971335,
    }
    raw.update(over)
    return raw


def manifest(*entries: dict, namespace: str = "dedal") -> dict:
    return {"format": 1, "namespace": namespace, "sources": list(entries)}


def write(tmp_path: Path, data) -> Path:
    path = tmp_path / gs.MANIFEST
    path.write_text(json.dumps(data))
    return path


def test_the_committed_manifest_reads_and_every_entry_is_recorded():
    m = gs.read(ROOT / "recipes" / "repo" / gs.MANIFEST)
    assert m.namespace == "dedal"
    assert {s.package for s in m.sources} == {"osu-micro-benchmarks", "nccl-tests", "neuron-ringtest", "arbor-busyring"}
    for s in m.sources:
        assert len(s.sha256) == 64 and s.size > 0, s.spec  # recorded by recipes/gitsrc/archive.py --record
        assert s.repository.startswith("https://github.com/") and s.url.startswith(s.repository + "/archive/")
    osu = m.find("osu-micro-benchmarks")
    assert osu.commit.startswith(osu.ref) and osu.ref in osu.version  # the commit, in the version's name


def test_paths_and_round_trip(tmp_path):
    m = gs.read(write(tmp_path, manifest(entry(), entry(package="nccl-tests", version="2.13.6", note="why"))))
    s = m.find("osu-micro-benchmarks", "7.4-bed60f5")
    assert s.storage_path == f"_source-cache/archive/4d/{SHA}.tar.gz"
    assert s.cosmetic_path == "osu-micro-benchmarks/osu-micro-benchmarks-7.4-bed60f5.tar.gz"
    assert m.find("nccl-tests").note == "why" and m.find("nccl-tests", "9") is None
    again = gs.read(m.write(tmp_path / "again.json"))
    assert again.to_json() == m.to_json()
    assert [s["package"] for s in m.to_json()["sources"]] == ["nccl-tests", "osu-micro-benchmarks"]  # sorted
    assert "note" not in m.to_json()["sources"][1]  # an empty note is left out


def test_replaced_keeps_the_others(tmp_path):
    m = gs.read(write(tmp_path, manifest(entry(sha256="", size=0), entry(package="nccl-tests", version="2.13.6"))))
    new = m.replaced(gs.GitSource(**{**entry(), "size": 5}))
    assert new.find("osu-micro-benchmarks").size == 5 and new.find("nccl-tests") == m.find("nccl-tests")
    assert m.find("osu-micro-benchmarks").size == 0  # the original is unchanged


@pytest.mark.parametrize(
    "data, says",
    [
        ([], "not a JSON object"),
        ({**manifest(entry()), "extra": 1}, "unknown key 'extra'"),
        ({**manifest(entry()), "format": 2}, "format 2 is not 1"),
        (manifest(entry(), namespace="no-dash"), "is not a Spack repository namespace"),
        ({"format": 1, "namespace": "dedal", "sources": {}}, "'sources' must be a list"),
        (manifest(entry(colour="red")), "sources[0]: unknown key 'colour'"),
        (manifest({k: v for k, v in entry().items() if k != "commit"}), "sources[0]: 'commit' is missing"),
        (manifest(entry(commit="bed60f5")), "commit 'bed60f5' is not 40 lower-case hex digits"),
        (manifest(entry(sha256="ab")), "sha256 'ab' is not 64 lower-case hex digits"),
        (manifest(entry(size="12")), "'size' must be an integer"),
        (manifest(entry(size=True)), "'size' must be an integer"),
        (manifest(entry(size=-1)), "size must not be negative"),
        (manifest(entry(prefix="osu")), "prefix 'osu' is not a directory name ending in '/'"),
        (manifest(entry(prefix="../x/")), "is not a directory name"),
        (manifest(entry(package="Osu Bench")), "is not a Spack package name"),
        (manifest(entry(url="ftp://x")), "url 'ftp://x' is not a URL"),
        (manifest(entry(), entry()), "sources[1]: osu-micro-benchmarks@7.4-bed60f5 is listed twice"),
    ],
)
def test_bad_manifests_are_one_line_naming_the_file(tmp_path, data, says):
    path = write(tmp_path, data)
    with pytest.raises(UserError) as err:
        gs.read(path)
    assert says in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_not_json_is_one_line(tmp_path):
    path = tmp_path / gs.MANIFEST
    path.write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        gs.read(path)


def test_origins_by_namespace_name_and_version(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    write(repo, manifest(entry(), entry(package="nccl-tests", version="2.13.6", sha256="")))
    bare = tmp_path / "other"  # a repository without a manifest, and a file (an include)
    bare.mkdir()
    (tmp_path / "inc.yaml").write_text("packages: {}\n")
    nodes = [
        ("h1", "dedal", "osu-micro-benchmarks", "7.4-bed60f5"),
        ("h2", "builtin", "osu-micro-benchmarks", "7.4-bed60f5"),  # another namespace's recipe
        ("h3", "dedal", "osu-micro-benchmarks", "7.3"),  # another version
        ("h4", "dedal", "nccl-tests", "2.13.6"),
    ]  # not recorded yet
    found = gs.origins([bare, tmp_path / "inc.yaml", repo], nodes)
    assert list(found) == ["h1"] and found["h1"].commit == COMMIT
    record = gs.origin_record(found["h1"])
    assert record["repository"] == "https://github.com/example/osu" and record["sha256"] == SHA
    assert record["archive"] == f"git archive --prefix=osu-{COMMIT}/ {COMMIT} | gzip -n"


def test_archived_by_sha256_leaves_out_what_is_not_recorded(tmp_path):
    write(tmp_path, manifest(entry(), entry(package="nccl-tests", version="2.13.6", sha256="")))
    found = gs.archived_by_sha256([tmp_path, tmp_path / "none"])
    assert list(found) == [SHA] and found[SHA].package == "osu-micro-benchmarks"
