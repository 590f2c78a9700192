"""squashfs adapter: an unpack that cannot fit is refused before it starts, on real images."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dedal.adapters import squashfs
from dedal.errors import NoSpace, ToolError


def _image(tmp_path: Path, sizes: dict) -> Path:
    src = tmp_path / "src"
    for name, size in sizes.items():
        f = src / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"\0" * size)  # zeros: a tiny image that unpacks to its full size
    out = tmp_path / "image.sqfs"
    squashfs.pack([src], out)
    return out


def test_what_an_unpack_takes_is_each_file_in_whole_blocks_and_a_block_a_directory(tmp_path: Path) -> None:
    image = _image(tmp_path, {"a": 1, "b": 4096, "sub/c": 5000, "sub/deeper/d": 0})
    listing = squashfs.entries(image)
    assert sorted(e["path"] for e in listing) == ["a", "b", "sub", "sub/c", "sub/deeper", "sub/deeper/d"]
    # a: one block, b: one, c: two, d: none; the directories sub and sub/deeper: one each
    assert squashfs.unpacked_bytes(listing) == (1 + 1 + 2 + 0 + 2) * 4096
    out = tmp_path / "out"
    squashfs.extract(image, out, merge=False)  # room enough: unpacked as before
    assert (out / "sub" / "c").stat().st_size == 5000


def test_an_unpack_larger_than_the_free_disk_is_refused_before_it_starts(tmp_path: Path, small_disk) -> None:
    small_fs = small_disk("1m")
    image = _image(tmp_path, {"big": 3 * 1024 * 1024, "small": 10})
    dest = small_fs / "cache" / "root"
    with pytest.raises(NoSpace) as e:
        squashfs.extract(image, dest, merge=False)
    msg = e.value.one_line()
    # where it would go, as far as it exists (dest's parents are made first)
    assert f"unpacking {image} needs about 3.0 MiB in {small_fs}/cache, which has" in msg
    assert "DEDAL_CACHE_DIR" in msg
    assert not dest.exists()  # nothing written: no half-unpacked tree to clean up
    assert squashfs.unpacked_bytes(squashfs.entries(image)) > shutil.disk_usage(small_fs).free
    # what fits there still unpacks
    fits = _image(tmp_path / "fits", {"small": 10})
    squashfs.extract(fits, small_fs / "fits", merge=False)
    assert (small_fs / "fits" / "small").stat().st_size == 10
    # a caller that unpacks many small images (layers) leaves the weighing out: unsquashfs meets the full disk
    with pytest.raises(ToolError, match="No space left on device"):
        squashfs.extract(image, small_fs / "unweighed", merge=False, room=False)
