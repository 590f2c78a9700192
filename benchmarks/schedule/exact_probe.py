"""How far is dedal's schedule from the best one? An exact solver's answer, where it has one.

    pip install ortools   # not a dedal dependency: used by this probe only
    .venv/bin/python benchmarks/schedule/exact_probe.py [--seconds 120] [CASE ...]

CASE is ``workload:nodes:cores`` (one node only; default: the single-node cases the
benchmark misses, and jedi-ci 1 x 8). ``--seeds 0`` skips the annealing. The same
machine model as ``dedal.schedule``, as a constraint program (OR-tools CP-SAT): one job
per package (each pays the overhead), its cores chosen among 1..p, packages after their
requirements, at most C cores in use. That is a restriction of dedal's model (no job
builds two packages): the solver's makespan is reachable in the model with start times
fixed in advance, which Slurm's priorities and backfill do not reproduce by themselves
(replayed by priority = solver start, cscs 1 x 8 came out at 1.10). Its bound is not a
bound of dedal's model (merged jobs save overheads); the same program without job
overheads has one (:func:`dag_allows`): what the DAG allows at best, which the solver
proves on the small builds. CP-SAT runs 2 workers and is not deterministic: the same
case varies by about 0.005 from run to run.

Beside it, the same question within dedal's own model and Slurm's list scheduling
(priorities, no fixed start times): :func:`dedal.schedule.anneal` from dedal's schedule,
``--seeds`` runs of a fixed number of simulations each (``ANNEAL_WORK`` / jobs, at most
``ANNEAL_MAX``), the best kept. Then both schedules are replayed with every package's real
duration its estimate times exp(N(0, 0.1)) (30 draws, ``robustness.actual``): whether what
annealing gained with exact estimates survives estimates off by 10 %.

Writes exact_probe.md in ``--out`` (default: next to this file, the recorded result): the
solver's makespan / LB after the time limit (optimal or not) and the annealed schedule's
beside dedal's, in the same model, for the same lower bound.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path
from typing import List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from dedal.schedule import DEFAULT_MODEL, Job, Machine, Workload, anneal, make_schedule, package_cores, simulate  # noqa: E402
import run as benchmark  # noqa: E402
from robustness import actual, noise_draws  # noqa: E402

DEFAULT_CASES = ["mpi-cuda:1:8", "mpi-cuda-pure:1:8", "cscs-prgenv-gnu:1:8", "jedi-ci:1:8", "synthetic-esd:1:64"]
SCALE = 10  # the solver works in tenths of a second
ANNEAL_WORK, ANNEAL_MAX = 6_000_000, 100_000  # simulations per annealing run: WORK / jobs, at most MAX
NOISE_SIGMA, NOISE_DRAWS = 0.1, 30


def noisy_mean(wl: Workload, jobs: List[Job], cores: int) -> float:
    """Mean simulated makespan of ``jobs`` over the noise draws (the same draws for every call)."""
    return statistics.mean(
        simulate(actual(jobs, wl, factor), nodes=1, cores=cores).makespan_s
        for factor in noise_draws(wl, NOISE_SIGMA, NOISE_DRAWS)
    )


def solve(wl: Workload, cores: int, overhead_s: float, seconds: float, relaxed: bool = False) -> tuple:
    """(makespan found, the solver's proven bound, status name) of the one-job-per-package
    program. ``relaxed``: no job overhead and every duration rounded down, so that its
    proven bound plus one overhead bounds every schedule of dedal's model (see
    :func:`dag_allows`)."""
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
            exact = (overhead_s + model.seconds(wl.duration[h], c)) * SCALE
            length = math.floor(exact) if relaxed else int(round(exact))
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
        return float("nan"), float("nan"), solver.StatusName(status)
    return solver.ObjectiveValue() / SCALE, solver.BestObjectiveBound() / SCALE, solver.StatusName(status)


def dag_allows(wl: Workload, cores: int, overhead_s: float, seconds: float) -> tuple:
    """(a lower bound on every schedule of dedal's model, the best relaxed schedule + one
    overhead, status) on one node: the relaxed program's proven bound plus one overhead.

    Why it bounds dedal's schedules: take any of them and drop its job overheads. Each
    package still runs after its requirements, for W/min(c, p) on the c cores of its job,
    which is as long as on min(c, p) <= its allotment cores, one of the relaxed program's
    choices; so the packages alone are a relaxed schedule, ending at least one overhead
    (the first job's, before anything is built) earlier. When the solver proves its
    optimum, this is what the DAG allows: no schedule in the model ends before it."""
    found, bound, status = solve(wl, cores, 0.0, seconds, relaxed=True)
    return overhead_s + bound, overhead_s + found, status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", default=DEFAULT_CASES)
    ap.add_argument("--seconds", type=float, default=120.0, help="solver time limit per case")
    ap.add_argument("--overhead", type=float, default=3.0)
    ap.add_argument("--seeds", type=int, default=3, help="annealing runs per case")
    ap.add_argument("--data", type=Path, default=HERE.parents[1].parent / "shared" / "data" / "spack")
    ap.add_argument(
        "--out", type=Path, default=HERE, help="folder for exact_probe.md (a trial run: not the recorded one)"
    )
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
        "`allowed`: what the DAG allows, a lower bound on every schedule of dedal's model (jobs merged or",
        "not): the proven bound of the same program without job overheads, plus the first job's overhead",
        "(`dag_allows`), or the DAG bound of `results.md` where that is higher (the solver proves little",
        "on large builds); where the relaxed status is OPTIMAL no schedule in the model ends earlier.",
        "`relaxed`: the solver's best schedule of that program plus one overhead (equal to `allowed` when",
        "OPTIMAL).",
        "`annealed`: dedal's schedule after `dedal.schedule.anneal` (list scheduling, no fixed start times), the best",
        f"of {args.seeds} seeds (each seed's ratio in brackets); `noise`: the annealed schedule's mean makespan",
        f"over dedal's with every estimate off by exp(N(0, {NOISE_SIGMA:g})) ({NOISE_DRAWS} draws; above 1: the",
        "annealed one is longer).",
        "",
        "| workload | nodes x cores | dedal | dedal jobs | dedal s | solver | solver status | solver s "
        "| allowed | relaxed | relaxed status | dedal / allowed | annealed | annealing s | noise |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for case in args.cases:
        name, nodes, cores = case.split(":")
        if int(nodes) != 1:
            raise SystemExit(f"exact_probe: {case}: one node only")
        wl = loads[name]
        t0 = time.perf_counter()
        ours = make_schedule(wl, Machine(nodes=1, cores=int(cores), overhead_s=args.overhead))
        took = time.perf_counter() - t0
        t0 = time.perf_counter()
        found, _, status = solve(wl, int(cores), args.overhead, args.seconds)
        solver_s = time.perf_counter() - t0
        lb = ours.lower_bound_s
        proven, relaxed, relaxed_status = dag_allows(wl, int(cores), args.overhead, args.seconds)
        allowed = max(proven, ours.dag_bound_s)  # where the solver proves little, results.md's DAG bound
        annealed = annealing = noise_col = "-"
        if args.seeds > 0:
            t0 = time.perf_counter()
            evaluations = min(ANNEAL_MAX, ANNEAL_WORK // max(1, len(ours.jobs)))
            runs = [
                anneal(
                    wl,
                    ours.jobs,
                    Machine(nodes=1, cores=int(cores), overhead_s=args.overhead),
                    evaluations=evaluations,
                    seed=seed,
                )
                for seed in range(1, args.seeds + 1)
            ]
            annealing = f"{time.perf_counter() - t0:.0f}"
            best, best_sim = min(runs, key=lambda r: r[1].makespan_s)
            noise_col = f"{noisy_mean(wl, best, int(cores)) / noisy_mean(wl, ours.jobs, int(cores)):.3f}"
            annealed = (
                f"{best_sim.makespan_s / lb:.3f} (" + " / ".join(f"{sim.makespan_s / lb:.3f}" for _, sim in runs) + ")"
            )
        print(
            f"{case}: dedal {ours.ratio:.4f} ({took:.1f} s), solver {found / lb:.4f} {status} ({solver_s:.0f} s), "
            f"allowed {allowed / lb:.4f} (relaxed {relaxed / lb:.4f} {relaxed_status}), "
            f"annealed {annealed}, with noise {noise_col}",
            flush=True,
        )
        lines.append(
            f"| {name} | 1 x {cores} | {ours.ratio:.3f} | {len(ours.jobs)} | {took:.1f} | "
            f"{found / lb:.3f} | {status} | {solver_s:.0f} | {allowed / lb:.3f} | {relaxed / lb:.3f} | "
            f"{relaxed_status} | {ours.makespan_s / allowed:.3f} | {annealed} | {annealing} | {noise_col} |"
        )
    lines.append("")
    out = args.out / "exact_probe.md"
    out.write_text("\n".join(lines))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
