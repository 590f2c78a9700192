"""How exactly dedal measures how long a command ran: ``proc.run`` with a log file and a
timeout (how verification runs every benchmark: its job wall time is this number) against
the way it measured before (``Popen.communicate`` with a timeout, which sleeps between polls
of the child, the sleeps doubling up to 50 ms) and against a blocking ``Popen.wait()`` (no
timeout, woken by the exit: the baseline), side by side, interleaved, on ``sleep X`` for X
from 0.06 to 0.54 s in steps of 0.02 s (not a multiple of the 50 ms poll: every phase of it).

    .venv/bin/python benchmarks/run_timing/resolution.py [--reps 5] [--out DIR]

Writes results.md and results.json in ``--out`` (default: next to this file): per duration
the median and worst excess over the baseline's time of the same run, in ms.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from dedal.adapters import proc  # noqa: E402

TIMEOUT_S = 60.0  # a run's timeout as verification gives one: far away, only there


def blocking(argv: List[str], log: Path) -> float:
    """The baseline: Popen + wait() without timeout (the kernel wakes it at the exit)."""
    with open(log, "a") as fh:
        start = time.monotonic()
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh).wait()
        return time.monotonic() - start


def polling(argv: List[str], log: Path) -> float:
    """What proc.run did before: communicate() with a timeout and the output in a file."""
    with open(log, "a") as fh:
        start = time.monotonic()
        with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh) as p:
            p.communicate(None, timeout=TIMEOUT_S)
        return time.monotonic() - start


def dedal_run(argv: List[str], log: Path) -> float:
    """proc.run as verification calls it (log and timeout)."""
    return proc.run(argv, log=log, timeout=TIMEOUT_S).seconds


WAYS: Dict[str, Callable[[List[str], Path], float]] = {"polling (before)": polling, "proc.run": dedal_run}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    durations = [round(0.06 + 0.02 * i, 2) for i in range(25)]
    excess: Dict[str, Dict[float, List[float]]] = {w: {d: [] for d in durations} for w in WAYS}
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "run.log"
        for _ in range(args.reps):
            for d in durations:
                argv = ["sleep", str(d)]
                for way, fn in WAYS.items():  # each way right after a baseline run of the same command
                    base = blocking(argv, log)
                    excess[way][d].append((fn(argv, log) - base) * 1000)
    rows = []
    for d in durations:
        row = {"seconds": d}
        for way in WAYS:
            xs = excess[way][d]
            row[way] = {"median_ms": round(statistics.median(xs), 2), "worst_ms": round(max(xs, key=abs), 2)}
        rows.append(row)
    overall = {way: round(statistics.median([x for d in durations for x in excess[way][d]]), 2) for way in WAYS}
    worst = {way: round(max((x for d in durations for x in excess[way][d]), key=abs), 2) for way in WAYS}
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "reps": args.reps,
        "timeout_s": TIMEOUT_S,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "median_ms": overall, "worst_ms": worst}, indent=1) + "\n"
    )
    ways = list(WAYS)
    lines = [
        "# Measured run time: excess over a blocking wait",
        "",
        f"Measured {meta['date']} by `benchmarks/run_timing/resolution.py` (Python {meta['python']}, "
        f"kernel {meta['kernel']}): `sleep X`, {args.reps} runs per duration and way, each right after a "
        "baseline run of the same command (Popen + `wait()` without timeout); the excess of each way's "
        "time over its baseline's, in ms: median [worst].",
        "",
        "| X (s) | " + " | ".join(ways) + " |",
        "| ---: | " + " | ".join("---:" for _ in ways) + " |",
    ]
    for row in rows:
        cells = [f"{row[w]['median_ms']:.2f} [{row[w]['worst_ms']:.2f}]" for w in ways]
        lines.append(f"| {row['seconds']:.2f} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Over every duration: "
        + "; ".join(f"{w} median {overall[w]:.2f} ms, worst {worst[w]:.2f} ms" for w in ways)
        + ".",
        "",
    ]
    (args.out / "results.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
