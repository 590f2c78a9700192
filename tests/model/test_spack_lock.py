"""The lock model on every real lock, cross-checked against Spack's own outputs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List, Set, Tuple

import pytest

from dedal.errors import UserError
from dedal.model.spack_lock import load_lock, parse_lock
from tests.conftest import SPACK_DATA

LOCKS = sorted(SPACK_DATA.glob("*.spack.lock")) + sorted(SPACK_DATA.glob("*/*.spack.lock"))

# (nodes, externals, to build, build-only incl. externals, build-only non-external, waves, max layers on a build node)
# as measured with the real Spack in ../shared/notes/spack-offline.md §3
KNOWN = {
    "mpi-cuda": (43, 11, 32, 20, 13, 9, 18),
    "mpi-cuda-extcuda": (42, 12, 30, 20, 13, 9, 16),
    "mpi-cuda-pure": (62, 3, 59, 32, 32, 16, 33),
    "tiny-zlib": (4, 2, 2, 1, 0, 2, 1),
    "tiny-dedal": (7, 2, 5, 3, 2, 4, 3),
}


def test_all_real_locks_are_present():
    assert len(LOCKS) >= 9, LOCKS


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_counts_match_real_spack_analysis(name):
    lock = load_lock(SPACK_DATA / f"{name}.spack.lock")
    nodes, ext, to_build, bo, bo_ne, waves, max_req = KNOWN[name]
    externals = lock.externals()
    build_only = lock.build_only()
    buildable = lock.reachable() - externals
    assert len(lock.nodes) == nodes
    assert len(externals) == ext
    assert len(buildable) == to_build
    assert len(build_only) == bo
    assert len(build_only - externals) == bo_ne
    assert len(lock.waves()) == waves
    assert max(len(lock.build_requirements(h)) for h in buildable) == max_req


def parse_spec_tree(path: Path) -> List[Tuple[int, str, bool, Set[str]]]:
    """`spack spec -l -t` lines: (indent, short hash, external, deptypes of the edge from the parent)."""
    rows = []
    flags = {"b": "build", "l": "link", "r": "run", "t": "test"}
    for line in path.read_text().splitlines():
        m = re.match(r"^(\[e\]| - |\[\+\])\s+([a-z0-9]{7})\s+\[(.{4})\]( +)(\^?)(\S+)", line)
        if not m:
            continue
        indent = len(m.group(4)) + (0 if not m.group(5) else 0)
        deptypes = {flags[c] for c in m.group(3) if c in flags}
        rows.append((indent, m.group(2), m.group(1) == "[e]", deptypes))
    return rows


@pytest.mark.parametrize("spec_l", sorted(SPACK_DATA.glob("*.spec-l.txt")), ids=lambda p: p.name)
def test_edges_match_spack_spec_tree(spec_l):
    lock = load_lock(SPACK_DATA / spec_l.name.replace(".spec-l.txt", ".spack.lock"))
    rows = parse_spec_tree(spec_l)
    assert rows, f"could not parse {spec_l}"
    stack: List[Tuple[int, str]] = []
    checked = 0
    for indent, short, external, deptypes in rows:
        node = lock.node(short)
        assert node.external == external, node.label
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if stack:
            parent = lock.node(stack[-1][1])
            assert node.hash in lock.children(parent.hash), f"{parent.label} -> {node.label} missing"
            # with the default cover ("nodes") Spack prints the union over all dependents
            union = {t for p in lock.nodes.values() for e in p.edges if e.child == node.hash for t in e.deptypes}
            assert union == deptypes, (parent.label, node.label)
            checked += 1
        else:
            assert node.hash in lock.roots
        stack.append((indent, short))
    assert checked > 0


@pytest.mark.parametrize("depfile", sorted(SPACK_DATA.glob("*.depfile.mk")), ids=lambda p: p.name)
def test_direct_dependencies_match_spack_depfile(depfile):
    """Spack's own per-package make targets: install-deps/<pkg> lists its direct dependencies."""
    lock = load_lock(SPACK_DATA / depfile.name.replace(".depfile.mk", ".spack.lock"))
    pattern = re.compile(r"^[\w.-]+/install-deps/\S+-([a-z0-9]{32}):(.*)$")
    seen = 0
    for line in depfile.read_text().splitlines():
        m = pattern.match(line)
        if not m:
            continue
        h = m.group(1)
        listed = set(re.findall(r"-([a-z0-9]{32})\b", m.group(2)))
        assert listed == set(lock.children(h)), lock.nodes[h].label
        # every non-external direct dependency is on the build node
        assert {d for d in listed if not lock.nodes[d].external} <= lock.build_requirements(h)
        seen += 1
    assert seen == len(lock.reachable())


def test_build_requirements_skip_build_deps_of_deps():
    lock = load_lock(SPACK_DATA / "tiny-dedal.spack.lock")
    by_name = {n.name: h for h, n in lock.nodes.items()}
    req = {lock.nodes[h].name for h in lock.build_requirements(by_name["dedal-app"])}
    assert req == {"dedal-tool", "gcc-runtime", "libdedal"}  # dedal-bootstrap is NOT needed (notes §4.5)
    assert {lock.nodes[h].name for h in lock.runtime_closure()} == {"dedal-app", "libdedal", "gcc-runtime", "glibc"}
    assert {lock.nodes[h].name for h in lock.build_only()} == {"dedal-tool", "dedal-bootstrap", "gmake"}


def test_waves_respect_dependencies_and_critical_path():
    lock = load_lock(SPACK_DATA / "mpi-cuda.spack.lock")
    waves = lock.waves()
    level = {h: i for i, w in enumerate(waves) for h in w}
    for h in level:
        for c in lock.children(h):
            if c in level:
                assert level[c] < level[h]
    durations = {h: 1.0 for h in level}
    length, chain = lock.critical_path(durations)
    assert length == len(waves) == len(chain)
    heavy = {h: (100.0 if lock.nodes[h].name == "openmpi" else 1.0) for h in level}
    length2, chain2 = lock.critical_path(heavy)
    assert any(lock.nodes[h].name == "openmpi" for h in chain2)
    for a, b in zip(chain2, chain2[1:]):
        assert a in lock.children(b)


def _v5(name="tiny-dedal") -> dict:
    return json.loads((SPACK_DATA / f"{name}.spack.lock").read_text())


def test_lockfile_v4_dependency_form():
    data = _v5()
    data["_meta"]["lockfile-version"] = 4
    data["_meta"]["specfile-version"] = 3
    for node in data["concrete_specs"].values():
        for dep in node.get("dependencies", []):
            dep["type"] = dep.pop("parameters")["deptypes"]
    v4 = parse_lock(json.dumps(data))
    v5 = load_lock(SPACK_DATA / "tiny-dedal.spack.lock")
    assert v4.build_only() == v5.build_only()
    assert {h: v4.build_requirements(h) for h in v4.nodes if not v4.nodes[h].external} == {
        h: v5.build_requirements(h) for h in v5.nodes if not v5.nodes[h].external
    }


def test_lockfile_v6_compilers_as_build_dependencies():
    """Spack 1.x: the compiler and compiler-wrapper are build-only nodes of every package."""
    data = _v5()
    data["_meta"].update({"lockfile-version": 6, "specfile-version": 5})
    specs = data["concrete_specs"]
    gcc = "g" * 32
    wrapper = "w" * 32
    specs[gcc] = {
        "name": "gcc",
        "version": "12.2.0",
        "external": {"path": "/usr", "module": None},
        "namespace": "builtin",
        "hash": gcc,
        "annotations": {"original_specfile_version": 5},
    }
    specs[wrapper] = {
        "name": "compiler-wrapper",
        "version": "1.0",
        "namespace": "builtin",
        "hash": wrapper,
        "annotations": {"original_specfile_version": 5},
    }
    for h, node in specs.items():
        if h in (gcc, wrapper) or node.get("external"):
            continue
        node.pop("compiler", None)
        node.setdefault("dependencies", []).extend(
            [
                {"name": "compiler-wrapper", "hash": wrapper, "parameters": {"deptypes": ["build"], "virtuals": []}},
                {"name": "gcc", "hash": gcc, "parameters": {"deptypes": ["build"], "virtuals": ["c", "cxx"]}},
            ]
        )
    lock = parse_lock(json.dumps(data))
    names = {lock.nodes[h].name for h in lock.build_only()}
    assert {"gcc", "compiler-wrapper"} <= names
    assert "compiler-wrapper" not in {lock.nodes[h].name for h in lock.runtime_closure()}
    app = next(h for h, n in lock.nodes.items() if n.name == "dedal-app")
    assert wrapper in lock.build_requirements(app)  # a build dependency is on the build node
    assert gcc not in lock.build_requirements(app)  # external: provided by the base image


def test_lockfile_v7_group_and_included_environments():
    data = _v5()
    data["_meta"]["lockfile-version"] = 7
    for r in data["roots"]:
        r["group"] = "default"
    zlib = _v5("tiny-zlib")
    data["include_concrete"] = {"/envs/zlib": {"roots": zlib["roots"], "concrete_specs": zlib["concrete_specs"]}}
    lock = parse_lock(json.dumps(data))
    assert len(lock.roots) == 2
    assert "zlib" in {lock.nodes[h].name for h in lock.runtime_closure()}


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["_meta"].update({"lockfile-version": 99}), "unsupported lockfile-version 99"),
        (lambda d: d["_meta"].update({"lockfile-version": 3}), "unsupported lockfile-version 3"),
        (lambda d: d.pop("_meta"), "not a Spack lock"),
        (lambda d: d.update({"roots": []}), "no roots"),
        (lambda d: d["roots"].append({"hash": "a" * 32, "spec": "x"}), "not among the concrete specs"),
        (
            lambda d: next(iter(d["concrete_specs"].values()))["dependencies"].append(
                {"name": "ghost", "hash": "z" * 32, "parameters": {"deptypes": ["link"], "virtuals": []}}
            ),
            "dangling",
        ),
        (
            lambda d: next(iter(d["concrete_specs"].values()))["dependencies"][0]["parameters"].update(
                {"deptypes": ["bogus"]}
            ),
            "unknown dependency types",
        ),
        (lambda d: next(iter(d["concrete_specs"].values())).pop("name"), "has no 'name'"),
    ],
)
def test_malformed_locks_are_clear_errors(mutate, message):
    data = _v5()
    mutate(data)
    with pytest.raises(UserError, match=re.escape(message)):
        parse_lock(json.dumps(data), Path("bad.lock"))


def test_cycle_is_detected():
    data = _v5()
    specs = data["concrete_specs"]
    by_name = {n["name"]: h for h, n in specs.items()}
    specs[by_name["libdedal"]].setdefault("dependencies", []).append(
        {"name": "dedal-app", "hash": by_name["dedal-app"], "parameters": {"deptypes": ["build"], "virtuals": []}}
    )
    with pytest.raises(UserError, match="cycle"):
        parse_lock(json.dumps(data))


def test_truncated_and_empty_locks(tmp_path):
    text = (SPACK_DATA / "mpi-cuda.spack.lock").read_text()
    trunc = tmp_path / "trunc.lock"
    trunc.write_text(text[: len(text) // 2])
    with pytest.raises(UserError, match="truncated"):
        load_lock(trunc)
    empty = tmp_path / "empty.lock"
    empty.write_text("")
    with pytest.raises(UserError, match="empty"):
        load_lock(empty)
    with pytest.raises(UserError, match="no such file"):
        load_lock(tmp_path / "missing.lock")
