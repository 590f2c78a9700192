"""How far is dedal's schedule from the best one? An exact solver's answer, where it has one.

    pip install ortools   # not a dedal dependency: used by this probe only
    .venv/bin/python benchmarks/schedule/exact_probe.py [--seconds 120] [CASE ...]

CASE is ``workload:nodes:cores`` (one node only; default: the single-node cases the
benchmark misses). The same machine model as ``dedal.schedule``, as a constraint
program (OR-tools CP-SAT): one job per package (each pays the overhead), its cores
chosen among 1..p, packages after their requirements, at most C cores in use. That is
a restriction of dedal's model (no job builds two packages): the solver's makespan is
reachable in the model with start times fixed in advance, which Slurm's priorities and
backfill do not reproduce by themselves (replayed by priority = solver start, cscs 1 x 8
came out at 1.10). Its bound is not a bound of dedal's model (merged jobs save
overheads) and is not reported. CP-SAT runs 2 workers and is not deterministic: the
same case varies by about 0.005 from run to run.

Writes exact_probe.md next to this file: the solver's makespan / LB after the time
limit (optimal or not) beside dedal's, in the same model, for the same lower bound.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from dedal.schedule import DEFAULT_MODEL, Workload, make_schedule, package_cores  # noqa: E402
import run as benchmark  # noqa: E402

DEFAULT_CASES = ["cscs-prgenv-gnu:1:8", "jedi-ci:1:8", "synthetic-esd:1:64"]
SCALE = 10  # the solver works in tenths of a second


def solve(wl: Workload, cores: int, overhead_s: float, seconds: float) -> tuple:
    """(makespan found, status name) of the one-job-per-package program."""
    from ortools.sat.python import cp_model

    model = DEFAULT_MODEL
    top = package_cores(wl, cores, model)
    cp = cp_model.CpModel()
    horizon = int(sum(overhead_s + model.seconds(wl.duration[h], 1) for h in wl.order) * SCALE)
    start = {h: cp.NewIntVar(0, horizon, f"s{i}") for i, h in enumerate(wl.order)}
    end = {h: cp.NewIntVar(0, horizon, f"e{i}") for i, h in enumerate(wl.order)}
    intervals, demands = [], []
    for h in wl.order:
        choices = []
        for c in range(1, top[h] + 1):
            length = int(round((overhead_s + model.seconds(wl.duration[h], c)) * SCALE))
            chosen = cp.NewBoolVar(f"{h}@{c}")
            choices.append(chosen)
            intervals.append(cp.NewOptionalIntervalVar(start[h], length, end[h], chosen, f"{h}@{c}"))
            demands.append(c)
        cp.AddExactlyOne(choices)
        for r in wl.requires[h]:
            cp.Add(start[h] >= end[r])
    cp.AddCumulative(intervals, demands, cores)
    makespan = cp.NewIntVar(0, horizon, "makespan")
    for h in wl.order:
        cp.Add(makespan >= end[h])
    cp.Minimize(makespan)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 2
    status = solver.Solve(cp)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return float("nan"), solver.StatusName(status)
    return solver.ObjectiveValue() / SCALE, solver.StatusName(status)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", default=DEFAULT_CASES)
    ap.add_argument("--seconds", type=float, default=120.0, help="solver time limit per case")
    ap.add_argument("--overhead", type=float, default=3.0)
    ap.add_argument("--data", type=Path, default=HERE.parents[1].parent / "shared" / "data" / "spack")
    args = ap.parse_args()
    if importlib.util.find_spec("ortools") is None:
        print("exact_probe: needs OR-tools (pip install ortools); dedal itself does not", file=sys.stderr)
        return 2
    loads = benchmark.workloads(args.data)
    lines: List[str] = [
        "# Exact probe (OR-tools CP-SAT) beside dedal's schedule",
        "",
        "Written by `benchmarks/schedule/exact_probe.py` (see its docstring): the solver's best",
        "one-job-per-package schedule within the time limit, ratio to the same lower bound as",
        f"`results.md` (job overhead {args.overhead:g} s). The solver varies from run to run (2 workers).",
        "",
        "| workload | nodes x cores | dedal | dedal jobs | dedal s | solver | solver status | solver s |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for case in args.cases:
        name, nodes, cores = case.split(":")
        if int(nodes) != 1:
            raise SystemExit(f"exact_probe: {case}: one node only")
        wl = loads[name]
        t0 = time.perf_counter()
        ours = make_schedule(wl, nodes=1, cores=int(cores), overhead_s=args.overhead)
        took = time.perf_counter() - t0
        t0 = time.perf_counter()
        found, status = solve(wl, int(cores), args.overhead, args.seconds)
        solver_s = time.perf_counter() - t0
        lb = ours.lower_bound_s
        print(f"{case}: dedal {ours.ratio:.4f} ({took:.1f} s), solver {found / lb:.4f} {status} ({solver_s:.0f} s)",
              flush=True)
        lines.append(f"| {name} | 1 x {cores} | {ours.ratio:.3f} | {len(ours.jobs)} | {took:.1f} | "
                     f"{found / lb:.3f} | {status} | {solver_s:.0f} |")
    lines.append("")
    (HERE / "exact_probe.md").write_text("\n".join(lines))
    print(f"wrote {HERE / 'exact_probe.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
