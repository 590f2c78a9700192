"""The environment file: a Spack environment (``spack:``, passed to Spack untouched)
plus an optional ``dedal:`` section describing the image.

Validated with a JSON schema so that every mistake is one precise line
(``env.yaml: dedal.verify.repetitions: expected integer, got 'five'``).
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import yaml

from dedal.errors import UserError
from dedal.model.artifacts import write_atomic
from dedal.model.base import unknown_base
from dedal.model.inputs import load_yaml

if TYPE_CHECKING:  # jsonschema itself only when an environment file is read (50 ms of every dedal run)
    import jsonschema

_ABS_PATH = {"type": "string", "pattern": "^/"}
# a path below a directory: not absolute, no '..' component
_REL_PATH = {"type": "string", "pattern": r"^(?!/)(?!(?:.*/)?\.\.(?:/|$)).+$"}

THRESHOLDS_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "latency_overhead_us": {"type": "number", "minimum": 0},
        "bandwidth_pct": {"type": "number", "minimum": 0},
        "busbw_pct": {"type": "number", "minimum": 0},
        "init_overhead_pct": {"type": "number", "minimum": 0},
    },
}

# an application-level check: a command of the image run on its ranks by the launcher
APP_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "command"],
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$"},
        "command": {"anyOf": [{"type": "string", "minLength": 1},
                              {"type": "array", "items": {"type": "string"}, "minItems": 1}]},
        "ranks": {"type": "integer", "minimum": 1},
        "nodes": {"type": "integer", "minimum": 1},
        "expect": {"type": "string"},
        "timeout": {"type": "number", "exclusiveMinimum": 0},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        # an application benchmark: the number the run prints, native against container
        "metric": {
            "type": "object",
            "additionalProperties": False,
            "required": ["match", "unit"],
            "properties": {
                "match": {"type": "string", "minLength": 1},
                "unit": {"type": "string", "minLength": 1},
                "better": {"enum": ["lower", "higher"]},
                "overhead_pct": {"type": "number", "minimum": 0},
                "repetitions": {"type": "integer", "minimum": 1},
            },
        },
        # a file the run writes (relative to its working directory) that must hold the lines of
        # a file in the image, in any order (a spike raster against the reference raster)
        "reference": {
            "type": "object",
            "additionalProperties": False,
            "required": ["output", "expected"],
            "properties": {
                "output": _REL_PATH,
                "expected": _ABS_PATH,
            },
        },
    },
}

# a row of the verification rules (dedal.stages.verify.rules): a site adds or overrides one. "when"
# names the fact it reads ("seen": stack:what, e.g. nccl:socket-network; "fact": a measured
# class:name, e.g. host:latency_small_us, with its range), the scope, host conditions, a regular
# expression one of the seen items matches; code "*" with "means" re-grades other rows' findings.
_HOST_VALUE = {"type": ["boolean", "null"]}
RULE_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["code", "when", "severity"],
    "properties": {
        "code": {"type": "string", "pattern": "^(?:\\*|[a-z0-9][a-z0-9-]*)$"},
        "when": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "seen": {"type": "string", "pattern": "^[a-z0-9*-]+:[a-z0-9*_-]+$"},
                "fact": {"type": "string", "pattern": "^[a-z0-9]+:[a-z0-9_]+$"},
                "scope": {"enum": ["", "intra-node", "inter-node", "self", "unknown", "gpu"]},
                "host": {"type": "object", "additionalProperties": False,
                         "properties": {"fabric": _HOST_VALUE, "multi_node": _HOST_VALUE, "gpus": _HOST_VALUE,
                                        "gpu_p2p": _HOST_VALUE, "gdrdma": _HOST_VALUE}},
                "match": {"type": "string"},
                "at_least": {"type": "number"},
                "below": {"type": "number"},
                "of": {"type": "string"},
                "unless": {"type": "array", "items": {"type": "string"}},
            },
        },
        "severity": {"enum": ["info", "warning", "error"]},
        "verdict": {"enum": ["good", "suboptimal", "bad", "failed", "degenerate"]},
        "message": {"type": "string", "minLength": 1},
        "means": {"type": "string"},
    },
}
RULES_FILE_SCHEMA: Dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["rules"],
    "properties": {"rules": {"type": "array", "items": RULE_SCHEMA}},
}

DEDAL_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$"},
        "tag": {"type": "string", "pattern": "^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$"},
        "description": {"type": "string"},
        "base_image": {"type": "string"},
        # the base the image is assembled on (default: base_image, the build base): a smaller
        # twin of the build base with only the runtime libraries (e.g. debian-trixie-cuda-runtime)
        "runtime_base": {"type": "string", "minLength": 1},
        "install_root": _ABS_PATH,
        "view": _ABS_PATH,
        "registry": {"type": "string", "pattern": "^oras://"},
        "lock": {"type": "string"},
        "keep_build_deps": {"type": "boolean"},
        "rebuild": {"type": "boolean"},  # CI: a job rebuilds the published image, fails on a difference
        "only": {"type": "array", "items": {"type": "string"}},
        "runscript": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "verify": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "enabled": {"type": "boolean"},
                "ranks": {"type": "integer", "minimum": 1},
                "nodes": {"type": "integer", "minimum": 1},
                "repetitions": {"type": "integer", "minimum": 1},
                "launcher": {"enum": ["auto", "mpirun", "srun"]},
                "benchmarks": {"type": "array", "items": {"type": "string"}},
                "gpu": {"type": "boolean"},
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
                "thresholds": THRESHOLDS_SCHEMA,
                "apps": {"type": "array", "items": APP_SCHEMA},
                "rules": {"type": "array", "items": RULE_SCHEMA},
            },
        },
    },
}

# the Spack manifest is Spack's to check, but for the shapes dedal itself reads (the specs,
# the files it carries, the config it adds to): wrong there, it would fail after writing
SPACK_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "properties": {"specs": {"type": "array"}, "config": {"type": "object"},
                   "include": {"type": "array"}, "repos": {"type": "array"}},
}

ENV_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["spack"],
    "properties": {"spack": SPACK_SCHEMA, "dedal": DEDAL_SCHEMA},
}


#: the container may be this much slower (or, higher better, lose this much) than native: an
#: application's time to solution varies more between runs than a microbenchmark's
DEFAULT_APP_OVERHEAD_PCT = 10.0


@dataclass
class AppMetric:
    """What makes an application check a benchmark: the number its output carries (``match``,
    a regular expression whose group ``value`` captures it, e.g. ``time to solution:
    (?P<value>[0-9.]+) s``), its unit, which way is better, and how much worse the container
    may be than native (``overhead_pct``, judged on the medians of ``repetitions`` runs per
    side; None: the verification's repetitions)."""

    match: str
    unit: str
    better: str = "lower"
    overhead_pct: float = DEFAULT_APP_OVERHEAD_PCT
    repetitions: Optional[int] = None

    @property
    def higher_is_better(self) -> bool:
        return self.better == "higher"

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "AppMetric":
        reps = data.get("repetitions")
        return cls(match=data["match"], unit=data["unit"], better=data.get("better", "lower"),
                   overhead_pct=float(data.get("overhead_pct", DEFAULT_APP_OVERHEAD_PCT)),
                   repetitions=int(reps) if reps is not None else None)

    def to_json(self) -> Dict[str, Any]:
        return {"match": self.match, "unit": self.unit, "better": self.better, "overhead_pct": self.overhead_pct,
                "repetitions": self.repetitions}


@dataclass
class AppReference:
    """A file every run must write (``output``, relative to the run's working directory) with
    the lines of ``expected`` (a file in the image), in any order: a spike raster written by
    several ranks in whatever order they finish, against the reference raster."""

    output: str
    expected: str

    def to_json(self) -> Dict[str, Any]:
        return {"output": self.output, "expected": self.expected}


@dataclass
class AppCheck:
    """An application run in the image on its ranks, as users will run it (``srun --mpi=pmix``
    or the image's ``mpirun``): the benchmarks say the MPI stack is fast, this says the
    application actually starts, talks MPI and computes. Passes on exit 0 with ``expect``
    (a regular expression) found in its output.

    With a ``metric`` it is an application benchmark: run natively and in the container,
    interleaved, and compared (:mod:`dedal.stages.verify.appbench`); then a group ``value`` in
    ``expect`` must capture the same text in every run of both sides (a spike count), and a
    ``reference`` file is checked after every run."""

    name: str
    command: List[str]          # a string in the file runs as ``/bin/sh -c STRING``
    ranks: int = 2
    nodes: int = 1
    expect: str = ""
    timeout: float = 600.0
    env: Dict[str, str] = field(default_factory=dict)
    metric: Optional[AppMetric] = None
    reference: Optional[AppReference] = None

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "AppCheck":
        command = data["command"]
        ref = data.get("reference")
        return cls(name=data["name"], command=["/bin/sh", "-c", command] if isinstance(command, str) else list(command),
                   ranks=int(data.get("ranks", 2)), nodes=int(data.get("nodes", 1)), expect=data.get("expect", ""),
                   timeout=float(data.get("timeout", 600.0)), env=dict(data.get("env") or {}),
                   metric=AppMetric.from_json(data["metric"]) if data.get("metric") else None,
                   reference=AppReference(ref["output"], ref["expected"]) if ref else None)

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"name": self.name, "command": list(self.command), "ranks": self.ranks,
                               "nodes": self.nodes, "expect": self.expect, "timeout": self.timeout,
                               "env": dict(self.env)}
        # only where set: an app check's form (and the settings digest of its reports) stays as it was
        if self.metric is not None:
            out["metric"] = self.metric.to_json()
        if self.reference is not None:
            out["reference"] = self.reference.to_json()
        return out


@dataclass
class VerifySpec:
    enabled: bool = True
    ranks: int = 2
    nodes: int = 1
    repetitions: int = 5
    launcher: str = "auto"
    benchmarks: List[str] = field(default_factory=list)
    gpu: bool = False
    env: Dict[str, str] = field(default_factory=dict)
    thresholds: Dict[str, float] = field(default_factory=dict)
    apps: List[AppCheck] = field(default_factory=list)
    rules: List[Dict[str, Any]] = field(default_factory=list)  # the site's rule rows, as written


@dataclass
class EnvFile:
    path: Path
    spack: Dict[str, Any]
    name: str
    tag: str = "latest"
    description: str = ""
    base_image: Optional[str] = None
    runtime_base: Optional[str] = None  # assemble on this base instead of base_image (layers stay keyed on it)
    install_root: Optional[str] = None
    view: Optional[str] = None
    registry: str = ""
    lock: Optional[Path] = None
    keep_build_deps: bool = False
    rebuild: bool = False  # CI: rebuild the published image (dedal rebuild) and fail on a difference
    only: List[str] = field(default_factory=list)
    runscript: str = ""
    labels: Dict[str, str] = field(default_factory=dict)
    verify: VerifySpec = field(default_factory=VerifySpec)

    @property
    def directory(self) -> Path:
        return self.path.parent

    def spack_yaml(self) -> Dict[str, Any]:
        """The plain Spack manifest, with paths that Spack resolves relative to the
        environment directory made absolute, so it works wherever dedal writes it."""
        spack = copy.deepcopy(self.spack)
        for key in ("include", "repos"):
            entries = spack.get(key)
            if isinstance(entries, list):
                spack[key] = [self._absolute(e) for e in entries]
        return {"spack": spack}

    def _absolute(self, entry: Any) -> Any:
        if isinstance(entry, str) and entry and not entry.startswith(("/", "$", "~")) and "://" not in entry:
            return str((self.directory / entry).resolve())
        return entry

    def write_spack_yaml(self, directory: Path) -> Path:
        return write_atomic(directory / "spack.yaml", yaml.safe_dump(self.spack_yaml(), sort_keys=False))


def app_problem(app: AppCheck) -> str:
    """What is wrong with an app entry beyond its shape (``key: why``; "" when nothing): its
    regular expressions, and a reference, which only a benchmark's runs can check (they run
    in a working directory of their own, where the file is found afterwards)."""
    try:
        re.compile(app.expect, re.MULTILINE)
    except re.error as e:
        return f"expect: not a regular expression: {e}"
    if app.metric is None:
        if app.reference is not None:
            return "reference: needs a metric (a reference file is checked on the runs of an app benchmark)"
        return ""
    try:
        match = re.compile(app.metric.match, re.MULTILINE)
    except re.error as e:
        return f"metric.match: not a regular expression: {e}"
    if "value" not in match.groupindex:
        return (f"metric.match: needs a group named value that captures the number (e.g. 'time: "
                f"(?P<value>[0-9.]+) s'), got {_describe(app.metric.match)}")
    return ""


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message(err: jsonschema.ValidationError) -> str:
    where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
    validator = err.validator
    if validator == "type":
        return f"{where}: expected {err.validator_value}, got {_describe(err.instance)}"
    if validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        known = ", ".join(sorted(err.schema.get("properties", {})))
        prefix = f"{where}: " if err.absolute_path else ""
        return f"{prefix}unknown key {extra[0]!r} (known: {known})"
    if validator == "required":
        missing = [r for r in err.validator_value if r not in err.instance]
        if not err.absolute_path and missing == ["spack"]:
            return "missing 'spack:' section (a Spack environment is required)"
        return f"{where}: missing key {missing[0]!r}"
    if validator == "pattern":
        if err.validator_value == "^/":
            return f"{where}: expected an absolute path, got {_describe(err.instance)}"
        if err.validator_value == _REL_PATH["pattern"]:
            return f"{where}: expected a relative path without '..', got {_describe(err.instance)}"
        return f"{where}: invalid value {_describe(err.instance)} (must match {err.validator_value})"
    if validator == "enum":
        return f"{where}: expected one of {', '.join(map(str, err.validator_value))}, got {_describe(err.instance)}"
    if validator == "minLength":
        return f"{where}: must not be empty"
    if validator == "minimum":
        return f"{where}: must be at least {err.validator_value}, got {_describe(err.instance)}"
    if validator == "exclusiveMinimum":
        return f"{where}: must be more than {err.validator_value}, got {_describe(err.instance)}"
    if validator == "minItems":
        return f"{where}: must not be empty"
    if validator == "anyOf":  # the app's command: a shell line or an argument list
        return f"{where}: expected a non-empty string or list of strings, got {_describe(err.instance)}"
    return f"{where}: {err.message}"


def _validate(data: Any, schema: Dict[str, Any], path: Path) -> None:
    """The first defect of ``data`` against ``schema`` as one :class:`UserError` naming ``path``."""
    import jsonschema

    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        raise UserError(f"{path}: {_message(errors[0])}")


def load_rules_file(path: Path) -> List[Dict[str, Any]]:
    """A site's file of verification rules (the ``verify_rules`` setting): ``rules:``, a list of
    rows of the same shape as ``dedal.verify.rules``."""
    data = load_yaml(path)
    _validate(data if data is not None else {}, RULES_FILE_SCHEMA, path)
    return [dict(r) for r in data["rules"]]


def parse_env(data: Any, path: Path) -> EnvFile:
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping with a 'spack:' section, got {type(data).__name__}")
    _validate(data, ENV_SCHEMA, path)
    ded = data.get("dedal") or {}
    verify = dict(ded.get("verify") or {})
    apps = [AppCheck.from_json(a) for a in verify.pop("apps", [])]
    names = [a.name for a in apps]
    for i, app in enumerate(apps):
        if app.name in names[:i]:
            raise UserError(f"{path}: dedal.verify.apps.{i}.name: {app.name!r} is used twice")
        problem = app_problem(app)
        if problem:
            raise UserError(f"{path}: dedal.verify.apps.{i}.{problem}")
    for key in ("base_image", "runtime_base"):  # unknown: said now, not after fetch has written its work dir
        problem = unknown_base(ded[key]) if ded.get(key) else ""
        if problem:
            raise UserError(f"{path}: dedal.{key}: {problem}")
    lock = ded.get("lock")
    env = EnvFile(
        path=path,
        spack=data["spack"],
        name=ded.get("name") or path.resolve().parent.name,
        tag=ded.get("tag", "latest"),
        description=ded.get("description", ""),
        base_image=ded.get("base_image"),
        runtime_base=ded.get("runtime_base"),
        install_root=ded.get("install_root"),
        view=ded.get("view"),
        registry=ded.get("registry", ""),
        lock=(path.parent / lock).resolve() if lock else None,
        keep_build_deps=ded.get("keep_build_deps", False),
        rebuild=ded.get("rebuild", False),
        only=list(ded.get("only", [])),
        runscript=ded.get("runscript", ""),
        labels=dict(ded.get("labels", {})),
        verify=VerifySpec(**verify, apps=apps),
    )
    if env.lock and not env.lock.is_file():
        raise UserError(f"{path}: dedal.lock: {env.lock} does not exist")
    return env


def load_env(path: Path) -> EnvFile:
    path = Path(path)
    if path.is_dir():
        for name in ("env.yaml", "spack.yaml"):
            if (path / name).is_file():
                path = path / name
                break
    return parse_env(load_yaml(path), path)
