"""Scale benchmark: plan + schedule + simulate of synthetic locks of 1,000 to 20,000 packages.

    .venv/bin/python benchmarks/schedule/scale.py [--sizes 1000 2000 5000 10000 20000]
        [--nodes 1 16 64 256] [--cores 64] [--overhead 3] [--lock PATH] [--baseline DIR]

Each lock is grown from a real one (``grow.py``: the real lock's shared core, everything
above it copied with fresh hashes; default: jedi-ci, 189 packages, the largest real lock in
../shared/data/spack). Each case (size x nodes) runs in a fresh process, through the
package's public API only, as ``dedal plan --simulate`` does: ``load_lock`` ->
``make_plan`` -> ``Workload.from_plan`` -> ``make_schedule`` (which simulates). Reported:

* seconds: CPU seconds of the process for that pipeline (``time.process_time``; the wall
  time is recorded too, but this machine is shared, so the wall time says more about the
  neighbours than about dedal), the plan's share apart (and in the JSON ``load_cpu_s``,
  reading the lock alone);
* peak MB: the process's peak resident memory (``VmHWM``), and what the interpreter
  with dedal imported held before the lock was read;
* ratio: makespan / lower bound (``Schedule.ratio``);
* vs CP list: dedal's makespan / the makespan of a plain critical-path list scheduler (one
  job per package, priority = bottom level: ``group(merge="none")``, then ``simulate``),
  run side by side in the same process on the same workload;
* both schedules pass ``dedal.schedule.validate`` (dependencies respected, no node over its
  cores) in every case, or the benchmark stops;
* with ``--baseline DIR`` (a checkout of another commit, e.g. ``git worktree add DIR
  COMMIT``): the same case run by that checkout's own ``scale.py --one``, in a fresh process
  right after this one, so that both see the same machine: its CPU seconds, peak memory and
  makespan, and the speed-up (its CPU seconds / ours).

Whether a change left the schedules as they were is checked by ``fingerprints.py``, not
here. Writes scale.md and scale.json next to this file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

DEFAULT_LOCK = ROOT.parent / "shared" / "data" / "spack" / "jedi-ci.spack.lock"


def peak_mb() -> float:
    """This process's peak resident memory: VmHWM, which execve resets (``ru_maxrss`` keeps
    the high-water mark of the parent at fork, here the grown lock's generator)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def one(lock: Path, nodes: int, cores: int, overhead: float) -> dict:
    """One case, in this process: the pipeline timed, then the baseline and the checks."""
    from dedal.model.plan import make_plan
    from dedal.model.spack_lock import load_lock
    from dedal.schedule import Machine, Workload, group, make_schedule, simulate, validate, schedule_problems

    before_mb = peak_mb()
    c0, w0 = time.process_time(), time.perf_counter()
    spack_lock = load_lock(lock)
    cl = time.process_time()
    plan = make_plan(
        spack_lock,
        env_name=lock.name.split(".")[0],
        install_root="/opt/software",
        base_image="host",
        base_id="benchmark",
    )
    del spack_lock  # freed before scheduling, as when the lock was a temporary: the same peak memory
    wl = Workload.from_plan(plan)
    c1 = time.process_time()
    sched = make_schedule(wl, Machine(nodes=nodes, cores=cores, overhead_s=overhead))
    c2, w2 = time.process_time(), time.perf_counter()
    peak = peak_mb()
    validate(wl, sched)
    c3 = time.process_time()
    cp_jobs = group(wl, Machine(nodes=nodes, cores=cores, overhead_s=overhead), merge="none")
    cp_sim = simulate(cp_jobs, nodes=nodes, cores=cores)
    c4 = time.process_time()
    problems = schedule_problems(wl, cp_jobs, cp_sim.starts, nodes=nodes, cores=cores)
    if problems:
        raise SystemExit(f"the critical-path list schedule is invalid: {problems[:3]}")
    return {
        "packages": len(wl.order),
        "nodes": nodes,
        "cores": cores,
        "cpu_s": round(c2 - c0, 3),
        "plan_cpu_s": round(c1 - c0, 3),
        "load_cpu_s": round(cl - c0, 3),
        "schedule_cpu_s": round(c2 - c1, 3),
        "wall_s": round(w2 - w0, 3),
        "peak_mb": round(peak, 1),
        "start_mb": round(before_mb, 1),
        "validate_cpu_s": round(c3 - c2, 3),
        "jobs": len(sched.jobs),
        "makespan_s": round(sched.makespan_s, 1),
        "lower_bound_s": round(sched.lower_bound_s, 1),
        "ratio": round(sched.ratio, 4),
        "dag_bound_s": round(sched.dag_bound_s, 1),
        "cp_list_makespan_s": round(cp_sim.makespan_s, 1),
        "cp_list_cpu_s": round(c4 - c3, 3),
        "cp_list_ratio": round(cp_sim.makespan_s / sched.lower_bound_s, 4),
        "vs_cp_list": round(sched.makespan_s / cp_sim.makespan_s, 4),
        "valid": True,
    }


def _case(script: Path, path: Path, nodes: int, cores: int, overhead: float, what: str) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            str(script),
            "--one",
            str(path),
            "--nodes",
            str(nodes),
            "--cores",
            str(cores),
            "--overhead",
            str(overhead),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{what}, {nodes} nodes failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(
    lock: Path, sizes: List[int], nodes_list: List[int], cores: int, overhead: float, baseline: Optional[Path] = None
) -> dict:
    import grow

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            path = grow.write(lock, size, Path(tmp) / f"grown-{size}.spack.lock")
            for nodes in nodes_list:
                row = _case(Path(__file__), path, nodes, cores, overhead, f"size {size}")
                row["size"] = size
                line = (
                    f"{size:>6} specs {row['packages']:>6} to build x {nodes:>3} nodes: {row['cpu_s']:7.2f} s cpu "
                    f"(plan {row['plan_cpu_s']:.2f}), {row['wall_s']:7.2f} s wall, peak {row['peak_mb']:.0f} MB, "
                    f"ratio {row['ratio']:.4f}, vs CP list {row['vs_cp_list']:.4f}"
                )
                if baseline is not None:
                    base = _case(
                        baseline / "benchmarks" / "schedule" / "scale.py",
                        path,
                        nodes,
                        cores,
                        overhead,
                        f"baseline, size {size}",
                    )
                    row["baseline"] = {
                        k: base[k] for k in ("cpu_s", "plan_cpu_s", "peak_mb", "jobs", "makespan_s", "ratio")
                    }
                    line += (
                        f"; baseline {base['cpu_s']:.2f} s cpu, peak {base['peak_mb']:.0f} MB, "
                        f"ratio {base['ratio']:.4f}"
                    )
                rows.append(row)
                print(line, flush=True)
    return {
        "lock": lock.name,
        "cores": cores,
        "overhead_s": overhead,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load_average": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d"),
        "baseline": _describe(baseline) if baseline else None,
        "rows": rows,
    }


def _describe(checkout: Path) -> str:
    """The baseline as the markdown names it: its commit where it is a git checkout."""
    out = subprocess.run(
        ["git", "-C", str(checkout), "log", "-1", "--format=commit %h of %cs"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()[:100] if out.returncode == 0 and out.stdout.strip() else str(checkout)


def markdown(res: dict) -> str:
    base = res.get("baseline")
    lines = [
        "# Scale benchmark: plan + schedule + simulate",
        "",
        "Written by `benchmarks/schedule/scale.py` (see its docstring). Locks grown from "
        f"`{res['lock']}` (`grow.py`), nodes of {res['cores']} cores, job overhead {res['overhead_s']:g} s, "
        f"Python {res['python']}, {res['machine']}, load average {', '.join(f'{x:.1f}' for x in res['load_average'])} "
        f"({res['date']}). `cpu s`: CPU seconds of `load_lock` + `make_plan` + `make_schedule` (the plan's "
        "share in brackets); `wall s` is recorded for reference only (a shared machine). `peak MB`: the "
        "process's peak resident memory (dedal imported: `start MB`). `ratio`: makespan / lower bound. "
        "`CP list`: a plain critical-path list scheduler (one job per package, bottom-level priorities) "
        "on the same workload, its ratio to the bound; `vs CP`: dedal's makespan / its. Every schedule "
        "passed `dedal.schedule.validate`.",
    ]
    if base:
        lines += [
            "",
            f"`before`: the same case run right after by the baseline checkout (`{base}`), in a "
            "fresh process of its own: its CPU seconds, peak MB and ratio; `speed-up` = its CPU seconds / "
            "ours. Both ran on the same machine minutes apart, so the speed-up is the number to compare "
            "(the CPU seconds of both rise and fall with the load of the other agents on the machine).",
        ]
    head = (
        "| specs | to build | nodes | cpu s (plan) | wall s | peak MB | start MB | jobs | ratio | of dag bound "
        "| CP list | vs CP |"
    )
    rule = "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    if base:
        head += " before cpu s | speed-up | before peak MB | before ratio |"
        rule += " ---: | ---: | ---: | ---: |"
    lines += ["", head, rule]
    for r in res["rows"]:
        line = (
            f"| {r['size']} | {r['packages']} | {r['nodes']} | {r['cpu_s']:.2f} ({r['plan_cpu_s']:.2f}) | "
            f"{r['wall_s']:.2f} | {r['peak_mb']:.0f} | {r['start_mb']:.0f} | {r['jobs']} | {r['ratio']:.4f} | "
            f"{r['makespan_s'] / r['dag_bound_s']:.4f} | {r['cp_list_ratio']:.4f} | {r['vs_cp_list']:.4f} |"
        )
        if base and r.get("baseline"):
            b = r["baseline"]
            line += f" {b['cpu_s']:.2f} | {b['cpu_s'] / r['cpu_s']:.1f} | {b['peak_mb']:.0f} | {b['ratio']:.4f} |"
        lines.append(line)
    return "\n".join(lines) + "\n" + BEFORE


# the steps of issue 24 before this table, and what this one changed (the numbers of this
# step from the run of 2026-11-26 that wrote the table; "alone": one case in a quiet moment)
BEFORE = """
## Issue 24, step by step

**Step 1** (from commit a145a69: same pipeline, same grown locks, CPU seconds, one case per
process, measured the same day): 1,000 specs on 1 node 36.1 s (ratio 1.2467, peak 61 MB),
16 nodes 6.1 s (1.0172, 35 MB), 64 nodes 7.0 s (1.0172), 256 nodes 11.5 s (1.0172); 2,000
specs on 16 nodes 21.5 s (1.0172, 48 MB). The issue's table (wall seconds, `dedal plan
--simulate`): 2,000 specs 71 / 12 / 14 / 23 s on 1 / 16 / 64 / 256 nodes, 5,000 specs over
600 s on 1 node and 66 / 104 s on 64 / 256 nodes, 10,000 not reached. Up to 900 packages
(every case of results.md, 805 at most) the schedules stayed byte-identical to those of
a145a69; beyond, the searches stop after fixed work, which costs 1,000 specs 0.2 % of
makespan on 16-256 nodes (1.0194 vs 1.0172) and 0.9 % on 1 node (1.2576 vs 1.2467), 2,000
specs 0.6 % on 16 nodes (1.0237 vs 1.0172).

**Step 2** (from commit faf516c) changed no schedule: the fingerprints of every case of
results.md and of the grown 1,000 / 2,000-spec locks on 1-256 nodes stayed faf516c's. Measured on
2026-11-25 with faf516c's code: 10,000 specs 9.70 / 9.29 / 5.82 / 7.03 CPU s on 1 / 16 / 64 /
256 nodes (plan 1.75 s), peak 386 MB on one node; 20,000 specs 18.7 / 25.3 / 15.5 / 10.9 s
(plan 3.5-3.7 s), peak 641 MB on one node. After it, alone, 10,000 specs took 3.5-4.2 CPU s
on 1-256 nodes and 20,000 specs 7.4 s on 1 and 16 nodes.

**Step 3** (`before` = commit 6a5f311, main before it; its table is scale.md of commit 89e65ba):

* job graphs, bottom levels, the critical path and `dag_bound` are computed over each
  package's transitively reduced requirements (`Workload.direct_requires`, made once per
  workload: 2 edges per package instead of 22 on the 10,000-spec lock); they give the same
  reduced `after` lists and the same longest paths (`tests/schedule/test_reduced.py`);
* `group(merge="none")` counts only those (with a job overhead, every other requirement
  completes strictly before one of them, so a package is ready at the same moment), and
  `decide()` loops over the packages waiting for a job in C; `settle()` reduces and
  prioritizes a new list of jobs over one graph instead of two;
* beyond `LARGE_BUILD` the searches (`improve`, then `refine`) start from the grouping that
  simulates shorter only, not from both (one `improve()` less): on these locks this changed
  which grouping the searches ended with only for 10,000 specs on 1 node, where starting
  from the merged one ends 4 s shorter (23990 s vs 23994.3 s, ratio 1.0303 vs 1.0305);
* reading and planning the lock: each node's children made once and shared by the
  closures, the waves, the critical path and the build requirements; an edge's dependency
  types checked once per combination; `layer_key()` without `json.dumps` of a dict. The
  plans are byte-identical (sha256 of `Plan.to_json()` of every lock in shared/data/spack
  and of the 1,000-20,000-spec grown ones).

Fingerprints (`fingerprints.py --baseline`, sha256 of `Schedule.to_json()`): all 130 cases
identical to 6a5f311's: every case of results.md (5 workloads x 64/8 cores x 1/4/16/64
nodes; dedal, dedal with order hints, per-package), the grown 1,000 and 2,000-spec locks on
1/16/64/256 nodes and their plans. Beyond, every makespan equals 6a5f311's (`before ratio`)
but that of 10,000 specs on 1 node, 4 s shorter. Peak memory is 1-5 % lower at 10,000 and
20,000 specs (171-174 vs 177-180 MB, 320-328 vs 333-341 MB), unchanged below.

After step 3 issue 24's targets were not met: 10,000 specs took 2.6-3.2 CPU s on 1-256 nodes (target
2 s; 1.3-1.4x faster than 6a5f311), 20,000 specs 5.1-6.1 s (target 5 s; 1.2-1.3x). Where
the time goes, alone, on 16 nodes (CPU s, by function): 10,000 specs 2.86 = `load_lock`
0.57 (JSON decoding 0.25, the nesting-depth check 0.12, the nodes' and the cycle checks 0.2) +
`make_plan` 0.31 + `Workload.from_plan` 0.05 + `make_schedule` 1.92 (the two groupings 0.79;
five simulations 0.6: one per grouping, `improve`'s merge, `refine`'s two moves; rebuilding
the jobs for those 0.19; `lower_bound` 0.14 with the reduced requirements; `dag_bound` 0.12);
20,000 specs 5.40 = `load_lock` 1.15 + `make_plan` 0.70 + `Workload` 0.12 +
`make_schedule` 3.42 (the two groupings 1.81, of which the merging one 1.1: its decisions
look at every package waiting for a job, thousands for a job of the shared core; three
simulations 0.73: one per grouping, `refine`'s one move; rebuilding the jobs for it 0.15;
`lower_bound` 0.35; `dag_bound` 0.25). What remains is the per-event cost of the two list
schedulers in Python (a simulation about 12 us per job, a grouping 30-55 us per package)
times the searches' simulations, and reading 20-40 MB of JSON. Dropping the searches
beyond 5,000 specs would save 0.5-0.6 s but lose what they
find (`refine`'s one move saves 3 s of 20,000 specs on 64 nodes, its two moves 18 s of
10,000 specs on 1 node), so they stay; incremental re-simulation of a candidate, or the
list schedulers in compiled code, are what is left to try.

**Step 4** (`before` = commit 89e65ba, main before it; its table is scale.md of commit
d12d748) changed no schedule and
no plan: `fingerprints.py --against` 89e65ba's, all 130 cases identical; every makespan and
ratio above equals `before`'s. What changed:

* each package's cores and seconds (`package_seconds`) and the default bottom levels are
  made once per workload and node size, shared by `lower_bound`, `dag_bound` and both
  groupings (each made them anew);
* a grouping of one package per job on its own cores skips `settle()`: its `after` lists
  are reduced as made and the jobs' bottom levels are the packages', to the bit (same sums,
  same order; `tests/schedule/test_reduced.py` holds it to `settle()`);
* `group()`: a finished job's pending dependents (thousands for the shared core) counted
  in C-level loops, a duration's seconds on c cores remembered per duration;
  `Nodes.reserve()` without tuples or `max()`; `simulate()` returns at once from an event
  where nothing waits or no core is free; `job_seconds()` hashes the model once a job;
* `dag_bound()` skips a head threshold whose upper bound (all the work of S, its longest
  tail, with a margin far above rounding) cannot beat the bound so far: the same value,
  0.08 instead of 0.11 CPU s at 10,000 specs, 0.13-0.19 instead of 0.25 at 20,000;
* `Workload.direct_requires()` tests each bit by the cheaper of a mask and a shift (a
  big-int operation costs the size of its result): 0.15 instead of 0.23-0.28 s at 20,000;
* `load_lock`: the JSON nesting check looks up each value's type instead of calling
  `isinstance` (json.loads makes plain dicts and lists): 0.08 instead of 0.125 s at 10,000.

Tried and left out: *incremental re-simulation* of a search candidate from the first job it
changes: a candidate of `improve`/`refine` changes the bottom-level priorities of the jobs'
ancestors, the shared core among them, which start at time 0; on the 10,000-spec lock the
order of the jobs' priorities stayed the same only for the first 6-218 jobs started (of
4,697-9,996; the changes other than priorities come 1,047-7,808 jobs in), so a re-simulation
would redo nearly all of it. *Refusing deep JSON by catching RecursionError only*: it would
accept 65-999 levels, which `tests/model/test_inputs.py` refuses (MAX_DEPTH + 1); the
check in C-level itertools (`compress`/`chain`) was slower (0.175 vs 0.126 s). *A cycle
check folded into another pass*: the load's post-order walk is cached and serves
`make_plan`'s waves, order and critical path, so it is not repeated. *Remembering checked
names and versions in `_parse_node`*: 0.03 CPU s less at 10,000 specs, but the peak memory
of the later grouping rose by 9 MB (174.6 to 183.9 MB), so it was not kept; a non-frozen
`Edge` (0.4 instead of 1.3 us an edge, 0.07 s) was left out with it, not measured alone.

**Issue 24's 2 s target is still not met at 10,000 specs**: 2.89 / 2.58 / 2.34 / 2.24 CPU s
on 1 / 16 / 64 / 256 nodes, 1.10 / 1.12 / 1.09 / 1.12x faster than 89e65ba side by side
(3.17 / 2.88 / 2.56 / 2.51 s). **The 5 s target at 20,000 specs is met on 16 and 256
nodes** (4.96 and 4.45 s) **and not on 1 and 64** (5.43 and 5.06 s); 1.09-1.11x faster
than 89e65ba (5.90 / 5.44 / 5.60 / 4.90 s). Within 0.1 s of the line, the load of the
other agents decides which side a run falls on. Peak memory unchanged (172-173 MB at
10,000 specs, 320-328 MB at 20,000). Where the time goes now, alone, on 16 nodes (CPU s):
10,000 specs 2.50 = `load_lock` 0.46 (the nesting check 0.08 of it) + `make_plan` 0.30 +
`Workload.from_plan` 0.08 + `make_schedule` 1.66 (the two groupings 0.65; five
simulations 0.54: 0.20 for the groupings, 0.34 for `improve`'s merge and `refine`'s two
moves; rebuilding the jobs for those 0.14; `lower_bound` 0.11 with the workload's reduced
requirements made first; `dag_bound` 0.08); 20,000 specs 4.81 = `load_lock` 0.96 +
`make_plan` 0.67 + `Workload` 0.18 + `make_schedule` 3.01 (the two groupings 1.53, three
simulations 0.69, `lower_bound` 0.27, `dag_bound` 0.19, rebuilding the jobs 0.17). What
is left is the same as after step 3: the per-event cost of the list schedulers in Python,
times the searches' simulations, and reading 20-40 MB of JSON; the list schedulers in
compiled code are what is left to try.

**Step 5** (`before` = commit d12d748, main before it; its table is scale.md of commit
c325bc3) changed no plan (the
plans' fingerprints are d12d748's) and no schedule up to 3,333 packages: `fingerprints.py
--against` d12d748's with `--sizes 1000 2000 5000 10000`, 138 of 140 cases identical (every
case of results.md); the two that differ, 5,000 specs on 1 node and 10,000 on 16 nodes,
have the same makespans. Every makespan and ratio of its table equals `before`'s but 20,000 specs
on 16 nodes, 3 s shorter (3580 vs 3583 s). What changed:

* `Ready` (the lists of what waits for cores, by cores and duration class) keeps the
  durations each list holds *now*, sorted, instead of the shortest one ever added. Once a
  list's short items had started, it was still looked at item by item on every event: on
  one node of the 10,000-spec lock 99.6 % of what `in_order()` gave under a reservation
  could not start. `simulate()` of the merged grouping there: 0.05 instead of 0.12 s;
* `simulate_unless()`: a search's candidate is kept only if it simulates shorter, so its
  simulation gives up at the first start that shows the makespan reaches the bound (the
  start plus the longest chain of estimates after it, the search's bonus left out, with a
  margin far above rounding); `improve()`, `refine()` and the choice between the two large
  groupings use it. The same choices (`tests/schedule/test_reduced.py`: it gives up exactly
  where the whole simulation reaches the bound). On 64 and 256 nodes every candidate of
  the 10,000-spec lock is dropped before its first job starts (its critical path is
  already longer); on 1 and 16 nodes only at the last jobs, so nothing is saved there;
* `refine()`: a move that changes only priorities keeps the jobs' reduced `after` lists and
  sets the priorities again (0.02 instead of 0.07 s at 10,000); the ids that splits take
  are counted only when a later split needs one (`new_ids()` passes over every job: 0.2 s
  at 10,000 on one node, where the last kept move never needed it);
* beyond 3,333 packages `improve()` does not start: its fixed work (10,000 jobs simulated)
  affords at most two merges there, which never found a shorter schedule on the 5,000 and
  10,000-spec locks (8 of 8 cases; 20,000 specs: at most one, never tried), and `refine()`
  tries merges along the chain too (0.15 s at 10,000). There, too, the starting point
  without merging is `per_package()`: one job per package listed in topological order,
  simulated once, instead of `group(merge="none")`'s package-level list schedule whose
  jobs were then listed by start and simulated again (0.2 s at 10,000; the same critical-
  path list schedule but for ties: 5,000 specs on 1 node and 10,000 on 16 nodes end with
  other schedules of the same length, 20,000 on 16 nodes 3 s shorter). Up to 3,333
  packages both stay as they were: on 1,000 specs one node, `per_package()` there ended
  1.3 s longer (2903.3 vs 2902 s);
* the JSON nesting check reads the brackets of the text where no string holds a bracket,
  quote or backslash (each `bytes.replace` pass takes out one level; otherwise the data is
  walked as before): 0.04 instead of 0.08 s; `make_plan` uses the waves of what is to be
  built as the order too when that is everything reachable (0.03 s); `simulate()` by job
  index, the ready lists keyed by an int (a job's rank by priority, about 6 % of a
  simulation); `Edge` a named tuple (0.03 s of `load_lock`).

Tried and left out: *counting direct requirements only in the merging grouping* (221,000
instead of 20,000 decrements at 10,000 specs): whether a job's packages release a
package is the same, but the packages waiting for the job, which `decide()` checks, need
every requirement, so their upkeep stays and little is saved. *Stopping a search at its
first candidate that is not shorter* (beyond 900 packages): 0.12 s less at 10,000 specs
on 16 nodes, but 1,000 and 2,000 specs ended 0.6 % longer (1429 vs 1420 and 1426 s on
16-256 nodes). *Skipping a candidate of `refine()` that `improve()` already simulated*: the
same candidate came up on 64 nodes and for 2,000 specs, but not on 16 nodes of 10,000
specs, where it would count. *A bound that also counts the jobs not started yet* (now +
their chain): on 16 nodes the candidates reach the incumbent's 2149 s only with the last
job, either way. *The ready lists kept in descending order* (what starts popped from the
end) *and `Nodes.place/release` with `_set()` copied inline*: the same within the noise
(schedule 1.17 / 1.42 CPU s on 1 / 16 nodes either way), so not kept.

**Issue 24's targets after step 5** (its table, run side by side with d12d748): 20,000
specs **3.90 / 4.13 / 4.33 / 3.62 CPU s** on 1 / 16 / 64 / 256 nodes, **under 5 s on all
four** (d12d748: 5.38 / 4.81 / 5.00 / 4.30); 10,000 specs **1.88 / 2.22 / 1.76 / 1.67 s**
(d12d748: 2.90 / 2.57 / 2.32 / 2.19), **under 2 s on 1, 64 and 256 nodes, not on 16**
(alone in a quiet moment 2.09-2.14 s there). Peak memory 173-175 MB at 10,000 specs (+2
MB), 317-327 MB at 20,000. Where the time goes on 16 nodes, alone, 10,000 specs (CPU s):
2.11 = `load_lock` 0.39 + `make_plan` and `Workload` 0.38 + `make_schedule` 1.33 (the
merging grouping 0.41 and its simulation 0.09, which loses there; one job per package and
its simulation 0.15; `refine`'s two moves 0.38, neither shorter; `lower_bound` 0.12,
`dag_bound` 0.08); on one node 1.86 (the merging grouping wins, with 4,697 jobs: its
simulations cost half). What is left is what step 4 said: the per-event cost of the list
schedulers in Python (a simulation about 10 us a job, the merging grouping 45 us a
package; `decide()` walks the thousands of packages that wait for a job of the shared
core), and reading 20 MB of JSON (0.39 s).

The command itself (the issue's first table): `dedal plan LOCK --simulate --nodes N` on the
10,000-spec lock, wall seconds, interpreter start, imports and output included, each
checkout's own code run by `python -m dedal` from it, alternating, twice: d12d748 3.68-3.75
/ 3.38-3.44 / 2.99-3.05 / 3.02 s on 1 / 16 / 64 / 256 nodes, step 5 2.21-2.39 / 2.41-2.63 /
2.10-2.15 / 2.02-2.04 s. Of that, `dedal` itself now imports only the command it runs
(`dedal plan --help` 0.24 instead of 0.60 s: every command's stages were imported to
build the parser) and `jsonschema` only when an environment file is read.

**Step 6** (this table; `before` = commit c325bc3, main before it) changed no plan and no
schedule: `fingerprints.py --against` c325bc3's with `--sizes 1000 2000 5000 10000`, 140 of
140 cases identical after each of its changes; every makespan above equals `before`'s.
What changed:

* the merging groupings count a waiting package's *direct* requirements only (20,000
  instead of 221,000 decrements at 10,000 specs). Step 5 left this out because `decide()`
  also checks every package that waits for the job through any requirement, and keeping
  that set up to date cost what the counts saved. Now the set is made only where a
  decision gets that far (most end before it: a second package released, another one next
  in line, no cores), as unions of the packages' dependents in C, and `expected_ready()`
  skips completed requirements in C instead of keeping sets of the others. Why the counts
  agree: a requirement that another one needs completes no later than that one (before
  its job started, or in its job), so a package has every requirement complete exactly
  when it has every direct one, the last to complete (and the last a job builds) is a
  direct one, and a job holds every uncompleted requirement of a package exactly when it
  holds every uncompleted direct one. `tests/schedule/test_reduced.py` holds 32 random
  groupings (with and without a job overhead, safe and backlog, 2-30 merges each) to
  c325bc3's jobs. The merging grouping of 10,000 specs: 0.42 -> 0.27 s on 16 nodes, 0.45 ->
  0.35 s on one; peak memory 10 MB less at 10,000 specs, 30 MB at 20,000;
* `Nodes` keeps its nodes sorted by free cores as ints (`free x nodes + node`), not pairs:
  a bisection compares ints and makes no tuple (a simulation 3-6 % less on 16-64 nodes);
* `refine()` answers a merge with `merge_jobs()` on the jobs as they are (what `improve()`
  uses), with the search's bonus, instead of `build_jobs()` from every package: the same
  jobs to the bit (tested on random groupings), 0.02-0.03 s of a schedule of 10,000 specs;
* reading the lock: a name that passes every rule of `name_problem()` at a glance (ASCII
  letters, digits, `_.+-`) passes by one regular-expression match (a test holds the match
  to the rules on 40,000 names); the edges share their checked (types, virtuals) tuples and
  are made by `tuple.__new__` (`load_lock` 0.372 -> 0.352 s; plans byte-identical).

Tried and left out (each measured interleaved with the code before it): the reservation
of `Nodes` by prefix sums in C (`accumulate`, `bisect`) or by a shortcut for nodes running
one-core jobs only (a third of the nodes it looks at): nothing beyond noise;
`expected_ready()` keeping each package's uncompleted requirements as a tuple refreshed
when something completed: slower (0.29-0.31 vs 0.27 s), as something completes between
nearly every two questions; the counts of the waiting packages decremented in C (`map`,
`dict.update`, `compress`): slower, most lists are short; `dag_bound()` summing the rate
changes per time before its sweep: the same bound to the bit, 5 of its 75 ms; the order
check of `Workload.topo()` by `max(map())`: 3 ms; `all_build_requirements()` from each
package's own link/run closure plus its other children's: the same sets, no faster (making
the closures is the cost).

**Issue 24's targets after step 6** (this table, side by side with c325bc3): 10,000 specs
**1.72 / 1.81 / 1.47 / 1.41 CPU s** on 1 / 16 / 64 / 256 nodes, **under 2 s on all four**
(c325bc3: 1.80 / 2.02 / 1.66 / 1.61); 20,000 specs **3.42 / 3.60 / 3.67 / 2.97 s**, under
5 s (c325bc3: 3.71 / 3.88 / 4.24 / 3.41). Two other runs of the whole table the same day,
the margin on 16 nodes being what it is: before `refine()`'s merges went through
`merge_jobs()`, 1.68 / 1.87 / 1.58 / 1.46 s (c325bc3 1.82 / 2.07 / 1.71 / 1.66), and after
it on a busier host 1.91 / 1.97 / 1.57 / 1.51 s (c325bc3 1.88 / 2.22 / 1.72 / 1.84): 16
nodes under 2 s in all three, by 0.03-0.19 s. Peak memory 162-163 MB at 10,000 specs, 288-291
MB at 20,000. On 16 nodes, the closest, where the time goes (py-spy, 6 runs): reading the
lock 18 % (JSON decoding 6 %), planning 14 % and the workload 2 %, the four simulations run
to their end 22 % (the merged grouping's, one job per package's and `refine()`'s two moves:
2194, 2149 (kept), 2176 and 2149 s, none stopped early by the bound), the merging grouping
18 % (its jobs and every package's dependents included), building `refine()`'s candidates
and its bookkeeping 6 %, the bounds 10 % (with the reduced requirements the rest shares),
one job per package 3 %, the final ids 2 %, freeing the lock 3 %.

The command itself: `dedal plan LOCK --simulate --nodes N` on the 10,000-spec lock, wall
seconds (interpreter start, imports and output included), each checkout's own code by
`python -m dedal`, alternating, twice: c325bc3 2.12-2.20 / 2.34-2.39 / 1.96 / 1.94-1.96 s
on 1 / 16 / 64 / 256 nodes, step 6 (before `merge_jobs()` in `refine()`) 1.99-2.01 / 2.14-2.16
/ 1.78 / 1.70-1.74 s.

## The ratios of 10,000 and 20,000 specs on 16 nodes

1.47 and 1.23 of the lower bound, with as many jobs as packages and the critical-path list
scheduler just as far: that bound is the DAG's, not the scheduler's. `LB = overhead +
max(critical path, work / capacity)` does not see that the grown lock's shared core (the
toolchain every copy needs) builds nearly alone first: on 16 nodes of 64 cores the
10,000-spec schedule keeps 39 % of the cores busy in its first 110 s and 1-9 % from then to
650 s, then 100 % nearly to the end; the tighter bound that counts this (`dag_bound`, column `of dag bound`) is 2043 s, and
the schedule (2149 s) is 1.052 of it (20,000 specs: 1.043). One job per package wins there
because merging (`safe`: 2194 s) delays dependents of the core; the searches beyond 900
packages (at 10,000 specs two refinements; a merge too before step 5) find nothing better there (on one node, from the
merged grouping, they gain 18 s).
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 5000, 10000, 20000])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--cores", type=int, default=64)
    ap.add_argument("--overhead", type=float, default=3.0)
    ap.add_argument("--lock", type=Path, default=DEFAULT_LOCK)
    ap.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # one case, in a fresh process
    ap.add_argument("--out", type=Path, default=HERE / "scale", help="results: OUT.md and OUT.json")
    ap.add_argument("--baseline", type=Path, help="a checkout of another commit, run side by side")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.nodes[0], args.cores, args.overhead)))
        return
    res = run(args.lock, args.sizes, args.nodes, args.cores, args.overhead, args.baseline)
    args.out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(res))


if __name__ == "__main__":
    main()
