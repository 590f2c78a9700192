"""The Spack lock model: parse spack.lock (lockfile versions 4 to 7) into a DAG.

Pure Python, no Spack needed: the planner, the scheduler and the assembler all work on
this model. The derived sets follow Spack's own rules (``../shared/notes/spack-offline.md``):

* runtime closure: link/run closure of the roots, what a view and an image contain;
* build-only: nodes reachable from the roots only through a ``build`` edge;
* build requirements of a node: its direct dependencies of every type plus the link/run
  closure of each of those (``installer.py``: an installed dependency contributes only
  LINK|RUN; build dependencies of dependencies are not needed).
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, Mapping, NamedTuple, Optional, Set, Tuple

from dedal.errors import UserError
from dedal.model.gcpause import collector_paused
from dedal.model.inputs import parse_json, read_input
from dedal.model.names import safe_name

SUPPORTED_LOCKFILE_VERSIONS = (4, 5, 6, 7)
DEPTYPES = ("build", "link", "run", "test")
RUNTIME_DEPTYPES = frozenset(("link", "run"))


class Edge(NamedTuple):
    """An edge of the lock, immutable: a named tuple, made three times faster than a frozen
    dataclass (a lock of 10,000 specs has 73,000 edges)."""

    child: str  # DAG hash of the dependency
    name: str
    deptypes: Tuple[str, ...]
    virtuals: Tuple[str, ...] = ()

    @property
    def runtime(self) -> bool:
        return bool(RUNTIME_DEPTYPES.intersection(self.deptypes))


@dataclass
class Node:
    hash: str
    name: str
    version: str
    namespace: str = "builtin"
    external: bool = False
    external_path: Optional[str] = None
    target: str = ""
    platform_os: str = ""
    edges: List[Edge] = field(default_factory=list)
    raw: dict = field(default_factory=dict, repr=False)  # the node dict exactly as in the lock

    @property
    def short(self) -> str:
        return self.hash[:7]

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}/{self.short}"

    @property
    def prefix_name(self) -> str:
        """Directory name under the install root (projection ``{name}-{version}-{hash}``)."""
        return f"{self.name}-{self.version}-{self.hash}"


@dataclass
class SpackLock:
    path: Optional[Path]
    lockfile_version: int
    specfile_version: Optional[int]
    spack_version: str
    spack_commit: str
    roots: List[str]
    root_specs: Dict[str, str]
    nodes: Dict[str, Node]
    sha256: str

    # -- basic graph queries -------------------------------------------------
    def node(self, hash_or_prefix: str) -> Node:
        key = hash_or_prefix.lstrip("/")
        if key in self.nodes:
            return self.nodes[key]
        matches = [h for h in self.nodes if h.startswith(key)] if len(key) >= 4 else []
        if len(matches) == 1:
            return self.nodes[matches[0]]
        raise UserError(f"no unique node with hash {hash_or_prefix!r} in {self.describe()}")

    def describe(self) -> str:
        return str(self.path) if self.path else "the lock"

    def children(self, h: str, deptypes: Optional[Iterable[str]] = None) -> List[str]:
        if deptypes is None:
            return list(self._kids("all")[h])
        want = set(deptypes)
        return [e.child for e in self.nodes[h].edges if want.intersection(e.deptypes)]

    def _kids(self, kind: str) -> Dict[str, Tuple[str, ...]]:
        """Each node's children in edge order through ``all`` its edges, those of some
        dependency ``typed``, or the ``runtime`` (link/run) ones; made once per lock:
        planning a lock of thousands walks them many times."""
        key = "_kids_" + kind
        cached = self.__dict__.get(key)
        if cached is None or cached[0] is not self.nodes or cached[1] != len(self.nodes):
            nodes = self.nodes.items()
            if kind == "all":
                kids = {h: tuple([e.child for e in n.edges]) for h, n in nodes}
            elif kind == "typed":
                kids = {h: tuple([e.child for e in n.edges if e.deptypes]) for h, n in nodes}
            else:
                kids = {
                    h: tuple([e.child for e in n.edges if not RUNTIME_DEPTYPES.isdisjoint(e.deptypes)])
                    for h, n in nodes
                }
            cached = self.__dict__[key] = (self.nodes, len(self.nodes), kids)
        return cached[2]

    def closure(self, starts: Iterable[str], deptypes: Iterable[str], include_starts: bool = True) -> Set[str]:
        """Nodes reachable from ``starts`` following only edges with one of ``deptypes``."""
        want = set(deptypes)
        seen: Set[str] = set()
        queue = deque(starts)
        if include_starts:
            seen.update(queue)
        if want.issuperset(DEPTYPES) or want == RUNTIME_DEPTYPES:  # the two every plan asks for
            kids = self._kids("runtime" if want == RUNTIME_DEPTYPES else "typed")
            while queue:
                for c in kids[queue.popleft()]:
                    if c not in seen:
                        seen.add(c)
                        queue.append(c)
            return seen
        while queue:
            h = queue.popleft()
            for e in self.nodes[h].edges:
                if want.intersection(e.deptypes) and e.child not in seen:
                    seen.add(e.child)
                    queue.append(e.child)
        return seen

    # -- derived sets ----------------------------------------------------------
    def reachable(self) -> Set[str]:
        return self.closure(self.roots, DEPTYPES)

    def runtime_closure(self) -> Set[str]:
        return self.closure(self.roots, RUNTIME_DEPTYPES)

    def build_only(self) -> Set[str]:
        return self.reachable() - self.runtime_closure()

    def externals(self) -> Set[str]:
        return {h for h, n in self.nodes.items() if n.external}

    def build_requirements(self, h: str) -> Set[str]:
        """Prefixes that must be installed before ``h`` can be built (externals excluded)."""
        direct = set(self.children(h))
        needed = self.closure(direct, RUNTIME_DEPTYPES)
        return {d for d in needed if not self.nodes[d].external}

    def all_build_requirements(self, hashes: Iterable[str]) -> Dict[str, Set[str]]:
        """:meth:`build_requirements` of each of ``hashes``, in one pass over the DAG: the
        link/run closure of every node is its own plus its link/run children's, each
        computed once (not a walk per node, which costs the DAG's size per node)."""
        runtime: Dict[str, FrozenSet[str]] = {}
        run_kids, kids = self._kids("runtime"), self._kids("all")
        for h in self._postorder(set(self.nodes)):
            below = run_kids[h]
            if len(below) == 1:  # a chain: its closure and the child's differ by one node
                runtime[h] = runtime[below[0]] | {h}
                continue
            acc: Set[str] = {h}
            for c in below:
                acc |= runtime[c]
            runtime[h] = frozenset(acc)
        externals = self.externals()
        out: Dict[str, Set[str]] = {}
        for h in hashes:
            needed: Set[str] = set()
            for c in set(kids[h]):
                needed |= runtime[c]
            out[h] = needed - externals if externals else needed
        return out

    def topological_order(self, subset: Optional[Iterable[str]] = None) -> List[str]:
        """Dependencies before dependents; ties broken by name then hash (deterministic)."""
        return [h for wave in self.waves(subset) for h in wave]

    def waves(self, subset: Optional[Iterable[str]] = None) -> List[List[str]]:
        """Topological levels of ``subset`` (default: every non-external node reachable from
        the roots), counting dependencies of every type inside the subset."""
        nodes = set(subset) if subset is not None else self.reachable() - self.externals()
        level: Dict[str, int] = {}
        kids = self._kids("all")
        for h in self._postorder(nodes):
            level[h] = 1 + max([level[c] for c in kids[h] if c in nodes], default=-1)
        result: List[List[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
        for h, lv in level.items():
            result[lv].append(h)
        for wave in result:
            wave.sort(key=lambda x: (self.nodes[x].name, x))
        return result

    def _postorder(self, nodes: Set[str]) -> List[str]:
        """``nodes`` with every dependency before its dependents: the order of the whole
        DAG (computed once per lock: plan and schedule ask for several subsets of a lock
        of thousands) restricted to ``nodes``."""
        cached = self.__dict__.get("_order")
        if cached is None or cached[0] is not self.nodes or cached[1] != len(self.nodes):
            cached = (self.nodes, len(self.nodes), self._walk(set(self.nodes)))
            self.__dict__["_order"] = cached
        if len(nodes) == len(self.nodes):
            return list(cached[2])
        return [h for h in cached[2] if h in nodes]

    def _walk(self, nodes: Set[str]) -> List[str]:
        order: List[str] = []
        state: Dict[str, int] = {}
        for start in sorted(nodes):
            if start in state:
                continue
            stack: List[Tuple[str, Iterable[str]]] = [(start, iter(sorted(self.children(start))))]
            state[start] = 1
            while stack:
                h, it = stack[-1]
                for c in it:
                    if c not in nodes:
                        continue
                    if state.get(c) == 1:
                        raise UserError(f"{self.describe()}: dependency cycle through {self.nodes[c].label}")
                    if c not in state:
                        state[c] = 1
                        stack.append((c, iter(sorted(self.children(c)))))
                        break
                else:
                    stack.pop()
                    state[h] = 2
                    order.append(h)
        return order

    def critical_path(
        self, durations: Mapping[str, float], subset: Optional[Iterable[str]] = None
    ) -> Tuple[float, List[str]]:
        """Longest chain of ``durations`` through the dependency DAG of ``subset``.

        Returns (length in seconds, hashes from the first package to build to the last)."""
        nodes = set(subset) if subset is not None else self.reachable() - self.externals()
        finish: Dict[str, float] = {}
        best_dep: Dict[str, Optional[str]] = {}
        kids = self._kids("all")
        for h in self._postorder(nodes):
            prev = max((c for c in kids[h] if c in nodes), key=lambda c: (finish[c], c), default=None)
            finish[h] = durations.get(h, 0.0) + (finish[prev] if prev else 0.0)
            best_dep[h] = prev
        if not finish:
            return 0.0, []
        end = max(finish, key=lambda x: (finish[x], x))
        chain = [end]
        while best_dep[chain[-1]]:
            chain.append(best_dep[chain[-1]])  # type: ignore[arg-type]
        return finish[end], list(reversed(chain))


def _fail(path: Optional[Path], msg: str) -> UserError:
    return UserError(f"{path or 'spack.lock'}: {msg}")


# (dependency types, virtuals) of an edge that passed the checks of _parse_node (lists of
# known types and of strings, as tuples) -> the same, shared by every edge that has them
_CHECKED_KINDS: Dict[Tuple[Tuple[str, ...], Tuple[str, ...]], Tuple[Tuple[str, ...], Tuple[str, ...]]] = {}
_make_edge = tuple.__new__  # Edge(*fields) without the Python-level __new__ of a named tuple


def _parse_node(path: Optional[Path], key: str, data: object, version: int) -> Node:
    if not isinstance(data, dict):
        raise _fail(path, f"concrete spec {key!r} is not an object")
    for req in ("name", "version"):
        if not isinstance(data.get(req), str):
            raise _fail(path, f"concrete spec {key!r} has no {req!r}")
    where = str(path or "spack.lock")
    safe_name(key, "concrete spec hash", where)  # the prefix <name>-<version>-<hash> becomes a directory
    safe_name(data["name"], f"package name of {key[:7]}", where)
    safe_name(data["version"], f"version of {data['name']}/{key[:7]}", where)
    edges: List[Edge] = []
    deps = data.get("dependencies", [])
    if isinstance(deps, dict):  # lockfile v1/v2 style nested mapping: not supported
        raise _fail(path, f"concrete spec {key!r} uses a pre-v3 dependency format")
    if not isinstance(deps, list):
        raise _fail(path, f"concrete spec {key!r}: 'dependencies' must be a list")
    for dep in deps:
        if not isinstance(dep, dict) or not isinstance(dep.get("hash"), str):
            raise _fail(path, f"concrete spec {key!r}: malformed dependency entry {dep!r}")
        params = dep.get("parameters")
        if isinstance(params, dict):
            deptypes = params.get("deptypes", [])
            virtuals = params.get("virtuals", [])
        else:  # specfile v3 (lockfile v4): "type": [...]
            deptypes = dep.get("type", [])
            virtuals = []
        if type(deptypes) is list and type(virtuals) is list:
            try:
                kinds = _CHECKED_KINDS.get((tuple(deptypes), tuple(virtuals)))
            except TypeError:  # an unhashable entry: refused below
                kinds = None
            if kinds is not None:  # the same few combinations on every edge of a large lock, checked once
                name = dep.get("name", "")
                edges.append(_make_edge(Edge, (dep["hash"], name if type(name) is str else str(name), *kinds)))
                continue
        if isinstance(deptypes, str):
            deptypes = [deptypes]
        if not isinstance(deptypes, list) or not all(isinstance(t, str) and t in DEPTYPES for t in deptypes):
            raise _fail(path, f"concrete spec {key!r}: unknown dependency types {deptypes!r}")
        if virtuals is None:
            virtuals = []
        if isinstance(virtuals, str) or not isinstance(virtuals, list) or not all(isinstance(v, str) for v in virtuals):
            raise _fail(path, f"concrete spec {key!r}: 'virtuals' must be a list of names, got {virtuals!r}")
        edges.append(Edge(dep["hash"], str(dep.get("name", "")), tuple(deptypes), tuple(virtuals)))
        if len(_CHECKED_KINDS) < 4096:
            kinds = (tuple(deptypes), tuple(virtuals))
            _CHECKED_KINDS[kinds] = kinds
    arch = data.get("arch") if isinstance(data.get("arch"), dict) else {}
    target = arch.get("target", "")
    if isinstance(target, dict):
        target = target.get("name", "")
    external = data.get("external")
    return Node(
        hash=key,
        name=data["name"],
        version=str(data["version"]),
        namespace=str(data.get("namespace") or "builtin"),
        external=bool(external),
        external_path=external.get("path") if isinstance(external, dict) else None,
        target=str(target),
        platform_os=str(arch.get("platform_os", "")),
        edges=edges,
        raw=data,
    )


@collector_paused()  # millions of small objects, no cycles (dedal.model.gcpause)
def parse_lock(text: str, path: Optional[Path] = None) -> SpackLock:
    """Parse the text of a spack.lock; every defect is a UserError naming the file."""
    if not text.strip():
        raise _fail(path, "empty file, not a Spack lock")
    data = parse_json(text, path or "spack.lock")
    if not isinstance(data, dict) or not isinstance(data.get("_meta"), dict):
        raise _fail(path, "not a Spack lock file (no _meta section)")
    meta = data["_meta"]
    if meta.get("file-type", "spack-lockfile") != "spack-lockfile":
        raise _fail(path, f"file-type is {meta.get('file-type')!r}, expected 'spack-lockfile'")
    version = meta.get("lockfile-version")
    if version not in SUPPORTED_LOCKFILE_VERSIONS:
        supported = ", ".join(map(str, SUPPORTED_LOCKFILE_VERSIONS))
        raise _fail(path, f"unsupported lockfile-version {version!r} (dedal reads versions {supported})")
    specs = data.get("concrete_specs")
    roots = data.get("roots")
    if not isinstance(specs, dict) or not isinstance(roots, list):
        raise _fail(path, "missing 'roots' or 'concrete_specs'")
    nodes: Dict[str, Node] = {}
    root_hashes: List[str] = []
    root_specs: Dict[str, str] = {}

    def add_section(section_specs: dict, section_roots: list, where: str) -> None:
        for key, nd in section_specs.items():
            node = _parse_node(path, key, nd, version)
            nodes.setdefault(key, node)
        for r in section_roots:
            if not isinstance(r, dict) or not isinstance(r.get("hash"), str):
                raise _fail(path, f"malformed root entry {r!r}{where}")
            if r["hash"] not in root_specs:  # a dict: thousands of roots in a facility stack
                root_hashes.append(r["hash"])
                root_specs[r["hash"]] = str(r.get("spec", ""))

    add_section(specs, roots, "")
    included = data.get("include_concrete") or {}
    if not isinstance(included, dict):
        raise _fail(path, "'include_concrete' must be an object")
    for env_path, sub in included.items():
        if not isinstance(sub, dict):
            raise _fail(path, f"include_concrete[{env_path!r}] is not an object")
        sub_specs, sub_roots = sub.get("concrete_specs") or {}, sub.get("roots") or []
        if not isinstance(sub_specs, dict) or not isinstance(sub_roots, list):
            raise _fail(path, f"include_concrete[{env_path!r}]: 'concrete_specs' must be an object and 'roots' a list")
        add_section(sub_specs, sub_roots, f" in include_concrete[{env_path!r}]")
    if not root_hashes:
        raise _fail(path, "no roots: the environment was never concretized")
    for h in root_hashes:
        if h not in nodes:
            raise _fail(path, f"root hash {h} is not among the concrete specs")
    for node in nodes.values():
        for e in node.edges:
            if e.child not in nodes:
                raise _fail(
                    path,
                    f"{node.label} depends on {e.name or '?'}/{e.child[:7]}, which is not in the lock (dangling hash)",
                )
    spack = data.get("spack") if isinstance(data.get("spack"), dict) else {}
    lock = SpackLock(
        path=path,
        lockfile_version=version,
        specfile_version=meta.get("specfile-version"),
        spack_version=str(spack.get("version", "")),
        spack_commit=str(spack.get("commit", "")),
        roots=root_hashes,
        root_specs=root_specs,
        nodes=nodes,
        sha256=hashlib.sha256(text.encode()).hexdigest(),
    )
    lock._postorder(set(nodes))  # raises on cycles, wherever they are
    return lock


LOCK_LIMIT = 64 << 20  # bytes of a spack.lock (the largest here, jedi-ci's 700 specs, has 0.25 MiB)


def load_lock(path: Path) -> SpackLock:
    path = Path(path)
    text = read_input(path, LOCK_LIMIT)
    return parse_lock(text, path)
