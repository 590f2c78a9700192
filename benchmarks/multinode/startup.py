"""Start-up under Slurm by container runtime: MPI_Init and the step's wall time, native against
Apptainer with a container per rank (plain ``srun apptainer exec``), Apptainer with one container
per node and step (``--sharens``: what ``dedal run`` and slurm/run-image.sbatch do), Apptainer with
one instance per node kept for all steps (what ``dedal verify`` does in an allocation) and
bubblewrap over the one mount of the image dedal keeps (what ``dedal verify`` does with bwrap), for
1, 2, 4 and 8 ranks per node on 1 and 2 nodes of the namespaced test cluster.

Every step is ``dedal.adapters.mpi.run_srun`` of the tests' benchmark image's ``dedal_init``
(tests/fixtures/bench.py: the trixie base with dedal's microbenchmarks) inside one allocation
(``salloc --no-shell``), as dedal verify and ``dedal run`` launch: the rank script, the image's
environment, the rank's PMIx variables handed over. The four ways alternate within each round
(native first, then the others in a rotating order), ``--rounds`` rounds (default 5); the table
has the medians, and container / native of the medians. Native is the image's own root
filesystem (the tree the SIF was packed from) in a bubblewrap sandbox per rank, as verify's
native side. MPI_Init is the slowest rank's (``dedal_init``'s max): the step waits for it. It
holds the wait for the last rank to arrive, too (MPI_Init's exchange needs every rank), so
the fastest rank's (the min: the last to arrive waits for nobody) is beside it: where they
part, the ranks arrived apart (more processes than CPUs), not MPI_Init grew. The
wall time is srun's, from its start to the last rank's end (container set-up, MPI_Init and
MPI_Finalize; the time to the first message is at most that).

Run as root with Apptainer (>= 1.3 for --sharens) on PATH:

    .venv/bin/python benchmarks/multinode/startup.py [--rounds 5] [--ranks 1,2,4,8] [--nodes 1,2]

Results: benchmarks/multinode/startup.json and startup.md (``--name NAME``: NAME.json and NAME.md,
e.g. a run of a few rows with more rounds beside the full table). The test cluster's nodes are network
and mount namespaces of this one machine (2 CPUs here): 8 ranks per node on 2 nodes are 16
processes on 2 CPUs, so what grows with the ranks is CPU time spent starting containers and MPI,
which is the cost at 128 ranks per node on a real node too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dedal.adapters import mpi, runtime  # noqa: E402
from dedal.adapters.runtime.apptainer import has_sharens, version as apptainer_version  # noqa: E402
from tests.fixtures.bench import make_bench_image  # noqa: E402  (the tests' image, built the same way)

HERE = Path(__file__).resolve().parent
CLUSTER = ROOT / "slurm" / "testcluster"
MODES = ("native", "apptainer per rank", "apptainer per node", "apptainer instance kept", "bwrap, mount kept")
ENV = {"OMPI_MCA_pml": "ucx", "OMPI_MCA_pml_ucx_tls": "any", "OMPI_MCA_pml_ucx_devices": "any"}
PRECISE = re.compile(r"# precise: min ([\d.]+) ms, max ([\d.]+) ms")


def run_step(
    mode: str, roots: Dict[str, Any], nodes: int, rpn: int, log: Path, work: Path, slurm_env: Dict[str, str]
) -> Optional[Dict[str, float]]:
    root, image_mount = roots[mode]
    rt = "apptainer" if mode.startswith("apptainer") else "bwrap"
    res = mpi.run_srun(
        root,
        ["/opt/view/bin/dedal_init"],
        nodes * rpn,
        env=ENV,
        log=log,
        script_dir=work / "launch",
        nodes=nodes,
        timeout=300,
        runtime_name=rt,
        slurm_env=slurm_env,
        share=mode != "apptainer per rank",
        image_mount=image_mount,
    )
    found = PRECISE.findall(log.read_text(errors="replace"))
    if res.returncode != 0 or not found:
        return None
    return {"init_ms": float(found[-1][1]), "init_min_ms": float(found[-1][0]), "wall_s": res.seconds}


def med(values: List[float]) -> Optional[float]:
    return round(statistics.median(values), 3) if values else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ranks", default="1,2,4,8", help="ranks per node")
    ap.add_argument("--nodes", default="1,2")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--name", default="startup", help="results NAME.json and NAME.md here (default startup)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (the test cluster and the image need it)")
    app = shutil.which("apptainer")
    if not app or not has_sharens(app):
        sys.exit("needs Apptainer >= 1.3 on PATH (--sharens)")
    ranks = [int(r) for r in args.ranks.split(",")]
    node_counts = [int(n) for n in args.nodes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="dsu-", dir="/tmp"))  # short: Unix sockets live under it
    state = work / "tc"
    env = dict(os.environ, DEDAL_TC_NETNS="1", DEDAL_TC_SHARED=str(work), DEDAL_TC_CPUS=str(max(ranks)))
    started, job = False, ""
    kept = contextlib.ExitStack()
    samples: Dict[str, List[Dict[str, float]]] = {}
    failed: Dict[str, int] = {}
    try:
        t0 = time.monotonic()
        image = make_bench_image(work / "image")
        build_s = time.monotonic() - t0
        subprocess.run(
            [str(CLUSTER / "start.sh"), str(state), str(max(node_counts))],
            env=env,
            check=True,
            timeout=180,
            stdout=subprocess.DEVNULL,
        )
        started = True
        facts = dict(line.split("=", 1) for line in (state / "cluster.env").read_text().splitlines() if "=" in line)
        senv = dict(os.environ, SLURM_CONF=facts["SLURM_CONF"])
        out = subprocess.run(
            ["salloc", "--no-shell", "-N", str(max(node_counts)), "--exclusive"],
            env=senv,
            capture_output=True,
            text=True,
            timeout=120,
        )
        found = re.search(r"Granted job allocation (\d+)", out.stderr + out.stdout)
        if not found:
            sys.exit(f"salloc failed: {out.stderr}")
        job = found.group(1)
        senv.update(SLURM_JOB_ID=job, SLURM_JOBID=job)
        kept = contextlib.ExitStack()
        instance = kept.enter_context(
            mpi.node_instances(image.sif, max(node_counts), log=work / "instances.log", slurm_env=senv)
        )
        if instance is None:
            sys.exit(f"the instances did not start: {work / 'instances.log'}")
        source = runtime.mount_source(image.sif)
        mounted = kept.enter_context(runtime.mounted(image.sif))
        roots = {
            "native": (image.root, None),
            "apptainer per rank": (image.sif, None),
            "apptainer per node": (image.sif, None),
            "apptainer instance kept": (instance, None),
            "bwrap, mount kept": (mounted, (str(mounted), str(source[0]), source[1])),
        }
        load_before = Path("/proc/loadavg").read_text().split()[:3]
        t1 = time.monotonic()
        for rnd in range(args.rounds):
            for nodes in node_counts:
                for rpn in ranks:
                    others = list(MODES[1:])
                    shift = rnd % len(others)
                    for mode in ["native"] + others[shift:] + others[:shift]:
                        key = f"{nodes}|{rpn}|{mode}"
                        got = run_step(
                            mode, roots, nodes, rpn, work / "logs" / f"{nodes}-{rpn}-{mode}-{rnd}.log", work, senv
                        )
                        if got is None:
                            failed[key] = failed.get(key, 0) + 1
                        else:
                            samples.setdefault(key, []).append({**got, "round": rnd})
            print(f"round {rnd + 1}/{args.rounds} done after {time.monotonic() - t1:.0f} s", file=sys.stderr)
        kept.close()
        rows = []
        for nodes in node_counts:
            for rpn in ranks:
                base = samples.get(f"{nodes}|{rpn}|native", [])
                n_init, n_wall = med([s["init_ms"] for s in base]), med([s["wall_s"] for s in base])
                n_fastest = med([s["init_min_ms"] for s in base])
                for mode in MODES:
                    got = samples.get(f"{nodes}|{rpn}|{mode}", [])
                    init, wall = med([s["init_ms"] for s in got]), med([s["wall_s"] for s in got])
                    fastest = med([s["init_min_ms"] for s in got])
                    # the same round's native step ran just before: a ratio per round cancels the
                    # machine's drift between rounds, its spread is the noise of one comparison
                    native_of = {s["round"]: s["init_ms"] for s in base}
                    paired = sorted(s["init_ms"] / native_of[s["round"]] for s in got if native_of.get(s["round"]))
                    rows.append(
                        {
                            "paired_init_ratios": [round(x, 3) for x in paired],
                            "nodes": nodes,
                            "ranks_per_node": rpn,
                            "mode": mode,
                            "runs": len(got),
                            "failed": failed.get(f"{nodes}|{rpn}|{mode}", 0),
                            "init_ms": init,
                            "wall_s": wall,
                            "init_ratio": round(init / n_init, 3) if init and n_init else None,
                            "init_min_ms": fastest,
                            "init_min_ratio": round(fastest / n_fastest, 3) if fastest and n_fastest else None,
                            "wall_ratio": round(wall / n_wall, 3) if wall and n_wall else None,
                        }
                    )
        result = {
            "date": time.strftime("%Y-%m-%d"),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "apptainer": apptainer_version(app),
            "rounds": args.rounds,
            "image_build_s": round(build_s, 1),
            "measure_s": round(time.monotonic() - t1, 1),
            "load_before": load_before,
            "load_after": Path("/proc/loadavg").read_text().split()[:3],
            "rows": rows,
        }
        (HERE / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
        (HERE / f"{args.name}.md").write_text(render(result))
        print(render(result))
        return 0
    finally:
        kept.close()
        if job:
            subprocess.run(["scancel", job], env=dict(os.environ, SLURM_CONF=str(state / "slurm.conf")), timeout=60)
        if started:
            subprocess.run([str(CLUSTER / "stop.sh"), str(state)], timeout=120, stdout=subprocess.DEVNULL)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _cell(value: Optional[float], ratio: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:g}" + (f" ({ratio:.2f}x)" if ratio is not None else "")


def render(r: Dict[str, Any]) -> str:
    lines = [
        "# Start-up by container runtime: MPI_Init and step wall time",
        "",
        f"Measured {r['date']} on {r['host']} ({r['cpus']} CPUs, Apptainer {r['apptainer']}) by "
        f"`benchmarks/multinode/startup.py`: {r['rounds']} rounds, the five ways alternating in each, medians; "
        f"in brackets container / native of the medians. Load average before {' '.join(r['load_before'])}, "
        f"after {' '.join(r['load_after'])}; {r['measure_s']} s of measuring.",
        "",
        "| nodes | ranks per node | way | runs (failed) | MPI_Init, slowest rank (ms) | "
        "MPI_Init / native, per round: median [min..max] | MPI_Init, fastest rank (ms) | step wall time (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in r["rows"]:
        paired = row.get("paired_init_ratios") or []
        per_round = (
            f"{statistics.median(paired):.2f}x [{min(paired):.2f}..{max(paired):.2f}]"
            if paired and row["mode"] != "native"
            else "-"
        )
        lines.append(
            f"| {row['nodes']} | {row['ranks_per_node']} | {row['mode']} | {row['runs']} ({row['failed']}) | "
            f"{_cell(row['init_ms'], row['init_ratio'] if row['mode'] != 'native' else None)} | "
            f"{per_round} | {_cell(row.get('init_min_ms'), row.get('init_min_ratio') if row['mode'] != 'native' else None)} | "
            f"{_cell(row['wall_s'], row['wall_ratio'] if row['mode'] != 'native' else None)} |"
        )
    lines += ["", *model(r), ""]
    return "\n".join(lines)


def model(r: Dict[str, Any]) -> List[str]:
    """What the table says, and what follows for 128 ranks per node, from the rows of one node:
    the CPU time of a cold start (a mount whose pages nothing has decompressed yet) is the
    container's extra MPI_Init at one rank per node; with a container per rank every rank pays
    it, with one per node the node pays it once, with the instance kept only its first step."""
    rows = {(x["nodes"], x["ranks_per_node"], x["mode"]): x for x in r["rows"]}
    one = [x for x in r["rows"] if x["nodes"] == 1 and x["ranks_per_node"] == 1]
    native = next((x["init_ms"] for x in one if x["mode"] == "native"), None)
    cold = next((x["init_ms"] for x in one if x["mode"] == "apptainer per node"), None)
    if not native or not cold:
        return []
    d = cold - native
    per = {
        m: [x["init_ratio"] for (n, _, mode), x in sorted(rows.items()) if mode == m and x["init_ratio"]]
        for m in MODES[1:]
    }
    span = {m: f"median {statistics.median(v):.2f}x ({min(v):.2f}-{max(v):.2f})" for m, v in per.items() if v}
    return [
        "What it says:",
        "",
        f"- MPI_Init against native, over every row: a container per rank {span.get('apptainer per rank', '-')}, "
        f"one container per node and step (`--sharens`) {span.get('apptainer per node', '-')}, one instance per node "
        f"kept for all steps {span.get('apptainer instance kept', '-')}, bwrap over the one mount dedal keeps "
        f"{span.get('bwrap, mount kept', '-')}.",
        f"- A cold start (a fresh mount of the SIF: Open MPI, UCX, PMIx and their plugins decompressed again) "
        f"costs about {d:.0f} ms of MPI_Init here (one rank, one node: {cold:g} against {native:g} ms native). "
        "A container per rank pays it for every rank, one container per node once per node and step, the "
        "instance kept once per node for the whole verification (its first step, the warm-up).",
        f"- For 128 ranks per node: a container per rank decompresses the stack 128 times per start "
        f"(about {128 * d / 1000:.0f} CPU seconds on this machine's cores, and 128 user namespaces, which "
        "site limits run out of), one per node once; on a 128-core node the 128 decompressions run side by "
        "side, so the wall time grows less than the CPU time, but the page reads, the namespaces and the "
        "processes grow with the ranks, and the ranks wait for the slowest.",
        "- The test cluster's nodes are namespaces of one 2-CPU machine: 8 ranks per node on 2 nodes are 16 "
        "busy-polling processes on 2 CPUs, so single rows are noisy "
        "(the load average above); bwrap's nodes here mount the image per step themselves (their /tmp is their "
        "own), so its kept mount does not help them.",
    ]


if __name__ == "__main__":
    sys.exit(main())
