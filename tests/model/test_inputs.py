"""Reading a user's JSON and YAML: every defect one UserError line (issue 22, item 4)."""
from __future__ import annotations

from pathlib import Path

import pytest

from dedal.errors import UserError
from dedal.model.inputs import MAX_DEPTH, load_json, load_yaml, parse_json, parse_yaml

pytestmark = pytest.mark.reliability


def _one_line(exc: pytest.ExceptionInfo, start: str) -> str:
    text = str(exc.value)
    assert "\n" not in text and text.startswith(start), text
    return text


@pytest.mark.parametrize("text,expect", [
    ("[" * 100_000 + "]" * 100_000, "nested deeper"),      # RecursionError inside json
    ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested deeper"),
    ("1" * 5000, "not valid JSON"),                      # int_max_str_digits
    ('{"a": ', "truncated?"),
])
def test_json_defects(text: str, expect: str) -> None:
    with pytest.raises(UserError) as err:
        parse_json(text, "f.json")
    assert expect in _one_line(err, "f.json: ")


@pytest.mark.parametrize("text,expect", [
    ("a: " + "[" * 5000 + "]" * 5000, "nested deeper"),
    ("a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested deeper"),
    ("a: &x [*x]", "contains it"),                       # a structure that holds itself
    ("a: 2024-13-45", "month must be"),                  # the timestamp constructor's ValueError
    ("a: [", "not valid YAML"),
    ("? [a]\n: 1", "not valid YAML"),                    # an unhashable key
])
def test_yaml_defects(text: str, expect: str) -> None:
    with pytest.raises(UserError) as err:
        parse_yaml(text, "f.yaml")
    assert expect in _one_line(err, "f.yaml: ")


def test_shared_aliases_are_counted_once() -> None:
    """"Billion laughs": 10 levels of 10 aliases would be 10**10 nodes walked naively."""
    lines = ["l0: &l0 [x]"] + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    data = parse_yaml("\n".join(lines), "f.yaml")
    assert len(data["l9"]) == 10


def test_nesting_within_the_limit_passes() -> None:
    depth = MAX_DEPTH - 1
    assert parse_json("[" * depth + "]" * depth, "f") is not None


@pytest.mark.parametrize("content,expect", [(b"\xff\xfe\x00bad", "not UTF-8 text (byte 0xff at offset 0)"),
                                            (None, "is a directory")])
def test_unreadable_files(tmp_path: Path, content: object, expect: str) -> None:
    path = tmp_path / "in.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)  # type: ignore[arg-type]
    for load in (load_json, load_yaml):
        with pytest.raises(UserError) as err:
            load(path)
        assert expect in _one_line(err, str(path))
