"""The options of ``dedal verify IMAGE``: the command line and the environment file.

Settings come from (later wins): built-in defaults, the image's label
``dedal.verify.thresholds`` (JSON; merged by the runner, which reads the image), the
environment file's ``dedal.verify`` section (``--env-file``), the command line. The
options are checked here, before anything runs (unknown thresholds included).
"""
from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from dedal.adapters.runtime import RUNTIMES
from dedal.errors import UserError
from dedal.model import config
from dedal.model.envfile import AppCheck, load_env, load_rules_file
from dedal.stages.verify import image as img
from dedal.stages.verify import rules
from dedal.stages.verify.catalogue import CATALOGUE, KEYS
from dedal.stages.verify.checks import Thresholds

if TYPE_CHECKING:
    from dedal.model.config import Settings


DEFAULT_MAX_SIZE = 4 << 20
DEFAULT_NCCL_MAX = 256 << 20
DEFAULT_TIMEOUT = 600.0


@dataclass
class Options:
    image: Path
    output: Optional[Path]
    reports_dir: Path
    cache_dir: Path
    runtime: str = "auto"
    ranks: int = 2
    nodes: Optional[int] = None
    repetitions: int = 5
    launcher: str = "auto"
    benchmarks: List[str] = field(default_factory=lambda: list(KEYS) + ["osu"])
    env: Dict[str, str] = field(default_factory=dict)
    thresholds: Dict[str, Any] = field(default_factory=dict)
    gpu: Optional[bool] = None
    max_size: int = DEFAULT_MAX_SIZE
    nccl_max_size: int = DEFAULT_NCCL_MAX
    native: str = "auto"
    native_root: Optional[Path] = None
    timeout: float = DEFAULT_TIMEOUT
    images_dir: Optional[Path] = None
    apps: List[AppCheck] = field(default_factory=list)  # application checks (the env file's dedal.verify.apps)
    remeasure: bool = True  # a check bad on timing alone is measured once more (runner.remeasurable)
    rules: List[Dict[str, Any]] = field(default_factory=list)  # a site's rule rows (verify_rules, dedal.verify.rules)

    def rule_table(self) -> Tuple[rules.Rule, ...]:
        """dedal's rules with the site's rows (:func:`dedal.stages.verify.rules.with_site`)."""
        return rules.with_site(rules.rules_from_config(self.rules))

    def settings_digest(self) -> str:
        """What decides a verification besides the image (sha256 of them): a report made
        with other settings (ranks, thresholds, application checks ...) is not this one's."""
        keys = {"runtime": self.runtime, "ranks": self.ranks, "nodes": self.nodes, "repetitions": self.repetitions,
                "launcher": self.launcher, "benchmarks": list(self.benchmarks), "env": dict(self.env),
                "thresholds": dict(self.thresholds), "gpu": self.gpu, "max_size": self.max_size,
                "nccl_max_size": self.nccl_max_size, "native": self.native,
                "native_root": str(self.native_root) if self.native_root else None, "timeout": self.timeout,
                "apps": [a.to_json() for a in self.apps]}
        if not self.remeasure:  # only when off: the digests of reports made before it stay as they were
            keys["remeasure"] = False
        if self.rules:  # likewise: only where a site has rows of its own
            keys["rules"] = list(self.rules)
        return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=int, default=None, metavar="N",
                   help="ranks per node for init and all-reduce (default: env file, else 2; latency and bandwidth "
                        "always use 2 ranks; 1 only with 2+ nodes, and then the runs within a node use 2)")
    p.add_argument("--nodes", type=int, default=None, metavar="N",
                   help="nodes for the inter-node runs (srun; default: the allocation's SLURM_JOB_NUM_NODES, else 1)")
    p.add_argument("--repetitions", "-r", type=int, default=None, metavar="N",
                   help="repetitions of each benchmark on each side (default: env file, else 5)")
    p.add_argument("--no-remeasure", dest="remeasure", action="store_false",
                   help="judge a check over its threshold on timing alone at once (default: run it as many "
                        "repetitions again, native and container interleaved, and judge all of them)")
    p.add_argument("--launcher", choices=("auto", "mpirun", "srun"), default=None,
                   help="auto: srun inside a Slurm allocation, else mpirun")
    p.add_argument("--env", "-e", action="append", default=[], metavar="KEY=VALUE",
                   help="set a variable for every run, native and container (e.g. UCX_TLS=tcp); repeatable")
    p.add_argument("--threshold", "-t", action="append", default=[], metavar="KEY=VALUE",
                   help="override a check threshold (latency_overhead_us, bandwidth_pct, busbw_pct, "
                        "init_overhead_pct, ...); repeatable")
    p.add_argument("--benchmarks", "-b", default=None, metavar="LIST",
                   help="comma-separated: init, latency, bw, allreduce, nccl, osu (the OSU/nccl-tests "
                        "counterparts when the image has them; on GPUs also OSU between device buffers), or "
                        "program names (osu_bw-cuda: OSU's -d cuda D D) (default: all); the env file's application "
                        "checks and benchmarks (apps) run whatever is chosen: 'apps' alone runs only them")
    p.add_argument("--max-size", type=_size, default=None, metavar="BYTES",
                   help=f"largest message of latency/bandwidth/all-reduce (default {DEFAULT_MAX_SIZE}; K/M suffix)")
    p.add_argument("--nccl-max-size", type=_size, default=None, metavar="BYTES",
                   help=f"largest NCCL all-reduce (default {DEFAULT_NCCL_MAX})")
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument("--gpu", dest="gpu", action="store_true", default=None,
                     help="run the GPU (NCCL) benchmarks (default: when the host has GPUs and the image CUDA)")
    gpu.add_argument("--no-gpu", dest="gpu", action="store_false", help="skip the GPU benchmarks")
    p.add_argument("--native", choices=("auto", "host", "rootfs"), default="auto",
                   help="native side: the host's MPI and programs (host), or the image's root filesystem "
                        "unpacked and run without a container (rootfs); auto: host where it has them")
    p.add_argument("--native-root", type=Path, default=None, metavar="DIR",
                   help="use this unpacked copy of the image as the native root (its benchmark binaries must be "
                        "byte-identical to the image's)")
    p.add_argument("--env-file", type=Path, default=None, metavar="ENV.yaml",
                   help="environment file whose dedal.verify section gives ranks, repetitions, env, thresholds, "
                        "application checks (apps) ...")
    p.add_argument("--runtime", choices=RUNTIMES, default=None,
                   help="container runtime (setting runtime)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help=f"limit of one run (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--output", "-o", type=Path, default=None, metavar="DIR",
                   help="report directory (default: <reports_dir>/<image>)")
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


def _pairs(specs: Sequence[str], what: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        key = key.strip()
        if not sep or not key or not (key[0].isalpha() or key[0] == "_") or not all(c.isalnum() or c == "_" for c in key):
            raise UserError(f"{what} {spec!r}: expected KEY=VALUE with a valid name")
        out[key] = value
    return out


def options_from_args(args: argparse.Namespace) -> Options:
    settings = config.from_args(args, runtime=getattr(args, "runtime", None))
    image = img.resolve_image(args.image, settings)
    spec = None
    if args.env_file is not None:
        spec = load_env(args.env_file).verify
    thresholds: Dict[str, Any] = dict(spec.thresholds) if spec else {}
    for key, value in _pairs(args.threshold, "--threshold").items():
        try:
            thresholds[key] = float(value)
        except ValueError:
            raise UserError(f"--threshold {key}={value}: expected a number") from None
    env: Dict[str, str] = dict(spec.env) if spec else {}
    env.update(_pairs(args.env, "--env"))
    opts = Options(
        image=image, output=args.output, reports_dir=Path(settings.reports_dir), cache_dir=Path(settings.cache_dir),
        runtime=settings.runtime,
        ranks=args.ranks if args.ranks is not None else (spec.ranks if spec else 2),
        nodes=args.nodes if args.nodes is not None else (spec.nodes if spec and spec.nodes > 1 else None),
        repetitions=args.repetitions if args.repetitions is not None else (spec.repetitions if spec else 5),
        launcher=args.launcher or (spec.launcher if spec else "auto"),
        benchmarks=_benchmark_list(args.benchmarks) if args.benchmarks else (
            list(spec.benchmarks) if spec and spec.benchmarks else list(KEYS) + ["osu"]),
        env=env, thresholds=thresholds,
        gpu=args.gpu if args.gpu is not None else (True if spec and spec.gpu else None),
        max_size=args.max_size or DEFAULT_MAX_SIZE, nccl_max_size=args.nccl_max_size or DEFAULT_NCCL_MAX,
        native=args.native, native_root=args.native_root,
        timeout=args.timeout if args.timeout is not None else DEFAULT_TIMEOUT,
        images_dir=Path(settings.images_dir), apps=list(spec.apps) if spec else [],
        remeasure=getattr(args, "remeasure", True),
        rules=site_rules(settings) + (list(spec.rules) if spec else []),
    )
    if opts.ranks < 1 or (opts.ranks < 2 and (opts.nodes or 1) < 2):
        raise UserError(f"--ranks {opts.ranks}: at least 2 ranks are needed to measure communication "
                        "(1 rank per node only with --nodes 2 or more)")
    if opts.repetitions < 1:
        raise UserError(f"--repetitions {opts.repetitions}: at least 1")
    if opts.nodes is not None and opts.nodes < 1:
        raise UserError(f"--nodes {opts.nodes}: at least 1")
    if opts.timeout <= 0:
        raise UserError("--timeout must be positive")
    if opts.launcher == "mpirun" and (opts.nodes or 1) > 1:
        raise UserError(f"{opts.nodes} nodes need the srun launcher (inside a Slurm allocation); mpirun runs on "
                        "this node")
    if "apps" in opts.benchmarks and not opts.apps:
        raise UserError("--benchmarks apps: no application checks to run (dedal.verify.apps of an --env-file)")
    Thresholds.from_mapping(opts.thresholds)  # unknown keys and bad values fail now, before anything runs
    opts.rule_table()  # and so do rules that could never fire
    return opts


def site_rule_table(settings: Settings) -> Tuple[rules.Rule, ...]:
    """dedal's rules with the rows of the site's ``verify_rules`` file (``dedal verify parse``)."""
    return rules.with_site(rules.rules_from_config(site_rules(settings)))


def site_rules(settings: Settings) -> List[Dict[str, Any]]:
    """The rule rows of the site's file (the ``verify_rules`` setting: a YAML file with a
    ``rules:`` list, checked by the same schema as ``dedal.verify.rules``); none without one."""
    path = settings.values.get("verify_rules") if hasattr(settings, "values") else None
    if not path:
        return []
    return load_rules_file(Path(path))


def _benchmark_list(text: str) -> List[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = set(KEYS) | {"osu", "apps"} | {b.name for b in CATALOGUE}
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise UserError(f"--benchmarks {text!r}: unknown {', '.join(bad) or 'empty list'}; known: "
                        f"{', '.join(KEYS)}, osu, apps, or program names ({', '.join(b.name for b in CATALOGUE)})")
    return names
