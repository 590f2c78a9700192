"""`dedal plan`: the build plan of an environment or lock (what is external, cached, to build)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from dedal.model.config import from_args
from dedal.ui.console import human_seconds, out, print_json
from dedal.errors import UserError
from dedal.model.cores import REF_CORES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="show the build plan of an environment or spack.lock",
        description="Derive the build plan: every package of the concretized environment, "
        "which are external, cached in the layer store, to build or build-only, "
        "the build waves and the critical path.",
    )
    p.add_argument("target", metavar="ENV_OR_LOCK", help="env.yaml (or its directory), a spack.lock, or a plan.json")
    p.add_argument(
        "--layers", metavar="DIR", help="layer store to check for cached layers (default: the configured one)"
    )
    p.add_argument("--install-root", metavar="PATH", help="install root the layers are built for")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("-o", "--output", metavar="FILE", help="also write the plan as JSON to FILE")
    p.add_argument(
        "--simulate",
        action="store_true",
        help="simulate the build schedule (the Slurm executor's grouping into jobs) instead of "
        "showing the plan: makespan, lower bound, ratio, utilization, jobs",
    )
    p.add_argument("--nodes", type=int, metavar="N", help="with --simulate: build nodes (default: setting slurm.nodes)")
    p.add_argument(
        "--cores",
        type=int,
        metavar="C",
        help="with --simulate: cores per node (default: setting slurm.cores_per_node, else 64)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dedal.model.layers import LayerStore  # imported when the command runs, not for --help
    from dedal.model.target import resolve

    settings = from_args(args, layer_store=args.layers, install_root=args.install_root)
    target = resolve(args.target, settings)
    plan = target.given_plan or target.make_plan(target.read_lock(), LayerStore(Path(settings.layer_store)))
    if args.output:
        plan.write(Path(args.output))
    if args.simulate:
        return simulate(plan, settings, args)
    if args.nodes is not None or args.cores is not None:
        raise UserError("--nodes and --cores go with --simulate")
    if args.json:
        print_json(plan.to_json())
        return 0
    unrecorded = target.lock_path is not None and target.base_source == "setting base_image"
    show(plan, base_note=": setting base_image, not recorded next to the lock" if unrecorded else "")
    return 0


def show(plan, base_note: str = "") -> None:
    """The plan as a table; ``base_note`` says where the base comes from when the plan's input does
    not (a bare lock: Spack's lock names no base image)."""
    table = Table(
        title=f"plan for {plan.env_name} (install root {plan.install_root}, base {plan.base_image}{base_note})"
    )
    for col in ("wave", "package", "hash", "status", "build-only", "in image", "needs"):
        table.add_column(col)
    wave_of = {h: i + 1 for i, wave in enumerate(plan.waves) for h in wave}
    order = sorted(plan.nodes.values(), key=lambda n: (wave_of.get(n.hash, 0) or 99, n.status, n.name))
    for n in order:
        table.add_row(
            str(wave_of.get(n.hash, "")),
            f"{n.name}@{n.version}",
            n.hash[:7],
            n.status.replace("_", " "),
            "yes" if n.build_only else "",
            "yes" if n.runtime and not n.external else "",
            str(len(plan.build_requirements.get(n.hash, []))) if not n.external else "",
        )
    out.print(table)
    c = plan.counts()
    out.print(
        f"{c['nodes']} packages: {c['external']} external, {c['cached']} cached, {c['to_build']} to build"
        f"{', ' + str(c['not_needed']) + ' not needed' if c['not_needed'] else ''}; "
        f"{c['build_only']} build-only; {c['runtime']} in the runtime closure; {c['waves']} waves"
    )
    if plan.critical_path:
        names = " -> ".join(plan.nodes[h].name for h in plan.critical_path)
        # the estimates are durations on the model's reference cores; --simulate gives each package
        # the cores of a build node, so its critical path is shorter (the two differed with no word why)
        out.print(
            f"critical path (estimated {human_seconds(plan.critical_path_s)} at make -j{REF_CORES} per package; "
            f"`dedal plan --simulate` estimates it on the build nodes' cores): {names}"
        )


def simulate(plan, settings, args: argparse.Namespace) -> int:
    for flag, value in (("--nodes", args.nodes), ("--cores", args.cores)):
        if value is not None and value < 1:
            raise UserError(f"{flag}: expected a positive number, got {value}")
    from dedal.schedule import schedule_plan

    sched = schedule_plan(plan, settings, nodes=args.nodes, cores=args.cores)
    if args.json:
        data = sched.to_json()
        data["env"] = plan.env_name
        print_json(data)
        return 0
    measured = sum(1 for h in plan.to_build if plan.nodes[h].measured)
    out.print(
        f"simulated build of {plan.env_name}: {len(plan.to_build)} packages to build on {sched.nodes} "
        f"node(s) x {sched.cores} cores, job overhead {sched.overhead_s:g} s; durations: {measured} measured, "
        f"{len(plan.to_build) - measured} modelled"
    )
    table = Table()
    for col in ("job", "start", "end", "node", "cores", "packages"):
        table.add_column(col)
    shown = sorted(sched.jobs, key=lambda j: (sched.starts[j.id][0], j.id))
    for j in shown[:40]:
        start, end, node = sched.starts[j.id]
        table.add_row(j.id, human_seconds(start), human_seconds(end), str(node + 1), str(j.cores), " ".join(j.names))
    if sched.jobs:
        out.print(table)
    if len(shown) > 40:
        out.print(f"... {len(shown) - 40} more jobs (--json lists them all)")
    out.print(
        f"makespan {human_seconds(sched.makespan_s)}, lower bound {human_seconds(sched.lower_bound_s)} "
        f"(critical path {human_seconds(sched.critical_path_s)}, work / capacity "
        f"{human_seconds(sched.work_core_s / (sched.nodes * sched.cores))}), "
        f"ratio {sched.ratio:.3f}"
    )
    hints = sum(len(j.order) for j in sched.jobs)
    out.print(
        f"utilization {sched.utilization:.1%}, {len(sched.jobs)} jobs for "
        f"{sum(len(j.hashes) for j in sched.jobs)} packages"
        + (f", {hints} order hints (slurm.order_hints: {settings.get('slurm.order_hints')})" if hints else "")
    )
    return 0
