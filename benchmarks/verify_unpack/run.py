"""Unpacking an image's root for the native runs: read in place in the SIF against copied out first.

``dedal verify`` runs the benchmarks natively in the image's own root filesystem, unpacked once
into dedal's cache. Until 2026-11-29 it first copied the SIF's squashfs partition into a file of
its own and unpacked that; now ``squashfs.extract`` reads the partition in place, at its offset.
Each round unpacks the same SIF both ways into the same directory (order alternating between
rounds, the page cache warm for both: the SIF is read once before the first round), and records
wall time and the most disk the way took beside the unpacked tree (the copy: the partition's size).

    .venv/bin/python benchmarks/verify_unpack/run.py [--image IMAGE.sif] [--rounds 5] [--dir DIR]

Default image: the demo's (``~/.local/share/dedal/images/demo/latest.sif``, made by the README's
first command). Results: benchmarks/verify_unpack/results.json and results.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from dedal.adapters import squashfs
from dedal.model import sif

HERE = Path(__file__).resolve().parent


def copied_out(image: Path, dest: Path, work: Path) -> int:
    """The former way: the partition copied into a file, unpacked from there; bytes of the copy."""
    part = sif.primary_partition(sif.read_sif(image))
    copy = work / "partition.sqfs"
    with open(image, "rb") as src, open(copy, "wb") as dst:
        src.seek(part.offset)
        left = part.size
        while left > 0:
            chunk = src.read(min(left, 8 << 20))
            dst.write(chunk)
            left -= len(chunk)
    try:
        squashfs.extract(copy, dest, devices=False)
    finally:
        copy.unlink()
    return part.size


def in_place(image: Path, dest: Path, work: Path) -> int:
    """dedal's way: unsquashfs at the partition's offset in the SIF; no bytes beside the tree."""
    part = sif.primary_partition(sif.read_sif(image))
    squashfs.extract(image, dest, devices=False, offset=part.offset)
    return 0


WAYS = {"copied out": copied_out, "in place": in_place}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", type=Path, default=Path.home() / ".local/share/dedal/images/demo/latest.sif")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None, help="where to unpack (default: a new directory in /tmp)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dedal-unpack-", dir=args.dir))
    with open(args.image, "rb") as f:  # warm the page cache for both ways alike
        while f.read(8 << 20):
            pass
    rows: List[Dict[str, object]] = []
    try:
        for r in range(args.rounds):
            order = list(WAYS) if r % 2 == 0 else list(reversed(WAYS))
            for way in order:
                dest = work / "root"
                start = time.monotonic()
                extra = WAYS[way](args.image, dest, work)
                rows.append({"round": r + 1, "way": way, "seconds": round(time.monotonic() - start, 3), "extra": extra})
                files = sum(1 for _ in dest.rglob("*"))
                rows[-1]["files"] = files
                shutil.rmtree(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {w: statistics.median(float(x["seconds"]) for x in rows if x["way"] == w) for w in WAYS}
    ratio = med["in place"] / med["copied out"]
    result = {
        "image": str(args.image),
        "image_bytes": args.image.stat().st_size,
        "unpacked_in": str(work.parent),
        "rounds": rows,
        "median_seconds": med,
        "ratio_in_place_to_copied": round(ratio, 3),
    }
    (HERE / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Unpacking the image's root for the native runs",
        "",
        f"Image `{args.image.name}`, {args.image.stat().st_size / 2**20:.0f} MiB; unpacked in {work.parent} "
        f"({args.rounds} rounds, order alternating).",
        "",
        "| round | way | seconds | extra disk beside the tree | files |",
        "| --- | --- | --- | --- | --- |",
    ]
    for x in rows:
        lines.append(
            f"| {x['round']} | {x['way']} | {x['seconds']} | {int(x['extra']) / 2**20:.0f} MiB | {x['files']} |"  # type: ignore[arg-type]
        )
    lines += [
        "",
        f"Median: copied out {med['copied out']:.2f} s, in place {med['in place']:.2f} s; "
        f"in place / copied out = **{ratio:.2f}**.",
        "",
    ]
    (HERE / "results.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
