"""Fingerprints of schedules: did a change to the scheduler change any schedule?

    .venv/bin/python benchmarks/schedule/fingerprints.py [--baseline DIR] [--sizes 1000 2000]

The sha256 of ``Schedule.to_json()`` (every job, its packages, cores, priority, start,
end and node) and of the plan's ``to_json()`` (but the lock's temporary path) for every case of results.md (its workloads
x 64/8 cores x 1/4/16/64 nodes; dedal, dedal with order hints, per-package) and of the
locks grown from jedi-ci (``grow.py``, ``--sizes``) on 1/16/64/256 nodes. With
``--baseline DIR`` (a checkout of another commit) the same list is made by that
checkout's own copy of this script, in a process of its own, and every case that
differs is named; the exit status is 1 if any does. Every schedule made here also passes
``dedal.schedule.validate`` (dependencies respected, no node over its cores), or it stops. A speed-up of the scheduler that
is meant to change nothing is checked by this, not by its timings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

DATA = ROOT.parent / "shared" / "data" / "spack"
GROWN_FROM = DATA / "jedi-ci.spack.lock"


def _sha(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def fingerprints(sizes: List[int], tmp: Path) -> Dict[str, str]:
    """Case name -> fingerprint, in this process, with this checkout's code."""
    import grow
    import run
    from dedal.model.plan import make_plan
    from dedal.model.spack_lock import load_lock
    from dedal.schedule import Machine, Workload, make_schedule, validate

    out: Dict[str, str] = {}
    for cores in (64, 8):
        for name, wl in run.workloads(DATA).items():
            for nodes in (1, 4, 16, 64):
                for what, kw in (
                    ("dedal", {}),
                    ("hints", {"hints": True}),
                    ("per-package", {"strategy": "per-package"}),
                ):
                    s = make_schedule(wl, Machine(nodes=nodes, cores=cores, overhead_s=3.0), **kw)
                    validate(wl, s)
                    out[f"{name} {nodes}x{cores} {what}"] = _sha(s.to_json())
    for size in sizes:
        path = grow.write(GROWN_FROM, size, tmp / f"grown-{size}.spack.lock")
        plan = make_plan(
            load_lock(path), env_name="grown", install_root="/opt/software", base_image="host", base_id="benchmark"
        )
        out[f"grown-{size} plan"] = _sha(dict(plan.to_json(), lock_path=""))  # the path is a temporary one
        wl = Workload.from_plan(plan)
        for nodes in (1, 16, 64, 256):
            s = make_schedule(wl, Machine(nodes=nodes, cores=64, overhead_s=3.0))
            validate(wl, s)
            out[f"grown-{size} {nodes}x64 dedal"] = _sha(s.to_json())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[1000, 2000])
    ap.add_argument("--baseline", type=Path, help="a checkout of another commit: compare with its fingerprints")
    ap.add_argument("--against", type=Path, help="compare with fingerprints saved by --json")
    ap.add_argument("--json", action="store_true", help="print the fingerprints as JSON (one line)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ours = fingerprints(args.sizes, Path(tmp))
    if args.json:
        print(json.dumps(ours))
        return 0
    if args.against is not None:
        theirs = json.loads(args.against.read_text())
    elif args.baseline is None:
        for k, v in ours.items():
            print(f"{v}  {k}")
        return 0
    else:
        theirs = _baseline(args.baseline, args.sizes)
    differ = [k for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k)]
    for k in differ:
        print(f"differs: {k}: {theirs.get(k)} (baseline) vs {ours.get(k)}")
    print(f"{len(ours) - len(differ)} of {len(ours)} cases identical to the baseline's")
    return 1 if differ else 0


def _baseline(checkout: Path, sizes: List[int]) -> Dict[str, str]:
    """The fingerprints of another checkout, by its own copy of this script."""
    got = subprocess.run(
        [
            sys.executable,
            str(checkout / "benchmarks" / "schedule" / "fingerprints.py"),
            "--json",
            "--sizes",
            *map(str, sizes),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if got.returncode != 0:
        raise SystemExit(f"the baseline's fingerprints failed:\n{got.stderr[-3000:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
