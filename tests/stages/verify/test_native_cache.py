"""The native side's unpacked roots (``verify-native/`` in the cache) stay bounded: every
rebuild of an image is a new identity and a new 1-2 GB copy, so unpacking one removes the
same image's roots beyond the last ``NATIVE_KEEP`` used, but never one that another
verification is using."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dedal.stages.verify import image as I
from dedal.stages.verify import native as N

pytestmark = pytest.mark.reliability


def _image(tmp_path: Path, text: str) -> Path:
    if not shutil.which("mksquashfs"):
        pytest.skip("needs squashfs-tools")
    src = tmp_path / f"src-{text}"
    (src / "etc").mkdir(parents=True)
    (src / "etc" / "hello").write_text(text + "\n")
    out = tmp_path / f"{text}.sqfs"
    subprocess.run(["mksquashfs", str(src), str(out), "-quiet", "-noappend"], check=True, timeout=60)
    return out


def _info(path: Path, name: str, identity: str) -> I.ImageInfo:
    return I.ImageInfo(path=path, kind="squashfs", name=name, identity=identity)


def _roots(cache: Path) -> list:
    return sorted(d.name for d in cache.iterdir())


def _let_go() -> None:
    """What the end of this process does: release the roots it used."""
    for fd in N._IN_USE:
        os.close(fd)
    N._IN_USE.clear()


def test_a_new_root_replaces_the_least_recently_used_of_its_name(tmp_path: Path) -> None:
    cache = tmp_path / "verify-native"
    sq = _image(tmp_path, "v")
    made = {}
    for n, identity in enumerate(("one", "two", "three")):
        root, reused = N.unpack_root(_info(sq, "esd", identity), cache)
        assert not reused and (root / "etc" / "hello").read_text() == "v\n"
        os.utime(root / ".dedal-unpacked", (1000 + n, 1000 + n))  # used: one, two, three
        made[identity] = root.name
    # roots this process uses are never pruned, even beyond NATIVE_KEEP
    assert N.NATIVE_KEEP == 2 and set(made.values()) <= set(_roots(cache))
    # an image whose name starts the same is another name
    other, _ = N.unpack_root(_info(sq, "esd-neuro", "x"), cache)
    _let_go()

    # the next verification (another process) uses "one" again, then unpacks a fourth
    code = f"""
import sys
from pathlib import Path
from dedal.stages.verify import image as I
from dedal.stages.verify import native as N
cache = Path({str(cache)!r})
info = lambda ident: I.ImageInfo(path=Path({str(sq)!r}), kind="squashfs", name="esd", identity=ident)
root, reused = N.unpack_root(info("one"), cache)
assert reused, root
root, reused = N.unpack_root(info("four"), cache)
assert not reused
print(root.name)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    four = out.stdout.strip()
    # kept: "four" (new) and "one" (used just before); gone: "two" and "three"
    assert _roots(cache) == sorted([four, made["one"], other.name])


def test_a_root_another_verification_uses_is_kept(tmp_path: Path) -> None:
    cache = tmp_path / "verify-native"
    sq = _image(tmp_path, "w")
    old, _ = N.unpack_root(_info(sq, "img", "old"), cache)
    os.utime(old / ".dedal-unpacked", (1000, 1000))
    # a verification in another process holds "old" (its shared lock) for as long as it runs
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import fcntl, os, sys, time
fd = os.open({str(old / ".dedal-unpacked")!r}, os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_SH)
print("held", flush=True)
time.sleep(60)
""",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        _let_go()
        for identity in ("a", "b"):
            root, _ = N.unpack_root(_info(sq, "img", identity), cache)
            os.utime(root / ".dedal-unpacked", (2000 + ord(identity), 2000 + ord(identity)))
            _let_go()
        assert old.name in _roots(cache) and (old / "etc" / "hello").read_text() == "w\n"  # in use: kept
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    root, _ = N.unpack_root(_info(sq, "img", "c"), cache)  # no one holds "old" any more
    assert old.name not in _roots(cache) and len(_roots(cache)) == N.NATIVE_KEEP
    assert not [n for n in _roots(cache) if n.startswith(".")]  # no half-removed copy left behind
    _let_go()


def test_the_unpacked_root_holds_no_device_node(tmp_path: Path) -> None:
    """The chroot of the native runs mounts its own /dev; the image's device nodes are left
    out, so a user who is not root can unpack it (unsquashfs: "could not create character
    device ..., because you're not superuser!", exit 2, and dedal verify failed there)."""
    if not shutil.which("mksquashfs"):
        pytest.skip("needs squashfs-tools")
    src = tmp_path / "src"
    (src / "etc").mkdir(parents=True)
    (src / "etc" / "hello").write_text("v\n")
    sq = tmp_path / "dev.sqfs"
    pseudo = ["-p", "dev d 755 0 0", "-p", "dev/null c 666 0 0 1 3", "-p", "dev/zero c 666 0 0 1 5"]
    subprocess.run(["mksquashfs", str(src), str(sq), "-quiet", "-noappend", *pseudo], check=True, timeout=60)
    root, _ = N.unpack_root(_info(sq, "dev", "one"), tmp_path / "verify-native")
    _let_go()
    assert (root / "etc" / "hello").read_text() == "v\n" and (root / "dev").is_dir()
    assert not os.path.lexists(root / "dev" / "null") and not os.path.lexists(root / "dev" / "zero")


def test_a_sifs_root_is_read_in_place_and_one_that_cannot_fit_is_refused(
    tmp_path: Path, small_sqfs, small_disk
) -> None:
    """The root is unpacked from the SIF at its partition's offset (no copy of the partition
    beside it); where the cache's file system cannot hold it, one line before anything is
    written (before: ``internal error: OSError ENOSPC`` while copying the partition out)."""
    from dedal.errors import NoSpace
    from dedal.model import sif

    image = tmp_path / "esd.sif"
    sif.write_sif(image, small_sqfs, definition="bootstrap: scratch\n", labels={}, metadata={})
    info = I.ImageInfo(path=image, kind="sif", name="esd", identity="one")
    root, reused = N.unpack_root(info, tmp_path / "verify-native")
    assert not reused and (root / "data" / "blob").read_bytes() == bytes(range(256)) * 300
    assert (root / "etc" / "os-release").read_text().startswith("ID=dedaltest")
    _let_go()

    cache = small_disk("64k") / "verify-native"  # the blob alone is 75 KiB
    with pytest.raises(NoSpace) as e:
        N.unpack_root(I.ImageInfo(path=image, kind="sif", name="esd", identity="two"), cache)
    assert f"unpacking {image} needs about" in e.value.one_line() and f"in {cache}, which has" in e.value.one_line()
    assert _roots(cache) == []  # no half-unpacked root, no temporary
