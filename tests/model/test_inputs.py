"""Reading a user's JSON and YAML: every defect one UserError line (issue 22, item 4)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dedal.errors import UserError
from dedal.model.inputs import MAX_DEPTH, load_json, load_yaml, parse_json, parse_yaml

pytestmark = pytest.mark.reliability


def _one_line(exc: pytest.ExceptionInfo, start: str) -> str:
    text = str(exc.value)
    assert "\n" not in text and text.startswith(start), text
    return text


@pytest.mark.parametrize(
    "text,expect",
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper"),  # RecursionError inside json
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested deeper"),
        ("1" * 5000, "not valid JSON"),  # int_max_str_digits
        ('{"a": ', "truncated?"),
    ],
)
def test_json_defects(text: str, expect: str) -> None:
    with pytest.raises(UserError) as err:
        parse_json(text, "f.json")
    assert expect in _one_line(err, "f.json: ")


@pytest.mark.parametrize(
    "text,expect",
    [
        ("a: " + "[" * 5000 + "]" * 5000, "nested deeper"),
        ("a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested deeper"),
        ("a: &x [*x]", "contains it"),  # a structure that holds itself
        ("a: 2024-13-45", "month must be"),  # the timestamp constructor's ValueError
        ("a: [", "not valid YAML"),
        ("? [a]\n: 1", "not valid YAML"),  # an unhashable key
    ],
)
def test_yaml_defects(text: str, expect: str) -> None:
    with pytest.raises(UserError) as err:
        parse_yaml(text, "f.yaml")
    assert expect in _one_line(err, "f.yaml: ")


def test_yaml_flow_depth_is_refused_before_pyyaml_reads_it(monkeypatch) -> None:
    """PyYAML's scanner is quadratic in the flow depth: a deep file is refused by counting its
    brackets, and PyYAML never sees it; brackets in quotes and comments do not count."""
    import yaml

    def never(*_a, **_k):
        raise AssertionError("PyYAML read a file that was deep enough to refuse first")

    for deep in ("a: " + "{b: " * 1500 + "1" + "}" * 1500, "[" * 100_000 + "]" * 100_000):
        monkeypatch.setattr(yaml, "safe_load", never)
        with pytest.raises(UserError, match=f"nested deeper than {MAX_DEPTH} levels"):
            parse_yaml(deep, "f.yaml")
    monkeypatch.undo()
    quoted = 'a: "' + "[" * 100 + "\"\nb: '" + "{" * 100 + "'\n# " + "[" * 100 + "\nc: [1, [2]]\n"
    assert parse_yaml(quoted, "f.yaml") == {"a": "[" * 100, "b": "{" * 100, "c": [1, [2]]}


@pytest.mark.parametrize(
    "text,expect",
    [
        # line and column 1-based (PyYAML's marks are 0-based), then PyYAML's problem and its context
        (
            "spack:\n  specs: [zlib\n",
            ":3:1: not valid YAML: expected ',' or ']', but got '<stream end>' (while parsing a flow sequence at 2:10)",
        ),
        ("spack:\n  specs: [zlib]\n  x: : y\n", ":3:6: not valid YAML: mapping values are not allowed here"),
        ("spack:\n\tspecs: [zlib]\n", ":2:1: not valid YAML: found character '\\t' that cannot start any token"),
        ("a: 'x\n", ":2:1: not valid YAML: found unexpected end of stream (while scanning a quoted scalar at 1:4)"),
        ("a: *nope\n", ":1:4: not valid YAML: found undefined alias 'nope'"),
        ("a: !!python/object:os.system x\n", ":1:4: not valid YAML: could not determine a constructor"),
    ],
)
def test_yaml_syntax_errors_name_the_line_and_column(tmp_path: Path, text: str, expect: str) -> None:
    path = tmp_path / "env.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        load_yaml(path)
    assert _one_line(err, f"{path}:").startswith(f"{path}{expect}"), str(err.value)


def test_yaml_errors_in_a_value_say_where_in_words() -> None:
    """A value that is no file (a ``-s key=[a`` setting) has no FILE:LINE:COLUMN to name."""
    with pytest.raises(UserError) as err:
        parse_yaml("[a", "slurm.extra_args")
    assert _one_line(
        err,
        "slurm.extra_args: not valid YAML (expected ',' or ']', but got '<stream end>' "
        "at line 1 column 3) (while parsing a flow sequence at 1:1)",
    )


def test_shared_aliases_are_counted_once() -> None:
    """ "Billion laughs": 10 levels of 10 aliases would be 10**10 nodes walked naively."""
    lines = ["l0: &l0 [x]"] + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    data = parse_yaml("\n".join(lines), "f.yaml")
    assert len(data["l9"]) == 10


def test_nesting_within_the_limit_passes() -> None:
    depth = MAX_DEPTH - 1
    assert parse_json("[" * depth + "]" * depth, "f") is not None


@pytest.mark.parametrize(
    "content,expect", [(b"\xff\xfe\x00bad", "not UTF-8 text (byte 0xff at offset 0)"), (None, "is a directory")]
)
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


def _random_json(rng: random.Random, depth: int) -> object:
    """Nested lists and objects down to ``depth`` levels somewhere, strings with and without
    brackets, quotes and backslashes among the leaves."""
    if depth == 0:
        return rng.choice([1, 2.5, None, True, "plain", "é", "", "a[b", 'say "x"', "back\\slash", "}{"])
    kids = [_random_json(rng, depth - 1)] + [
        _random_json(rng, rng.randint(0, min(2, depth - 1))) for _ in range(rng.randint(0, 3))
    ]
    return {f"k{i}": k for i, k in enumerate(kids)} if rng.random() < 0.5 else kids


@pytest.mark.parametrize("seed", range(40))
def test_the_depth_read_from_the_text_is_the_depth_of_the_data(seed: int) -> None:
    """parse_json reads the nesting from the brackets of the text where no string holds a
    bracket, quote or backslash, else it walks the data: either way the same depth, and the
    same answer at MAX_DEPTH and one level more."""
    import json
    from dedal.model.inputs import _json_depth_problem, _json_text_depth

    rng = random.Random(seed)
    data = _random_json(rng, rng.choice([0, 1, 3, 8, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1]))
    ascii_only = rng.random() < 0.5
    text = json.dumps(data, ensure_ascii=ascii_only, indent=rng.choice([None, 1]))
    walked = 0
    level = [data] if isinstance(data, (dict, list)) else []
    while level:
        walked += 1
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v) if isinstance(c, (dict, list))]
    read = _json_text_depth(text)
    assert read is None or read == min(walked, MAX_DEPTH + 1)
    # the strings as written in the text (escapes and all): read from the text unless one of them has a mark
    written = [json.dumps(leaf, ensure_ascii=ascii_only)[1:-1] for leaf in _leaves(data) if isinstance(leaf, str)]
    assert (read is not None) == (not any(set(w) & set('[]{}"\\') for w in written))
    assert bool(_json_depth_problem(data)) == (walked > MAX_DEPTH)
    if walked > MAX_DEPTH:
        with pytest.raises(UserError, match="nested deeper"):
            parse_json(text, "f")
    else:
        assert parse_json(text, "f") == data


def _leaves(data: object) -> list:
    if isinstance(data, dict):
        return [leaf for v in data.values() for leaf in _leaves(v)]
    if isinstance(data, list):
        return [leaf for v in data for leaf in _leaves(v)]
    return [data]
