"""`dedal diff A.sif B.sif`: SIFs written by the tests (real mksquashfs, dedal's SIF writer)
that are identical, differ by one label, by one file, by an entry only one has; hostile
inputs (issue 39, item 3): a FIFO, a large object, an entry named '..', a name with a
line break."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Tuple

import pytest

from dedal.adapters import squashfs
from dedal.model import sif
from dedal.stages.sifdiff import content_diff, diff_images, json_diff


def _image(tmp: Path, name: str, files: dict, labels: dict) -> Path:
    root = tmp / f"{name}-root"
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
    os.chmod(root, 0o755)
    part = tmp / f"{name}.sqfs"
    squashfs.pack([root], part)
    out = tmp / f"{name}.sif"
    sif.write_sif(
        out,
        part,
        definition="Bootstrap: dedal\n",
        labels=labels,
        metadata={"data": {"attributes": {"labels": labels}}},
        created=1700000000,
    )
    return out


FILES = {
    "opt/sw/pkg/bin/tool": b"\x7fELF\x00binary",
    "opt/sw/pkg/.spack/spec.json": '{"a": 1, "b": [1, 2]}',
    "opt/sw/pkg/share/notes.txt": "one\ntwo\nthree\n",
    "opt/sw/pkg/log.txt.gz": gzip.compress(b"x\n", mtime=0),
}
LABELS = {"dedal.env": "t", "org.opencontainers.image.created": "2023-11-14T22:13:20Z"}


@pytest.fixture
def images(tmp_path):
    if os.geteuid() != 0 and not os.path.exists("/dev/fuse"):
        pytest.skip("needs root or FUSE to mount the partitions")
    a = _image(tmp_path, "a", FILES, LABELS)
    same = _image(tmp_path, "same", FILES, LABELS)
    label = _image(tmp_path, "label", FILES, {**LABELS, "dedal.env": "u"})
    changed = dict(FILES)
    changed["opt/sw/pkg/share/notes.txt"] = "one\nTWO\nthree\n"
    changed["opt/sw/pkg/extra/new.txt"] = "new"
    del changed["opt/sw/pkg/log.txt.gz"]
    file = _image(tmp_path, "file", changed, LABELS)
    return a, same, label, file


def test_identical(images, run_dedal):
    a, same, _label, _file = images
    r = run_dedal("diff", str(a), str(same))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("identical: ") and len(r.stdout.splitlines()) == 1
    data = json.loads(run_dedal("diff", str(a), str(same), "--json").stdout)
    assert data["identical"] is True and data["differences"] == []


def test_one_label(images, run_dedal):
    a, _same, label, _file = images
    r = run_dedal("diff", str(a), str(label))
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("differ: ") and "1 label" in lines[0]
    assert "label dedal.env: changed: 't' -> 'u'" in lines
    data = json.loads(run_dedal("diff", str(a), str(label), "--json").stdout)
    labels = [d for d in data["differences"] if d["where"] == "label"]
    assert labels == [{"where": "label", "name": "dedal.env", "what": "changed", "a": "t", "b": "u", "detail": []}]
    files = [d["name"] for d in data["differences"] if d["where"] == "file"]
    assert files == []  # the labels live outside the partition here: no file differs


def test_one_file(images, run_dedal):
    a, _same, _label, file = images
    r = run_dedal("diff", str(a), str(file), "--json")
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    found = {(d["name"], d["what"]) for d in data["differences"] if d["where"] == "file"}
    assert found == {
        ("/opt/sw/pkg/share/notes.txt", "content"),
        ("/opt/sw/pkg/extra", "only in B"),
        ("/opt/sw/pkg/log.txt.gz", "only in A"),
    }
    notes = next(d for d in data["differences"] if d["name"] == "/opt/sw/pkg/share/notes.txt")
    assert "-two" in notes["detail"] and "+TWO" in notes["detail"]
    assert not [d for d in data["differences"] if d["where"] == "label"]
    text = run_dedal("diff", str(a), str(file)).stdout
    assert "file /opt/sw/pkg/extra: only in B (directory with 1 entries)" in text
    assert text.splitlines()[0].startswith("differ: ") and "3 files" in text.splitlines()[0]
    quick = run_dedal("diff", str(a), str(file), "--no-files")
    assert quick.returncode == 1 and "file " not in quick.stdout and "(files not compared)" in quick.stdout


def test_bad_input(images, run_dedal, tmp_path):
    a = images[0]
    text = tmp_path / "not.sif"
    text.write_text("hello\n")
    for other, message in (
        (text, "not a SIF image"),
        (tmp_path / "missing.sif", "no such file"),
        (tmp_path, "is a directory"),
    ):
        r = run_dedal("diff", str(a), str(other))
        assert r.returncode == 2 and r.stdout == ""
        assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr


def test_content_diffs():
    assert json_diff({"a": 1, "b": {"c": "x"}}, {"a": 1, "b": {"c": "y"}, "d": []}) == ['b.c: "x" -> "y"', "d: - -> []"]
    assert json_diff({"l": json.dumps({"k": 1})}, {"l": json.dumps({"k": 2})}) == ["l.k: 1 -> 2"]  # JSON in a string
    lines = content_diff("/x.txt.gz", gzip.compress(b"a\nb\n", mtime=0), gzip.compress(b"a\nc\n", mtime=0))
    assert "-b" in lines and "+c" in lines
    same_text = content_diff("/x.gz", gzip.compress(b"a\n", mtime=0), gzip.compress(b"a\n", mtime=1))
    assert same_text == ["(same text; the gzip headers differ: time stamp or file name)"]
    assert content_diff("/bin/x", b"\x00\x01", b"\x00\x02") == []  # binary: no text diff


def test_api_sorts_and_counts(images):
    a, _same, label, _file = images
    res = diff_images(a, label)
    assert not res.identical and res.counts()["label"] == 1
    assert [d.where for d in res.differences] == sorted(
        (d.where for d in res.differences), key=["header", "label", "object", "file"].index
    )


# ----------------------------------------------------------------------------- hostile inputs (issue 39, item 3)


@pytest.mark.reliability
def test_a_fifo_or_a_device_is_refused_at_once(images, run_dedal, tmp_path):
    a = images[0]
    fifo = tmp_path / "pipe.sif"
    os.mkfifo(fifo)
    for other, says in ((fifo, "is a FIFO, not a regular file"), (Path("/dev/zero"), "is a character device")):
        for args in ((str(a), str(other)), (str(other), str(a))):
            r = run_dedal("diff", *args, timeout=60)  # was: blocked forever opening the FIFO
            assert r.returncode == 2 and r.stdout == "", r.stderr
            assert r.stderr.strip().splitlines() == [
                f"dedal: error: {other}: {says}" + ("" if "FIFO" in says else ", not a regular file")
            ]


def _sif_with_object(tmp: Path, name: str, size: int, last: bytes) -> Path:
    """A SIF with a non-partition object of ``size`` bytes (siftool add, datatype Generic)."""
    from tests.fixtures.registry import siftool

    image = _image(tmp, name, FILES, LABELS)
    blob = tmp / f"{name}.bin"
    with open(blob, "wb") as fh:
        for _ in range(size >> 20):
            fh.write(b"{" * (1 << 20))  # text-like bytes: no NUL to stop a text diff early
        fh.write(last)
    subprocess.run(
        [siftool(), "add", str(image), str(blob), "--datatype", "7", "--filename", "big.json"],
        check=True,
        capture_output=True,
    )
    blob.unlink()
    return image


@pytest.mark.reliability
def test_a_large_object_is_streamed_with_bounded_memory(tmp_path):
    """A 150 MB object in each image: the diff's largest resident set stays under 100 MB
    (objects were read whole, twice: 640 MB for 300 MB objects; now 42 MB)."""
    if os.geteuid() != 0 and not os.path.exists("/dev/fuse"):
        pytest.skip("needs root or FUSE to mount the partitions")
    a = _sif_with_object(tmp_path, "a", 150 << 20, b"A")
    b = _sif_with_object(tmp_path, "b", 150 << 20, b"B")
    measure = (
        "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
        "sys.stderr.write(r.stdout + r.stderr)"
    )
    from tests.conftest import dedal_exe

    r = subprocess.run(
        [sys.executable, "-c", measure, dedal_exe(), "diff", str(a), str(b), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    rc, maxrss_kib = map(int, r.stdout.split())
    data = json.loads(r.stderr)
    # siftool add stamps the object (and the header) with the time of day: the two images were
    # made a second apart or not; beside those stamps the content is the one difference
    stamps = [
        d for d in data["differences"] if d["what"] == "time" or (d["where"], d["name"]) == ("header", "modified")
    ]
    (big,) = [d for d in data["differences"] if d not in stamps]
    assert rc == 1 and big["name"] == "big.json (Generic/Raw)" and big["what"] == "content", r.stderr[-2000:]
    assert maxrss_kib < 100 * 1024, f"{maxrss_kib} KiB"


def _crafted(tmp: Path, name: str, files: dict, patch: Optional[Tuple[bytes, bytes]] = None) -> Path:
    """A SIF whose squashfs holds ``files``, uncompressed, with the bytes ``patch[0]``
    (one name, once) replaced by ``patch[1]``: what a hand-made image can hold."""
    root = tmp / f"{name}-root"
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(data)
    os.chmod(root, 0o755)
    part = tmp / f"{name}.sqfs"
    subprocess.run(
        [
            "mksquashfs",
            str(root),
            str(part),
            "-noappend",
            "-all-root",
            "-noI",
            "-noD",
            "-noF",
            "-noX",
            "-mkfs-time",
            "0",
            "-all-time",
            "0",
            "-quiet",
            "-no-progress",
        ],
        check=True,
        capture_output=True,
    )
    if patch:
        raw = part.read_bytes()
        assert raw.count(patch[0]) == 1
        part.write_bytes(raw.replace(patch[0], patch[1]))
    out = tmp / f"{name}.sif"
    sif.write_sif(
        out,
        part,
        definition="Bootstrap: dedal\n",
        labels=LABELS,
        metadata={"data": {"attributes": {"labels": LABELS}}},
        created=1700000000,
    )
    return out


@pytest.mark.reliability
def test_an_entry_named_dotdot_is_shown_not_hidden(images, run_dedal, tmp_path):
    files = {"opt/d/Q7": "hello\n", "opt/d/zz": "other\n"}
    a = _crafted(tmp_path, "plain-d", files)
    b = _crafted(tmp_path, "dotdot-d", files, (b"Q7", b".."))  # the entry Q7 renamed to '..'
    r = run_dedal("diff", str(a), str(b), "--json")
    assert r.returncode == 1, r.stderr
    found = {(d["name"], d["what"]) for d in json.loads(r.stdout)["differences"] if d["where"] == "file"}
    assert found == {("/opt/d/..", "only in B"), ("/opt/d/Q7", "only in A")}, found
    text = run_dedal("diff", str(a), str(b)).stdout
    assert "file /opt/d/..: only in B (a file named '..' that no path reaches)" in text.splitlines(), text


@pytest.mark.reliability
def test_a_name_with_a_line_break_cannot_forge_a_line(images, run_dedal, tmp_path):
    forged = "x\nlabel dedal.env: changed: 't' -> 'evil'"
    a = _image(tmp_path, "plain", FILES, LABELS)
    b = _image(tmp_path, "forging", {**FILES, f"opt/sw/{forged}": "boo", "opt/sw/back\\slash": "\x1b[2Jx"}, LABELS)
    r = run_dedal("diff", str(a), str(b))
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("differ: ") and "2 files" in lines[0]
    assert all(line.startswith(("file /", "object ", "label ", "header ", "    ")) for line in lines[1:]), lines
    assert not any(line.startswith("label ") for line in lines)
    assert "file /opt/sw/x\\nlabel dedal.env: changed: 't' -> 'evil': only in B (file)" in lines
    assert "file /opt/sw/back\\\\slash: only in B (file)" in lines  # a backslash cannot fake an escape
    names = {d["name"] for d in json.loads(run_dedal("diff", str(a), str(b), "--json").stdout)["differences"]}
    assert f"/opt/sw/{forged}" in names and "/opt/sw/back\\slash" in names  # --json: exact
