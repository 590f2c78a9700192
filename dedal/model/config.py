"""One settings model: defaults < config file < DEDAL_* environment < command line.

Every setting has a type, a default and a help text; ``dedal config show`` prints the
effective value of each and where it came from. Values are validated with messages
that name the setting, e.g. ``layer_store: expected a directory path, got 3``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple


from dedal.errors import UserError
from dedal.model.inputs import parse_yaml, load_yaml

#: the container runtimes a setting or ``--runtime`` may name: auto, then the backends of
#: dedal.adapters.runtime in the order auto tries them
RUNTIMES = ("auto", "apptainer", "bwrap", "charliecloud")
PINNED_SPACK_REF = "e8f8cf8543b31ff6ba81a5ab0e515bc9a4856384"  # develop, 6 Jun 2024 (0.23.0.dev0)


def _xdg(var: str, fallback: str) -> Path:
    return Path(os.environ.get(var) or Path.home() / fallback)


@dataclass(frozen=True)
class Setting:
    key: str
    kind: str  # path | str | int | bool | float | choice | list
    default: Callable[[Dict[str, Any]], Any]
    help: str
    choices: Tuple[str, ...] = ()
    optional: bool = False  # None allowed

    @property
    def env_var(self) -> str:
        return "DEDAL_" + self.key.replace(".", "_").upper()


def _const(value: Any) -> Callable[[Dict[str, Any]], Any]:
    return lambda _values: value


def _under(key: str, sub: str) -> Callable[[Dict[str, Any]], Any]:
    return lambda values: Path(values[key]) / sub


SETTINGS: List[Setting] = [
    Setting(
        "data_dir",
        "path",
        lambda v: _xdg("XDG_DATA_HOME", ".local/share") / "dedal",
        "root of dedal's own state (layer store, mirror, plans, images, reports by default)",
    ),
    Setting(
        "cache_dir",
        "path",
        lambda v: _xdg("XDG_CACHE_HOME", ".cache") / "dedal",
        "caches that can be rebuilt (Spack checkout, base root filesystems)",
    ),
    Setting(
        "layer_store",
        "path",
        _under("data_dir", "layers"),
        "directory of <key>.sqfs layers and <key>.json manifests (shared storage on a cluster)",
    ),
    Setting("mirror", "path", _under("data_dir", "mirror"), "Spack source mirror (shared storage on a cluster)"),
    Setting(
        "work_dir",
        "path",
        _under("data_dir", "work"),
        "per-environment artifacts: spack.yaml, spack.lock, plan.json, logs",
    ),
    Setting("images_dir", "path", _under("data_dir", "images"), "assembled images: <env>/<tag>.sif"),
    Setting(
        "reports_dir",
        "path",
        _under("data_dir", "reports"),
        "verification reports: <image>/verify.json, report.md, plots",
    ),
    Setting(
        "verify_rules",
        "path",
        _const(None),
        "a site's verification rules: a YAML file whose 'rules:' list adds or overrides rows of dedal's rules table (the shape of an env file's dedal.verify.rules; e.g. 'Slingshot needs the OFI plugin'); empty: dedal's rows only",
        optional=True,
    ),
    Setting(
        "base_cache",
        "path",
        _under("cache_dir", "base"),
        "built base root filesystems, keyed by the hash of their definition",
    ),
    Setting(
        "stage_dir",
        "path",
        _const(Path("/dev/shm")),
        "node-local directory where packages are built and images assembled",
    ),
    Setting(
        "install_root",
        "path",
        _const(Path("/opt/esd/software")),
        "fixed install root of Spack prefixes, at build time and in the image",
    ),
    Setting("view", "path", _const(Path("/opt/view")), "Spack view in the image"),
    Setting("base_image", "str", _const("debian-trixie"), "base image name (see `dedal base list`)"),
    Setting("spack_root", "path", _const(None), "existing Spack checkout to use instead of cloning", optional=True),
    Setting(
        "spack_url", "str", _const("https://github.com/spack/spack.git"), "git URL (or local path) Spack is cloned from"
    ),
    Setting("spack_ref", "str", _const(PINNED_SPACK_REF), "pinned Spack commit, tag or branch"),
    Setting(
        "envs_url", "str", _const(""), "git URL (or path) of a spack-envs repository; ENV arguments are paths inside it"
    ),
    Setting("envs_ref", "str", _const("main"), "commit, tag or branch of the spack-envs repository"),
    Setting(
        "debian_mirror",
        "str",
        _const(""),
        "Debian mirror for base images (default: the host's apt sources, else deb.debian.org)",
    ),
    Setting(
        "pypi_index",
        "str",
        _const("https://pypi.org/simple"),
        "PyPI simple index (PEP 691 JSON) that fetch takes "
        "Python sources from when Spack's own PyPI URL fails: the file with the recipe's sha256; empty: never",
    ),
    Setting("runtime", "choice", _const("auto"), "container runtime for builds and `dedal exec`", choices=RUNTIMES),
    Setting("executor", "choice", _const("local"), "where build jobs run", choices=("local", "slurm")),
    Setting(
        "verify_gate",
        "choice",
        _const("passed"),
        "which verification verdicts let an image be published "
        "(build-image, and dedal publish with a verify.json attached): passed (good or suboptimal), good (good "
        "with every planned check run, no GPU check skipped), off "
        "(publish whatever the verdict; the report is attached and shows it)",
        choices=("passed", "good", "off"),
    ),
    Setting("jobs", "int", lambda v: os.cpu_count() or 1, "parallel build jobs for the local executor"),
    Setting("build_jobs", "int", _const(0), "make -j inside one package build (0: cores of the job)"),
    Setting("keep_going", "bool", _const(False), "build every branch not blocked by a failure"),
    Setting(
        "job_overhead_s",
        "float",
        _const(3.0),
        "per-job overhead (queue, materialize, Spack start-up) used by the scheduler",
    ),
    Setting("slurm.partition", "str", _const(""), "sbatch --partition"),
    Setting("slurm.account", "str", _const(""), "sbatch --account"),
    Setting("slurm.qos", "str", _const(""), "sbatch --qos"),
    Setting(
        "slurm.time",
        "str",
        _const("04:00:00"),
        "sbatch --time: the most a build job may run, and the limit of a job resubmitted after running past its estimate",
    ),
    Setting(
        "slurm.time_factor",
        "float",
        _const(2.0),
        "each job's --time is its estimate times this (whole minutes), at most slurm.time: Slurm's backfill plans with the limits, see benchmarks/schedule/cluster.md; 0: slurm.time for every job",
    ),
    Setting("slurm.constraint", "str", _const(""), "sbatch --constraint"),
    Setting("slurm.nodes", "int", _const(4), "nodes the build may use at once (scheduling capacity)"),
    Setting("slurm.cpus_per_job", "int", _const(0), "sbatch --cpus-per-task (0: scheduler decides per job)"),
    Setting("slurm.cores_per_node", "int", _const(0), "cores of one build node (0: from sinfo)"),
    Setting("slurm.mem", "str", _const(""), "sbatch --mem per job"),
    Setting("slurm.extra_args", "list", _const([]), "extra sbatch options, e.g. ['--reservation=esd']"),
    Setting(
        "slurm.template", "path", _const(None), "job script template overriding slurm/build-job.sh.in", optional=True
    ),
    Setting("slurm.retries", "int", _const(2), "resubmissions of a job lost to NODE_FAIL, PREEMPTED or BOOT_FAIL"),
    Setting("slurm.poll_s", "float", _const(2.0), "seconds between squeue/sacct polls"),
    Setting(
        "slurm.detach",
        "bool",
        _const(False),
        "submit the jobs and exit instead of following them (sites that stop long processes on login nodes): dedal status shows them, the next dedal build follows them (order hints, retries) and builds what they left",
    ),
    Setting(
        "slurm.order_hints",
        "choice",
        _const("auto"),
        "plan fixed start times and have Slurm follow them by afterany hints that expire at their planned time; pays off only with accurate durations, so auto: when every package to build has a measured duration (benchmarks/schedule/cluster.md)",
        choices=("auto", "true", "false"),
    ),
    Setting("registry", "str", _const(""), "default oras:// repository to publish to (empty: do not publish)"),
    Setting("registry_insecure", "bool", _const(False), "plain HTTP / unverified TLS for the registry"),
    Setting(
        "layer_cache",
        "str",
        _const(""),
        "oras://HOST[:PORT]/REPO of a remote layer cache: layers the store lacks are pulled from it before building, the ones built are pushed to it (empty: none)",
    ),
    Setting(
        "layer_cache_push",
        "bool",
        _const(True),
        "push the layers a build made to the layer cache (off: only pull, e.g. in merge-request pipelines)",
    ),
    Setting(
        "registry_deadline_s",
        "float",
        _const(180.0),
        "seconds one registry operation (a publish, a pull, a layer of the cache) may go without progress (no byte sent or received, no answer), retries and waits included; none is started or retried after it (a transfer that moves is never cut)",
    ),
    Setting(
        "registry_timeout_s",
        "float",
        _const(60.0),
        "seconds without a byte from the registry before an attempt counts as failed (a stalled registry)",
    ),
    Setting(
        "sign",
        "bool",
        _const(False),
        "publish images signed with Apptainer's PGP key (dedal publish --sign; `apptainer verify` accepts them); the key's passphrase, if any, in $DEDAL_SIGN_PASSPHRASE, never in a setting",
    ),
    Setting(
        "sign_keyidx",
        "int",
        _const(0),
        "which secret key of Apptainer's keyring signs (`apptainer key list --secret`; the keyring of $APPTAINER_KEYSDIR, else ~/.apptainer/keys)",
    ),
    Setting(
        "require_signature",
        "bool",
        _const(False),
        "pull only images signed by a key of the local Apptainer keyring (dedal pull --verify): an unsigned or wrongly signed image is refused and nothing is written",
    ),
    Setting(
        "provenance",
        "bool",
        _const(False),
        "attach an in-toto/SLSA provenance statement of the build's inputs (env, lock, Spack commit, base, SOURCE_DATE_EPOCH, from the image's labels) to published images, as a referrer (dedal publish --provenance)",
    ),
    Setting(
        "signers",
        "list",
        _const([]),
        "fingerprints of the keys an image must be signed by where a signature is required (empty: any key of the local keyring)",
    ),
]

BY_KEY: Dict[str, Setting] = {s.key: s for s in SETTINGS}


def _convert(s: Setting, value: Any, from_text: bool) -> Any:
    if value is None:
        if s.optional:
            return None
        raise UserError(f"{s.key}: a value is required")
    if from_text and isinstance(value, str):
        text = value.strip()
        if s.kind == "int":
            try:
                return int(text)
            except ValueError:
                raise UserError(f"{s.key}: expected an integer, got {value!r}") from None
        if s.kind == "float":
            try:
                return float(text)
            except ValueError:
                raise UserError(f"{s.key}: expected a number, got {value!r}") from None
        if s.kind == "bool":
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise UserError(f"{s.key}: expected true or false, got {value!r}")
        if s.kind == "list":
            loaded = parse_yaml(text, s.key) if text.startswith("[") else [t for t in text.split() if t]
            value = loaded
        if s.kind == "path" and text == "" and s.optional:
            return None
    if s.kind == "path":
        if not isinstance(value, (str, os.PathLike)) or isinstance(value, bool) or str(value) == "":
            raise UserError(f"{s.key}: expected a directory path, got {value!r}")
        return Path(os.path.expanduser(os.fspath(value)))
    if s.kind == "choice" and isinstance(value, bool) and "true" in s.choices:
        value = "true" if value else "false"  # YAML's true/false for a choice that has them
    if s.kind in ("str", "choice"):
        if not isinstance(value, str):
            raise UserError(f"{s.key}: expected a string, got {value!r}")
        if s.kind == "choice" and value not in s.choices:
            raise UserError(f"{s.key}: expected one of {', '.join(s.choices)}, got {value!r}")
        return value
    if s.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{s.key}: expected an integer, got {value!r}")
        if value < 0:
            raise UserError(f"{s.key}: expected a non-negative integer, got {value!r}")
        return value
    if s.kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{s.key}: expected a number, got {value!r}")
        if not value >= 0:  # NaN too
            raise UserError(f"{s.key}: expected a non-negative number, got {value!r}")
        return float(value)
    if s.kind == "bool":
        if not isinstance(value, bool):
            raise UserError(f"{s.key}: expected true or false, got {value!r}")
        return value
    if s.kind == "list":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UserError(f"{s.key}: expected a list of strings, got {value!r}")
        return list(value)
    raise AssertionError(s.kind)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    flat: Dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and any(k.startswith(full + ".") for k in BY_KEY):
            flat.update(_flatten(value, full + "."))
        else:
            flat[full] = value
    return flat


def default_config_files() -> List[Path]:
    return [_xdg("XDG_CONFIG_HOME", ".config") / "dedal" / "config.yaml", Path.cwd() / "dedal.yaml"]


def read_config_file(path: Path) -> Dict[str, Any]:
    data = load_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    flat = _flatten(data)
    for key in flat:
        if key not in BY_KEY:
            raise UserError(f"{path}: unknown setting {key!r} (see `dedal config show`)")
    return flat


@dataclass
class Settings:
    values: Dict[str, Any]
    sources: Dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        raise AttributeError(name)

    def get(self, key: str) -> Any:
        return self.values[key]

    def section(self, prefix: str) -> Dict[str, Any]:
        """Settings under ``prefix.`` with the prefix removed (e.g. section('slurm'))."""
        p = prefix + "."
        return {k[len(p) :]: v for k, v in self.values.items() if k.startswith(p)}

    def as_rows(self) -> List[Tuple[str, Any, str]]:
        return [(s.key, self.values[s.key], self.sources[s.key]) for s in SETTINGS]


def load_settings(
    config_file: Optional[Path] = None,
    overrides: Optional[Mapping[str, Any]] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> Settings:
    """Resolve every setting from its sources, in increasing priority."""
    environ = os.environ if environ is None else environ
    layers: List[Tuple[str, Dict[str, Any], bool]] = []
    files = [Path(config_file)] if config_file else [p for p in default_config_files() if p.is_file()]
    if config_file and not Path(config_file).exists():  # a FIFO, a device: read_input says what it is
        raise UserError(f"{config_file}: configuration file not found")
    for path in files:
        layers.append((f"file {path}", read_config_file(path), False))
    env_values = {s.key: environ[s.env_var] for s in SETTINGS if s.env_var in environ}
    layers.append(("env", env_values, True))
    flag_values: Dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        if key not in BY_KEY:
            raise UserError(f"unknown setting {key!r} (see `dedal config show`)")
        flag_values[key] = value
    layers.append(("flag", flag_values, True))

    values: Dict[str, Any] = {}
    sources: Dict[str, str] = {}
    for s in SETTINGS:  # defaults may refer to earlier settings (data_dir -> layer_store)
        chosen: Optional[Tuple[str, Any, bool]] = None
        for origin, data, from_text in layers:
            if s.key in data:
                chosen = (origin if origin != "env" else f"env {s.env_var}", data[s.key], from_text)
        if chosen is None:
            values[s.key] = s.default(values)
            sources[s.key] = "default"
        else:
            values[s.key] = _convert(s, chosen[1], chosen[2])
            sources[s.key] = chosen[0]
    return Settings(values, sources)


def parse_overrides(pairs: List[str]) -> Dict[str, str]:
    """``KEY=VALUE`` strings from ``--set`` into a dict; values stay text (converted per type)."""
    result: Dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UserError(f"--set {pair!r}: expected KEY=VALUE")
        key, value = pair.split("=", 1)
        result[key.strip()] = value
    return result


def from_args(args: Any, **flags: Any) -> Settings:
    """Settings for a CLI invocation: global --config/--set plus command flags (None = not given)."""
    overrides: Dict[str, Any] = parse_overrides(getattr(args, "overrides", []) or [])
    overrides.update({k: v for k, v in flags.items() if v is not None})
    cfg = getattr(args, "config", None)
    return load_settings(Path(cfg) if cfg else None, overrides)
