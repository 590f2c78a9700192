"""`dedal verify`: check that an image performs like bare metal; parse benchmark logs.

Layout of the subcommand (argparse sub-parsers under ``verify``)::

    dedal verify parse FILE [--kind KIND] [--json]   parse one log, print its verdict
    dedal verify run IMAGE [options]                 the runner (dedal.stages.verify.verify)
    dedal verify IMAGE [options]                     same as ``verify run IMAGE``

``parse`` and ``run`` are ordinary sub-parsers. The shorthand ``dedal verify IMAGE``
works because the sub-parser action of ``verify`` treats a first argument that is not
a sub-command name as the IMAGE of ``run`` (an image literally named ``parse`` or
``run`` is written ``dedal verify run ./parse``).

The verification itself is the verify stage's (:func:`dedal.stages.verify.verify`: checked
options in, the report out); this module holds its command line: the options
(:func:`add_run_arguments`), the settings read from them
(:func:`dedal.stages.verify.options_from_args`), what is printed and the exit code
(:func:`run_verify`).

``verify parse`` exits 0 whenever the file was parsed, whatever the verdict (the verdict
is in the output), and 2 on bad input (missing file, unknown kind).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from dedal.commands import needs_action
from dedal.adapters.runtime import RUNTIMES
from dedal.errors import UserError
from dedal.model.env_defaults import DEFAULT_RANKS, DEFAULT_REPETITIONS
from dedal.stages.verify import DEFAULT_MAX_SIZE, DEFAULT_NCCL_MAX, DEFAULT_TIMEOUT, KINDS, parse_file, parse_text
from dedal.ui.console import err, print_json

SUBCOMMANDS = ("parse", "run")


class _AnyName(dict):
    """``choices`` of the ``verify`` sub-parser action: the sub-command names, but any
    word is "in" it, so that argparse lets ``verify IMAGE`` through to ``__call__``."""

    def __init__(self, names: Dict[str, argparse.ArgumentParser]) -> None:
        super().__init__()
        self._names = names

    def __contains__(self, key: object) -> bool:
        return (isinstance(key, str) and not key.startswith("-")) or key in self._names

    def __iter__(self):  # type: ignore[override]
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def keys(self):  # type: ignore[override]
        return self._names.keys()

    def __getitem__(self, key: str) -> argparse.ArgumentParser:
        return self._names[key]


class _DefaultToRun(argparse._SubParsersAction):  # type: ignore[misc]
    """Sub-parser action that maps ``verify IMAGE ...`` to ``verify run IMAGE ...``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.choices = _AnyName(self._name_parser_map)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Sequence[str],
        option_string: Optional[str] = None,
    ) -> None:
        values = list(values or [])
        if values and values[0] not in self._name_parser_map:
            values = ["run"] + values
        super().__call__(parser, namespace, values, option_string)


def _kinds_help() -> str:
    width = max(len(k) for k in KINDS)
    return "\n".join(f"  {k:<{width}}  {desc}" for k, desc in KINDS.items())


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="verify an image against bare metal; parse benchmark and debug logs",
        description="Verify that an image performs like bare metal (`dedal verify IMAGE`, the runner), "
        "or parse one benchmark output / debug log (`dedal verify parse FILE`).",
    )
    p.register("action", "parsers", _DefaultToRun)
    vsub = p.add_subparsers(dest="verify_command", metavar="ACTION")

    parse = vsub.add_parser(
        "parse",
        help="parse one log (OSU, nccl-tests, NCCL/UCX/Open MPI debug, srun --mpi=list) and give its verdict",
        description="Parse one benchmark output or debug log and print what it shows: tables, bandwidths, "
        "transports, failure signatures, and a verdict (good, suboptimal, bad, failed, "
        "degenerate, unknown). Exit code 0 when the file was parsed, whatever the verdict; "
        "2 on bad input.",
        epilog="log kinds (guessed from the content unless --kind is given):\n" + _kinds_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parse.add_argument("file", metavar="FILE", help="the log file to parse ('-': standard input)")
    parse.add_argument("--kind", metavar="KIND", help="parse as this kind instead of guessing: " + ", ".join(KINDS))
    parse.add_argument("--json", action="store_true", help="print one JSON object (machine-readable)")
    parse.set_defaults(func=run_parse)

    run = vsub.add_parser(
        "run",
        help="run the bundled benchmarks natively and in IMAGE, compare, write reports/<image>/ "
        "(default: `dedal verify IMAGE` means `dedal verify run IMAGE`)",
        description="Run the bundled microbenchmarks natively and in the image, check overheads and "
        "transports, write reports/<image>/verify.json, report.md and plots. "
        "Exit code non-zero when a check fails.",
    )
    run.add_argument("image", metavar="IMAGE", help="the image (SIF file, or an image name of this workspace)")
    add_run_arguments(run)
    run.set_defaults(func=run_verify)
    p.set_defaults(func=needs_action(p))


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``dedal verify run IMAGE`` (IMAGE itself is added by :func:`register`);
    :func:`dedal.stages.verify.options_from_args` reads them."""
    p.add_argument(
        "--ranks",
        type=int,
        default=None,
        metavar="N",
        help=f"ranks per node for init and all-reduce (default: env file, else {DEFAULT_RANKS}; latency and "
        "bandwidth always use 2 ranks; at 1, the runs within a node use 2)",
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=None,
        metavar="N",
        help="nodes for the inter-node runs (srun; default: the allocation's SLURM_JOB_NUM_NODES, else 1)",
    )
    p.add_argument(
        "--repetitions",
        "-r",
        type=int,
        default=None,
        metavar="N",
        help=f"repetitions of each benchmark on each side (default: env file, else {DEFAULT_REPETITIONS})",
    )
    p.add_argument(
        "--no-remeasure",
        dest="remeasure",
        action="store_false",
        help="judge a check over its threshold on timing alone at once (default: run it as many "
        "repetitions again, native and container interleaved, and judge all of them)",
    )
    p.add_argument(
        "--launcher",
        choices=("auto", "mpirun", "srun"),
        default=None,
        help="auto: srun inside a Slurm allocation, else mpirun",
    )
    p.add_argument(
        "--env",
        "-e",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a variable for every run, native and container (e.g. UCX_TLS=tcp); repeatable",
    )
    p.add_argument(
        "--threshold",
        "-t",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a check threshold (latency_overhead_us, bandwidth_pct, busbw_pct, "
        "init_overhead_pct, ...); repeatable",
    )
    p.add_argument(
        "--benchmarks",
        "-b",
        default=None,
        metavar="LIST",
        help="comma-separated: init, latency, bw, allreduce, nccl, osu (the OSU/nccl-tests "
        "counterparts when the image has them; on GPUs also OSU between device buffers), or "
        "program names (osu_bw-cuda: OSU's -d cuda D D) (default: all); the env file's application "
        "checks and benchmarks (apps) run whatever is chosen: 'apps' alone runs only them",
    )
    p.add_argument(
        "--max-size",
        type=_size,
        default=None,
        metavar="BYTES",
        help=f"largest message of latency/bandwidth/all-reduce (default {DEFAULT_MAX_SIZE}; K/M suffix)",
    )
    p.add_argument(
        "--nccl-max-size",
        type=_size,
        default=None,
        metavar="BYTES",
        help=f"largest NCCL all-reduce (default {DEFAULT_NCCL_MAX})",
    )
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument(
        "--gpu",
        dest="gpu",
        action="store_true",
        default=None,
        help="run the GPU (NCCL) benchmarks (default: when the host has GPUs and the image CUDA)",
    )
    gpu.add_argument("--no-gpu", dest="gpu", action="store_false", help="skip the GPU benchmarks")
    p.add_argument(
        "--native",
        choices=("auto", "host", "rootfs"),
        default="auto",
        help="native side: the host's MPI and programs (host), or the image's root filesystem "
        "unpacked and run without a container (rootfs); auto: host where it has them",
    )
    p.add_argument(
        "--native-root",
        type=Path,
        default=None,
        metavar="DIR",
        help="use this unpacked copy of the image as the native root (its benchmark binaries must be "
        "byte-identical to the image's)",
    )
    p.add_argument(
        "--env-file",
        type=Path,
        default=None,
        metavar="ENV.yaml",
        help="environment file whose dedal.verify section gives ranks, repetitions, env, thresholds, "
        "application checks (apps) ...",
    )
    p.add_argument("--runtime", choices=RUNTIMES, default=None, help="container runtime (setting runtime)")
    p.add_argument(
        "--timeout", type=float, default=None, metavar="SECONDS", help=f"limit of one run (default {DEFAULT_TIMEOUT:g})"
    )
    p.add_argument(
        "--output",
        "-o",
        type=Path,
        default=None,
        metavar="DIR",
        help="report directory (default: <reports_dir>/<image>)",
    )
    p.add_argument("--json", action="store_true", help="print verify.json (and the file paths) on stdout")


def _size(text: str) -> int:
    t = text.strip().upper().rstrip("B")
    mult = 1
    for suffix, factor in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if t.endswith(suffix):
            t, mult = t[:-1], factor
    try:
        value = int(float(t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size in bytes (e.g. 65536, 64K, 4M), got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a size must be at least 1 byte, got {text!r}")
    return value


def run_verify(args: argparse.Namespace) -> int:
    """``dedal verify run IMAGE``: the options checked, the verification run
    (:func:`dedal.stages.verify.verify`), its verdict printed; the exit code is the verdict's."""
    from dedal.stages.verify import console_lines, options_from_args, verify

    opts = options_from_args(args)

    def progress(text: str) -> None:
        err.print(text, markup=False, highlight=False)

    outcome = verify(opts, progress=progress)
    rep = outcome.report
    if args.json:
        data = rep.to_json()
        data["report_dir"] = str(outcome.outdir)
        data["files"] = {k: str(v) for k, v in outcome.paths.items()}
        print_json(data)
        return rep.exit_code
    for line in console_lines(rep):
        print(line)
    print(
        f"report: {outcome.paths['report.md']} (verify.json, "
        f"{sum(1 for k in outcome.paths if k.startswith('plot:'))} plot(s)); raw logs: {outcome.outdir / 'raw'}"
    )
    return rep.exit_code


def run_parse(args: argparse.Namespace) -> int:
    if args.kind is not None and args.kind not in KINDS:
        raise UserError(f"unknown log kind {args.kind!r}; known kinds: {', '.join(KINDS)}")
    from dedal.model import config
    from dedal.stages.verify import site_rule_table

    rows = site_rule_table(config.from_args(args))  # a site's rows (the verify_rules setting) judge too
    if args.file == "-":
        result = parse_text(sys.stdin.buffer.read(), args.kind, rows=rows)
        result["source"] = "<stdin>"
    else:
        result = parse_file(args.file, args.kind, rows=rows)
    if args.json:
        print_json(result)
    else:
        print(summary(result))
    return 0


def summary(result: Dict[str, Any]) -> str:
    """A human-readable account of one parse result: verdict first, then the facts."""
    out: List[str] = []
    src = result.get("source") or "<text>"
    out.append(
        f"{src}: {result['verdict'].upper()}  (kind {result['kind']}"
        + (f"; sections {', '.join(result['sections'])}" if len(result.get("sections") or []) > 1 else "")
        + ")"
    )
    kind = result["kind"]
    if result.get("tables") is not None and (result.get("tables") or result.get("inits")):
        ver = f" v{result['version']}" if result.get("version") else ""
        suites = {t.get("suite") for t in result["tables"]}
        suite = (
            "dedal-bench"
            if result.get("suites") == ["dedal-bench"]
            else "ucx_perftest"
            if suites == {"ucx-perftest"}
            else "OSU Micro-Benchmarks"
        )
        out.append(f"{suite}{ver}: {len(result['tables'])} table(s)")
        for t in result["tables"]:
            rows = t["rows"]
            span = ""
            if rows and t["columns"] and t["columns"][0].lower() == "size":
                span = f", sizes {rows[0][0]}..{rows[-1][0]} B"
            unit = f" [{t['unit']}]" if t.get("unit") else ""
            out.append(f"  {t['benchmark']}: {len(rows)} row(s){span}; columns: {', '.join(t['columns'])}{unit}")
            for row in rows[:1] + (rows[-1:] if len(rows) > 1 else []):
                out.append("    " + "  ".join(str(v) for v in row))
        for init in result.get("inits") or []:
            name = "dedal_init" if suite == "dedal-bench" else "osu_init"
            out.append(
                f"  {name}: nprocs {init['nprocs']}, min {init['min_ms']:g} ms, max {init['max_ms']:g} ms, "
                f"avg {init['avg_ms']:g} ms"
            )
    if kind == "nccl-tests" or result.get("rows") is not None and "peak_busbw" in result:
        out.append(
            f"{result.get('test') or 'nccl-tests'}: {result.get('nranks')} rank(s) on "
            f"{result.get('nnodes')} node(s), {len(result.get('rows') or [])} row(s)"
        )
        if result.get("peak_busbw") is not None:
            out.append(
                f"  peak bus bandwidth {result['peak_busbw']:g} GB/s at {result.get('peak_busbw_size')} B; "
                f"average {result['avg_busbw'] if result.get('avg_busbw') is not None else 'n/a'} GB/s"
            )
    if result.get("transports") and isinstance(result["transports"], dict):
        out.append(
            f"NCCL{(' ' + result['nccl_version']) if result.get('nccl_version') else ''}: network "
            f"{result.get('network')}, GPUDirect RDMA {result.get('gdrdma')}"
        )
        for t, n in sorted(result["transports"].items(), key=lambda kv: -kv[1]):
            out.append(f"  via {t}: {n}")
    if result.get("transports_by_scope"):
        out.append(f"UCX{(' ' + result['ucx_version']) if result.get('ucx_version') else ''} transports:")
        for scope, tls in result["transports_by_scope"].items():
            out.append(f"  {scope}: {', '.join(tls)}")
    if kind == "ucx-info":
        out.append(
            f"ucx_info: transports {', '.join(result.get('transport_names') or [])}; "
            f"devices {', '.join(result.get('devices') or [])}"
        )
    if result.get("btl_used") or result.get("btl_components"):
        used = ", ".join(f"{k}: {v}" for k, v in (result.get("btl_used") or {}).items())
        out.append(
            f"Open MPI: pml {result.get('pml') or '?'}; BTLs {', '.join(result.get('btl_components') or [])}"
            + (f"; used per peer {used}" if used else "")
        )
    if kind == "srun-mpi-list":
        out.append(
            f"Slurm MPI plugins: {', '.join(result.get('plugins') or []) or 'none'}; PMIx versions: "
            f"{', '.join(result.get('pmix_versions') or []) or 'none'}"
        )
    findings = result.get("findings") or []
    if findings:
        out.append("findings:")
        for f in findings:
            out.append(f"  [{f['severity']}] {f['code']}: {f['message']}")
            for ev in f.get("evidence", [])[:3]:
                out.append(f"      | {ev}")
    elif result["verdict"] == "unknown":
        out.append("nothing recognizable in this file")
    return "\n".join(out)
