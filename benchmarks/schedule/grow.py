"""Synthetic Spack locks of any size, grown from a real one.

A site that builds one stack for many compilers, MPIs, GPUs and targets has one shared
core (the toolchain, build tools, Python) and many copies of everything above it. So:
the *core* of the real lock is every package that at least ``CORE_FAN_IN`` packages
depend on, with everything those need (closed downwards); every other package is
copied, with fresh hashes, as often as it takes to reach the size asked for (the last
copy a prefix of the others in topological order, so it is closed downwards too). A
copy keeps its packages' names, versions and edges: the same degree per node and the
same durations in dedal's model, while the core's fan-in grows into the thousands.
Deterministic: the same lock and size give the same file.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Dict, List, Set

CORE_FAN_IN = 5
_B32 = "abcdefghijklmnopqrstuvwxyz234567"


def _hash(seed: str) -> str:
    """A Spack-looking DAG hash (32 base32 characters), a function of ``seed``."""
    digest = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:20], "big")
    return "".join(_B32[(digest >> (5 * i)) & 31] for i in range(32))


def _children(spec: dict) -> List[str]:
    return [d["hash"] for d in spec.get("dependencies", [])]


def grow(data: dict, size: int) -> dict:
    """A lock (its JSON) of about ``size`` concrete specs, grown from ``data`` (a lock's JSON)."""
    specs: Dict[str, dict] = data["concrete_specs"]
    fan_in = Counter(c for s in specs.values() for c in _children(s))
    core: Set[str] = set()
    stack = [h for h in specs if fan_in[h] >= CORE_FAN_IN or specs[h].get("external")]
    while stack:
        h = stack.pop()
        if h not in core:
            core.add(h)
            stack.extend(_children(specs[h]))
    # the rest in topological order (dependencies first), deterministic
    rest: List[str] = []
    done: Set[str] = set(core)

    def visit(h: str) -> None:
        todo = [(h, iter(sorted(_children(specs[h]))))]
        while todo:
            cur, it = todo[-1]
            for c in it:
                if c not in done:
                    todo.append((c, iter(sorted(_children(specs[c])))))
                    break
            else:
                todo.pop()
                if cur not in done:
                    done.add(cur)
                    rest.append(cur)

    for h in sorted(specs):
        visit(h)
    if not rest:
        raise ValueError("the lock has no packages outside its core to copy")
    out_specs: Dict[str, dict] = {h: specs[h] for h in sorted(core)}
    old_roots = {r["hash"]: r.get("spec", "") for r in data["roots"]}
    roots: List[dict] = [{"hash": h, "spec": s} for h, s in old_roots.items() if h in core]
    copies = 0
    while len(out_specs) < size:
        take = rest[: size - len(out_specs)]
        new = {h: (h if copies == 0 else _hash(f"{h}/{copies}")) for h in take}
        depended = set()
        for h in take:
            spec = copy.deepcopy(specs[h])
            for d in spec.get("dependencies", []):
                if d["hash"] in new:
                    d["hash"] = new[d["hash"]]
                    depended.add(d["hash"])
            spec.pop("hash", None)
            out_specs[new[h]] = spec
        # roots: the real ones that made it into this copy, and whatever nobody in it needs
        for h in take:
            if h in old_roots or new[h] not in depended:
                roots.append({"hash": new[h], "spec": old_roots.get(h) or specs[h]["name"]})
        copies += 1
    out = {k: v for k, v in data.items() if k not in ("concrete_specs", "roots", "include_concrete")}
    out["roots"] = _dedup(roots)
    out["concrete_specs"] = out_specs
    return out


def _dedup(roots: List[dict]) -> List[dict]:
    seen: Set[str] = set()
    out = []
    for r in roots:
        if r["hash"] not in seen:
            seen.add(r["hash"])
            out.append(r)
    return out


def write(source: Path, size: int, dest: Path) -> Path:
    """Grow ``source`` to ``size`` specs and write it to ``dest`` (a spack.lock)."""
    data = json.loads(Path(source).read_text())
    dest.write_text(json.dumps(grow(data, size), indent=1, sort_keys=True) + "\n")
    return dest
