"""`dedal inspect` through the installed console script."""

from __future__ import annotations

import json

from dedal.model import sif
from tests.model.test_sif import DEFINITION, LABELS, METADATA, SBOM


def make(tmp_path, small_sqfs, **kw):
    out = tmp_path / "img.sif"
    args = dict(definition=DEFINITION, labels=LABELS, metadata=METADATA, sbom=SBOM)
    args.update(kw)
    sif.write_sif(out, small_sqfs, **args)
    return out


def test_inspect_text(run_dedal, tmp_path, small_sqfs):
    img = make(tmp_path, small_sqfs)
    r = run_dedal("inspect", str(img))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "SIF 01, amd64" in out
    assert "FS (Squashfs/*System/amd64)" in out and "inspect-metadata.json" in out
    assert "dedal.env: test" in out
    assert "layers: 1" in out and "zlib@1.3.1" in out
    assert "SBOM: CycloneDX 1.5, 2 components (2 library), for esd-test 1" in out
    r = run_dedal("inspect", "--definition", str(img))
    assert "Bootstrap: dedal" in r.stdout


def test_inspect_json(run_dedal, tmp_path, small_sqfs):
    img = make(tmp_path, small_sqfs)
    r = run_dedal("inspect", "--json", str(img))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [o["type"] for o in data["objects"]][-1] == "FS (Squashfs/*System/amd64)"
    assert all(o["group"] == 1 for o in data["objects"])
    assert data["labels"]["dedal.env"] == "test"
    assert data["layers"] == [{"spec": "zlib@1.3.1", "key": "abc123", "size": 1000}]
    assert data["sbom"]["components"] == 2 and data["sbom"]["format_declared"] == "cyclonedx-json"
    assert data["sizes"]["file"] == img.stat().st_size
    assert data["sizes"]["rootfs_partition"] == small_sqfs.stat().st_size
    assert data["rootfs"]["compression"] == "zstd"
    assert data["primary_arch"] == "amd64"
    part = [o for o in data["objects"] if o["datatype"] == sif.DATA_PARTITION][0]
    assert part["offset"] % 4096 == 0


def test_inspect_without_sbom_and_labels_from_metadata(run_dedal, tmp_path, small_sqfs):
    img = make(
        tmp_path,
        small_sqfs,
        sbom=None,
        labels={},
        metadata={"attributes": {"labels": {"from": "metadata"}}, "dedal": {"layers": ["a", "b"]}},
    )
    data = json.loads(run_dedal("inspect", "--json", str(img)).stdout)
    assert data["sbom"] is None
    assert data["labels"] == {"from": "metadata"}
    assert data["layers"] == ["a", "b"]
    text = run_dedal("inspect", str(img)).stdout
    assert "SBOM: none" in text and "layers: 2" in text


def test_inspect_bad_files_one_line_error(run_dedal, tmp_path, small_sqfs):
    for bad, message in ((tmp_path / "missing.sif", "no such file"), (small_sqfs, "not a SIF image")):
        r = run_dedal("inspect", str(bad))
        assert r.returncode == 2
        assert r.stderr.startswith("dedal: error: ") and message in r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    img = make(tmp_path, small_sqfs)
    cut = tmp_path / "cut.sif"
    cut.write_bytes(img.read_bytes()[:33000])
    r = run_dedal("inspect", str(cut))
    assert r.returncode == 2 and "truncated SIF" in r.stderr


def test_inspect_remote_goes_to_publish(run_dedal):
    """oras:// references are handed to dedal.stages.publish.inspect_remote (an unreachable registry
    is a one-line error, not a traceback; the retries before it are said as they happen)."""
    r = run_dedal("inspect", "oras://127.0.0.1:9/esd/none:latest", timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    *retries, last = r.stderr.strip().splitlines()
    assert last.startswith("dedal: error: ") and "127.0.0.1:9" in last and "connection" in last
    assert all(line.startswith("registry 127.0.0.1:9: ") and "retry" in line for line in retries), retries
