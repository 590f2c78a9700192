"""dedal.model.sif against the real siftool: layout, reader agreement, reproducibility, bad files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from dedal.model import sif
from dedal.adapters import siftool
from dedal.errors import UserError

DEFINITION = "Bootstrap: dedal\nFrom: debian-trixie\n\n%labels\n    maintainer esd\n"
LABELS = {
    "org.label-schema.schema-version": "1.0",
    "dedal.env": "test",
    "dedal.layers": json.dumps([{"spec": "zlib@1.3.1", "key": "abc123", "size": 1000}]),
}
METADATA = {"type": "container", "attributes": {"deffile": DEFINITION}}
SBOM = json.dumps(
    {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {"component": {"name": "esd-test", "version": "1"}},
        "components": [
            {"type": "library", "name": "zlib", "version": "1.3.1"},
            {"type": "library", "name": "openmpi", "version": "5.0.7"},
        ],
    }
).encode()


def write(out: Path, sqfs: Path, **kw) -> sif.SifInfo:
    args = dict(definition=DEFINITION, labels=LABELS, metadata=METADATA, sbom=SBOM)
    args.update(kw)
    return sif.write_sif(out, sqfs, **args)


def test_layout_is_what_apptainer_build_writes(tmp_path, small_sqfs, siftool_exe, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    out = tmp_path / "img.sif"
    write(out, small_sqfs)
    rows = siftool.list_objects(out)
    assert [r["type"] for r in rows] == [
        "Def.FILE",
        "JSON.Generic",
        "JSON.Labels",
        "SBOM (cyclonedx-json)",
        "FS (Squashfs/*System/amd64)",
    ]
    assert {r["group"] for r in rows} == {"1"}
    assert {r["link"] for r in rows} == {"NONE"}
    assert int(rows[-1]["start"]) % 4096 == 0
    head = siftool.header(out)
    assert head["Launch Script"] == "#!/usr/bin/env run-singularity"
    assert head["Version"] == "01"
    assert head["Primary Architecture"] == "amd64"
    assert head["Descriptors Total"] == "48" and head["Descriptors Free"] == "43"
    assert "Created At" not in head  # deterministic zero time, like sif.OptCreateDeterministic
    part = siftool.info(out, 5)
    assert (part["Filesystem Type"], part["Partition Type"], part["Architecture"]) == ("Squashfs", "*System", "amd64")
    assert siftool.info(out, 2)["Name"] == "inspect-metadata.json"
    assert siftool.info(out, 3)["Name"] == "labels.json"
    assert siftool.info(out, 4)["Format"] == "cyclonedx-json"
    assert out.read_bytes()[:32].rstrip(b"\0") == b"#!/usr/bin/env run-singularity\n"
    assert out.stat().st_mode & 0o111  # executable, like apptainer build's output


def _assert_reader_agrees(path: Path) -> None:
    info = sif.read_sif(path)
    rows = siftool.list_objects(path)
    assert len(rows) == len(info.descriptors)
    head = siftool.header(path)
    assert info.id == head["ID"]
    assert info.primary_arch == head["Primary Architecture"]
    assert info.launch_script.rstrip("\n") == head["Launch Script"]
    assert str(info.descriptors_offset) == head["Descriptors Offset"]
    assert str(info.data_offset) == head["Data Offset"]
    for d, row in zip(info.descriptors, rows):
        assert (str(d.id), str(d.group), d.offset, d.offset + d.size, d.type_label) == (
            row["id"],
            row["group"],
            int(row["start"]),
            int(row["end"]),
            row["type"],
        )
        detail = siftool.info(path, d.id)
        assert int(detail["Offset"]) == d.offset and int(detail["Size"]) == d.size
        assert detail.get("Name", "") == d.name
        if d.datatype != sif.DATA_PARTITION:
            assert siftool.dump(path, d.id) == sif.read_object(path, d)


def test_reader_agrees_with_siftool_on_dedal_sif(tmp_path, small_sqfs, siftool_exe):
    out = tmp_path / "img.sif"
    write(out, small_sqfs)
    _assert_reader_agrees(out)


def test_reader_agrees_with_siftool_on_siftool_sif(tmp_path, small_sqfs, siftool_exe):
    files = {}
    for name, data in (
        ("d.def", DEFINITION.encode()),
        ("m.json", b'{"type": "container"}\n'),
        ("l.json", json.dumps(LABELS).encode()),
        ("s.json", SBOM),
    ):
        (tmp_path / name).write_bytes(data)
        files[name] = tmp_path / name
    out = tmp_path / "siftool.sif"
    siftool.create(
        out,
        small_sqfs,
        definition=files["d.def"],
        metadata=files["m.json"],
        labels=files["l.json"],
        sbom=files["s.json"],
    )
    _assert_reader_agrees(out)
    info = sif.read_sif(out)
    assert info.created > 1_600_000_000  # siftool stamps the current time
    assert sif.primary_partition(info).size == small_sqfs.stat().st_size


def _zero_times(data: bytes) -> bytes:
    buf = bytearray(data)
    buf[64:80] = bytes(16)  # header created/modified
    for i in range(sif.DESCRIPTOR_CAPACITY):
        base = sif.DESCRIPTORS_OFFSET + i * sif.DESCRIPTOR.size
        buf[base + 41 : base + 57] = bytes(16)  # descriptor created/modified
    return bytes(buf)


def test_writer_is_byte_identical_to_siftool_up_to_times(tmp_path, small_sqfs, siftool_exe):
    """Same objects through siftool (new + add) and through dedal: same bytes except the times."""
    ours = tmp_path / "ours.sif"
    info = write(ours, small_sqfs, created=1_700_000_000)
    objs = {d.datatype: sif.read_object(ours, d) for d in info.descriptors if d.datatype != sif.DATA_PARTITION}
    names = {
        "d.def": sif.DATA_DEFFILE,
        "m.json": sif.DATA_GENERIC_JSON,
        "l.json": sif.DATA_LABELS,
        "s.json": sif.DATA_SBOM,
    }
    for name, dt in names.items():
        (tmp_path / name).write_bytes(objs[dt])
    theirs = tmp_path / "theirs.sif"
    siftool.create(
        theirs,
        small_sqfs,
        definition=tmp_path / "d.def",
        metadata=tmp_path / "m.json",
        labels=tmp_path / "l.json",
        sbom=tmp_path / "s.json",
    )
    again = tmp_path / "again.sif"
    write(again, small_sqfs, created=1_700_000_000, image_id=sif.read_sif(theirs).id)
    assert _zero_times(again.read_bytes()) == _zero_times(theirs.read_bytes())


def test_same_inputs_same_bytes(tmp_path, small_sqfs, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    a, b = tmp_path / "a.sif", tmp_path / "b.sif"
    write(a, small_sqfs)
    write(b, small_sqfs)
    assert a.read_bytes() == b.read_bytes()
    c = tmp_path / "c.sif"
    write(c, small_sqfs, labels={**LABELS, "x": "y"})
    assert sif.read_sif(c).id != sif.read_sif(a).id


def test_source_date_epoch_sets_header_and_descriptor_times(tmp_path, small_sqfs, siftool_exe, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    a, b = tmp_path / "a.sif", tmp_path / "b.sif"
    write(a, small_sqfs)
    write(b, small_sqfs)
    assert a.read_bytes() == b.read_bytes()
    info = sif.read_sif(a)
    assert info.created == info.modified == 1_700_000_000
    assert {d.created for d in info.descriptors} == {1_700_000_000}
    assert siftool.header(a)["Created At"] == "2023-11-14 22:13:20 +0000 UTC"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(UserError, match="SOURCE_DATE_EPOCH"):
        write(tmp_path / "bad.sif", small_sqfs)


def test_without_sbom_and_with_extra_json(tmp_path, small_sqfs, siftool_exe):
    out = tmp_path / "img.sif"
    info = write(out, small_sqfs, sbom=None, extra_json=[("oci-config.json", {"Env": ["A=1"]})])
    assert [d.type_label for d in info.descriptors] == [
        "Def.FILE",
        "JSON.Generic",
        "JSON.Generic",
        "JSON.Labels",
        "FS (Squashfs/*System/amd64)",
    ]
    assert [d.name for d in info.by_type(sif.DATA_GENERIC_JSON)] == ["inspect-metadata.json", "oci-config.json"]
    assert sif.read_json_object(out, info.by_name("oci-config.json")) == {"Env": ["A=1"]}
    assert [r["type"] for r in siftool.list_objects(out)][-1] == "FS (Squashfs/*System/amd64)"


def test_partition_superblock_and_mount_offset(tmp_path, small_sqfs):
    out = tmp_path / "img.sif"
    info = write(out, small_sqfs)
    part = sif.primary_partition(info)
    with open(out, "rb") as fh:
        fh.seek(part.offset)
        assert fh.read(part.size) == small_sqfs.read_bytes()
    sb = sif.squashfs_superblock(out, part.offset)
    assert sb["compression"] == "zstd" and sb["bytes_used"] <= part.size


# ---------------------------------------------------------------------------- bad files


def test_not_a_sif(tmp_path, small_sqfs):
    text = tmp_path / "notes.txt"
    text.write_text("hello\n" * 100)
    with pytest.raises(UserError, match="not a SIF image"):
        sif.read_sif(text)
    with pytest.raises(UserError, match="not a SIF image"):
        sif.read_sif(small_sqfs)
    with pytest.raises(UserError, match="no such file"):
        sif.read_sif(tmp_path / "missing.sif")
    with pytest.raises(UserError, match="is a directory"):
        sif.read_sif(tmp_path)
    empty = tmp_path / "empty.sif"
    empty.write_bytes(b"")
    with pytest.raises(UserError, match="not a SIF image"):
        sif.read_sif(empty)


@pytest.mark.parametrize("keep", [100, 20000, 32200, 33000])
def test_truncated_sif(tmp_path, small_sqfs, keep):
    full = tmp_path / "full.sif"
    write(full, small_sqfs)
    cut = tmp_path / "cut.sif"
    cut.write_bytes(full.read_bytes()[:keep])
    with pytest.raises(UserError, match="truncated SIF|not a SIF"):
        sif.read_sif(cut)


def test_wrong_version_and_corrupt_header(tmp_path, small_sqfs):
    full = tmp_path / "full.sif"
    write(full, small_sqfs)
    data = bytearray(full.read_bytes())
    data[42:45] = b"02\0"
    bad = tmp_path / "v2.sif"
    bad.write_bytes(bytes(data))
    with pytest.raises(UserError, match="unsupported SIF version '02'"):
        sif.read_sif(bad)
    data = bytearray(full.read_bytes())
    struct.pack_into("<q", data, 104, 12345)  # descriptors size that does not match the count
    bad.write_bytes(bytes(data))
    with pytest.raises(UserError, match="corrupt SIF header"):
        sif.read_sif(bad)


def test_no_primary_partition_and_arch_check(tmp_path, small_sqfs, siftool_exe):
    out = tmp_path / "nopart.sif"
    siftool._run("new", str(out))
    (tmp_path / "d.def").write_text(DEFINITION)
    siftool._run("add", str(out), str(tmp_path / "d.def"), "--datatype", "1", "--groupid", "1")
    info = sif.read_sif(out)
    with pytest.raises(UserError, match="no primary system partition"):
        sif.primary_partition(info)
    img = tmp_path / "arm.sif"
    info = write(img, small_sqfs, arch="arm64")
    assert info.primary_arch == "arm64"
    assert siftool.header(img)["Primary Architecture"] == "arm64"
    with pytest.raises(UserError, match="is for arm64, this host is amd64"):
        sif.check_arch(info, "amd64")
    sif.check_arch(info, "arm64")


def test_writer_rejects_bad_input_and_leaves_nothing(tmp_path, small_sqfs):
    out = tmp_path / "img.sif"
    notsq = tmp_path / "x.bin"
    notsq.write_bytes(b"\0" * 4096)
    with pytest.raises(UserError, match="not a squashfs image"):
        write(out, notsq)
    with pytest.raises(UserError, match="squashfs image not found"):
        write(out, tmp_path / "missing.sqfs")
    with pytest.raises(UserError, match="unknown SIF architecture"):
        write(out, small_sqfs, arch="vax")
    assert list(tmp_path.iterdir()) == [notsq]
