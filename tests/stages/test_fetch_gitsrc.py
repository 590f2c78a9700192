"""The fetch stage and sources archived from git repositories (recipes/gitsrc): where one is
missing from the mirror (GitHub unreachable, or its archive not the recorded bytes), the
error names its origin and the script that puts it there. No Spack, no network."""

from __future__ import annotations

from typing import List

from dedal.model import git_sources
from dedal.stages.fetch import _git_hints, _missing
from tests.conftest import ROOT

REPO = ROOT / "recipes" / "repo"


def listing() -> List[dict]:
    """What dedal/data/list_sources.py says of the archived sources (esd-gpu's two, esd-neuro's
    ringtest and busyring) and one other."""
    manifest = git_sources.in_repo(REPO)
    entries = [
        {
            "name": s.package,
            "version": s.version,
            "hash": "h" + s.package[:6],
            "has_code": True,
            "sources": [
                {
                    "fetcher": "URLFetchStrategy",
                    "url": s.url,
                    "digest": s.sha256,
                    "commit": None,
                    "mirror_paths": [s.storage_path, s.cosmetic_path],
                }
            ],
            "patches": [],
            "resources": [],
        }
        for s in manifest.sources
    ]
    entries.append(
        {
            "name": "zlib",
            "version": "1.3.1",
            "hash": "hzlib",
            "has_code": True,
            "sources": [
                {
                    "fetcher": "URLFetchStrategy",
                    "url": "http://deb.debian.org/z.tar.gz",
                    "digest": "ab" * 32,
                    "commit": None,
                    "mirror_paths": [f"_source-cache/archive/ab/{'ab' * 32}.tar.gz"],
                }
            ],
            "patches": [],
            "resources": [],
        }
    )
    return entries


def test_a_missing_archived_source_names_its_origin_and_the_script(tmp_path):
    missing, total = _missing(listing(), tmp_path / "mirror")
    assert total == 5 and len(missing) == 5
    _git_hints(missing, git_sources.archived_by_sha256([REPO, ROOT / "spack-envs" / "debian-trixie-externals.yaml"]))
    lines = {m.package.split("@")[0]: m.line() for m in missing}
    assert lines["osu-micro-benchmarks"].endswith(
        "(archived from https://github.com/sherrywong1220/osu-micro-benchmarks-7.4 at bed60f564c29: "
        "recipes/gitsrc/archive.py of dedal's checkout puts it into the mirror)"
    )
    assert "archived from https://github.com/NVIDIA/nccl-tests at 0b4c4cb99fb1" in lines["nccl-tests"]
    assert "archived from https://github.com/neuronsimulator/ringtest at 78b996a7a9f2" in lines["neuron-ringtest"]
    assert (
        "archived from https://github.com/thorstenhater/euhpc-arbor-benchmark at 0adb4ae9ff03"
        in lines["arbor-busyring"]
    )
    assert (
        lines["zlib"]
        == f"zlib@1.3.1 source http://deb.debian.org/z.tar.gz -> _source-cache/archive/ab/{'ab' * 32}.tar.gz"
    )


def test_an_archived_source_in_the_mirror_is_not_missing(tmp_path):
    entries = listing()[:1]
    stored = tmp_path / "mirror" / entries[0]["sources"][0]["mirror_paths"][0]
    stored.parent.mkdir(parents=True)
    stored.write_bytes(b"archive")
    assert _missing(entries, tmp_path / "mirror") == ([], 1)
