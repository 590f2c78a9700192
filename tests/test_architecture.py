"""The floor plan of docs/ARCHITECTURE.md, checked: stages import the floors below them
(errors, ui, model, schedule, adapters) and earlier stages only through their faces; CI and
commands reach a stage package through its face. Read with ``ast``, nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, List, Tuple

import dedal

PACKAGE = Path(dedal.__file__).parent
STAGES = PACKAGE / "stages"
# the stage packages in pipeline order: each may use the ones before it, never one after it
ORDER = ("fetch", "building", "assemble", "verify", "publish")
BELOW_STAGES = ("dedal.errors", "dedal.ui", "dedal.model", "dedal.schedule", "dedal.adapters", "dedal.stages")


def _imports(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, dotted name) of every dedal module ``path`` imports; ``from X import y`` gives
    ``X.y`` where ``y`` is a module of package ``X`` (so that reaching past a face through
    ``from dedal.stages.verify import image`` counts)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("dedal"):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("dedal"):
            folder = PACKAGE.parent.joinpath(*node.module.split("."))
            subs = [a.name for a in node.names if (folder / f"{a.name}.py").is_file() or (folder / a.name).is_dir()]
            yield from ((node.lineno, f"{node.module}.{s}") for s in subs)
            if len(subs) < len(node.names):
                yield node.lineno, node.module


def _stage_package(module: str) -> str:
    """``dedal.stages.<package>`` of a module inside a stage package, else ""."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["dedal", "stages"] and (STAGES / parts[2]).is_dir() else ""


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _past_a_face(importer: str, imported: str) -> bool:
    """Whether ``imported`` is inside a stage package other than the importer's own."""
    inside = _stage_package(imported)
    return bool(inside) and inside != _stage_package(importer + ".x")


def _violations(top: Path, rule) -> List[str]:
    found = []
    for path in sorted(top.rglob("*.py")):
        me = _module_name(path)
        for line, name in _imports(path):
            why = rule(me, name)
            if why:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name}: {why}")
    return found


def _stage_rule(me: str, name: str) -> str:
    if not name.startswith(BELOW_STAGES) and name != "dedal":
        return "a stage imports only errors, ui, model, schedule, adapters and stages"
    if _past_a_face(me, name):
        return f"past the face of dedal.stages.{_stage_package(name)} (import from its __init__)"
    mine, theirs = _stage_package(me + ".x"), name.split(".")[2] if name.count(".") >= 2 else ""
    if (
        name.startswith("dedal.stages.")
        and mine in ORDER
        and theirs in ORDER
        and ORDER.index(theirs) > ORDER.index(mine)
    ):
        return f"{mine} comes before {theirs} in the pipeline"
    return ""


def test_stages_import_lower_floors_and_earlier_stages_faces_only() -> None:
    assert _violations(STAGES, _stage_rule) == []


def test_ci_and_commands_use_stage_packages_through_their_faces() -> None:
    def rule(me, name):  # noqa: ANN001, ANN202
        return "past a stage package's face" if _past_a_face(me, name) else ""

    assert _violations(PACKAGE / "ci", rule) == []
    assert [v for v in _violations(PACKAGE / "commands", rule) if ".stages.verify." in v] == []


def test_the_rules_see_what_they_forbid() -> None:
    """The checks above would catch the imports that this issue removed."""
    assert _stage_rule("dedal.stages.building.cache", "dedal.stages.publish.pull")
    assert _stage_rule("dedal.stages.building.cache", "dedal.stages.publish")  # a later stage, face or not
    assert _stage_rule("dedal.stages.pipeline", "dedal.stages.verify.runner")
    assert _stage_rule("dedal.stages.verify.runner", "dedal.commands.verify")
    assert not _stage_rule("dedal.stages.publish.push", "dedal.stages.verify")
    assert not _stage_rule("dedal.stages.verify.runner", "dedal.stages.verify.plan")
    assert not _stage_rule("dedal.stages.building.node", "dedal.stages.layer_audit")
