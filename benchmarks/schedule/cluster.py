"""Does real Slurm run dedal's schedule the way ``dedal.schedule.simulate`` says it does?

    sudo .venv/bin/python benchmarks/schedule/cluster.py [--case cscs-prgenv-gnu:1:8 ...]
                                                         [--variant fixed estimate hints]
                                                         [--noise 0.3] [--scale 1]

Every ratio in results.md is simulated: the model assumes Slurm starts the highest-priority
eligible job that fits and backfills lower-priority jobs around it knowing when each running
job ends. Real Slurm plans its backfill with the jobs' time limits, not their durations, and
runs it every ``bf_interval`` (30 s). This replays dedal's schedule for a case on the local
test cluster (``slurm/testcluster``: one slurmd per node, ``DEDAL_TC_CPUS`` = the case's
cores) with each job a ``sleep`` of its duration (times ``--scale``), submitted as the Slurm
executor submits it (dependencies first, ``--nice`` = rank, ``afterok``, ``--cpus-per-task``),
and compares the makespan Slurm reached (first start to last end, from ``sacct -c``) with
the simulated one. Variants (``--variant``):

* ``fixed``: what dedal submitted before ``slurm.time_factor``: one limit for every job
  (the default ``slurm.time``, 04:00:00);
* ``estimate``: what ``dedal build`` submits now: each job's limit its estimate times
  ``slurm.time_factor`` (2) in whole minutes, at most ``slurm.time``
  (:func:`dedal.stages.building.executors.slurm.job_time_limit`);
* ``hints``: ``estimate`` with ``slurm.order_hints`` on: the schedule with fixed start
  times, each job also waiting (``afterany``) for its order hints, and each hint dropped
  (``scontrol update``) once its planned time has passed, as the executor does.

Durations: each job sleeps its estimate; with ``--noise SIGMA`` each package's real duration
is its estimate times exp(N(0, SIGMA)) instead (``robustness.actual``; the same draw, seeded
by ``--seed``, for every variant), while limits and hints still come from the estimates, as
they would in a build whose estimates are off. ``simulated`` is then the model run with the
real durations.

Each case and variant runs on its own test cluster, all at once (the jobs only sleep).
Slurm's defaults are kept (``bf_interval`` 30 s, ``bf_resolution`` 60 s), so ``--scale``
below 1 distorts the replay; results.md/cluster.md are at scale 1 (real time: a case takes
as long as its makespan). Needs root, munge and Slurm, like the test cluster. Writes
cluster.md and cluster.json; rows of an earlier cluster.json in ``--out`` are kept unless
the same case, variant and noise is run again (each row says when it ran).
"""

from __future__ import annotations

import argparse
import json
import math
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
from typing import Dict, List, Mapping, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from dedal.adapters.slurm import Slurm, State  # noqa: E402
from dedal.model.config import BY_KEY  # noqa: E402
from dedal.stages.building.executors.slurm import job_time_limit, live_hints  # noqa: E402
from dedal.schedule import Job, Machine, TimeLimits, job_topo, make_schedule, simulate, simulate_backfill  # noqa: E402
from robustness import actual, noise_draws  # noqa: E402
from run import LIMITS, workloads, write  # noqa: E402

TESTCLUSTER = ROOT / "slurm" / "testcluster"
CAP = BY_KEY["slurm.time"].default({})  # 04:00:00
OVERHEAD = 3.0
POLL_S = 5.0
STARTING = threading.Lock()  # start.sh picks free ports: one cluster at a time


VARIANTS = ("fixed", "estimate", "hints")


def limits_of(mode: str) -> TimeLimits:
    """The default limits (``estimate``, ``hints``), or ``slurm.time`` for every job (``fixed``)."""
    return replace(LIMITS, factor=0.0) if mode == "fixed" else LIMITS


def expire_hints(
    slurm: Slurm,
    jobs: Mapping[str, Job],
    ids: Mapping[str, str],
    hints: Dict[str, List[str]],
    active: Mapping[str, bool],
    pending: Mapping[str, bool],
    elapsed: float,
) -> int:
    """What the executor's ``expire_hints`` does (with its :func:`live_hints`): a pending job
    stops waiting for an order hint once the hint's planned time has passed (or its job
    ended). Returns how many hints were dropped from Slurm's dependencies (``scontrol update``)."""
    dropped = 0
    for jid, waits in hints.items():
        if not waits or not pending[jid]:
            continue
        live = live_hints(jobs[jid], waits, active.__getitem__, elapsed)
        if live == waits:
            continue
        if any(a not in live and active[a] for a in waits):
            if not slurm.set_dependencies(
                ids[jid], [ids[a] for a in jobs[jid].after if active[a]], [ids[a] for a in live]
            ):
                continue  # it started meanwhile
            dropped += sum(1 for a in waits if a not in live and active[a])
        hints[jid] = live
    return dropped


def replay(name: str, nodes: int, cores: int, mode: str, scale: float, wl, sigma: float = 0.0, seed: int = 1) -> dict:
    """One case on its own test cluster; always stops the cluster."""
    sched = make_schedule(wl, Machine(nodes=nodes, cores=cores, overhead_s=OVERHEAD), hints=mode == "hints")
    planned = [replace(j, est_s=j.est_s * scale, order={a: t * scale for a, t in j.order.items()}) for j in sched.jobs]
    factor = next(noise_draws(wl, sigma, 1, seed))  # every factor 1 when sigma is 0
    real = actual(sched.jobs, wl, factor)  # the estimates when sigma is 0
    jobs = [replace(r, est_s=r.est_s * scale, order=p.order) for r, p in zip(real, planned)]
    sim = simulate(jobs, nodes=nodes, cores=cores)
    policy = limits_of(mode)
    # as the executor submits them: from the estimates, whatever the jobs really take
    limits = {j.id: job_time_limit(j.est_s, policy.factor, CAP) for j in planned}
    model: Optional[float] = None
    if mode != "hints":  # simulate_backfill has no order hints
        model = simulate_backfill(jobs, nodes=nodes, cores=cores, limits=policy.seconds(planned)).makespan_s
    state = Path(tempfile.mkdtemp(prefix=f"dedal-replay-{mode[:3]}-", dir="/tmp"))
    env = dict(os.environ, DEDAL_TC_CPUS=str(cores))
    with STARTING:
        started = subprocess.run(
            [str(TESTCLUSTER / "start.sh"), str(state), str(nodes)],
            env=env,
            text=True,
            capture_output=True,
            timeout=180,
        )
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
        by_id = {j.id: j for j in jobs}
        hints = {j.id: list(j.order) for j in jobs if j.order}
        dropped = 0
        submitted = time.monotonic()
        for rank, j in enumerate(job_topo(jobs)):
            ids[j.id] = slurm.submit(
                f"#!/bin/sh\nsleep {j.est_s:.1f}\n",
                name=f"replay-{j.id}",
                dependencies=[ids[a] for a in j.after],
                after_any=[ids[a] for a in j.order],
                nodes=1,
                cpus=j.cores,
                time=limits[j.id],
                nice=rank,
                output=state / "job-%j.out",
                workdir=state,
            )
        deadline = time.monotonic() + 3 * sim.makespan_s + 600
        while True:
            states = slurm.states(ids.values())
            if all(s.state.is_finished for s in states.values()):
                break
            if hints:
                now = {k: states[v].state for k, v in ids.items()}
                dropped += expire_hints(
                    slurm,
                    by_id,
                    ids,
                    hints,
                    {k: not s.is_finished for k, s in now.items()},
                    {k: s is State.PENDING for k, s in now.items()},
                    time.monotonic() - submitted,
                )
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
    makespan = max(e for _, e in stamp.values()) - t0
    late = [(stamp[k][0] - t0) - sim.starts[k][0] for k in ids]
    return {
        "workload": name,
        "nodes": nodes,
        "cores": cores,
        "limit": mode,
        "noise": sigma,
        "seed": seed if sigma > 0 else None,
        "scale": scale,
        "jobs": len(jobs),
        "hints": sum(len(j.order) for j in jobs),
        "hints_dropped": dropped,
        "ran": datetime.now().strftime("%Y-%m-%d"),
        "slurm_version": version,
        "simulated_s": round(sim.makespan_s, 1),
        "slurm_s": round(makespan, 1),
        "slurm_vs_simulated": round(makespan / sim.makespan_s, 4),
        "backfill_model_s": None if model is None else round(model, 1),
        "slurm_vs_backfill_model": None if model is None else round(makespan / model, 4),
        "lower_bound_s": round(sched.lower_bound_s * scale, 1),
        "slurm_vs_lower_bound": round(makespan / (sched.lower_bound_s * scale), 4),
        "start_later_than_simulated_mean_s": round(statistics.mean(late), 1),
        "start_later_than_simulated_max_s": round(max(late), 1),
    }


def _key(row: dict) -> tuple:
    return (row["workload"], row["nodes"], row["cores"], row["limit"], row.get("noise", 0.0), row.get("seed"))


def _fmt(value: Optional[float], digits: int = 0, bold: bool = False) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return f"**{text}**" if bold else text


def markdown(result: dict) -> str:
    lines = [
        "# dedal's schedule on real Slurm",
        "",
        "Written by `benchmarks/schedule/cluster.py` (see its docstring): dedal's schedule for each case,",
        "every job a `sleep` of its duration, run by Slurm "
        f"{result['slurm_version']} on the local test cluster (one slurmd per node, default",
        "backfill parameters), against what `dedal.schedule.simulate` predicts for the same jobs (the model",
        "every ratio in results.md is judged by) and what `simulate_backfill` (Slurm's main and backfill",
        "schedulers, planning with the time limits; it has no order hints) predicts.",
        f"`fixed`: dedal before `slurm.time_factor`: every job with the default `slurm.time` ({CAP}).",
        "`estimate`: what `dedal build` submits now: each job's limit its estimate times",
        f"`slurm.time_factor` ({LIMITS.factor:g}) in whole minutes. `hints`: `estimate` with",
        "`slurm.order_hints` on (each hint dropped at its planned time). `noise`: 0, every job sleeps",
        "its estimate; sigma > 0, every package's real duration is its estimate times exp(N(0, sigma))",
        "(one draw, the same for every variant with that seed), the limits and hints still from the",
        "estimates, and `simulated` is the model given those real durations. A `hints` row says how many",
        "hints the jobs had and how many the replay dropped from Slurm's dependencies at their time.",
        "",
        "| workload | nodes x cores | jobs | variant | noise (seed) | simulated (s) | backfill model (s) | "
        "Slurm (s) | Slurm / simulated | Slurm / backfill model | Slurm / LB | "
        "starts later than simulated, mean / max (s) | ran |",
        "| --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in result["rows"]:
        noise = r.get("noise") or 0.0
        drawn = f"{noise:g} ({r.get('seed')})" if noise else "0"
        variant = r["limit"] + (f" ({r['hints']}, {r.get('hints_dropped', 0)} dropped)" if r.get("hints") else "")
        lines.append(
            f"| {r['workload']} | {r['nodes']} x {r['cores']} | {r['jobs']} | {variant} | "
            f"{drawn} | "
            f"{r['simulated_s']:.0f} | {_fmt(r.get('backfill_model_s'))} | {r['slurm_s']:.0f} | "
            f"**{r['slurm_vs_simulated']:.3f}** | {_fmt(r.get('slurm_vs_backfill_model'), 3)} | "
            f"{r['slurm_vs_lower_bound']:.3f} | {r['start_later_than_simulated_mean_s']:.0f} / "
            f"{r['start_later_than_simulated_max_s']:.0f} | {r.get('ran', '-')} |"
        )
    lines += [""] + hints_vs_list(result["rows"])
    return "\n".join(lines)


def hints_vs_list(rows: List[dict]) -> List[str]:
    """Markdown: per case and noise, Slurm's makespan with order hints over the list schedule's
    (``estimate``) for each draw where both ran, and the mean over the draws."""
    made: Dict[tuple, Dict[str, float]] = {}
    for r in rows:
        key = (r["workload"], r["nodes"], r["cores"], r.get("noise") or 0.0, r.get("seed"))
        made.setdefault(key, {})[r["limit"]] = r["slurm_s"]
    by_noise: Dict[tuple, List[float]] = {}
    for (name, nodes, cores, noise, _seed), runs in sorted(made.items(), key=lambda kv: (kv[0][:4], kv[0][4] or 0)):
        if "hints" in runs and "estimate" in runs:
            by_noise.setdefault((name, nodes, cores, noise), []).append(runs["hints"] / runs["estimate"])
    if not by_noise:
        return []
    lines = [
        "## Order hints against the list schedule",
        "",
        "Slurm's makespan with `hints` over `estimate`'s for the same case and draw (below 1: hints",
        "shorter), each draw and their mean.",
        "",
        "| workload | nodes x cores | noise | draws | each draw | mean |",
        "| --- | --- | --- | ---: | --- | ---: |",
    ]
    for (name, nodes, cores, noise), ratios in by_noise.items():
        lines.append(
            f"| {name} | {nodes} x {cores} | {noise:g} | {len(ratios)} | "
            f"{' / '.join(f'{x:.3f}' for x in ratios)} | **{statistics.mean(ratios):.3f}** |"
        )
    return lines + [""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", nargs="+", default=["cscs-prgenv-gnu:1:8"], help="workload:nodes:cores")
    ap.add_argument("--variant", nargs="+", choices=VARIANTS, default=["fixed", "estimate"])
    ap.add_argument("--noise", type=float, default=0.0, help="sigma of each package's log-normal duration error")
    ap.add_argument("--seed", type=int, default=1, help="the noise draw")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "spack")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    if not (args.noise >= 0 and math.isfinite(args.noise)):
        ap.error("--noise must be a finite number >= 0")
    wls = workloads(args.data)
    rows: List[dict] = []
    errors: List[str] = []

    def one(case: str, mode: str) -> None:
        name, nodes, cores = case.split(":")
        try:
            row = replay(name, int(nodes), int(cores), mode, args.scale, wls[name], args.noise, args.seed)
            rows.append(row)
            print(
                f"{name} {nodes}x{cores} {mode} noise {args.noise:g}: simulated {row['simulated_s']:.0f} s, "
                f"backfill model {_fmt(row['backfill_model_s'])} s, Slurm {row['slurm_s']:.0f} s "
                f"({row['slurm_vs_simulated']:.3f})",
                flush=True,
            )
        except Exception as exc:  # reported below; the other replays go on
            errors.append(f"{case} {mode}: {exc}")

    threads = [threading.Thread(target=one, args=(c, m)) for c in args.case for m in args.variant]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        print("error:", e, file=sys.stderr)
    if rows:
        earlier = args.out / "cluster.json"
        kept = json.loads(earlier.read_text())["rows"] if earlier.is_file() else []
        mine = {_key(r) for r in rows}
        rows = [r for r in kept if _key(r) not in mine] + rows
        rows.sort(key=lambda r: (r["workload"], r["nodes"], r["cores"], r.get("noise") or 0.0, r["limit"]))
        write(
            args.out,
            "cluster",
            {
                "benchmark": "schedule-on-slurm",
                "slurm_version": rows[-1]["slurm_version"],
                "overhead_s": OVERHEAD,
                "rows": rows,
            },
            markdown,
        )
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
