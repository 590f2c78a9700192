"""Which packages go into an image: the runtime closure of the roots (build-only
dependencies dropped unless ``keep_build_deps``), or of the roots that ``--only`` names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from dedal.errors import UserError

if TYPE_CHECKING:
    from dedal.model.plan import Plan


RUNTIME_TYPES = frozenset(("link", "run"))


def _closure(plan: Plan, starts: Sequence[str], types: Optional[frozenset]) -> List[str]:
    seen: Dict[str, None] = {}
    stack = list(starts)
    while stack:
        h = stack.pop()
        if h in seen or h not in plan.nodes:
            continue
        seen[h] = None
        for child, deptypes in plan.nodes[h].deps.items():
            if types is None or set(deptypes) & types:
                stack.append(child)
    return list(seen)


def match_specs(plan: Plan, only: Sequence[str]) -> List[str]:
    """The DAG hashes ``only`` names: ``name``, ``name@version`` or ``/hash-prefix``; roots
    first, then any package of the runtime closure (an MPI-only image of a bigger env)."""
    runtime = [h for h in plan.runtime_closure if not plan.nodes[h].external]
    chosen: List[str] = []
    for raw in only:
        spec = raw.strip()
        if not spec:
            continue
        if spec.startswith("/"):
            found = [h for h in runtime if h.startswith(spec[1:])]
        else:
            name, _, version = spec.partition("@")

            def fits(h: str) -> bool:
                n = plan.nodes[h]
                return n.name == name and (not version or n.version == version)

            found = [h for h in plan.roots if fits(h)] or [h for h in runtime if fits(h)]
        if not found:
            roots = ", ".join(sorted(plan.nodes[h].name for h in plan.roots))
            raise UserError(f"--only {spec}: no such package in the image of {plan.env_name} (roots: {roots})")
        if len(found) > 1:
            labels = ", ".join(sorted(plan.nodes[h].label for h in found))
            raise UserError(f"--only {spec}: ambiguous ({labels}); use name@version or /hash")
        if found[0] not in chosen:
            chosen.append(found[0])
    if not chosen:
        raise UserError("--only: no package named")
    return chosen


def select_packages(
    plan: Plan, only: Optional[Sequence[str]] = None, keep_build_deps: bool = False
) -> Tuple[List[str], List[str]]:
    """(roots, every package of the image in dependency order, externals included)."""
    order = plan.runtime_layers(keep_build_deps=True)
    externals = [h for h in plan.nodes if plan.nodes[h].external]
    if not only:
        roots = list(plan.roots)
        wanted = set(plan.runtime_closure) | (set(plan.build_only) if keep_build_deps else set())
    else:
        roots = match_specs(plan, only)
        wanted = set(_closure(plan, roots, RUNTIME_TYPES))
        if keep_build_deps:
            wanted |= set(_closure(plan, roots, None))
    ordered = [h for h in order if h in wanted] + sorted(h for h in externals if h in wanted)
    return roots, ordered
