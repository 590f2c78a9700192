"""Order hints when the estimates are wrong: dedal's schedule with and without them, replayed
with noisy durations.

    .venv/bin/python benchmarks/schedule/robustness.py [--draws 30] [--sigma 0.1 0.2 0.3 0.5]

Hints (``slurm.order_hints``, by default only where every duration was measured) make Slurm follow a plan
with fixed start times, which beats
list scheduling when the estimates hold (results.md) but could hold cores idle for a job
that runs late. So each hint expires at its planned time. This script measures what that
is worth: for the cases where dedal's schedule has hints, every package's real duration is
its estimate times exp(N(0, sigma)) (the same draws for every variant), and the jobs as
submitted are simulated with those durations (``dedal.schedule.simulate``):

* no hints: the schedule made with ``slurm.order_hints`` off (list scheduling only; the default
  where durations are the model's);
* hints: dedal's schedule, each hint dropped at its planned time (what the executor does);
* hints kept: the same hints never dropped (``afterany`` alone).

Reported: mean makespan over the draws relative to "no hints" (below 1: better), and in how
many draws the variant was strictly shorter. Writes robustness.md and robustness.json.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Dict, Iterator, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from dedal.schedule import DEFAULT_MODEL, Job, Machine, Workload, make_schedule, simulate  # noqa: E402
from run import workloads, write  # noqa: E402

CASES = [("cscs-prgenv-gnu", 1, 8), ("jedi-ci", 1, 8), ("mpi-cuda-pure", 1, 8), ("synthetic-esd", 1, 64)]
OVERHEAD = 3.0
SEED = 11


def noise_draws(wl: Workload, sigma: float, count: int, seed: int = SEED) -> Iterator[Dict[str, float]]:
    """``count`` draws of each package's real duration over its estimate, exp(N(0, sigma)),
    from one generator seeded with ``seed`` (the same draws for every caller and variant)."""
    rng = random.Random(seed)
    for _ in range(count):
        yield {h: math.exp(rng.gauss(0.0, sigma)) for h in wl.order}


def actual(
    jobs: List[Job], wl: Workload, factor: Dict[str, float], keep_hints: bool = True, never_expire: bool = False
) -> List[Job]:
    """The jobs with their real durations (each package's estimate times its factor)."""
    out = []
    for j in jobs:
        real = OVERHEAD + sum(DEFAULT_MODEL.seconds(wl.duration[h], j.cores) * factor[h] for h in j.hashes)
        order = {a: (math.inf if never_expire else t) for a, t in j.order.items()} if keep_hints else {}
        out.append(replace(j, est_s=real, order=order))
    return out


def run(draws: int, sigmas: List[float], data: Path) -> dict:
    wls = workloads(data)
    rows = []
    for name, nodes, cores in CASES:
        wl = wls[name]
        hinted = make_schedule(wl, Machine(nodes=nodes, cores=cores, overhead_s=OVERHEAD), hints=True)
        listed = make_schedule(wl, Machine(nodes=nodes, cores=cores, overhead_s=OVERHEAD))
        for sigma in sigmas:
            base: List[float] = []
            hint: List[float] = []
            kept: List[float] = []
            for factor in noise_draws(wl, sigma, draws):
                base.append(simulate(actual(listed.jobs, wl, factor), nodes=nodes, cores=cores).makespan_s)
                hint.append(simulate(actual(hinted.jobs, wl, factor), nodes=nodes, cores=cores).makespan_s)
                kept.append(
                    simulate(actual(hinted.jobs, wl, factor, never_expire=True), nodes=nodes, cores=cores).makespan_s
                )
            mean = statistics.mean(base)
            row = {
                "workload": name,
                "nodes": nodes,
                "cores": cores,
                "sigma": sigma,
                "draws": draws,
                "hints": sum(len(j.order) for j in hinted.jobs),
                "planned_ratio_hints": round(hinted.makespan_s / listed.makespan_s, 4),
                "no_hints_mean_s": round(mean, 1),
                "hints_vs_no_hints": round(statistics.mean(hint) / mean, 4),
                "hints_shorter_in": sum(h < b - 1e-6 for h, b in zip(hint, base)),
                "kept_vs_no_hints": round(statistics.mean(kept) / mean, 4),
                "kept_shorter_in": sum(k < b - 1e-6 for k, b in zip(kept, base)),
            }
            rows.append(row)
            print(
                f"{name:16} {nodes}x{cores:<3} sigma {sigma:.1f}: hints {row['hints_vs_no_hints']:.4f} "
                f"(shorter in {row['hints_shorter_in']}/{draws}), hints kept {row['kept_vs_no_hints']:.4f} "
                f"(shorter in {row['kept_shorter_in']}/{draws}); exact estimates {row['planned_ratio_hints']:.4f}",
                flush=True,
            )
    return {"benchmark": "schedule-robustness", "seed": SEED, "overhead_s": OVERHEAD, "rows": rows}


def markdown(result: dict) -> str:
    lines = [
        "# Order hints under wrong estimates",
        "",
        "Written by `benchmarks/schedule/robustness.py` (see its docstring). Each package's real duration is",
        "its estimate times exp(N(0, sigma)); sigma 0.3 is roughly +-30 %. Mean makespan over the draws",
        "relative to dedal's schedule without hints (list scheduling only); below 1 is better.",
        "`exact` is the same ratio when every estimate holds.",
        "",
        "| workload | nodes x cores | hints | exact | sigma | hints, dropped at their time | shorter in | "
        "hints kept | shorter in |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['workload']} | {r['nodes']} x {r['cores']} | {r['hints']} | {r['planned_ratio_hints']:.4f} | "
            f"{r['sigma']:.1f} | **{r['hints_vs_no_hints']:.4f}** | {r['hints_shorter_in']}/{r['draws']} | "
            f"{r['kept_vs_no_hints']:.4f} | {r['kept_shorter_in']}/{r['draws']} |"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=30)
    ap.add_argument("--sigma", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.5])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "spack")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    write(args.out, "robustness", run(args.draws, args.sigma, args.data), markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
