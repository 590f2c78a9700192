"""One rule set for names that become paths: package names, versions and hashes of a
lock, a plan's env_name and tag, a lock file's name (issue 22, item 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dedal.errors import UserError
from dedal.model.names import MAX_NAME_BYTES, name_problem, safe_name
from dedal.model.plan import Plan, make_plan
from dedal.model.spack_lock import parse_lock
from tests.conftest import SPACK_DATA

pytestmark = pytest.mark.reliability

LOCK = SPACK_DATA / "tiny-zlib.spack.lock"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        ".",
        "..",
        "../x",
        "a/b",
        "/abs",
        "a\0b",
        "a\nb",
        "-rf",
        "x" * (MAX_NAME_BYTES + 1),
        "\u00e9" * (MAX_NAME_BYTES // 2 + 1),
        None,
        5,
        ["a"],
    ],
)
def test_unsafe_names_are_refused(bad: object) -> None:
    assert name_problem(bad)
    with pytest.raises(UserError) as err:
        safe_name(bad, "package name", "x.lock")
    line = err.value.one_line()
    assert line.startswith("x.lock: package name ") and "\n" not in str(err.value)


@pytest.mark.parametrize("good", ["zlib", "py-numpy", "1.2.3", "git.abc=main", "x" * MAX_NAME_BYTES, "a..b", ".hidden"])
def test_ordinary_names_pass(good: str) -> None:
    assert name_problem(good) == ""
    assert safe_name(good, "name") == good


def test_the_plain_name_shortcut_accepts_only_what_the_rules_accept() -> None:
    """safe_name() passes a plain ASCII name by one match; it must never pass one that
    name_problem() refuses, nor refuse one it accepts (40,000 names near the edges)."""
    import random
    from dedal.model.names import _PLAIN

    rng = random.Random(7)
    plain, other = "aZ09_.+-", "/=@~%^,:\0\n\x7f \u00e9"
    matched = 0
    for _ in range(40_000):
        size = rng.choice([0, 1, 2, 3, 8, MAX_NAME_BYTES - 1, MAX_NAME_BYTES, MAX_NAME_BYTES + 1])
        chars = [rng.choice(plain) for _ in range(size)]
        if chars and rng.random() < 0.3:  # one character of another kind somewhere
            chars[rng.randrange(size)] = rng.choice(other)
        name = "".join(chars)
        if _PLAIN.fullmatch(name):
            matched += 1
            assert name_problem(name) == "", name
        try:
            assert safe_name(name, "name") == name and name_problem(name) == ""
        except UserError:
            assert name_problem(name), name
    assert matched > 10_000  # the shortcut was taken, not only the rules


def _lock_with(field: str, value: object) -> str:
    data = json.loads(LOCK.read_text())
    spec = next(iter(data["concrete_specs"].values()))
    spec[field] = value
    return json.dumps(data)


@pytest.mark.parametrize(
    "field,value",
    [("name", "../../escape"), ("name", "a/b"), ("version", ".."), ("version", "1.0/../../x"), ("name", "")],
)
def test_lock_names_are_checked_where_they_enter(field: str, value: str) -> None:
    with pytest.raises(UserError, match="cannot be used as a file name"):
        parse_lock(_lock_with(field, value), Path("x.lock"))


def test_lock_hash_key_is_checked() -> None:
    data = json.loads(LOCK.read_text())
    key = next(iter(data["concrete_specs"]))
    data["concrete_specs"]["../" + key] = data["concrete_specs"].pop(key)
    with pytest.raises(UserError, match="cannot be used as a file name"):
        parse_lock(json.dumps(data), Path("x.lock"))


def _plan_json() -> dict:
    lock = parse_lock(LOCK.read_text(), LOCK)
    return make_plan(lock, env_name="t", install_root="/opt/sw", base_image="b", base_id="b-1").to_json()


@pytest.mark.parametrize(
    "field,value",
    [
        ("env_name", "../../escaped"),
        ("tag", "../../x"),
        ("env_name", ""),
        ("tag", "a\0b"),
        ("env_name", 5),
        ("install_root", "relative"),
        ("install_root", "/opt/../etc"),
    ],
)
def test_plan_fields_that_become_paths(field: str, value: object) -> None:
    data = _plan_json()
    data[field] = value
    with pytest.raises(UserError) as err:
        Plan.from_json(data, "p.json")
    assert err.value.one_line().startswith("p.json: ")


@pytest.mark.parametrize(
    "field,value", [("name", "../x"), ("version", "../../x"), ("key", "../../k"), ("hash", "other")]
)
def test_plan_node_names(field: str, value: str) -> None:
    data = _plan_json()
    node = next(iter(data["nodes"].values()))
    node[field] = value
    with pytest.raises(UserError):
        Plan.from_json(data, "p.json")


def test_plan_names_unknown_hashes() -> None:
    data = _plan_json()
    data["to_build"] = ["nothere"]
    with pytest.raises(UserError, match="not a node of the plan"):
        Plan.from_json(data, "p.json")


def test_make_plan_refuses_unsafe_env_name_and_tag() -> None:
    lock = parse_lock(LOCK.read_text(), LOCK)
    for kw in ({"env_name": ".."}, {"env_name": "t", "tag": "../x"}):
        with pytest.raises(UserError):
            make_plan(lock, install_root="/opt/sw", base_image="b", base_id="b-1", **{"env_name": "t", **kw})


def test_lock_file_name_that_gives_no_env_name(run_dedal, tmp_path: Path) -> None:
    (tmp_path / "..lock").write_text(LOCK.read_text())
    before = sorted(tmp_path.rglob("*"))
    r = run_dedal("plan", "..lock")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "rename the file" in r.stderr
    assert sorted(tmp_path.rglob("*")) == before


def test_plan_with_escaping_env_name_writes_nothing(run_dedal, tmp_path: Path) -> None:
    data = _plan_json()
    data["env_name"] = "../../escaped"
    (tmp_path / "p.json").write_text(json.dumps(data))
    before = sorted(tmp_path.rglob("*"))
    r = run_dedal("assemble", "p.json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "env_name '../../escaped' cannot be used as a file name" in r.stderr
    assert sorted(tmp_path.rglob("*")) == before and not (tmp_path.parent / "escaped").exists()
