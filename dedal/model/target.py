"""How a command's argument becomes a Target: pure resolution, nothing written.

Commands accept an environment file (or its directory), a ``spack.lock`` or a
``plan.json``; all resolve to a Target with the same fields, so every stage can be run
alone on the artifact of the stage before it. Spack's lock names no base image: a bare
lock's comes from the plan.json (or env.yaml) of the same environment next to it, else
from the setting ``base_image``, and :attr:`Target.base_source` says which. Writing the
work directory (spack.yaml, spack.lock, plan.json) is the stages' part:
:func:`dedal.stages.workspace.prepare`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from dedal.errors import UserError
from dedal.model import durations
from dedal.model.base import base_identity, runtime_base_name
from dedal.model.config import Settings
from dedal.model.env_defaults import DEFAULT_TAG
from dedal.model.envfile import EnvFile, load_env
from dedal.model.inputs import load_json
from dedal.model.names import name_problem
from dedal.model.layers import LayerStore
from dedal.model.plan import Plan, make_plan
from dedal.model.spack_env import minimal_manifest
from dedal.model.spack_lock import SpackLock, load_lock


@dataclass(frozen=True)
class Target:
    """What a command's argument names: the environment, its lock or its plan, and the
    settings; every value here is read, none is written (the stages write)."""

    settings: Settings
    name: str
    env: Optional[EnvFile] = None
    lock_path: Optional[Path] = None
    plan_path: Optional[Path] = None
    given_plan: Optional[Plan] = None
    # a bare lock's base image as recorded next to it (plan.json of `dedal fetch`, env.yaml), and that file
    lock_base: Optional[Tuple[str, str]] = None

    # -- effective image settings: a given plan fixes them; otherwise the environment
    # -- file wins over site defaults
    @property
    def install_root(self) -> str:
        if self.given_plan:
            return self.given_plan.install_root
        return (self.env.install_root if self.env and self.env.install_root else None) or str(
            self.settings.install_root
        )

    @property
    def view(self) -> str:
        if self.given_plan:
            return self.given_plan.view
        return (self.env.view if self.env and self.env.view else None) or str(self.settings.view)

    @property
    def base_image(self) -> str:
        if self.given_plan:
            return self.given_plan.base_image
        if self.env and self.env.base_image:
            return self.env.base_image
        return self.lock_base[0] if self.lock_base else self.settings.base_image

    @property
    def base_source(self) -> str:
        """Where :attr:`base_image` comes from: the plan, the environment file, the file next to a
        bare lock that records its base, else ``setting base_image`` (a lock alone does not say)."""
        if self.given_plan:
            return str(self.plan_path or "the plan")
        if self.env and self.env.base_image:
            return str(self.env.path)
        return self.lock_base[1] if self.lock_base else "setting base_image"

    @property
    def runtime_base(self) -> str:
        """The base the image is assembled on: the environment file's ``runtime_base`` (a
        known definition; UserError otherwise), else the build base."""
        if self.given_plan:
            return self.given_plan.runtime_base or self.given_plan.base_image
        return runtime_base_name(self.base_image, self.env.runtime_base if self.env else None)

    @property
    def tag(self) -> str:
        if self.given_plan:
            return self.given_plan.tag
        return self.env.tag if self.env else DEFAULT_TAG

    @property
    def workdir(self) -> Path:
        return Path(self.settings.work_dir) / self.name

    @property
    def store(self) -> LayerStore:
        return LayerStore(Path(self.settings.layer_store))

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    def find_lock(self) -> Path:
        """The lock to build from: given by the user, next to the env file, or fetched."""
        candidates = []
        if self.lock_path:
            candidates.append(self.lock_path)
        if self.given_plan and self.given_plan.lock_path:
            candidates.append(Path(self.given_plan.lock_path))
        if self.env:
            if self.env.lock:
                candidates.append(self.env.lock)
            candidates.append(self.env.directory / "spack.lock")
        candidates.append(self.workdir / "spack.lock")
        for c in candidates:
            if c.is_file():
                return c
        raise UserError(
            f"{self.name}: no spack.lock yet; run `dedal fetch {self.env.path if self.env else self.name}` "
            "(or put a spack.lock next to the environment file)"
        )

    def manifest(self, lock: Optional[SpackLock]) -> Dict[str, Any]:
        """The spack.yaml this target names: the environment file's, or for a bare lock one
        of the lock's root specs (``lock``: the lock, read already)."""
        if self.env is not None:
            return self.env.spack_yaml()
        if lock is None:
            raise ValueError(f"{self.name}: the manifest of a bare lock is made of the lock")
        return minimal_manifest(lock.root_specs)

    def read_lock(self) -> SpackLock:
        """The lock, parsed and checked against the environment file: once per command (the
        caller keeps it and passes it on)."""
        lock = load_lock(self.find_lock())
        if self.env is not None:
            check_lock_matches(self.env, lock)
        return lock

    def base_id(self) -> str:
        if self.given_plan:
            return self.given_plan.base_id
        return base_identity(self.base_image)

    def make_plan(self, lock: SpackLock, store: Optional[LayerStore] = None) -> Plan:
        """The plan of ``lock`` with this target's image settings, against ``store`` (the
        configured one by default) as it is now: pure, nothing written."""
        store = store if store is not None else self.store
        measured = durations.from_manifests(store.manifests()) if store.root.is_dir() else {}
        return make_plan(
            lock,
            env_name=self.name,
            install_root=self.install_root,
            base_image=self.base_image,
            base_id=self.base_id(),
            view=self.view,
            tag=self.tag,
            store=store,
            measured=measured,
            runtime_base=self.runtime_base,
        )

    def work_plan(self, lock: SpackLock) -> Plan:
        """The plan as :func:`dedal.stages.workspace.prepare` writes it: against today's store,
        naming the work directory and its copy of the lock (a given plan.json: its own
        environment directory). Pure: the checks before a stage's first write use it."""
        if self.given_plan is not None and self.plan_path is not None:
            return replace(self.make_plan(lock), env_dir=self.given_plan.env_dir)
        return replace(self.make_plan(lock), env_dir=str(self.workdir), lock_path=str(self.workdir / "spack.lock"))

    def plan(self) -> Plan:
        """A given plan.json as is; otherwise a fresh plan against the current store (the lock
        parsed here: for callers that only read)."""
        if self.given_plan:
            return self.given_plan
        return self.make_plan(self.read_lock())


_SPEC_TOKEN = re.compile(r"[+~][^\s+~^%]+|[^\s+~^%]+|[\^%][^\s+~^%]+")


def _spec_tokens(spec: str) -> frozenset:
    """An abstract spec as a set of tokens, so that Spack's own formatting in the lock
    ("openmpi@5+cuda fabrics=ucx") equals what the user wrote ("openmpi@5 fabrics=ucx +cuda")."""
    return frozenset(_SPEC_TOKEN.findall(spec))


def check_lock_matches(env: EnvFile, lock: SpackLock) -> None:
    """A lock concretized from other specs would build another environment: refuse it."""
    specs = env.spack.get("specs")
    if not isinstance(specs, list) or not all(isinstance(s, str) for s in specs):
        return  # matrices / definitions: Spack expands them; nothing simple to compare
    wanted = {_spec_tokens(s): s for s in specs}
    locked = {_spec_tokens(s): s for s in lock.root_specs.values()}
    if set(wanted) != set(locked):
        missing = sorted(wanted[k] for k in set(wanted) - set(locked))
        extra = sorted(locked[k] for k in set(locked) - set(wanted))
        parts = []
        if missing:
            parts.append(f"not in the lock: {', '.join(missing)}")
        if extra:
            parts.append(f"only in the lock: {', '.join(extra)}")
        raise UserError(
            f"{lock.describe()} does not match {env.path} ({'; '.join(parts)}); "
            "re-run `dedal fetch` to concretize again, or give the matching spack.lock"
        )


def _env_name(name: str, path: Path) -> str:
    """The environment name a lock's file name gives (``<name>.lock``, ``<name>/spack.lock``)."""
    if name_problem(name):
        raise UserError(
            f"{path}: the environment name {name!r} this file name gives cannot be used as a "
            f"directory name ({name_problem(name)}); rename the file to <name>.lock"
        )
    return name


def recorded_base(lock: Path, name: str) -> Optional[Tuple[str, str]]:
    """The base image a bare lock was concretized on, where a file of the same environment next
    to it records it: the plan.json `dedal fetch` writes beside its lock (naming this lock, or one
    with the same content), else an env.yaml (naming no other lock) that sets one. (base, file) or
    None; what cannot be read there is passed over: the lock is what was asked for."""
    plan_file, env_file = lock.parent / "plan.json", lock.parent / "env.yaml"
    if plan_file.is_file():
        try:
            plan = Plan.from_json(load_json(plan_file), str(plan_file))
            same = plan.lock_path and Path(plan.lock_path).is_file() and os.path.samefile(plan.lock_path, lock)
            if plan.env_name == name and (same or plan.lock_sha256 == load_lock(lock).sha256):
                return plan.base_image, str(plan_file)
        except (UserError, OSError, AttributeError):
            pass
    if env_file.is_file():
        try:
            env = load_env(env_file)
            if env.name == name and env.base_image and (env.lock is None or os.path.samefile(env.lock, lock)):
                return env.base_image, str(env_file)
        except (UserError, OSError):
            pass
    return None


def resolve(arg: str, settings: Settings) -> Target:
    path = Path(arg)
    try:
        path.stat()
    except FileNotFoundError:
        raise UserError(f"{arg}: no such file or directory") from None
    except (OSError, ValueError) as exc:  # a name too long, a NUL, no permission
        raise UserError(f"{arg[:200]}: cannot use ({getattr(exc, 'strerror', None) or exc})") from None
    if path.is_file() and (path.suffix == ".lock" or path.name.endswith("spack.lock")):
        name = path.resolve().parent.name if path.name == "spack.lock" else path.name.split(".")[0]
        name = _env_name(name, path)
        return Target(settings, name=name, lock_path=path.resolve(), lock_base=recorded_base(path.resolve(), name))
    if path.is_file() and path.suffix == ".json":
        data = load_json(path)
        if isinstance(data, dict) and "concrete_specs" in data:
            name = _env_name(path.name.split(".")[0], path)
            return Target(settings, name=name, lock_path=path.resolve(), lock_base=recorded_base(path.resolve(), name))
        plan = Plan.from_json(data, str(path)) if isinstance(data, dict) else None
        if plan is None:
            raise UserError(f"{path}: neither a plan nor a Spack lock")
        return Target(settings, name=plan.env_name, plan_path=path.resolve(), given_plan=plan)
    env = load_env(path)
    return Target(settings, name=env.name, env=env)
