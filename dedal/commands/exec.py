"""``dedal exec IMAGE -- CMD...``, ``dedal shell IMAGE`` and ``dedal run IMAGE -- CMD...``: run
something in an image (``run``: on the ranks of a Slurm allocation).

IMAGE is a SIF, a squashfs file, a root filesystem directory, or the name of a built
base image (``dedal base list``). ``apptainer exec`` is used where Apptainer exists;
elsewhere the SIF's squashfs partition is mounted at its offset and run with
bubblewrap (or Charliecloud), with the same environment the image defines
(``/.singularity.d/env/*.sh``). Like Apptainer, the current directory is bound into
the container (unless it is a system directory) and is the working directory.
"""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from dedal.adapters import mpi, runtime
from dedal.adapters.runtime import Bind
from dedal.model import base, config
from dedal.errors import UserError

if TYPE_CHECKING:
    from dedal.model.config import Settings


SYSTEM_DIRS = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/proc",
    "/sbin",
    "/sys",
    "/usr",
    "/var",
    "/run",
    "/opt",
)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("image", help="SIF, squashfs file, root directory, or built base image name")
    p.add_argument(
        "-B",
        "--bind",
        action="append",
        default=[],
        metavar="SRC[:DST[:ro]]",
        help="bind a host path into the container (repeatable)",
    )
    p.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a variable inside (after the image's own environment; repeatable)",
    )
    p.add_argument("--pwd", default=None, help="working directory inside (default: the current directory)")
    p.add_argument("--no-cwd", action="store_true", help="do not bind the current directory")
    p.add_argument("--runtime", default=None, choices=config.RUNTIMES, help="container runtime (setting runtime)")
    p.add_argument(
        "--nv",
        action="store_true",
        help="NVIDIA GPU support: the host driver's libraries, binaries and /dev/nvidia* "
        "(apptainer --nv; bwrap and ch-run bind the same, found as Apptainer finds them)",
    )


def register(sub: Any) -> None:
    e = sub.add_parser(
        "exec",
        help="run a command in an image",
        description="Run a command in an image: dedal exec IMAGE -- CMD [ARG...]",
    )
    _common(e)
    e.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")
    e.set_defaults(func=cmd_exec)
    s = sub.add_parser("shell", help="interactive shell in an image")
    _common(s)
    s.set_defaults(func=cmd_shell)
    r = sub.add_parser(
        "run",
        help="run an MPI program of an image on the ranks of a Slurm allocation",
        description="Run a program of an image on the ranks of the Slurm allocation this runs in "
        "(salloc, sbatch): srun --mpi=pmix with the ranks of each node in one container "
        "(Apptainer's --sharens; bwrap and ch-run over one mount of the image per node), "
        "as dedal verify measures it. dedal run IMAGE -- CMD [ARG...]",
    )
    _common(r)
    r.add_argument(
        "-n", "--ntasks", type=int, default=None, metavar="N", help="ranks (default: the allocation's, SLURM_NTASKS)"
    )
    r.add_argument(
        "-N", "--nodes", type=int, default=None, metavar="N", help="nodes (default: the allocation's, SLURM_NNODES)"
    )
    r.add_argument(
        "--per-rank",
        action="store_true",
        help="a container of its own for every rank, as plain `srun apptainer exec` (slower to start)",
    )
    r.add_argument(
        "--print",
        action="store_true",
        help="print the equivalent srun command without dedal (for a job script) and exit",
    )
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")
    r.set_defaults(func=cmd_run)


def parse_binds(specs: List[str]) -> List[Any]:
    binds = []
    for spec in specs:
        parts = spec.split(":")
        if not parts[0] or len(parts) > 3 or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise UserError(f"--bind {spec!r}: expected SRC[:DST[:ro|rw]]")
        src = Path(parts[0]).expanduser()
        if not src.exists():
            raise UserError(f"--bind {spec!r}: {src} does not exist")
        dst = parts[1] if len(parts) > 1 and parts[1] else str(src.resolve())
        if not dst.startswith("/"):
            raise UserError(f"--bind {spec!r}: the destination must be an absolute path")
        binds.append(Bind(src, dst, readonly=len(parts) == 3 and parts[2] == "ro"))
    return binds


def parse_env(specs: List[str]) -> Dict[str, str]:
    env: Dict[str, str] = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        if (
            not sep
            or not key
            or not (key[0].isalpha() or key[0] == "_")
            or not all(c.isalnum() or c == "_" for c in key)
        ):
            raise UserError(f"--env {spec!r}: expected KEY=VALUE with a valid variable name")
        env[key] = value
    return env


def resolve_image(image: str, settings: Settings) -> Path:
    """A path as given, or the root directory of a built base image called ``image``."""
    p = Path(image)
    if p.exists():
        return p
    if "/" not in image and image in base.known_names():
        img = base.find_base(image, settings)
        if img is None:
            raise UserError(f"base image {image!r} is not built yet (dedal base build {image})")
        return img.rootfs_dir
    raise UserError(f"{image}: no such image (a SIF, squashfs file, directory or built base name)")


def _prepare(args: Any) -> Dict[str, Any]:
    settings = config.from_args(args, runtime=args.runtime)
    image = resolve_image(args.image, settings)
    binds = parse_binds(args.bind)
    env = parse_env(args.env)
    cwd: Optional[str] = args.pwd
    here = os.getcwd()
    auto_cwd = not args.no_cwd and settings.runtime != "charliecloud"  # ch-run cannot add mount points
    if auto_cwd and here != "/" and not any(here == d or here.startswith(d + "/") for d in SYSTEM_DIRS):
        if not any(b.target == here for b in binds):
            binds.append(runtime.Bind(here, here))
        cwd = cwd or here
    return {"root": image, "binds": binds, "env": env, "cwd": cwd or "/", "runtime": settings.runtime, "nv": args.nv}


def _command(args: Any, name: str) -> List[str]:
    """The command after IMAGE (and ``--``); an option there is refused: as with ``apptainer
    exec``, dedal's options go before the image, and what follows it belongs to the command."""
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    elif cmd and cmd[0].startswith("-"):
        raise UserError(f"{cmd[0]}: options go before IMAGE: dedal {name} [OPTIONS] IMAGE -- CMD [ARG...]")
    if not cmd:
        raise UserError(f"no command given: dedal {name} IMAGE -- CMD [ARG...]")
    return cmd


def cmd_exec(args: Any) -> int:
    cmd = _command(args, "exec")
    spec = _prepare(args)
    return runtime.run_interactive(spec.pop("root"), cmd, **spec)


def cmd_shell(args: Any) -> int:
    spec = _prepare(args)
    spec["env"].setdefault("PS1", "dedal> ")
    shell = ["/bin/sh", "-c", "if [ -x /bin/bash ]; then exec /bin/bash --norc; else exec /bin/sh; fi"]
    return runtime.run_interactive(spec.pop("root"), shell, **spec)


def _allocation(args: Any) -> Tuple[int, int]:
    """(ranks, nodes): as given, else the allocation's; outside an allocation, bad input."""
    if not os.environ.get("SLURM_JOB_ID"):
        raise UserError(
            "dedal run launches with srun inside a Slurm allocation (SLURM_JOB_ID is not set): "
            "salloc or sbatch first; one process outside Slurm: dedal exec IMAGE -- CMD"
        )
    counts = []
    for flag, given, var in (("--ntasks", args.ntasks, "SLURM_NTASKS"), ("--nodes", args.nodes, "SLURM_NNODES")):
        value = given if given is not None else os.environ.get(var, "1")
        try:
            n = int(value)
        except ValueError:
            raise UserError(f"{var}={value!r}: expected a number (or give {flag})") from None
        if n < 1:
            raise UserError(f"{flag}: expected a positive number, got {n}")
        counts.append(n)
    if counts[0] < counts[1]:
        raise UserError(f"{counts[0]} rank(s) cannot fill {counts[1]} node(s)")
    return counts[0], counts[1]


def plain_srun(image: Path, cmd: List[str], ranks: int, nodes: int, *, binds: List[Any], nv: bool) -> List[str]:
    """What ``dedal run`` does, as a job script says it without dedal: srun --mpi=pmix, the ranks
    of a node joining one container (``--sharens``), the program leading a session of its own
    (``setsid``: Apptainer forwards scancel's SIGTERM to its process group)."""
    out = ["srun", "--mpi=pmix", "-N", str(nodes), "-n", str(ranks), "apptainer", "exec", "--sharens"]
    if nv:
        out.append("--nv")
    for b in binds:
        out += ["--bind", f"{b.src}:{b.target}" + (":ro" if b.readonly else "")]
    return out + [str(image), "setsid", *cmd]


def cmd_run(args: Any) -> int:
    cmd = _command(args, "run")
    spec = _prepare(args)
    ranks, nodes = _allocation(args)
    if args.print:
        print(shlex.join(plain_srun(spec["root"], cmd, ranks, nodes, binds=spec["binds"], nv=spec["nv"])))
        return 0
    return mpi.run_srun_attached(
        spec["root"],
        cmd,
        ranks,
        nodes=nodes,
        env=spec["env"],
        runtime_name=spec["runtime"],
        binds=spec["binds"],
        nv=spec["nv"],
        share=not args.per_rank,
        cwd=spec["cwd"],
    )
