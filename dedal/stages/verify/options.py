"""The options of ``dedal verify IMAGE``: the command line and the environment file.

Settings come from (later wins): built-in defaults, the image's label
``dedal.verify.thresholds`` (JSON; merged by the runner, which reads the image), the
environment file's ``dedal.verify`` section (``--env-file``), the command line. The
options are checked here, before anything runs (unknown thresholds included).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from dedal.errors import UserError
from dedal.model import config
from dedal.model.artifacts import inputs_digest
from dedal.model.env_defaults import DEFAULT_LAUNCHER, DEFAULT_RANKS, DEFAULT_REPETITIONS
from dedal.model.envfile import AppCheck, VerifySpec, load_env, load_rules_file
from dedal.stages.verify import image as img
from dedal.stages.verify import rules
from dedal.stages.verify.catalogue import CATALOGUE, KEYS
from dedal.stages.verify.thresholds import Thresholds

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
    ranks: int = DEFAULT_RANKS
    nodes: Optional[int] = None
    repetitions: int = DEFAULT_REPETITIONS
    launcher: str = DEFAULT_LAUNCHER
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
        keys = {
            "runtime": self.runtime,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "repetitions": self.repetitions,
            "launcher": self.launcher,
            "benchmarks": list(self.benchmarks),
            "env": dict(self.env),
            "thresholds": dict(self.thresholds),
            "gpu": self.gpu,
            "max_size": self.max_size,
            "nccl_max_size": self.nccl_max_size,
            "native": self.native,
            "native_root": str(self.native_root) if self.native_root else None,
            "timeout": self.timeout,
            "apps": [a.to_json() for a in self.apps],
        }
        if not self.remeasure:  # only when off: the digests of reports made before it stay as they were
            keys["remeasure"] = False
        if self.rules:  # likewise: only where a site has rows of its own
            keys["rules"] = list(self.rules)
        return inputs_digest(keys)


@dataclass(frozen=True)
class Given:
    """What a command line sets over the environment file (None, empty: not given)."""

    ranks: Optional[int] = None
    nodes: Optional[int] = None
    repetitions: Optional[int] = None
    launcher: Optional[str] = None
    benchmarks: Optional[List[str]] = None
    env: Dict[str, str] = field(default_factory=dict)
    thresholds: Dict[str, float] = field(default_factory=dict)
    gpu: Optional[bool] = None
    max_size: Optional[int] = None
    nccl_max_size: Optional[int] = None
    native: str = "auto"
    native_root: Optional[Path] = None
    timeout: Optional[float] = None
    remeasure: bool = True


def verify_options(
    image: Path, output: Optional[Path], settings: Settings, spec: Optional[VerifySpec], given: Given = Given()
) -> Options:
    """The one merge of a verification's options, for ``dedal verify`` and build-image alike:
    the defaults (the environment file schema's, then these), the environment file's
    ``dedal.verify`` section (``spec``; None without a file), what was ``given`` on the command
    line (or build-image's ``--verify-env``), and the site's rule rows before the file's. Checked
    here, once, before anything runs."""
    spec = spec if spec is not None else VerifySpec()
    thresholds: Dict[str, Any] = {**spec.thresholds, **given.thresholds}
    opts = Options(
        image=image,
        output=output,
        reports_dir=Path(settings.reports_dir),
        cache_dir=Path(settings.cache_dir),
        runtime=settings.runtime,
        ranks=given.ranks if given.ranks is not None else spec.ranks,
        nodes=given.nodes if given.nodes is not None else (spec.nodes if spec.nodes > 1 else None),
        repetitions=given.repetitions if given.repetitions is not None else spec.repetitions,
        launcher=given.launcher or spec.launcher,
        benchmarks=list(given.benchmarks or spec.benchmarks or list(KEYS) + ["osu"]),
        env={**spec.env, **given.env},
        thresholds=thresholds,
        gpu=given.gpu if given.gpu is not None else (True if spec.gpu else None),
        max_size=given.max_size or DEFAULT_MAX_SIZE,
        nccl_max_size=given.nccl_max_size or DEFAULT_NCCL_MAX,
        native=given.native,
        native_root=given.native_root,
        timeout=given.timeout if given.timeout is not None else DEFAULT_TIMEOUT,
        images_dir=Path(settings.images_dir),
        apps=list(spec.apps),
        remeasure=given.remeasure,
        rules=site_rules(settings) + list(spec.rules),
    )
    # one rank per node is fine on one node too: the runs within a node use 2 (Plan.ranks_for)
    if opts.ranks < 1:
        raise UserError(f"--ranks {opts.ranks}: at least 1 (1 rank per node: the runs within a node still use 2)")
    if opts.repetitions < 1:
        raise UserError(f"--repetitions {opts.repetitions}: at least 1")
    if opts.nodes is not None and opts.nodes < 1:
        raise UserError(f"--nodes {opts.nodes}: at least 1")
    if opts.timeout <= 0:
        raise UserError("--timeout must be positive")
    if opts.launcher == "mpirun" and (opts.nodes or 1) > 1:
        raise UserError(
            f"{opts.nodes} nodes need the srun launcher (inside a Slurm allocation); mpirun runs on this node"
        )
    if "apps" in opts.benchmarks and not opts.apps:
        raise UserError("--benchmarks apps: no application checks to run (dedal.verify.apps of an --env-file)")
    Thresholds.from_mapping(opts.thresholds)  # unknown keys and bad values fail now, before anything runs
    opts.rule_table()  # and so do rules that could never fire
    return opts


def _pairs(specs: Sequence[str], what: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        key = key.strip()
        if (
            not sep
            or not key
            or not (key[0].isalpha() or key[0] == "_")
            or not all(c.isalnum() or c == "_" for c in key)
        ):
            raise UserError(f"{what} {spec!r}: expected KEY=VALUE with a valid name")
        out[key] = value
    return out


def options_from_args(args: argparse.Namespace) -> Options:
    """``dedal verify``'s options: its command line and ``--env-file`` through :func:`verify_options`."""
    settings = config.from_args(args, runtime=getattr(args, "runtime", None))
    image = img.resolve_image(args.image, settings)
    spec = load_env(args.env_file).verify if args.env_file is not None else None
    thresholds: Dict[str, float] = {}
    for key, value in _pairs(args.threshold, "--threshold").items():
        try:
            thresholds[key] = float(value)
        except ValueError:
            raise UserError(f"--threshold {key}={value}: expected a number") from None
    given = Given(
        ranks=args.ranks,
        nodes=args.nodes,
        repetitions=args.repetitions,
        launcher=args.launcher,
        benchmarks=_benchmark_list(args.benchmarks) if args.benchmarks else None,
        env=_pairs(args.env, "--env"),
        thresholds=thresholds,
        gpu=args.gpu,
        max_size=args.max_size,
        nccl_max_size=args.nccl_max_size,
        native=args.native,
        native_root=args.native_root,
        timeout=args.timeout,
        remeasure=getattr(args, "remeasure", True),
    )
    return verify_options(image, args.output, settings, spec, given)


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
        raise UserError(
            f"--benchmarks {text!r}: unknown {', '.join(bad) or 'empty list'}; known: "
            f"{', '.join(KEYS)}, osu, apps, or program names ({', '.join(b.name for b in CATALOGUE)})"
        )
    return names
