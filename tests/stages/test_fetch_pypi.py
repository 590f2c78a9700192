"""The fetch stage's PyPI step (`_from_pypi`): sources that Spack could not fetch, taken
from the loopback PyPI index of tests/fixtures/pypi.py. No network.

data/esd-neuro-sources.json is what dedal/data/list_sources.py wrote for esd-neuro with
the real Spack (entries bzip2, py-wheel, py-numpy, neuron kept), plus one entry written
by hand in the same form for py-tomli 2.0.1 (the URL and sha256 of Spack's recipe, its
mirror paths as Spack names them), the project whose real sdist the loopback index serves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

from dedal.stages.fetch import _from_pypi, _missing
from tests.fixtures.pypi import TOMLI_SDIST, TOMLI_SHA

SOURCES = Path(__file__).parent / "data" / "esd-neuro-sources.json"


def listing() -> List[dict]:
    return json.loads(SOURCES.read_text())


def entry(sources: List[dict], name: str) -> dict:
    return next(pkg for pkg in sources if pkg["name"] == name)


def test_the_recorded_listing_holds_what_the_tests_rely_on():
    sources = listing()
    tomli = entry(sources, "py-tomli")["sources"][0]
    assert tomli["digest"] == TOMLI_SHA and "/packages/source/t/tomli/" in tomli["url"]
    assert tomli["mirror_paths"][0] == f"_source-cache/archive/de/{TOMLI_SHA}.tar.gz"
    assert entry(sources, "bzip2")["sources"][0]["url"].startswith("http://deb.debian.org/debian/pool/")


def test_missing_pypi_sources_come_from_the_index_by_sha256(pypi_index, tmp_path):
    sources = listing()
    mirror = tmp_path / "mirror"
    notes: List[str] = []
    added = _from_pypi(sources, mirror, pypi_index.index, notes.append)
    assert added == 1
    stored = mirror / f"_source-cache/archive/de/{TOMLI_SHA}.tar.gz"
    assert stored.read_bytes() == TOMLI_SDIST.read_bytes()
    # py-tomli is no longer missing; the others are, each named once in the notes
    still = {m.package.split("@")[0] for m in _missing(sources, mirror)[0]}
    assert "py-tomli" not in still and {"bzip2", "py-wheel"} <= still
    assert any(n.startswith("py-tomli@2.0.1: tomli-2.0.1.tar.gz from ") for n in notes)
    assert any(n.startswith("py-wheel@") and "HTTP 404" in n for n in notes)  # this index has no wheel page
    # only PyPI URLs are looked up: never the Debian ones
    assert all(r.startswith(("/simple/", "/files/")) for r in pypi_index.requests)
    assert "/simple/bzip2/" not in pypi_index.requests


def test_present_sources_and_an_empty_index_ask_nothing(pypi_index, tmp_path):
    sources = [entry(listing(), "py-tomli")]
    mirror = tmp_path / "mirror"
    assert _from_pypi(sources, mirror, "", lambda line: None) == 0
    stored = mirror / f"_source-cache/archive/de/{TOMLI_SHA}.tar.gz"
    stored.parent.mkdir(parents=True)
    stored.write_bytes(b"already there")
    assert _from_pypi(sources, mirror, pypi_index.index, lambda line: None) == 0
    assert pypi_index.requests == [] and stored.read_bytes() == b"already there"


def test_a_sha256_the_index_does_not_list_stays_missing(pypi_index, tmp_path):
    sources = [entry(listing(), "py-tomli")]
    sources[0]["sources"][0]["digest"] = "0" * 64
    notes: List[str] = []
    assert _from_pypi(sources, tmp_path / "mirror", pypi_index.index, notes.append) == 0
    assert notes == [f"py-tomli@2.0.1: no file with sha256 000000000000... in {pypi_index.index}/tomli/"]
    assert not (tmp_path / "mirror").exists()
