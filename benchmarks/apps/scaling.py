"""Application scaling, native and container: one application benchmark of an environment file
(an app of ``dedal.verify.apps`` with a ``metric``) run by ``dedal verify -b apps`` at 1, 2, ...
N nodes of the Slurm allocation this runs in, as the ESD container paper's figures show it
(time against nodes, container and native, the ideal line; weak scaling normalised to the
1-node native time).

Every node count is one verification of its own (:func:`dedal.stages.verify.verify`):
the same native side (the image's root unpacked, or the host's programs), the container launched
as users launch it (``srun --mpi=pmix``, the ranks of a node in one container), native and
container interleaved after a warm-up per side, every run's correctness checked (exit, expect,
expect's value, the reference file), the medians of the metric compared against the app's
threshold; its report is kept under ``DIR/reports/<n>-nodes/``.

Strong scaling (``--mode strong``, the default): the same problem at every node count, ``R``
ranks per node; ideal: the smallest node count's native value times its nodes / n (for a rate,
higher is better: times n / its nodes). Weak scaling (``--mode weak``): the problem grows with
the nodes, so the command must say how: ``--command`` is a shell line in which ``{nodes}``,
``{ranks}`` and ``{ranks_per_node}`` are replaced per node count (the environment file's own
command runs unchanged in ``dedal verify``); ideal: flat (a rate: grows with n). A reference
file depends on the problem, so in weak mode it is dropped unless ``--reference-output`` and
``--reference-expected`` (templates too) say which file holds at each size; expect's value must
still be the same natively and in the container at each node count.

Run inside an allocation of at least the largest node count (``salloc -N 4 --exclusive``), with
the container runtime on PATH; outside Slurm only 1 node (the image's own ``mpirun``)::

    .venv/bin/python benchmarks/apps/scaling.py IMAGE.sif --env-file ENV.yaml --app NAME \\
        [--nodes 1,2,4] [--ranks-per-node R] [--mode strong|weak] [--command 'LINE with {ranks}'] \\
        [--reference-output spk{ranks}.std] [--reference-expected /path/in/image] [-r 5] [-o DIR] \\
        [-- more dedal verify options, e.g. --runtime apptainer --timeout 1800]

Writes ``DIR/results.json`` (every run's value per node count and side), ``DIR/results.md`` (the
table) and ``DIR/<app>-<mode>.png`` (top: the metric against nodes, median and min..max of
each side, the ideal line; bottom: strong scaling's speed-up, weak scaling's values normalised
to the 1-node native value, both sides, the ideal line). Default DIR:
``benchmarks/apps/results/<app>-<mode>/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dedal.errors import DedalError  # noqa: E402
from dedal.model.envfile import AppCheck, AppReference, load_env  # noqa: E402
from dedal.commands.verify import add_run_arguments as add_arguments  # noqa: E402
from dedal.stages.verify import options_from_args, verify  # noqa: E402

HERE = Path(__file__).resolve().parent
MODES = ("strong", "weak")


# ---------------------------------------------------------------------------- the app at n nodes


def app_at(
    app: AppCheck,
    nodes: int,
    ranks_per_node: int,
    *,
    command: Optional[str] = None,
    reference_output: Optional[str] = None,
    reference_expected: Optional[str] = None,
    keep_reference: bool = True,
    expect: Optional[str] = None,
) -> AppCheck:
    """``app`` on ``nodes`` nodes of ``ranks_per_node`` ranks each: its ``command`` (a shell
    line), ``expect`` (a pattern) and reference with ``{nodes}``, ``{ranks}`` and
    ``{ranks_per_node}`` filled in (``expect``: only those three words are replaced, so
    that a pattern's own braces stay)."""
    fill = {"nodes": nodes, "ranks": nodes * ranks_per_node, "ranks_per_node": ranks_per_node}
    reference = app.reference if keep_reference else None
    if reference_output or reference_expected:
        base = app.reference or AppReference("", "")
        reference = AppReference(
            (reference_output or base.output).format(**fill), (reference_expected or base.expected).format(**fill)
        )
        if not reference.output or not reference.expected:
            raise SystemExit("--reference-output and --reference-expected go together where the app has no reference")
    pattern = app.expect
    if expect is not None:
        pattern = expect
        for word, value in fill.items():
            pattern = pattern.replace("{" + word + "}", str(value))
    return dataclasses.replace(
        app,
        nodes=nodes,
        ranks=nodes * ranks_per_node,
        reference=reference,
        expect=pattern,
        command=["/bin/sh", "-c", command.format(**fill)] if command else list(app.command),
    )


def shown_command(command: Sequence[str]) -> str:
    """The command as the env file gave it: a shell line as it is, an argument list quoted."""
    if len(command) == 3 and list(command[:2]) == ["/bin/sh", "-c"]:
        return command[2]
    return shlex.join(command)


# ---------------------------------------------------------------------------- results


def point(
    nodes: int, ranks: int, report: Dict[str, Any], check_name: str, report_dir: str, load: Optional[float] = None
) -> Dict[str, Any]:
    """One node count's result from its verify.json (a dict): the measured values per side
    (the correct repetitions), the check's verdict and its findings' codes; ``load``: the
    host's 1-minute load average before its runs (other work on the machine is noise)."""
    check = next((c for c in report.get("checks", []) if c.get("name") == check_name), None)
    measured = report.get("measurements", {}).get(check_name) or {}
    values = {side: list((measured.get(side) or {}).get("0") or []) for side in ("native", "container")}
    return {
        "nodes": nodes,
        "ranks": ranks,
        "native": values["native"],
        "container": values["container"],
        "verdict": check.get("verdict") if check else "missing",
        "problems": sorted({f["code"] for f in (check or {}).get("findings", []) if f.get("severity") == "error"}),
        "skip_reason": (check or {}).get("skip_reason", ""),
        "report": report_dir,
        "load": load,
    }


def _median(values: Sequence[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def derive(points: Sequence[Dict[str, Any]], mode: str, higher_is_better: bool) -> List[Dict[str, Any]]:
    """Per node count: the medians, container / native, the ideal value, and each side's value
    normalised to the base (the smallest node count's native median: 1 node in a run from 1) and
    its efficiency (1: ideal). Strong scaling of a time: ideal base x n0 / n; weak scaling of a
    time: ideal base; a rate (higher is better): ideal base x n / n0 in both modes."""
    rows = sorted(points, key=lambda p: p["nodes"])
    first = next((p for p in rows if p["native"]), None)
    base = _median(first["native"]) if first else None
    n0 = first["nodes"] if first else None
    out = []
    for p in rows:
        nat, con = _median(p["native"]), _median(p["container"])
        ideal = None
        if base is not None and n0:
            if higher_is_better:
                ideal = base * p["nodes"] / n0
            else:
                ideal = base * n0 / p["nodes"] if mode == "strong" else base
        row = {
            **p,
            "native_median": nat,
            "container_median": con,
            "ideal": ideal,
            "ratio": con / nat if nat and con is not None else None,
        }
        for side, v in (("native", nat), ("container", con)):
            row[f"{side}_normalised"] = v / base if v is not None and base else None
            if v and ideal:
                row[f"{side}_efficiency"] = v / ideal if higher_is_better else ideal / v
            else:
                row[f"{side}_efficiency"] = None
        out.append(row)
    return out


def _fmt(v: Optional[float], digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


def _span(values: Sequence[float]) -> str:
    return f"{_fmt(_median(values))} [{_fmt(min(values))}..{_fmt(max(values))}]" if values else "-"


def markdown(results: Dict[str, Any]) -> str:
    """The table of results.md: one row per node count."""
    unit, mode, hib = results["unit"], results["mode"], results["higher_is_better"]
    ideal = "the base x n / n0" if hib else "the base x n0 / n" if mode == "strong" else "the base"
    lines = [
        f"# {results['app']}: {mode} scaling, native and container",
        "",
        f"Measured {results['date']} on {results['host']} by `benchmarks/apps/scaling.py` with `dedal verify -b "
        f"apps` per node count: image `{results['image']}`, {results['ranks_per_node']} rank(s) per node, "
        f"{results['repetitions']} repetition(s) per side, native and container interleaved after a warm-up per "
        f"side; medians [min..max] of the correct repetitions; {'higher' if hib else 'lower'} is better. "
        f"Base: the native median at the smallest node count n0; ideal: {ideal}; normalised: value / base; "
        f"efficiency: {'value / ideal' if hib else 'ideal / value'} (1: ideal).",
        "",
        f"Command: `{results['command']}`; expect: `{results.get('expect', '')}`; "
        f"{results.get('cpus', '?')} CPU(s) on this machine, shared by all its nodes.",
        "",
        f"| nodes | ranks | native ({unit}) | container ({unit}) | container / native | ideal ({unit}) | "
        "native normalised | container normalised | efficiency native | efficiency container | load before | verdict |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results["rows"]:
        verdict = (
            r["verdict"]
            + (f" ({', '.join(r['problems'])})" if r["problems"] else "")
            + (f": {r['skip_reason']}" if r.get("skip_reason") else "")
        )
        lines.append(
            f"| {r['nodes']} | {r['ranks']} | {_span(r['native'])} | {_span(r['container'])} | "
            f"{_fmt(r['ratio'], 3)} | {_fmt(r['ideal'])} | {_fmt(r['native_normalised'], 3)} | "
            f"{_fmt(r['container_normalised'], 3)} | {_fmt(r['native_efficiency'], 3)} | "
            f"{_fmt(r['container_efficiency'], 3)} | {_fmt(r.get('load'), 2)} | {verdict} |"
        )
    lines += ["", f"Plot: `{results['plot']}`; each node count's report: `reports/<n>-nodes/report.md`.", ""]
    return "\n".join(lines)


def plot_png(results: Dict[str, Any]) -> bytes:
    """Top: the metric against nodes (log 2), median and min..max of each side, the ideal line
    (log y for strong scaling). Bottom: strong scaling's speed-up over the base (ideal n / n0),
    weak scaling's values normalised to the base (ideal 1); a rate's normalised value either way."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter

    rows = [r for r in results["rows"] if r["native"] or r["container"]]
    fig = Figure(figsize=(7.5, 7.0), dpi=100)
    FigureCanvasAgg(fig)
    ax, bx = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    hib, mode, unit = results["higher_is_better"], results["mode"], results["unit"]
    for side, color, marker in (("native", "#1f77b4", "o"), ("container", "#d62728", "s")):
        pts = [(r["nodes"], r[side]) for r in rows if r[side]]
        if not pts:
            continue
        xs = [n for n, _ in pts]
        med = [statistics.median(v) for _, v in pts]
        lo = [m - min(v) for m, (_, v) in zip(med, pts)]
        hi = [max(v) - m for m, (_, v) in zip(med, pts)]
        ax.errorbar(
            xs,
            med,
            yerr=[lo, hi],
            color=color,
            marker=marker,
            markersize=4,
            capsize=3,
            linewidth=1.4,
            label=f"{side} (median, min..max)",
        )
        if mode == "weak" or hib:
            norm = [r[f"{side}_normalised"] for r in rows if r[side]]
        else:  # strong scaling of a time: the speed-up over the base
            norm = [1 / r[f"{side}_normalised"] if r[f"{side}_normalised"] else None for r in rows if r[side]]
        bx.plot(xs, norm, color=color, marker=marker, markersize=4, linewidth=1.4, label=side)
    ideal = [(r["nodes"], r["ideal"]) for r in rows if r["ideal"] is not None]
    if ideal:
        ax.plot(
            [n for n, _ in ideal], [v for _, v in ideal], color="#444444", linestyle="--", linewidth=1.0, label="ideal"
        )
        n0 = min(n for n, _ in ideal)  # weak scaling of a time stays at 1; a speed-up and a rate grow with n
        ref = [1.0 if mode == "weak" and not hib else n / n0 for n, _ in ideal]
        bx.plot([n for n, _ in ideal], ref, color="#444444", linestyle="--", linewidth=1.0, label="ideal")
    ax.set_xscale("log", base=2)
    if mode == "strong":
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    ax.set_ylabel(f"{results['app']} ({unit}, {'higher' if hib else 'lower'} is better)")
    ax.set_title(f"{results['app']}: {mode} scaling, native and container")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    base = f"{min(r['nodes'] for r in rows)}-node native" if rows else "the base"
    bx.set_ylabel(f"speed-up over {base}" if mode == "strong" and not hib else f"normalised to {base}")
    bx.set_xlabel("nodes")
    nodes = sorted({r["nodes"] for r in rows})
    if nodes:
        bx.set_xticks(nodes)
        bx.set_xticklabels([str(n) for n in nodes])
    bx.grid(True, which="major", alpha=0.3)
    bx.legend(loc="best", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


# ---------------------------------------------------------------------------- the runs


def verify_at(
    image: str, env_file: Path, app: AppCheck, nodes: int, outdir: Path, extra: Sequence[str]
) -> Dict[str, Any]:
    """``dedal verify IMAGE -b apps --nodes N`` with ``app`` as the only application (the env
    file's other settings as they are); its verify.json."""
    parser = argparse.ArgumentParser(prog="dedal verify")
    parser.add_argument("image")
    add_arguments(parser)
    argv = [image, "-b", "apps", "--env-file", str(env_file), "--nodes", str(nodes), "-o", str(outdir), *extra]
    opts = options_from_args(parser.parse_args(argv))
    opts.apps = [app]

    def progress(text: str) -> None:
        print(f"[{nodes} node(s)] {text}", file=sys.stderr, flush=True)

    outcome = verify(opts, progress=progress)
    return json.loads((outcome.outdir / "verify.json").read_text())


def main(argv: Optional[Sequence[str]] = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    extra: List[str] = []
    if "--" in raw:
        extra = raw[raw.index("--") + 1 :]
        raw = raw[: raw.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("image")
    ap.add_argument("--env-file", type=Path, required=True)
    ap.add_argument("--app", required=True, help="the name of an app with a metric in the env file's dedal.verify.apps")
    ap.add_argument("--nodes", default="1,2", help="node counts, comma-separated (default 1,2)")
    ap.add_argument(
        "--ranks-per-node", type=int, default=None, help="ranks per node (default: the app's ranks / its nodes)"
    )
    ap.add_argument("--mode", choices=MODES, default="strong")
    ap.add_argument(
        "--command",
        default=None,
        help="shell line run instead of the app's command, {nodes} {ranks} {ranks_per_node} filled in "
        "(weak scaling needs it)",
    )
    ap.add_argument(
        "--expect",
        default=None,
        help="the pattern each run's output must match instead of the app's expect, {nodes} {ranks} "
        "{ranks_per_node} filled in (weak scaling: the result grows with the problem)",
    )
    ap.add_argument("--reference-output", default=None, help="the reference's output file (a template)")
    ap.add_argument("--reference-expected", default=None, help="the reference file in the image (a template)")
    ap.add_argument(
        "--repetitions",
        "-r",
        type=int,
        default=None,
        help="repetitions per side (default: the app's metric.repetitions, else the env file's)",
    )
    ap.add_argument("--output", "-o", type=Path, default=None)
    args = ap.parse_args(raw)

    node_counts = sorted({int(n) for n in args.nodes.split(",") if n.strip()})
    if not node_counts or node_counts[0] < 1:
        ap.error(f"--nodes {args.nodes}: positive node counts")
    allocation = int(os.environ.get("SLURM_JOB_NUM_NODES", "0") or 0) if os.environ.get("SLURM_JOB_ID") else 0
    if node_counts[-1] > max(1, allocation):
        ap.error(
            f"--nodes {args.nodes}: {node_counts[-1]} nodes, but "
            + (f"the allocation has {allocation}" if allocation else "this runs outside a Slurm allocation (1)")
        )
    try:
        apps = {a.name: a for a in load_env(args.env_file).verify.apps}
    except DedalError as exc:
        ap.error(str(exc))
    app = apps.get(args.app)
    if app is None or app.metric is None:
        with_metric = ", ".join(n for n, a in apps.items() if a.metric is not None) or "none"
        ap.error(
            f"--app {args.app}: no app with a metric of that name in {args.env_file} (those with one: {with_metric})"
        )
    if args.mode == "weak" and not args.command:
        ap.error("--mode weak: the problem must grow with the nodes: give --command with {nodes} or {ranks}")
    assert app is not None and app.metric is not None
    if args.repetitions:  # the app's own metric.repetitions would win over verify's --repetitions
        app = dataclasses.replace(app, metric=dataclasses.replace(app.metric, repetitions=args.repetitions))
    rpn = args.ranks_per_node or max(1, app.ranks // app.nodes)
    out = args.output or HERE / "results" / f"{app.name}-{args.mode}"
    out.mkdir(parents=True, exist_ok=True)

    points = []
    for n in node_counts:
        at = app_at(
            app,
            n,
            rpn,
            command=args.command,
            reference_output=args.reference_output,
            reference_expected=args.reference_expected,
            keep_reference=args.mode == "strong",
            expect=args.expect,
        )
        rel = f"reports/{n}-nodes"
        load = os.getloadavg()[0]
        try:
            report = verify_at(str(args.image), args.env_file, at, n, out / rel, extra)
        except DedalError as exc:
            print(f"dedal: error: {exc}", file=sys.stderr)
            return exc.exit_code
        points.append(point(n, at.ranks, report, f"app {app.name}", rel, load))
    results = {
        "app": app.name,
        "mode": args.mode,
        "unit": app.metric.unit,
        "higher_is_better": app.metric.higher_is_better,
        "image": str(args.image),
        "command": args.command or shown_command(app.command),
        "expect": args.expect or app.expect,
        "ranks_per_node": rpn,
        "cpus": os.cpu_count(),
        "repetitions": args.repetitions or app.metric.repetitions or load_env(args.env_file).verify.repetitions,
        "date": time.strftime("%Y-%m-%d"),
        "host": platform.node(),
        "plot": f"{app.name}-{args.mode}.png",
        "extra_verify_options": extra,
    }
    results["rows"] = derive(points, args.mode, app.metric.higher_is_better)
    (out / results["plot"]).write_bytes(plot_png(results))
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(markdown(results))
    print(markdown(results))
    return 0 if all(r["verdict"] in ("good", "suboptimal") for r in results["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
