"""The schemas of dedal's input files, kept as data (``dedal/data/schema/<name>.schema.json``,
JSON Schema draft-07, printed by ``dedal schema NAME`` so that editors check the files
too), and the validator that reads them.

The validator knows the part of JSON Schema those files use (``type``, ``properties``,
``additionalProperties``, ``required``, ``pattern``, ``enum``, ``minLength``,
``minimum``, ``exclusiveMinimum``, ``minItems``, ``items``, ``anyOf``, local
``$ref``, ``default``) and does two things a general validator does not: it fills in
the defaults, so that the schema is the only place they are written, and it says
every defect in one line each (``dedal.verify.repetitions: expected integer, got
'five'``), not only the first. Its own code rather than ``jsonschema``: about as many
lines as the messages built on ``jsonschema``'s errors took, and no 50 ms import.
"""

from __future__ import annotations

import copy
import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any, Dict, List, Tuple

Location = Tuple[Any, ...]  # where in the document: keys and list indices

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    # as draft-07 has them: a bool is not a number, 3.0 is an integer
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
}


def schema_names() -> List[str]:
    """The schemas dedal ships (``env``, ...)."""
    folder = resources.files("dedal").joinpath("data/schema")
    return sorted(p.name[: -len(".schema.json")] for p in folder.iterdir() if p.name.endswith(".schema.json"))


@lru_cache(maxsize=None)
def _text(name: str) -> str:
    return resources.files("dedal").joinpath(f"data/schema/{name}.schema.json").read_text(encoding="utf-8")


def schema_text(name: str) -> str:
    """The schema file ``name`` as shipped (what ``dedal schema NAME`` prints)."""
    return _text(name)


def load_schema(name: str) -> Dict[str, Any]:
    """The schema ``name`` (a fresh copy: callers may derive schemas from it)."""
    return json.loads(_text(name))


def describe(value: Any) -> str:
    """A value as an error message quotes it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def where(path: Location) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


class Validator:
    """Checks documents against one schema (its ``definitions`` hold what ``$ref`` names)."""

    def __init__(self, schema: Dict[str, Any]) -> None:
        self.schema = schema

    def fill_and_check(self, data: Any) -> Tuple[Any, List[str]]:
        """``data`` with every default the schema gives filled in (a copy; ``data`` is left
        as it was) and every defect, one line each, in document order, the outer first."""
        data = copy.deepcopy(data)
        errors: List[Tuple[Location, str]] = []
        self._check(data, self.schema, (), errors)
        errors.sort(key=lambda e: (len(e[0]), [str(p) for p in e[0]]))
        return data, [message for _path, message in errors]

    def errors(self, data: Any) -> List[str]:
        return self.fill_and_check(data)[1]

    def defaults(self, *pointer: str) -> Dict[str, Any]:
        """The defaults of the properties of the object schema at ``pointer`` (``"dedal",
        "verify"``: the properties' names, or a definition's name after ``"#"``): what the
        dataclasses built from a document take as their own defaults (``{"ranks": 2, ...}``)."""
        schema = self._resolve(self.schema)
        if pointer and pointer[0] == "#":
            schema = self._resolve(self.schema["definitions"][pointer[1]])
            pointer = pointer[2:]
        for key in pointer:
            schema = self._resolve(schema["properties"][key])
        out: Dict[str, Any] = {}
        for key, sub in schema.get("properties", {}).items():
            sub = self._resolve(sub)
            if "default" in sub:
                out[key] = sub["default"]
        return out

    def _resolve(self, schema: Dict[str, Any]) -> Dict[str, Any]:
        while "$ref" in schema:
            ref = schema["$ref"]
            if not ref.startswith("#/"):
                raise ValueError(f"only local $ref are supported, got {ref!r}")
            target: Any = self.schema
            for part in ref[2:].split("/"):
                target = target[part]
            schema = target
        return schema

    def _check(self, value: Any, schema: Dict[str, Any], path: Location, errors: List[Tuple[Location, str]]) -> None:
        schema = self._resolve(schema)

        def fail(message: str) -> None:
            errors.append((path, message))

        here = where(path)
        types = schema.get("type")
        if types is not None:
            names = [types] if isinstance(types, str) else list(types)
            if not any(_TYPES[t](value) for t in names):
                fail(f"{here}: expected {types}, got {describe(value)}")
                return  # nothing inside a value of the wrong type is worth a line
        if "enum" in schema and value not in schema["enum"]:
            fail(f"{here}: expected one of {', '.join(map(str, schema['enum']))}, got {describe(value)}")
        if "anyOf" in schema:
            if not any(not self.errors_at(value, s) for s in schema["anyOf"]):
                # the only anyOf: an app's command, a shell line or an argument list
                fail(f"{here}: expected a non-empty string or list of strings, got {describe(value)}")
        if isinstance(value, str):
            self._check_string(value, schema, here, fail)
        if _TYPES["number"](value):
            if "minimum" in schema and value < schema["minimum"]:
                fail(f"{here}: must be at least {schema['minimum']}, got {describe(value)}")
            if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
                fail(f"{here}: must be more than {schema['exclusiveMinimum']}, got {describe(value)}")
        if isinstance(value, list):
            if "minItems" in schema and len(value) < schema["minItems"]:
                fail(f"{here}: must not be empty")
            if "items" in schema:
                for i, item in enumerate(value):
                    self._check(item, schema["items"], path + (i,), errors)
        if isinstance(value, dict):
            self._check_object(value, schema, path, errors)

    def errors_at(self, value: Any, schema: Dict[str, Any]) -> List[Tuple[Location, str]]:
        """The defects of ``value`` against a part of the schema (``anyOf``'s choices); nothing filled."""
        found: List[Tuple[Location, str]] = []
        self._check(copy.deepcopy(value), schema, (), found)
        return found

    @staticmethod
    def _check_string(value: str, schema: Dict[str, Any], here: str, fail: Any) -> None:
        if "minLength" in schema and len(value) < schema["minLength"]:
            fail(f"{here}: must not be empty")
        pattern = schema.get("pattern")
        if pattern is not None and not re.search(pattern, value):
            if pattern == "^/":
                fail(f"{here}: expected an absolute path, got {describe(value)}")
            elif pattern.startswith("^(?!/)"):
                fail(f"{here}: expected a relative path without '..', got {describe(value)}")
            else:
                fail(f"{here}: invalid value {describe(value)} (must match {pattern})")

    def _check_object(
        self, value: Dict[str, Any], schema: Dict[str, Any], path: Location, errors: List[Tuple[Location, str]]
    ) -> None:
        props: Dict[str, Any] = schema.get("properties", {})
        here = where(path)
        missing = [key for key in schema.get("required", []) if key not in value]
        for key in missing:
            if not path and key == "spack":
                errors.append((path, "missing 'spack:' section (a Spack environment is required)"))
            else:
                errors.append((path, f"{here}: missing key {key!r}"))
        extra = schema.get("additionalProperties", True)
        for key in list(value):
            if key in props:
                continue
            if extra is False:
                prefix = f"{here}: " if path else ""
                errors.append((path, f"{prefix}unknown key {key!r} (known: {', '.join(sorted(props))})"))
            elif isinstance(extra, dict):
                self._check(value[key], extra, path + (key,), errors)
        for key, sub in props.items():
            if key in value:
                self._check(value[key], sub, path + (key,), errors)
                continue
            default = self._resolve(sub).get("default", _ABSENT)
            if default is not _ABSENT:
                value[key] = copy.deepcopy(default)
                # walked for the defaults within ({} for dedal: fills dedal.verify); a default is
                # not the user's to be told about (registry "" is "none", not a bad address)
                self._check(value[key], sub, path + (key,), [])


_ABSENT = object()
