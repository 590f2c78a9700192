"""The build plan: every node of the DAG, what is external, cached or to build, and what
each build needs on its node. Written by ``dedal plan`` / ``dedal fetch`` as plan.json;
every later stage reads it instead of the lock.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Set

from dedal.model import durations
from dedal.errors import UserError
from dedal.model.artifacts import write_atomic
from dedal.model.env_defaults import DEFAULT_TAG
from dedal.model.inputs import load_json
from dedal.model.names import safe_name
from dedal.model.layers import LayerStore, layer_key
from dedal.model.spack_lock import SpackLock
from dedal.model.gcpause import collector_paused

PLAN_FORMAT = 1


@dataclass
class PlanNode:
    hash: str
    name: str
    version: str
    namespace: str
    external: bool
    build_only: bool
    runtime: bool  # in the link/run closure of the roots: goes into the image
    status: str  # external | cached | to_build | not_needed
    deps: Dict[str, List[str]] = field(default_factory=dict)  # child hash -> deptypes
    key: Optional[str] = None  # layer key (None for externals)
    external_path: Optional[str] = None
    estimate_s: float = 0.0
    measured: bool = False  # estimate_s is an earlier build's of this name and version

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}/{self.hash[:7]}"

    @property
    def prefix_name(self) -> str:
        return f"{self.name}-{self.version}-{self.hash}"


@dataclass(frozen=True)
class Plan:
    """Frozen: resolved once per command and handed to each stage as it is (a stage that
    needs another plan makes one with ``dataclasses.replace``)."""

    lockfile_version: int
    env_name: str
    tag: str
    install_root: str
    view: str
    base_image: str
    base_id: str
    lock_path: str
    lock_sha256: str
    spack_version: str
    spack_commit: str
    roots: List[str]
    root_specs: Dict[str, str]
    nodes: Dict[str, PlanNode]
    runtime_closure: List[str]
    build_only: List[str]
    to_build: List[str]
    cached: List[str]
    build_requirements: Dict[str, List[str]]
    waves: List[List[str]]
    critical_path: List[str] = field(default_factory=list)
    critical_path_s: float = 0.0
    layer_store: str = ""
    env_dir: str = ""  # where the Spack manifest (spack.yaml) and lock for the builds live
    runtime_base: str = ""  # the base the image is assembled on, where not base_image (keys stay base_id's)
    format: int = PLAN_FORMAT

    # -- JSON ----------------------------------------------------------------
    def to_json(self) -> dict:
        data = asdict(self)
        data["nodes"] = {h: asdict(n) for h, n in self.nodes.items()}
        return data

    @classmethod
    def from_json(cls, data: dict, where: str = "plan.json") -> "Plan":
        try:
            if data.get("format") != PLAN_FORMAT:
                raise UserError(
                    f"{where}: plan format {data.get('format')!r} is not {PLAN_FORMAT}; re-run `dedal plan`"
                )
            nodes = {h: PlanNode(**n) for h, n in data["nodes"].items()}
            fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "nodes"}
            plan = cls(nodes=nodes, **fields)
        except (KeyError, TypeError, AttributeError) as exc:
            raise UserError(f"{where}: not a dedal plan ({exc})") from None
        plan.check(where)
        return plan

    def check(self, where: str = "plan.json") -> None:
        """What later stages rely on: field types, names that become paths (env, tag, each
        prefix and layer key, one rule set: dedal.model.names), hashes that name nodes."""

        def expect(value: object, kind: object, what: str) -> None:
            if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):  # type: ignore[arg-type]
                shown = getattr(kind, "__name__", "number")
                raise UserError(f"{where}: {what}: expected {shown}, got {type(value).__name__}")

        for name in (
            "env_name",
            "tag",
            "install_root",
            "view",
            "base_image",
            "base_id",
            "lock_path",
            "lock_sha256",
            "spack_version",
            "spack_commit",
            "layer_store",
            "env_dir",
            "runtime_base",
        ):
            expect(getattr(self, name), str, name)
        safe_name(self.env_name, "env_name", where)
        safe_name(self.tag, "tag", where)
        for name in ("install_root", "view"):
            value = getattr(self, name)
            if not value.startswith("/") or ".." in value.split("/") or "\0" in value:
                raise UserError(f"{where}: {name} {value!r}: expected an absolute path without '..'")
        expect(self.critical_path_s, (int, float), "critical_path_s")  # type: ignore[arg-type]
        expect(self.root_specs, dict, "root_specs")
        expect(self.build_requirements, dict, "build_requirements")
        hash_lists = {
            "roots": self.roots,
            "runtime_closure": self.runtime_closure,
            "build_only": self.build_only,
            "to_build": self.to_build,
            "cached": self.cached,
            "critical_path": self.critical_path,
        }
        hash_lists.update({f"build_requirements[{h!r}]": v for h, v in self.build_requirements.items()})
        expect(self.waves, list, "waves")
        hash_lists.update({f"waves[{i}]": w for i, w in enumerate(self.waves)})
        for what, hashes in hash_lists.items():
            expect(hashes, list, what)
            unknown = [h for h in hashes if not isinstance(h, str) or h not in self.nodes]
            if unknown:
                raise UserError(f"{where}: {what} names {unknown[0]!r}, which is not a node of the plan")
        for h, node in self.nodes.items():
            label = f"nodes[{h[:12]!r}]"
            for name in ("hash", "name", "version", "namespace", "status"):
                expect(getattr(node, name), str, f"{label}.{name}")
            for name in ("external", "build_only", "runtime", "measured"):
                expect(getattr(node, name), bool, f"{label}.{name}")
            expect(node.estimate_s, (int, float), f"{label}.estimate_s")  # type: ignore[arg-type]
            if node.hash != h:
                raise UserError(f"{where}: {label} holds hash {node.hash!r}")
            safe_name(node.hash, f"{label} hash", where)
            safe_name(node.name, f"{label} package name", where)
            safe_name(node.version, f"{label} version", where)
            if node.key is not None:
                safe_name(node.key, f"{label} layer key", where)
            expect(node.deps, dict, f"{label}.deps")
            for child, types in node.deps.items():
                if child not in self.nodes or not isinstance(types, list):
                    raise UserError(f"{where}: {label}.deps names {child!r}, which is not a node of the plan")

    def write(self, path: Path) -> Path:
        """Write as ``path`` (a temporary name, then renamed); UserError for a path that
        cannot be a plan file (a directory, ``/``, a name too long, no permission)."""
        path = Path(path)
        if not path.name or path.is_dir():
            raise UserError(f"{path}: is a directory; give the plan's file name (e.g. {path / 'plan.json'})")
        try:
            write_atomic(path, json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")
        except OSError as exc:
            raise UserError(f"{path}: cannot write the plan ({exc.strerror or exc})") from None
        return path

    @classmethod
    def read(cls, path: Path) -> "Plan":
        if not Path(path).exists():
            raise UserError(f"{path}: no such plan")
        data = load_json(path)
        if not isinstance(data, dict):
            raise UserError(f"{path}: not a dedal plan")
        return cls.from_json(data, str(path))

    # -- queries -----------------------------------------------------------------
    def node(self, h: str) -> PlanNode:
        return self.nodes[h]

    def layer_keys(self, hashes: Optional[List[str]] = None) -> Dict[str, str]:
        sel = self.nodes if hashes is None else hashes
        return {h: self.nodes[h].key for h in sel if self.nodes[h].key}  # type: ignore[misc]

    def runtime_layers(self, keep_build_deps: bool = False) -> List[str]:
        """Non-external hashes whose layers make up the image, dependencies first."""
        wanted = set(self.runtime_closure)
        if keep_build_deps:
            wanted |= set(self.build_only)
        order = [h for wave in _levels(self, wanted) for h in wave]
        return [h for h in order if not self.nodes[h].external]

    def dependents(self) -> Dict[str, Set[str]]:
        """For each to-build hash, the to-build hashes whose build needs it."""
        result: Dict[str, Set[str]] = {h: set() for h in self.to_build}
        for h in self.to_build:
            for req in self.build_requirements.get(h, []):
                if req in result:
                    result[req].add(h)
        return result

    def counts(self) -> Dict[str, int]:
        statuses = [n.status for n in self.nodes.values()]
        return {
            "nodes": len(self.nodes),
            "external": statuses.count("external"),
            "cached": statuses.count("cached"),
            "to_build": statuses.count("to_build"),
            "not_needed": statuses.count("not_needed"),
            "build_only": len(self.build_only),
            "runtime": len(self.runtime_closure),
            "waves": len(self.waves),
        }


def _levels(plan: Plan, subset: Set[str]) -> List[List[str]]:
    level: Dict[str, int] = {}

    def visit(h: str, trail: Set[str]) -> int:
        if h in level:
            return level[h]
        deps = [c for c in plan.nodes[h].deps if c in subset]
        level[h] = 1 + max((visit(c, trail) for c in deps), default=-1)
        return level[h]

    for h in sorted(subset):
        visit(h, set())
    waves: List[List[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for h, lv in level.items():
        waves[lv].append(h)
    return [sorted(w, key=lambda x: (plan.nodes[x].name, x)) for w in waves]


@collector_paused()  # large locks (dedal.model.gcpause)
def make_plan(
    lock: SpackLock,
    *,
    env_name: str,
    install_root: str,
    base_image: str,
    base_id: str,
    view: str = "/opt/view",
    tag: str = DEFAULT_TAG,
    store: Optional[LayerStore] = None,
    measured: Optional[Mapping[tuple, float]] = None,
    runtime_base: str = "",
) -> Plan:
    """Derive the plan; a layer present in ``store`` counts as cached, and the build
    dependencies of a cached package are then not needed at all."""
    safe_name(env_name, "environment name")
    safe_name(tag, "tag")
    externals = lock.externals()
    runtime = lock.runtime_closure()
    reachable = lock.reachable()
    build_only = reachable - runtime  # lock.build_only(), without walking the DAG twice more
    keys = {h: layer_key(n.name, n.version, h, install_root, base_id) for h, n in lock.nodes.items() if not n.external}
    present = {h for h, k in keys.items() if store is not None and store.has(k)}
    requirements = {h: sorted(r) for h, r in lock.all_build_requirements(keys).items()}

    needed: Set[str] = set()
    queue = [h for h in runtime if h not in externals]
    while queue:
        h = queue.pop()
        if h in needed:
            continue
        needed.add(h)
        if h not in present:
            queue.extend(r for r in requirements[h] if r not in needed)
    to_build = needed - present
    estimates = durations.estimate(((h, n.name, n.version, n.external) for h, n in lock.nodes.items()), measured)

    nodes: Dict[str, PlanNode] = {}
    for h, n in lock.nodes.items():
        if n.external:
            status = "external"
        elif h in present:
            status = "cached"
        elif h in to_build:
            status = "to_build"
        else:
            status = "not_needed"
        nodes[h] = PlanNode(
            hash=h,
            name=n.name,
            version=n.version,
            namespace=n.namespace,
            external=n.external,
            build_only=h in build_only,
            runtime=h in runtime,
            status=status,
            deps={e.child: list(e.deptypes) for e in n.edges},
            key=keys.get(h),
            external_path=n.external_path,
            estimate_s=estimates[h],
            measured=not n.external and (n.name, n.version) in (measured or {}),
        )
    waves = lock.waves(to_build)
    cp_len, cp = lock.critical_path(estimates, to_build)
    # everything reachable is to be built (a first build without externals): the same waves
    order = [h for w in waves for h in w] if to_build == reachable else lock.topological_order(reachable)
    return Plan(
        lockfile_version=lock.lockfile_version,
        env_name=env_name,
        tag=tag,
        install_root=str(install_root),
        view=str(view),
        base_image=base_image,
        base_id=base_id,
        runtime_base=runtime_base if runtime_base != base_image else "",
        lock_path=str(lock.path or ""),
        lock_sha256=lock.sha256,
        spack_version=lock.spack_version,
        spack_commit=lock.spack_commit,
        roots=list(lock.roots),
        root_specs=dict(lock.root_specs),
        nodes=nodes,
        runtime_closure=[h for h in order if h in runtime],
        build_only=[h for h in order if h in build_only],
        to_build=[h for h in order if h in to_build],
        cached=[h for h in order if h in present],
        build_requirements=requirements,
        waves=waves,
        critical_path=cp,
        critical_path_s=cp_len,
        layer_store=str(store.root) if store else "",
    )
