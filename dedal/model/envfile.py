"""The environment file: a Spack environment (``spack:``, passed to Spack untouched)
plus an optional ``dedal:`` section describing the image.

Checked against ``dedal/data/schema/env.schema.json`` (:mod:`dedal.model.schema`), which also
holds every default: each mistake is one precise line (``env.yaml: dedal.verify.repetitions:
expected integer, got 'five'``), and all of them are said at once.
"""

from __future__ import annotations

import copy
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from dedal.errors import UserError
from dedal.model.artifacts import write_atomic
from dedal.model.base import unknown_base
from dedal.model.inputs import load_yaml
from dedal.model import env_defaults
from dedal.model.env_defaults import (  # the schema's defaults: the dataclasses below take them
    DEFAULT_APP_OVERHEAD_PCT,
    DEFAULT_LAUNCHER,
    DEFAULT_NODES,
    DEFAULT_RANKS,
    DEFAULT_REPETITIONS,
    DEFAULT_TAG,
    ENV_SCHEMA,
    ENV_VALIDATOR,
)
from dedal.model.schema import Validator, describe

# a site's file of verification rules: ``rules:``, rows of the same shape as dedal.verify.rules
RULES_FILE_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["rules"],
    "properties": {"rules": {"type": "array", "items": {"$ref": "#/definitions/rule"}}},
    "definitions": ENV_SCHEMA["definitions"],
}


@dataclass
class AppMetric:
    """What makes an application check a benchmark: the number its output carries (``match``,
    a regular expression whose group ``value`` captures it, e.g. ``time to solution:
    (?P<value>[0-9.]+) s``), its unit, which way is better, and how much worse the container
    may be than native (``overhead_pct``, judged on the medians of ``repetitions`` runs per
    side; None: the verification's repetitions)."""

    match: str
    unit: str
    better: str = env_defaults.METRIC["better"]
    overhead_pct: float = DEFAULT_APP_OVERHEAD_PCT
    repetitions: Optional[int] = None

    @property
    def higher_is_better(self) -> bool:
        return self.better == "higher"

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "AppMetric":
        """From the metric of a checked file (its defaults filled in)."""
        reps = data.get("repetitions")
        return cls(
            match=data["match"],
            unit=data["unit"],
            better=data["better"],
            overhead_pct=float(data["overhead_pct"]),
            repetitions=int(reps) if reps is not None else None,
        )

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class AppReference:
    """A file every run must write (``output``, relative to the run's working directory) with
    the lines of ``expected`` (a file in the image), in any order: a spike raster written by
    several ranks in whatever order they finish, against the reference raster."""

    output: str
    expected: str

    def to_json(self) -> Dict[str, Any]:
        return {"output": self.output, "expected": self.expected}


#: the check of the image's own `apptainer test`, which every verification runs (verify/apps.OWN_TEST)
OWN_TEST_NAME = "apptainer-test"


@dataclass
class AppCheck:
    """An application run in the image on its ranks, as users will run it (``srun --mpi=pmix``
    or the image's ``mpirun``): the benchmarks say the MPI stack is fast, this says the
    application actually starts, talks MPI and computes. Passes on exit 0 with ``expect``
    (a regular expression) found in its output.

    With a ``metric`` it is an application benchmark: run natively and in the container,
    interleaved, and compared (:mod:`dedal.stages.verify.appbench`); then a group ``value`` in
    ``expect`` must capture the same text in every run of both sides (a spike count), and a
    ``reference`` file is checked after every run. With ``gpu`` it needs a GPU per rank (a CUDA
    build such as Arbor's finds its device at start-up and stops without one): where no GPU is
    usable it is reported as a skipped GPU check, never run."""

    name: str
    command: List[str]  # a string in the file runs as ``/bin/sh -c STRING``
    ranks: int = env_defaults.APP["ranks"]
    nodes: int = env_defaults.APP["nodes"]
    expect: str = env_defaults.APP["expect"]
    timeout: float = env_defaults.APP["timeout"]
    env: Dict[str, str] = field(default_factory=dict)
    metric: Optional[AppMetric] = None
    reference: Optional[AppReference] = None
    gpu: bool = env_defaults.APP["gpu"]  # skipped where no GPU is usable (a CUDA build that needs the driver)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "AppCheck":
        """From an app of a checked file (its defaults filled in)."""
        command = data["command"]
        ref = data.get("reference")
        return cls(
            name=data["name"],
            command=["/bin/sh", "-c", command] if isinstance(command, str) else list(command),
            ranks=int(data["ranks"]),
            nodes=int(data["nodes"]),
            expect=data["expect"],
            timeout=float(data["timeout"]),
            env=dict(data["env"]),
            metric=AppMetric.from_json(data["metric"]) if data.get("metric") else None,
            reference=AppReference(ref["output"], ref["expected"]) if ref else None,
            gpu=bool(data.get("gpu", env_defaults.APP["gpu"])),
        )

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "name": self.name,
            "command": list(self.command),
            "ranks": self.ranks,
            "nodes": self.nodes,
            "expect": self.expect,
            "timeout": self.timeout,
            "env": dict(self.env),
        }
        # only where set: an app check's form (and the settings digest of its reports) stays as it was
        if self.metric is not None:
            out["metric"] = self.metric.to_json()
        if self.reference is not None:
            out["reference"] = self.reference.to_json()
        if self.gpu:
            out["gpu"] = True
        return out


@dataclass
class VerifySpec:
    """The ``dedal.verify`` section; its defaults are the schema's."""

    enabled: bool = env_defaults.VERIFY["enabled"]
    ranks: int = DEFAULT_RANKS
    nodes: int = DEFAULT_NODES
    repetitions: int = DEFAULT_REPETITIONS
    launcher: str = DEFAULT_LAUNCHER
    benchmarks: List[str] = field(default_factory=list)
    gpu: bool = env_defaults.VERIFY["gpu"]
    env: Dict[str, str] = field(default_factory=dict)
    thresholds: Dict[str, float] = field(default_factory=dict)
    apps: List[AppCheck] = field(default_factory=list)
    rules: List[Dict[str, Any]] = field(default_factory=list)  # the site's rule rows, as written


@dataclass
class EnvFile:
    path: Path
    spack: Dict[str, Any]
    name: str
    tag: str = DEFAULT_TAG
    description: str = env_defaults.DEDAL["description"]
    base_image: Optional[str] = None
    runtime_base: Optional[str] = None  # assemble on this base instead of base_image (layers stay keyed on it)
    install_root: Optional[str] = None
    view: Optional[str] = None
    registry: str = env_defaults.DEDAL["registry"]
    lock: Optional[Path] = None
    keep_build_deps: bool = env_defaults.DEDAL["keep_build_deps"]
    rebuild: bool = env_defaults.DEDAL[
        "rebuild"
    ]  # CI: rebuild the published image (dedal rebuild) and fail on a difference
    only: List[str] = field(default_factory=list)
    runscript: str = env_defaults.DEDAL["runscript"]
    help: str = env_defaults.DEDAL["help"]  # apptainer run-help: printed before dedal's text
    test: str = env_defaults.DEDAL["test"]  # apptainer test: run after dedal's checks
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
        local = local_entry(entry, self.directory)
        return str(local) if local is not None else entry

    def write_spack_yaml(self, directory: Path) -> Path:
        return write_atomic(directory / "spack.yaml", yaml.safe_dump(self.spack_yaml(), sort_keys=False))


def local_entry(entry: Any, directory: Path) -> Optional[Path]:
    """The path on this machine of a ``spack.include`` or ``spack.repos`` entry, a relative one
    taken from ``directory`` (the environment file's folder, as Spack takes it); None for what
    Spack resolves itself (``$spack/...``, ``~``, a URL) or what is not a path."""
    if not isinstance(entry, str) or not entry or entry.startswith(("$", "~")) or "://" in entry:
        return None
    return Path(entry) if entry.startswith("/") else (directory / entry).resolve()


def missing_local_inputs(spack: Dict[str, Any], directory: Path) -> List[str]:
    """The package repositories and included files the manifest names on this machine that are
    not there, a problem each. dedal binds them into the sandbox Spack runs in: one that is
    missing (an environment copied out of its checkout, its ``../../recipes/repo`` gone) made
    Spack concretize for half a minute and then say only that a package was not found."""
    problems: List[str] = []
    for key in ("repos", "include"):
        entries = spack.get(key)
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            local = local_entry(entry, directory)
            if local is None:
                continue
            where = (
                "" if entry == str(local) else f" ({local}: a relative path starts at the environment file's folder)"
            )
            if not local.exists():
                problems.append(f"spack.{key}.{i}: {entry} does not exist{where}")
            elif key == "repos" and not (local / "repo.yaml").is_file():
                problems.append(f"spack.{key}.{i}: {entry} is not a Spack package repository (no repo.yaml){where}")
    return problems


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
        return (
            f"metric.match: needs a group named value that captures the number (e.g. 'time: "
            f"(?P<value>[0-9.]+) s'), got {describe(app.metric.match)}"
        )
    return ""


def _refuse(path: Path, problems: List[str]) -> None:
    """Every problem of the file ``path`` in one :class:`UserError`: ``FILE: PROBLEM`` for one,
    else ``FILE: N problems:`` and a line each, ``;`` between them (``one_line`` joins the lines
    for the terminal: ``FILE: 2 problems: dedal.tag: ...; dedal.verify.ranks: ...``)."""
    if len(problems) == 1:
        raise UserError(f"{path}: {problems[0]}")
    if problems:
        raise UserError(f"{path}: {len(problems)} problems:\n" + ";\n".join(f"  {p}" for p in problems))


def _validate(data: Any, validator: Validator, path: Path) -> Any:
    """``data`` with the schema's defaults filled in; every defect at once as one :class:`UserError`."""
    filled, problems = validator.fill_and_check(data)
    _refuse(path, problems)
    return filled


def load_rules_file(path: Path) -> List[Dict[str, Any]]:
    """A site's file of verification rules (the ``verify_rules`` setting): ``rules:``, a list of
    rows of the same shape as ``dedal.verify.rules``."""
    data = load_yaml(path)
    data = _validate(data if data is not None else {}, Validator(RULES_FILE_SCHEMA), path)
    return [dict(r) for r in data["rules"]]


def parse_env(data: Any, path: Path) -> EnvFile:
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping with a 'spack:' section, got {type(data).__name__}")
    data = _validate(data, ENV_VALIDATOR, path)
    ded = data["dedal"]
    verify = dict(ded["verify"])
    apps = [AppCheck.from_json(a) for a in verify.pop("apps")]
    problems: List[str] = []
    names = [a.name for a in apps]
    for i, app in enumerate(apps):
        if app.name in names[:i]:
            problems.append(f"dedal.verify.apps.{i}.name: {app.name!r} is used twice")
        elif app.name == OWN_TEST_NAME:
            problems.append(
                f"dedal.verify.apps.{i}.name: {app.name!r} is the image's own test, which verification runs"
            )
        problem = app_problem(app)
        if problem:
            problems.append(f"dedal.verify.apps.{i}.{problem}")
    if verify["launcher"] == "mpirun" and verify["nodes"] > 1:  # mpirun starts ranks on this node only
        problems.append(f"dedal.verify.nodes: {verify['nodes']} nodes need the srun launcher, not mpirun")
    for key in ("base_image", "runtime_base"):  # unknown: said now, not after fetch has written its work dir
        problem = unknown_base(ded[key]) if ded.get(key) else ""
        if problem:
            problems.append(f"dedal.{key}: {problem}")
    lock = (path.parent / ded["lock"]).resolve() if ded.get("lock") else None
    if lock is not None and not lock.is_file():
        problems.append(f"dedal.lock: {lock} does not exist")
    problems.extend(missing_local_inputs(data["spack"], path.parent))
    _refuse(path, problems)
    return EnvFile(
        path=path,
        spack=data["spack"],
        name=ded.get("name") or path.resolve().parent.name,
        tag=ded["tag"],
        description=ded["description"],
        base_image=ded.get("base_image"),
        runtime_base=ded.get("runtime_base"),
        install_root=ded.get("install_root"),
        view=ded.get("view"),
        registry=ded["registry"],
        lock=lock,
        keep_build_deps=ded["keep_build_deps"],
        rebuild=ded["rebuild"],
        only=list(ded["only"]),
        runscript=ded["runscript"],
        help=ded["help"],
        test=ded["test"],
        labels=dict(ded["labels"]),
        verify=VerifySpec(**verify, apps=apps),
    )


def load_env(path: Path) -> EnvFile:
    path = Path(path)
    if path.is_dir():
        for name in ("env.yaml", "spack.yaml"):
            if (path / name).is_file():
                path = path / name
                break
    return parse_env(load_yaml(path), path)
