"""Schedule benchmark: makespan / lower bound of dedal's schedule and of two baselines.

    .venv/bin/python benchmarks/schedule/run.py [--cores 64 8] [--nodes 1 4 16 64] [--overhead 3]

Workloads: the real Spack locks in ../shared/data/spack (durations from dedal's model,
``dedal.model.durations``) and a synthetic environment of ESD size (``synthetic.py``, fixed
seed: ~800 packages, 80 roots, a few very long builds). For each node count, three
schedules are simulated side by side in the same machine model (``dedal.schedule``:
nodes of C cores, a package of work W on c cores takes W/min(c, p), every job pays the
same per-job overhead):

* dedal: the grouping and critical-path priorities the Slurm executor submits;
* one job per package in submission order, as ``spack ci`` generates them;
* one node running ``spack install -j C``: one package after the other, each on the
  whole node.

The ratio is makespan / lower bound, LB = overhead + max(critical path, work / capacity).
``dag`` is the tighter bound that also counts how narrow the DAG is at its start and end
(what no schedule can beat either). Writes results.md and results.json next to this file.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from dedal.model.plan import make_plan  # noqa: E402
from dedal.adapters.slurm import time_minutes  # noqa: E402
from dedal.model.config import BY_KEY  # noqa: E402
from dedal.schedule import DEFAULT_MODEL, Machine, Schedule, TimeLimits, Workload, make_schedule, simulate_backfill  # noqa: E402
from dedal.model.spack_lock import load_lock  # noqa: E402
import synthetic  # noqa: E402

LOCKS = ["mpi-cuda.spack.lock", "mpi-cuda-pure.spack.lock", "cscs-prgenv-gnu.spack.lock", "jedi-ci.spack.lock"]
TARGET = 1.05


def lock_workload(path: Path) -> Workload:
    lock = load_lock(path)
    plan = make_plan(
        lock, env_name=path.name.split(".")[0], install_root="/opt/esd/software", base_image="host", base_id="benchmark"
    )
    return Workload.from_plan(plan)


def workloads(data: Path) -> Dict[str, Workload]:
    out = {}
    for name in LOCKS:
        if (data / name).is_file():
            out[name.split(".")[0]] = lock_workload(data / name)
    out["synthetic-esd"] = synthetic.generate()
    return out


# the time limits `dedal build` gives the jobs by default (slurm.time_factor, slurm.time)
LIMITS = TimeLimits(BY_KEY["slurm.time_factor"].default({}), time_minutes(BY_KEY["slurm.time"].default({})))


def on_slurm(sched: Schedule) -> float:
    """Makespan / LB of ``sched`` as Slurm's own schedulers would run it (``simulate_backfill``
    with the jobs' default time limits)."""
    sim = simulate_backfill(sched.jobs, nodes=sched.nodes, cores=sched.cores, limits=LIMITS.seconds(sched.jobs))
    return sim.makespan_s / sched.lower_bound_s


def run(nodes_list: List[int], cores_list: List[int], overhead: float, data: Path) -> dict:
    rows = []
    for cores in cores_list:
        for name, wl in workloads(data).items():
            for nodes in nodes_list:
                t0 = time.perf_counter()
                ours = make_schedule(wl, Machine(nodes=nodes, cores=cores, overhead_s=overhead))
                took = time.perf_counter() - t0
                hinted = make_schedule(wl, Machine(nodes=nodes, cores=cores, overhead_s=overhead), hints=True)
                ci = make_schedule(wl, Machine(nodes=nodes, cores=cores, overhead_s=overhead), strategy="per-package")
                single = make_schedule(
                    wl, Machine(nodes=nodes, cores=cores, overhead_s=overhead), strategy="single-node"
                )
                slurm, ci_slurm = on_slurm(ours), on_slurm(ci)
                row = {
                    "workload": name,
                    "packages": len(wl.order),
                    "nodes": nodes,
                    "cores": cores,
                    "lower_bound_s": round(ours.lower_bound_s, 1),
                    "critical_path_s": round(ours.critical_path_s, 1),
                    "work_per_capacity_s": round(ours.work_core_s / (nodes * cores), 1),
                    "dag_bound_ratio": round(ours.dag_bound_s / ours.lower_bound_s, 4),
                    "dedal_makespan_s": round(ours.makespan_s, 1),
                    "dedal_ratio": round(ours.ratio, 4),
                    "dedal_jobs": len(ours.jobs),
                    "dedal_utilization": round(ours.utilization, 4),
                    "dedal_vs_dag_bound": round(ours.makespan_s / ours.dag_bound_s, 4),
                    "hints_ratio": round(hinted.ratio, 4),
                    "hints": sum(len(j.order) for j in hinted.jobs),
                    "hints_within_target": hinted.ratio <= TARGET,
                    "per_package_ratio": round(ci.ratio, 4),
                    "per_package_jobs": len(ci.jobs),
                    "single_node_ratio": round(single.ratio, 4),
                    "schedule_seconds": round(took, 2),
                    "dedal_slurm_ratio": round(slurm, 4),
                    "per_package_slurm_ratio": round(ci_slurm, 4),
                }
                row["slurm_within_target"] = row["dedal_slurm_ratio"] <= TARGET
                row["slurm_ahead_of_both"] = slurm < min(ci_slurm, single.ratio)
                row["ahead_of_both"] = ours.makespan_s < min(ci.makespan_s, single.makespan_s)
                row["within_target"] = ours.ratio <= TARGET
                rows.append(row)
                print(
                    f"{name:16} C={cores:<3} N={nodes:<3} LB {ours.lower_bound_s:8.0f} s  dedal {ours.ratio:.3f} "
                    f"({len(ours.jobs)} jobs, util {ours.utilization:.0%}; with order hints {hinted.ratio:.3f}, "
                    f"{row['hints']} hints)  per-package {ci.ratio:.3f}  "
                    f"single-node {single.ratio:.3f}  dag-bound {ours.dag_bound_s / ours.lower_bound_s:.3f}  "
                    f"[{took:.1f} s]; on Slurm: dedal {slurm:.3f} per-package {ci_slurm:.3f}",
                    flush=True,
                )
    return {
        "benchmark": "schedule",
        "overhead_s": overhead,
        "model": DEFAULT_MODEL.to_json(),
        "target_ratio": TARGET,
        "synthetic": synthetic.describe(synthetic.generate()),
        "seed": synthetic.SEED,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "rows": rows,
    }


def markdown(result: dict) -> str:
    lines = [
        "# Schedule benchmark",
        "",
        "Written by `benchmarks/schedule/run.py` (see its docstring); every number is simulated in dedal's",
        f"machine model (`dedal/model/cores.py`, used by `dedal/schedule/`): job overhead {result['overhead_s']:g} s, a package of work W on",
        f"c cores takes W/min(c, p) with p = clamp(d/{result['model']['unit_s']:g} s, 1, {result['model']['p_max']}), "
        f"d = its duration on {result['model']['ref_cores']} cores.",
        "Ratio = makespan / lower bound, LB = overhead + max(critical path, work / (nodes x cores)).",
        "`dag` = the tighter bound that also counts how narrow the DAG is at its start and end, over LB.",
        "Baselines: one job per package in submission order (as `spack ci` generates them), and one node",
        "running `spack install -j C` (one package at a time on the whole node).",
        "`dedal`: what `dedal build --executor slurm` submits by default when the durations are the model's",
        "(critical-path priorities, Slurm starts what fits). `+hints`: what it submits by default when every",
        "duration was measured (`slurm.order_hints: auto`): fixed start times that Slurm follows through",
        "`afterany` hints, each dropped at its planned time, and how many hints. In this model hints win",
        "only while the estimates hold (off by 10 %: from 0.4 % better to 1 % worse than no hints, off by",
        "30 %: 1.4-1.8 % worse, `robustness.md`); on real Slurm, which runs the list schedule worse than",
        "this model, they were 4.5-6.0 % better with exact durations, from 3.1 % better to 2.5 % worse",
        "off by 10 % and 1-5 % worse off by 20-30 % (`cluster.md`).",
        "`on Slurm`: the same schedules (dedal's, per-package's) run by a model of Slurm's own schedulers",
        "(`simulate_backfill`: the main scheduler stops at the first job that does not fit; the backfill",
        "scheduler runs every 30 s and plans with the jobs' time limits, here what `dedal build` sets:",
        "estimate x `slurm.time_factor` (2)). The first model knows every job's duration and backfills",
        "around the top job only, so it flatters full nodes; `cluster.md` runs cases on real Slurm.",
        "",
        f"Synthetic ESD environment (seed {result['seed']}): "
        + ", ".join(f"{k} {v}" for k, v in result["synthetic"].items())
        + ".",
        "",
    ]
    by_cores: Dict[int, List[dict]] = {}
    for r in result["rows"]:
        by_cores.setdefault(r["cores"], []).append(r)
    for cores, rows in by_cores.items():
        lines += [
            f"## Nodes of {cores} cores",
            "",
            "| workload | packages | nodes | LB (s) | dag | dedal | jobs | util | +hints | hints | per-package | "
            "single-node | ahead of both | within 5 % | dedal on Slurm | per-package on Slurm |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: | :---: "
            "| ---: | ---: |",
        ]
        for r in rows:
            lines.append(
                f"| {r['workload']} | {r['packages']} | {r['nodes']} | {r['lower_bound_s']:.0f} | "
                f"{r['dag_bound_ratio']:.3f} | **{r['dedal_ratio']:.3f}** | {r['dedal_jobs']} | "
                f"{r['dedal_utilization']:.0%} | {r['hints_ratio']:.3f} | {r['hints']} | "
                f"{r['per_package_ratio']:.3f} | {r['single_node_ratio']:.2f} | "
                f"{'yes' if r['ahead_of_both'] else 'NO'} | {'yes' if r['within_target'] else 'no'} | "
                f"{r['dedal_slurm_ratio']:.3f} | {r['per_package_slurm_ratio']:.3f} |"
            )
        lines.append("")
    misses = [r for r in result["rows"] if not r["within_target"]]
    lines += ["## Reading", ""]
    lines.append(
        f"dedal is ahead of both baselines in {sum(r['ahead_of_both'] for r in result['rows'])} of "
        f"{len(result['rows'])} cases and within 5 % of the lower bound in "
        f"{sum(r['within_target'] for r in result['rows'])}."
    )
    slurm_misses = [r for r in result["rows"] if not r["slurm_within_target"]]
    lines.append(
        f"On Slurm's own schedulers (`on Slurm`, model): within 5 % in "
        f"{len(result['rows']) - len(slurm_misses)} of {len(result['rows'])}, ahead of both baselines in "
        f"{sum(r['slurm_ahead_of_both'] for r in result['rows'])}; beyond 5 %: "
        + "; ".join(
            f"{r['workload']} on {r['nodes']} x {r['cores']}: {r['dedal_slurm_ratio']:.3f}" for r in slurm_misses
        )
        + "."
    )
    if misses:
        lines.append(
            "Beyond 5 %: "
            + "; ".join(
                f"{r['workload']} on {r['nodes']} x {r['cores']} cores: {r['dedal_ratio']:.3f} "
                f"({r['dedal_vs_dag_bound']:.3f} of the DAG bound; critical path {r['critical_path_s']:.0f} s vs "
                f"work/capacity {r['work_per_capacity_s']:.0f} s)"
                for r in misses
            )
            + "."
        )
        beyond = [r for r in misses if r["dag_bound_ratio"] > TARGET]
        allowed = [r for r in misses if r["dag_bound_ratio"] <= TARGET]
        if beyond:
            lines.append(
                "Out of reach of any schedule in the model (the DAG bound itself is above 5 %): "
                + "; ".join(
                    f"{r['workload']} on {r['nodes']} x {r['cores']} (DAG bound {r['dag_bound_ratio']:.3f})"
                    for r in beyond
                )
                + "; how close dedal comes to the best these DAGs allow, proven by an exact "
                "solver: `exact_probe.md` (`allowed`)."
            )
        if allowed:
            lines.append(
                "Where the DAG bound would allow 5 % but dedal is not there (job overheads and cores "
                "left idle while the DAG is narrow; the best schedule may also lie above that bound): "
                + "; ".join(f"{r['workload']} on {r['nodes']} x {r['cores']}" for r in allowed)
                + ". "
                "An exact solver (OR-tools CP-SAT, 2 minutes) and annealing of dedal's list schedule "
                "beside dedal on these: `exact_probe.md`."
            )
        reached = [r for r in misses if r["hints_within_target"]]
        if reached:
            lines.append(
                "Within 5 % with measured durations (order hints on by default, `+hints`): "
                + "; ".join(f"{r['workload']} on {r['nodes']} x {r['cores']}: {r['hints_ratio']:.3f}" for r in reached)
                + "."
            )
    lines.append("")
    return "\n".join(lines)


def write(out: Path, stem: str, result: dict, render) -> None:
    """``<stem>.json`` and ``<stem>.md`` (``render(result)``) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{stem}.md").write_text(render(result))
    print(f"wrote {out / (stem + '.md')} and {out / (stem + '.json')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--cores", type=int, nargs="+", default=[64, 8])
    ap.add_argument("--overhead", type=float, default=3.0, help="per-job overhead in seconds (setting job_overhead_s)")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "spack")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    write(args.out, "results", run(args.nodes, args.cores, args.overhead, args.data), markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
