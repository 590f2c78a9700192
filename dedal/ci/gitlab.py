"""GitLab CI for a repository of environments (``spack-envs/<name>/env.yaml``).

* :func:`select` decides which environments a pipeline builds: the ones named, all of
  them, or those a change touches (``git diff`` between two commits through the git
  adapter). An environment is touched by a change under its own directory or under
  a path its ``spack:`` section points at inside the repository (``repos:``,
  ``include:``, ``dedal.lock``), e.g. a package recipe in ``recipes/repo``.
* :func:`child_pipeline` writes the child pipeline that builds them: per environment
  the jobs ``<name>:fetch`` -> ``build`` -> ``assemble`` -> ``verify`` -> ``publish``
  chained by ``needs:``, each extending a template of ``ci/templates.yml`` (runner
  tags, scripts, artifacts, cache, retries live there, where sites adapt them), with
  ``resource_group: dedal-<name>``, the GPU verify template when the environment's
  ``dedal.verify.gpu`` is true, no verify job when ``dedal.verify.enabled`` is false,
  and a publish job that runs only on the default branch or a tag, and only where a
  registry is configured (the environment's ``dedal.registry`` or the CI variable
  ``DEDAL_REGISTRY``); for an environment with ``dedal.rebuild: true``, a rebuild job
  after it (stage ``rebuild``, in the pipeline only then) that rebuilds the published
  image from what it carries (``dedal rebuild``) and fails on any difference, the way
  distributions' rebuilders check packages. The output is deterministic: same inputs,
  same bytes.
* :func:`collect` copies a stage's small outputs (plan, lock, logs, layer manifests,
  image manifest and SBOM, verification reports) from the work directories into
  ``ci-artifacts/<name>/<stage>/`` for GitLab's ``artifacts:``, and after assembly
  writes ``image.env`` (``DEDAL_CI_IMAGE=...``) for the later jobs (dotenv report).

Per-environment facts reach the jobs as ``DEDAL_CI_*`` variables; paths and site
settings are dedal's own ``DEDAL_*`` settings, set as CI/CD variables (``ci/README.md``).
"""

from __future__ import annotations

import os
import posixpath
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

import yaml

from dedal.adapters import git as gitad
from dedal.errors import UserError
from dedal.model import artifacts, verify_report
from dedal.model.envfile import EnvFile, load_env, local_entry
from dedal.model.inputs import load_json, read_input
from dedal.model.plan import Plan
from dedal.model.target import Target

STAGES = ("fetch", "build", "assemble", "verify", "publish")
DEFAULT_ENVS_DIR = "spack-envs"
DEFAULT_TEMPLATES = "ci/templates.yml"
ARTIFACTS_DIR = "ci-artifacts"
ENV_FILE_NAMES = ("env.yaml", "spack.yaml")
IMAGE_DOTENV = "image.env"

# logs of the work directory by stage (the rest are the build's per-package/job logs)
_FETCH_LOGS = ("concretize.log", "list-sources.log", "mirror-create.log")
_FETCH_FILES = ("spack.yaml", "spack.lock", "plan.json")
_BUILD_FILES = ("plan.json", "slurm-jobs.json")


# --------------------------------------------------------------------------- environments


@dataclass
class CiEnv:
    """What the pipeline needs to know about one environment."""

    name: str
    env_file: str  # relative to the repository root, '/'-separated
    directory: str  # idem
    tag: str
    registry: str  # the environment's own oras:// repository ('' = $DEDAL_REGISTRY/<name>)
    verify: bool
    gpu: bool
    verify_nodes: int
    rebuild: bool = False
    watched: List[str] = field(default_factory=list)  # repository paths whose changes touch it

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class Selection:
    envs: List[CiEnv]
    reason: str  # one line: why these environments
    changes: Dict[str, List[str]] = field(default_factory=dict)  # env name -> changed paths touching it
    note: str = ""  # a warning worth showing (e.g. fell back to all)

    def to_json(self) -> Dict[str, Any]:
        return {
            "environments": [e.to_json() for e in self.envs],
            "reason": self.reason,
            "changes": self.changes,
            "note": self.note,
        }


def _rel(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise UserError(f"{path}: not inside the repository {root} (CI jobs only see the repository)") from None


def _env_file_in(directory: Path) -> Optional[Path]:
    for name in ENV_FILE_NAMES:
        if (directory / name).is_file():
            return directory / name
    return None


def env_dirs(root: Path, envs_dir: str = DEFAULT_ENVS_DIR) -> List[Path]:
    """Directories under ``root/envs_dir`` holding an env.yaml or spack.yaml (not those
    nested inside another environment's directory), sorted."""
    base = root / envs_dir
    if not base.is_dir():
        raise UserError(f"{base}: no such directory (the environments; see --envs-dir)")
    found: List[Path] = []
    for dirpath, dirnames, _files in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        here = Path(dirpath)
        if here != base and _env_file_in(here):
            found.append(here)
            dirnames[:] = []  # an environment's subdirectories are its own (includes, ...)
    return sorted(found)


def watched_paths(root: Path, env_file: Path) -> List[str]:
    """Repository paths whose changes touch the environment: its directory, and what its
    ``spack:`` section (``repos:``, ``include:``) and ``dedal.lock`` point at inside the
    repository. Read leniently: a file that does not parse still watches its directory."""
    directory = env_file.parent
    watched = {_rel(directory, root)}
    try:
        data = yaml.safe_load(read_input(env_file))
    except (UserError, yaml.YAMLError):
        data = None
    entries: List[Any] = []
    if isinstance(data, dict):
        spack = data.get("spack")
        if isinstance(spack, dict):
            for key in ("repos", "include"):
                value = spack.get(key)
                if isinstance(value, list):
                    entries.extend(value)
        ded = data.get("dedal")
        if isinstance(ded, dict) and isinstance(ded.get("lock"), str):
            entries.append(ded["lock"])
    for entry in entries:
        if isinstance(entry, dict):  # include: [{path: ...}]
            entry = entry.get("path")
        target = local_entry(entry, directory)
        if target is None:  # Spack's own ($spack/...), ~, a URL
            continue
        try:
            watched.add(target.resolve().relative_to(root.resolve()).as_posix())
        except ValueError:
            continue  # outside the repository: not ours to watch
    return sorted(watched)


def describe(root: Path, env_file: Path) -> CiEnv:
    """Load (and validate) one environment file; bad input is a UserError naming it."""
    env: EnvFile = load_env(env_file)
    return CiEnv(
        name=env.name,
        env_file=_rel(env.path, root),
        directory=_rel(env.directory, root),
        tag=env.tag,
        registry=env.registry,
        verify=env.verify.enabled,
        gpu=env.verify.gpu,
        verify_nodes=env.verify.nodes,
        rebuild=env.rebuild,
        watched=watched_paths(root, env.path),
    )


def _touches(changed: str, watched: Iterable[str]) -> bool:
    return any(w in ("", ".") or changed == w or changed.startswith(w.rstrip("/") + "/") for w in watched)


def affected(changed: Sequence[str], watched: Dict[str, List[str]]) -> Dict[str, List[str]]:
    """{key: the changed paths that touch it} for every key whose watched paths a change touches."""
    result: Dict[str, List[str]] = {}
    for key, paths in watched.items():
        hits = [c for c in changed if _touches(c, paths)]
        if hits:
            result[key] = hits
    return result


def select(
    root: Path,
    *,
    envs: Sequence[str] = (),
    envs_dir: str = DEFAULT_ENVS_DIR,
    changed_since: Optional[str] = None,
    all_envs: bool = False,
) -> Selection:
    """The environments a pipeline builds.

    ``envs`` (paths of environment files or directories) restrict the candidates (default:
    every environment under ``envs_dir``); ``all_envs`` takes every candidate;
    ``changed_since`` (a commit) keeps those touched by ``git diff since HEAD``. When that
    commit is unknown (empty, all zeros as GitLab gives for a new branch, or outside a
    shallow clone) every candidate is taken and ``note`` says why."""
    if all_envs and changed_since is not None:
        raise UserError("--all and --changed-since exclude each other")
    root = Path(root)
    if envs:
        files = []
        for arg in envs:
            p = Path(arg)
            if not p.is_absolute() and not p.exists() and (root / p).exists():
                p = root / p
            f = _env_file_in(p) if p.is_dir() else p
            if f is None or not f.is_file():
                raise UserError(f"{arg}: no env.yaml or spack.yaml there")
            files.append(f)
    else:
        files = [_env_file_in(d) for d in env_dirs(root, envs_dir)]
    candidates = {_rel(f.parent, root): f for f in files}

    changes: Dict[str, List[str]] = {}
    note = ""
    if changed_since is None and not all_envs and not envs:
        raise UserError("say which environments: ENV..., --all, or --changed-since REF")
    if changed_since is not None:
        changed = gitad.changed_paths(root, changed_since)
        if changed is None:
            shown = changed_since[:12] if changed_since and set(changed_since) != {"0"} else (changed_since or "''")
            note = (
                f"{shown} is not a commit of this clone (a new branch, a first push, or a shallow clone): "
                "taking every environment"
            )
            reason = f"every environment ({shown} unknown)"
            chosen = sorted(candidates)
        else:
            watched = {d: watched_paths(root, f) for d, f in candidates.items()}
            hits = affected(changed, watched)
            chosen = sorted(hits)
            changes = {d: hits[d] for d in chosen}
            reason = f"changed since {changed_since[:12]}"
    else:
        chosen = sorted(candidates)
        reason = "every environment (--all)" if all_envs else "named on the command line"
    selected = [describe(root, candidates[d]) for d in chosen]
    by_name: Dict[str, str] = {}
    for e in selected:
        if e.name in by_name:
            raise UserError(
                f"{by_name[e.name]} and {e.env_file} are both named {e.name!r} (dedal.name): "
                "their jobs, images and registry repositories would clash"
            )
        by_name[e.name] = e.env_file
    return Selection(selected, reason, {e.name: changes[e.directory] for e in selected if e.directory in changes}, note)


# --------------------------------------------------------------------------- the child pipeline


def _job_vars(env: CiEnv) -> Dict[str, str]:
    return {"DEDAL_CI_ENV": env.name, "DEDAL_CI_ENV_FILE": env.env_file, "DEDAL_CI_IMAGE_TAG": env.tag}


def env_jobs(env: CiEnv) -> Dict[str, Dict[str, Any]]:
    """The jobs of one environment, in pipeline order."""
    group = f"dedal-{env.name}"
    jobs: Dict[str, Dict[str, Any]] = {}

    def job(
        stage: str, template: str, needs: List[str], extra_vars: Optional[Dict[str, str]] = None, **more: Any
    ) -> str:
        name = f"{env.name}:{stage}"
        variables = _job_vars(env)
        variables.update(extra_vars or {})
        body: Dict[str, Any] = {"extends": template, "stage": stage}
        if needs:
            body["needs"] = list(needs)
        body["variables"] = variables
        body["resource_group"] = group
        body.update(more)
        jobs[name] = body
        return name

    fetch = job("fetch", ".dedal-fetch", [])
    build = job("build", ".dedal-build", [fetch])
    assemble = job("assemble", ".dedal-assemble", [build])
    last = [assemble]
    if env.verify:
        verify = job(
            "verify",
            ".dedal-verify-gpu" if env.gpu else ".dedal-verify",
            [assemble],
            {"DEDAL_CI_VERIFY_NODES": str(env.verify_nodes), "DEDAL_CI_VERIFY_GPU": str(env.gpu).lower()},
        )
        last.append(verify)
    publish_vars = {"DEDAL_CI_REGISTRY_REPO": env.registry} if env.registry else {}
    when_registry = "" if env.registry else "$DEDAL_REGISTRY && "
    rules = [
        {"if": f"{when_registry}$CI_COMMIT_TAG"},
        {"if": f"{when_registry}$CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH"},
    ]
    publish = job("publish", ".dedal-publish", last, publish_vars, rules=rules)
    if env.rebuild:
        job("rebuild", ".dedal-rebuild", [publish], publish_vars, rules=rules)
    return jobs


def child_pipeline(selection: Selection, templates: str = DEFAULT_TEMPLATES) -> Dict[str, Any]:
    """The child pipeline (a dict in GitLab's YAML shape) for the selected environments."""
    stages = list(STAGES) + (["rebuild"] if any(e.rebuild for e in selection.envs) else [])
    doc: Dict[str, Any] = {"include": [{"local": templates}], "stages": stages}
    if not selection.envs:
        doc["dedal-nothing-to-build"] = {"extends": ".dedal-nothing", "stage": "fetch"}
        return doc
    for env in selection.envs:
        doc.update(env_jobs(env))
    return doc


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # every job spelled out, no &id001
        return True

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> Any:
        return super().increase_indent(flow, False)  # lists indented under their key


def _dump(data: Dict[str, Any]) -> str:
    """Top-level keys one block each, separated by a blank line."""
    return "\n".join(
        yaml.dump({k: v}, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000, allow_unicode=True)
        for k, v in data.items()
    )


def render(selection: Selection, templates: str = DEFAULT_TEMPLATES, command: str = "dedal ci generate") -> str:
    """The child pipeline as YAML text, with a header saying what made it and why."""
    lines = [
        f"# Generated by `{command}`; do not edit: every pipeline generates it again.",
        "# The jobs extend the templates in " + templates + " (runner tags, scripts, artifacts).",
        f"# Environments: {selection.reason}",
    ]
    for env in selection.envs:
        touched = selection.changes.get(env.name)
        lines.append(
            f"#   {env.name}: {env.env_file}"
            + (f" ({', '.join(touched[:5])}" + (", ..." if len(touched) > 5 else "") + ")" if touched else "")
        )
    if not selection.envs:
        lines.append("#   (none)")
    if selection.note:
        lines.append(f"# Note: {selection.note}")
    return "\n".join(lines) + "\n\n" + _dump(child_pipeline(selection, templates))


def write_atomic(path: Path, text: str) -> None:
    artifacts.write_atomic(path, text)


# --------------------------------------------------------------------------- artifacts


@dataclass
class Collected:
    stage: str
    env: str
    directory: str
    files: List[str] = field(default_factory=list)  # relative to directory
    missing: List[str] = field(default_factory=list)  # what was looked for and not there (and why)
    image: str = ""  # assemble: the SIF path written to image.env

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def _plan_of(target: Target) -> Plan:
    path = target.workdir / "plan.json"
    if path.is_file():
        try:
            return Plan.from_json(load_json(path), str(path))
        except (ValueError, UserError):
            pass
    return target.plan()


def image_path(target: Target) -> Path:
    """Where ``dedal assemble ENV`` (no -o) writes the environment's SIF."""
    # the assemble stage (its adapters, the registry client) only for `dedal ci collect`, not for generate
    from dedal.stages.assemble import image_paths, select_packages

    plan = _plan_of(target)
    env = target.env
    only = list(env.only) if env is not None and env.only else None
    keep = bool(env.keep_build_deps) if env is not None else False
    roots, _hashes = select_packages(plan, only, keep)
    only_names = [plan.nodes[h].name for h in roots] if only else []
    return image_paths(target.settings, plan, None, only_names)[0]


def _report_dirs(reports_dir: Path, name: str, tag: str, image: Optional[Path]) -> List[Path]:
    """Verification report directories of this image under ``reports_dir``: named after
    the image (``<name>``, ``<name>-<tag>``, ``<name>/<tag>``, the SIF's stem), or whose
    verify.json names the image."""
    if not reports_dir.is_dir():
        return []
    names = {name, f"{name}-{tag}", f"{name}_{tag}", f"{name}/{tag}"}
    if image is not None:
        names.add(image.stem)
        names.add(f"{name}/{image.stem}")
    found = []
    for cand in sorted(reports_dir.glob("*/verify.json")) + sorted(reports_dir.glob("*/*/verify.json")):
        d = cand.parent
        rel = d.relative_to(reports_dir).as_posix()
        hit = rel in names
        if not hit and image is not None:
            try:
                ref = verify_report.load(cand).image
            except UserError:
                ref = ""
            hit = bool(ref) and (ref == str(image) or posixpath.basename(ref) == image.name)
        if hit and d not in found:
            found.append(d)
    return found


def collect(stage: str, target: Target, directory: Optional[Path] = None, dotenv: Optional[Path] = None) -> Collected:
    """Copy the small outputs of ``stage`` for ``target`` into ``directory`` (default
    ``ci-artifacts/<name>/<stage>``; each file written under a temporary name and renamed,
    other files there are left alone). What is not there (a stage that failed early) is
    listed in ``missing``, never an error. After assemble, ``image.env`` is also written to
    ``dotenv`` when given (a fixed path for GitLab's ``artifacts:reports:dotenv``)."""
    if stage not in STAGES:
        raise UserError(f"unknown stage {stage!r} (one of {', '.join(STAGES)})")
    dest = Path(directory) if directory else Path(ARTIFACTS_DIR) / target.name / stage
    result = Collected(stage, target.name, str(dest))
    work = target.workdir
    logs = work / "logs"
    dest.mkdir(parents=True, exist_ok=True)

    def take(src: Path, rel: str) -> None:
        if src.is_file():
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            with artifacts.atomic_path(out) as tmp:
                shutil.copy2(src, tmp)
            result.files.append(rel)
        else:
            result.missing.append(str(src))

    def stage_logs(keep) -> None:  # noqa: ANN001
        if logs.is_dir():
            for log in sorted(p for p in logs.iterdir() if p.is_file() and keep(p.name)):
                take(log, f"logs/{log.name}")

    if stage == "fetch":
        for name in _FETCH_FILES:
            take(work / name, name)
        stage_logs(lambda n: n in _FETCH_LOGS)
    elif stage == "build":
        for name in _BUILD_FILES:
            if (work / name).is_file() or name == "plan.json":
                take(work / name, name)
        if (work / "jobs").is_dir():
            for res in sorted((work / "jobs").glob("*.json")):
                take(res, f"jobs/{res.name}")
        stage_logs(lambda n: n not in _FETCH_LOGS and not n.startswith("assemble-"))
        try:
            plan = _plan_of(target)
        except UserError as exc:
            result.missing.append(f"layer manifests ({exc.one_line()})")
        else:
            store = target.store
            for h in sorted(plan.nodes, key=lambda h: (plan.nodes[h].name, h)):
                key = plan.nodes[h].key
                if key:
                    take(store.manifest_path(key), f"layers/{key}.json")
    elif stage == "assemble":
        stage_logs(lambda n: n.startswith("assemble-"))
        try:
            sif = image_path(target)
        except UserError as exc:
            result.missing.append(f"image ({exc.one_line()})")
        else:
            stem = sif.name[:-4]
            take(sif.with_name(f"{stem}.image.json"), "image.json")
            take(sif.with_name(f"{stem}.sbom.cdx.json"), "sbom.cdx.json")
            if sif.is_file():
                write_atomic(dest / IMAGE_DOTENV, f"DEDAL_CI_IMAGE={sif}\n")
                result.files.append(IMAGE_DOTENV)
                if dotenv is not None:
                    write_atomic(Path(dotenv), f"DEDAL_CI_IMAGE={sif}\n")
                result.image = str(sif)
            else:
                result.missing.append(str(sif))
    elif stage == "verify":
        sif: Optional[Path]
        try:
            sif = image_path(target)
        except UserError:
            sif = None
        reports_dir = Path(target.settings.reports_dir)
        dirs = _report_dirs(reports_dir, target.name, target.tag, sif)
        if not dirs:
            result.missing.append(f"a verification report of {target.name} under {reports_dir}")
        for i, d in enumerate(dirs):
            sub = "report" if len(dirs) == 1 else f"report-{i + 1}"
            for f in sorted(p for p in d.rglob("*") if p.is_file()):
                take(f, f"{sub}/{f.relative_to(d).as_posix()}")
    # publish: the job writes publish.json there itself (dedal publish --json)
    result.files.sort()
    return result
