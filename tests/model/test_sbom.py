"""dedal.model.sbom: the origin of a source archived from a git repository (the rest of the
SBOM is tested with the assembly, tests/stages/assemble/test_units.py)."""

from __future__ import annotations

import hashlib
import json

from dedal.model import git_sources, sbom
from dedal.model.plan import make_plan
from dedal.model.spack_lock import load_lock
from tests.conftest import SPACK_DATA
from tests.fixtures.golden import assert_golden

COMMIT = "0b4c4cb99fb1381edec1f78c37230688ea1ceb26"
SHA = "52b472a58a4918d3221a9b8c4bd9335382643d7e241983918b64692d685cc3d1"


def tiny_plan():
    lock = load_lock(SPACK_DATA / "tiny-dedal.spack.lock")
    return make_plan(lock, env_name="t", install_root="/opt/t", base_image="host", base_id="host:test")


def test_an_archived_source_names_its_repository_commit_and_sha256():
    plan = tiny_plan()
    hashes = list(plan.runtime_closure)
    app = next(h for h in hashes if plan.nodes[h].name == "dedal-app")
    source = git_sources.GitSource(
        package="dedal-app",
        version="1.0",
        repository="https://github.com/example/app",
        ref="v1.0",
        commit=COMMIT,
        prefix="app-1.0/",
        url="https://github.com/example/app/archive/v1.0.tar.gz",
        sha256=SHA,
        size=33658,
    )
    doc = sbom.make_sbom(plan, hashes, created=1700000000, origins={app: git_sources.origin_record(source)})
    comps = {c["name"]: c for c in doc["components"]}
    refs = comps["dedal-app"]["externalReferences"]
    assert refs[0] == {
        "type": "vcs",
        "url": "https://github.com/example/app",
        "comment": f"source: commit {COMMIT} (v1.0)",
    }
    assert refs[1]["type"] == "distribution" and refs[1]["url"] == source.url
    assert refs[1]["hashes"] == [{"alg": "SHA-256", "content": SHA}]
    assert refs[1]["comment"] == f"source archive: git archive --prefix=app-1.0/ {COMMIT} | gzip -n"
    props = {p["name"]: p["value"] for p in comps["dedal-app"]["properties"]}
    assert props["dedal:source_repository"] == "https://github.com/example/app"
    assert props["dedal:source_commit"] == COMMIT and props["dedal:source_sha256"] == SHA
    assert props["dedal:source_ref"] == "v1.0" and props["dedal:source_url"] == source.url
    # the other components say nothing of sources, and without origins nothing does
    assert all("externalReferences" not in c for name, c in comps.items() if name != "dedal-app")
    plain = sbom.make_sbom(plan, hashes, created=1700000000)
    assert all("externalReferences" not in c for c in plain["components"])
    assert plain["serialNumber"] != doc["serialNumber"]  # the content differs, so does the serial
    json.loads(sbom.dumps(doc))


def test_a_commit_named_by_itself_is_not_repeated():
    plan = tiny_plan()
    app = next(h for h in plan.runtime_closure if plan.nodes[h].name == "dedal-app")
    origin = {"repository": "https://x.example/r", "ref": COMMIT, "commit": COMMIT, "url": "", "sha256": ""}
    comp = next(c for c in sbom.make_sbom(plan, [app], origins={app: origin})["components"])
    assert comp["externalReferences"] == [
        {"type": "vcs", "url": "https://x.example/r", "comment": f"source: commit {COMMIT}"}
    ]


def test_sbom_matches_the_golden_file(monkeypatch):
    """The whole CycloneDX document, as the image carries it, from fixed inputs (layer
    digests, creation time, properties, one archived source and dedal's version)."""
    monkeypatch.setattr(sbom, "__version__", "0.0.0+golden")
    lock = load_lock(SPACK_DATA / "tiny-dedal.spack.lock")
    plan = tiny_plan()
    hashes = sorted(plan.runtime_closure)
    layers = {
        h: {"key": plan.nodes[h].key, "sha256": hashlib.sha256(h.encode()).hexdigest(), "size": 4096}
        for h in hashes
        if not plan.nodes[h].external
    }
    app = next(h for h in hashes if plan.nodes[h].name == "dedal-app")
    source = git_sources.GitSource(
        package="dedal-app",
        version="1.0",
        repository="https://github.com/example/app",
        ref="v1.0",
        commit=COMMIT,
        prefix="app-1.0/",
        url="https://github.com/example/app/archive/v1.0.tar.gz",
        sha256=SHA,
        size=33658,
    )
    doc = sbom.make_sbom(
        plan,
        hashes,
        layers=layers,
        lock=lock,
        created=1700000000,
        roots=plan.roots,
        properties={"dedal:base_image": "host", "dedal:base_id": "host:test"},
        origins={app: git_sources.origin_record(source)},
    )
    assert_golden("sbom.cdx.json", sbom.dumps(doc).decode())
