"""The validator of dedal's schema files: defaults filled from the schema (the only place
they are written), every defect listed, the input left as it was."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dedal.model.envfile import ENV_SCHEMA, AppCheck, AppMetric, EnvFile, VerifySpec
from dedal.model.schema import Validator, load_schema, schema_names


def test_defaults_are_filled_and_the_input_left_alone() -> None:
    doc = {"spack": {"specs": ["zlib"]}, "dedal": {"verify": {"apps": [{"name": "a", "command": "true"}]}}}
    filled, errors = Validator(ENV_SCHEMA).fill_and_check(doc)
    assert errors == []
    assert doc == {"spack": {"specs": ["zlib"]}, "dedal": {"verify": {"apps": [{"name": "a", "command": "true"}]}}}
    assert filled["dedal"]["tag"] == "latest" and filled["dedal"]["registry"] == ""
    verify = filled["dedal"]["verify"]
    assert (verify["ranks"], verify["nodes"], verify["repetitions"], verify["launcher"]) == (2, 1, 5, "auto")
    assert verify["apps"][0] == {
        "name": "a",
        "command": "true",
        "ranks": 2,
        "nodes": 1,
        "expect": "",
        "timeout": 600.0,
        "env": {},
        "gpu": False,
    }
    assert Validator(ENV_SCHEMA).fill_and_check({"spack": {}})[0]["dedal"]["verify"]["enabled"] is True


def test_the_dataclasses_take_the_schemas_defaults() -> None:
    """No default written twice: each dataclass field with a schema default has that default."""
    v = Validator(ENV_SCHEMA)
    for cls, pointer in (
        (VerifySpec, ("dedal", "verify")),
        (EnvFile, ("dedal",)),
        (AppCheck, ("#", "app")),
        (AppMetric, ("#", "metric")),
    ):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, default in v.defaults(*pointer).items():
            if key == "verify":  # EnvFile.verify: a VerifySpec, checked above
                continue
            f = fields[key]
            value = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
            assert value == default, (cls.__name__, key)


def test_every_defect_one_line_in_document_order() -> None:
    errors = Validator(ENV_SCHEMA).errors({"dedal": {"verify": {"nodes": 0, "gpu": "yes"}, "view": "opt"}})
    assert errors == [
        "missing 'spack:' section (a Spack environment is required)",
        "dedal.view: expected an absolute path, got 'opt'",
        "dedal.verify.gpu: expected boolean, got 'yes'",
        "dedal.verify.nodes: must be at least 1, got 0",
    ]


def test_integers_and_booleans_as_draft_07_has_them() -> None:
    check = Validator({"type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": "number"}}}).errors
    assert check({"n": 3.0, "x": 1}) == []
    assert check({"n": True, "x": False}) == ["n: expected integer, got True", "x: expected number, got False"]


def test_the_shipped_schemas() -> None:
    assert "env" in schema_names()
    assert load_schema("env") == ENV_SCHEMA and load_schema("env") is not ENV_SCHEMA
    assert (Path(__file__).resolve().parents[2] / "dedal" / "data" / "schema" / "env.schema.json").is_file()


def test_the_env_file_keys_spack_envs_readme_lists_are_the_schemas() -> None:
    """The README's list of `dedal:` keys and the schema name the same keys (a rule's own
    fields aside: the README names `rules`): the documented thresholds.noise_sigmas was
    refused as unknown, and dedal.rebuild was nowhere in the list."""
    import re

    from tests.conftest import ROOT

    text = (ROOT / "spack-envs" / "README.md").read_text()
    listed = set(re.findall(r"`([a-z_]+)`", text[text.index("The `dedal:` keys:") : text.index("Unknown keys and")]))
    definitions = ENV_SCHEMA["definitions"]
    named, todo = set(), [ENV_SCHEMA["properties"]["dedal"]]
    while todo:
        node = todo.pop()
        ref = node.get("$ref") or (node.get("items") or {}).get("$ref")
        if ref and not ref.endswith("/rule"):
            todo.append(definitions[ref.rsplit("/", 1)[1]])
        for key, sub in (node.get("properties") or {}).items():
            named.add(key)
            todo.append(sub)
    assert listed - {"dedal"} == named
