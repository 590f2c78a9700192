"""MPI_Init in the image as root against as a user who is not root: how sites run Apptainer.

As root dedal's verification mounts the image with the kernel's squashfs (a loop device), as
Apptainer does in its setuid mode; a user who is not root gets squashfuse (FUSE), as Apptainer
does without setuid, on most sites. The shared libraries MPI_Init loads come through that mount.
Each round runs ``dedal verify run IMAGE --benchmarks init`` once as root and once as ``--user``
(order alternating between rounds), and takes container / native of the MPI_Init medians (each
verification's own native runs are its baseline, measured beside its container runs). The table
has every round and the median of the rounds' ratios per side.

Needs: root; a user (``--user``, e.g. ``useradd -m sci``) who can run this checkout's ``dedal``
(its .venv's Python readable) and open ``/dev/fuse`` (Debian's default mode 0666); Apptainer on
PATH; an image readable by that user (``--image``, default: the demo's, copied to /tmp).

    .venv/bin/python benchmarks/unprivileged/run.py --user sci [--rounds 3] [--image IMAGE.sif]

Results: benchmarks/unprivileged/results.json and results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
DEDAL = HERE.parent.parent / ".venv" / "bin" / "dedal"


def init_ratio(user: str, image: Path, home: str) -> Dict[str, float]:
    """One verification of MPI_Init as ``user`` ("root": this process), its medians and ratio."""
    out = Path(tempfile.mkdtemp(prefix="dedal-unpriv-"))
    os.chmod(out, 0o777)
    cmd = [str(DEDAL), "verify", "run", str(image), "-o", str(out / "report"), "--benchmarks", "init"]
    env = {"PATH": f"{Path(shutil.which('apptainer') or '/usr/bin/apptainer').parent}:/usr/bin:/bin", "HOME": home}
    if user != "root":
        runuser = shutil.which("runuser") or "/usr/sbin/runuser"
        cmd = [runuser, "-u", user, "--", "env", *(f"{k}={v}" for k, v in env.items()), *cmd]
    else:
        env["APPTAINER_DROP_CAPS"] = os.environ.get("APPTAINER_DROP_CAPS", "CAP_SYS_RESOURCE")
    t0 = time.monotonic()
    subprocess.run(cmd, env={**os.environ, **env}, check=True, capture_output=True, text=True, timeout=900)
    report = json.loads((out / "report" / "verify.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    [check] = [c for c in report["checks"] if c["name"].endswith("init intra-node")]
    size = check["sizes"][0]
    native, container = size["native"]["median"], size["container"]["median"]
    return {
        "native_ms": native,
        "container_ms": container,
        "ratio": round(container / native, 4),
        "seconds": round(time.monotonic() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--user", required=True, help="a user who is not root")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--image", type=Path, default=None)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the root side and runuser need it")
    image = args.image
    if image is None:
        demo = Path.home() / ".local/share/dedal/images/demo/latest.sif"
        image = Path("/tmp/dedal-unpriv-demo.sif")
        shutil.copyfile(demo, image)
        os.chmod(image, 0o644)
    home = subprocess.run(["getent", "passwd", args.user], capture_output=True, text=True, check=True)
    user_home = home.stdout.split(":")[5]
    rows: List[Dict[str, object]] = []
    for r in range(args.rounds):
        order = ["root", args.user] if r % 2 == 0 else [args.user, "root"]
        for who in order:
            row = {"round": r + 1, "user": "root" if who == "root" else "not root"}
            row.update(init_ratio(who, image, str(Path.home()) if who == "root" else user_home))
            rows.append(row)
            print(json.dumps(row), flush=True)
    median = {
        side: statistics.median(float(x["ratio"]) for x in rows if x["user"] == side) for side in ("root", "not root")
    }
    result = {"image": str(image), "rounds": args.rounds, "rows": rows, "median_ratio": median}
    (HERE / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# MPI_Init in the image: root (kernel squashfs) against a user who is not root (squashfuse)",
        "",
        f"`benchmarks/unprivileged/run.py --user {args.user} --rounds {args.rounds}`, image `{image.name}`; "
        "container / native of the MPI_Init medians, each verification's native runs its baseline.",
        "",
        "| round | user | native (ms) | container (ms) | container / native | verification (s) |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for x in rows:
        lines.append(
            f"| {x['round']} | {x['user']} | {x['native_ms']:.2f} | {x['container_ms']:.2f} | {x['ratio']:.3f} "
            f"| {x['seconds']} |"
        )
    lines += ["", f"Median of the rounds: root {median['root']:.3f}, not root {median['not root']:.3f}.", ""]
    (HERE / "results.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
