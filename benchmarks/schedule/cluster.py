"""Does real Slurm run dedal's schedule the way ``dedal.schedule.simulate`` says it does?

    sudo .venv/bin/python benchmarks/schedule/cluster.py [--case cscs-prgenv-gnu:1:8 ...]
                                                         [--limit fixed estimate] [--scale 1]

Every ratio in results.md is simulated: the model assumes Slurm starts the highest-priority
eligible job that fits and backfills lower-priority jobs around it knowing when each running
job ends. Real Slurm plans its backfill with the jobs' time limits, not their durations, and
runs it every ``bf_interval`` (30 s). This replays dedal's schedule for a case on the local
test cluster (``slurm/testcluster``: one slurmd per node, ``DEDAL_TC_CPUS`` = the case's
cores) with each job a ``sleep`` of its estimate (times ``--scale``), submitted as the Slurm
executor submits it (dependencies first, ``--nice`` = rank, ``afterok``, ``--cpus-per-task``),
and compares the makespan Slurm reached (first start to last end, from ``sacct -c``) with
the simulated one. Time limits (``--limit``):

* ``fixed``: what dedal submitted before ``slurm.time_factor``: one limit for every job
  (the default ``slurm.time``, 04:00:00);
* ``estimate``: what ``dedal build`` submits now: each job's limit its estimate times
  ``slurm.time_factor`` (2) in whole minutes, at most ``slurm.time``
  (:func:`dedal.executors.slurm.job_time_limit`).

Each case and limit runs on its own test cluster, all at once (the jobs only sleep).
Slurm's defaults are kept (``bf_interval`` 30 s, ``bf_resolution`` 60 s), so ``--scale``
below 1 distorts the replay; results.md/cluster.md are at scale 1 (real time: a case takes
as long as its makespan). Needs root, munge and Slurm, like the test cluster. Writes
cluster.md and cluster.json.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from dedal.adapters.slurm import Slurm  # noqa: E402
from dedal.config import BY_KEY  # noqa: E402
from dedal.executors.slurm import job_time_limit  # noqa: E402
from dedal.schedule import TimeLimits, job_topo, make_schedule, simulate, simulate_backfill  # noqa: E402
from run import LIMITS, workloads, write  # noqa: E402

TESTCLUSTER = ROOT / "slurm" / "testcluster"
CAP = BY_KEY["slurm.time"].default({})  # 04:00:00
OVERHEAD = 3.0
POLL_S = 5.0
STARTING = threading.Lock()  # start.sh picks free ports: one cluster at a time


def limits_of(mode: str) -> TimeLimits:
    """The default limits (``estimate``), or ``slurm.time`` for every job (``fixed``)."""
    return LIMITS if mode == "estimate" else replace(LIMITS, factor=0.0)


def replay(name: str, nodes: int, cores: int, mode: str, scale: float, wl) -> dict:
    """One case on its own test cluster; always stops the cluster."""
    sched = make_schedule(wl, nodes=nodes, cores=cores, overhead_s=OVERHEAD)
    jobs = [replace(j, est_s=j.est_s * scale) for j in sched.jobs]
    sim = simulate(jobs, nodes=nodes, cores=cores)
    policy = limits_of(mode)
    limits = {j.id: job_time_limit(j.est_s, policy.factor, CAP) for j in jobs}  # as the executor submits them
    model = simulate_backfill(jobs, nodes=nodes, cores=cores, limits=policy.seconds(jobs))
    state = Path(tempfile.mkdtemp(prefix=f"dedal-replay-{mode[:3]}-", dir="/tmp"))
    env = dict(os.environ, DEDAL_TC_CPUS=str(cores))
    with STARTING:
        started = subprocess.run([str(TESTCLUSTER / "start.sh"), str(state), str(nodes)], env=env, text=True,
                                 capture_output=True, timeout=180)
    try:
        if started.returncode != 0:
            raise RuntimeError(f"start.sh failed: {started.stderr[-2000:]}")
        for line in (state / "cluster.env").read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                env[key.strip()] = value.strip()
        slurm = Slurm(env)
        version = slurm.version()
        ids: Dict[str, str] = {}
        for rank, j in enumerate(job_topo(jobs)):
            ids[j.id] = slurm.submit(f"#!/bin/sh\nsleep {j.est_s:.1f}\n", name=f"replay-{j.id}",
                                     dependencies=[ids[a] for a in j.after], nodes=1, cpus=j.cores,
                                     time=limits[j.id], nice=rank, output=state / "job-%j.out",
                                     workdir=state)
        deadline = time.monotonic() + 3 * sim.makespan_s + 600
        while True:
            states = slurm.states(ids.values())
            if all(s.state.is_finished for s in states.values()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} {nodes}x{cores} {mode}: not done after {3 * sim.makespan_s + 600:.0f} s")
            time.sleep(POLL_S)
        bad = {k: s.state.value for k, s in states.items() if not s.state.is_success}
        if bad:
            raise RuntimeError(f"{name} {nodes}x{cores} {mode}: jobs did not complete: {bad}")
        times = slurm.times(ids.values())
    except BaseException:
        print(f"{name} {nodes}x{cores} {mode}: the cluster's logs stay in {state}", file=sys.stderr)
        raise
    finally:
        subprocess.run([str(TESTCLUSTER / "stop.sh"), str(state)], capture_output=True, timeout=120)
    shutil.rmtree(state, ignore_errors=True)
    stamp = {k: tuple(datetime.fromisoformat(t).timestamp() for t in times[v]) for k, v in ids.items()}
    t0 = min(s for s, _ in stamp.values())
    real = max(e for _, e in stamp.values()) - t0
    late = [(stamp[k][0] - t0) - sim.starts[k][0] for k in ids]
    return {"workload": name, "nodes": nodes, "cores": cores, "limit": mode, "scale": scale, "jobs": len(jobs),
            "slurm_version": version,
            "simulated_s": round(sim.makespan_s, 1), "slurm_s": round(real, 1),
            "slurm_vs_simulated": round(real / sim.makespan_s, 4),
            "backfill_model_s": round(model.makespan_s, 1), "slurm_vs_backfill_model": round(real / model.makespan_s, 4),
            "lower_bound_s": round(sched.lower_bound_s * scale, 1),
            "slurm_vs_lower_bound": round(real / (sched.lower_bound_s * scale), 4),
            "start_later_than_simulated_mean_s": round(statistics.mean(late), 1),
            "start_later_than_simulated_max_s": round(max(late), 1)}


def markdown(result: dict) -> str:
    lines = ["# dedal's schedule on real Slurm", "",
             "Written by `benchmarks/schedule/cluster.py` (see its docstring): dedal's schedule for each case,",
             "every job a `sleep` of its estimate, run by Slurm "
             f"{result['slurm_version']} on the local test cluster (one slurmd per node, default",
             "backfill parameters), against what `dedal.schedule.simulate` predicts for the same jobs (the model",
             "every ratio in results.md is judged by) and what `simulate_backfill` (Slurm's main and backfill",
             "schedulers, planning with the time limits) predicts.",
             f"`fixed`: dedal before `slurm.time_factor`: every job with the default `slurm.time` ({CAP}).",
             "`estimate`: what `dedal build` submits now: each job's limit its estimate times",
             f"`slurm.time_factor` ({LIMITS.factor:g}) in whole minutes.", "",
             "| workload | nodes x cores | jobs | time limits | simulated (s) | backfill model (s) | Slurm (s) | "
             "Slurm / simulated | Slurm / backfill model | Slurm / LB | starts later than simulated, mean / max (s) |",
             "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        lines.append(f"| {r['workload']} | {r['nodes']} x {r['cores']} | {r['jobs']} | {r['limit']} | "
                     f"{r['simulated_s']:.0f} | {r['backfill_model_s']:.0f} | {r['slurm_s']:.0f} | "
                     f"**{r['slurm_vs_simulated']:.3f}** | {r['slurm_vs_backfill_model']:.3f} | "
                     f"{r['slurm_vs_lower_bound']:.3f} | {r['start_later_than_simulated_mean_s']:.0f} / "
                     f"{r['start_later_than_simulated_max_s']:.0f} |")
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", nargs="+", default=["cscs-prgenv-gnu:1:8"], help="workload:nodes:cores")
    ap.add_argument("--limit", nargs="+", choices=("fixed", "estimate"), default=["fixed", "estimate"])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "spack")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    wls = workloads(args.data)
    rows: List[dict] = []
    errors: List[str] = []

    def one(case: str, mode: str) -> None:
        name, nodes, cores = case.split(":")
        try:
            row = replay(name, int(nodes), int(cores), mode, args.scale, wls[name])
            rows.append(row)
            print(f"{name} {nodes}x{cores} {mode}: simulated {row['simulated_s']:.0f} s, backfill model "
                  f"{row['backfill_model_s']:.0f} s, Slurm {row['slurm_s']:.0f} s ({row['slurm_vs_simulated']:.3f})", flush=True)
        except Exception as exc:  # reported below; the other replays go on
            errors.append(f"{case} {mode}: {exc}")

    threads = [threading.Thread(target=one, args=(c, m)) for c in args.case for m in args.limit]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        print("error:", e, file=sys.stderr)
    if rows:
        rows.sort(key=lambda r: (r["workload"], r["nodes"], r["cores"], r["limit"]))
        write(args.out, "cluster", {"benchmark": "schedule-on-slurm", "slurm_version": rows[0]["slurm_version"],
                                    "overhead_s": OVERHEAD, "rows": rows}, markdown)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
