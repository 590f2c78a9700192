"""Property: no input makes dedal print a traceback or write a file (issue 22).

Hypothesis generates malformed spack.locks, plans, configuration files, environment
files, ``-s`` settings, argument vectors and registry references (1,400 a run: 150 to
200 of each kind through the CLI, 300 references; each from a real, valid artifact bent
in one place, or from scratch) and runs them through the
CLI's ``main`` in this process (the installed script is the same function; a process
per input would take an hour). Every run must end with exit 0 or 2 (2: one line
``dedal: error: ...``, or argparse's usage), print no traceback, and leave every
directory as it found it. An exit of 70 is dedal's own "internal error" line: a bug."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from dedal import cli
from dedal.errors import UserError
from dedal.model.config import SETTINGS
from dedal.model.oci import parse_reference
from dedal.model.plan import make_plan
from dedal.model.spack_lock import parse_lock
from tests.conftest import SPACK_DATA

pytestmark = pytest.mark.reliability

LOCK_TEXT = (SPACK_DATA / "tiny-zlib.spack.lock").read_text()
LOCK = json.loads(LOCK_TEXT)
PLAN = make_plan(
    parse_lock(LOCK_TEXT), env_name="t", install_root="/opt/sw", base_image="debian-trixie", base_id="b-1"
).to_json()
ENV = {
    "spack": {"specs": sorted(parse_lock(LOCK_TEXT).root_specs.values()), "concretizer": {"unify": True}},
    "dedal": {"name": "t", "tag": "v1", "install_root": "/opt/sw"},
}
CONFIG = {"jobs": 2, "install_root": "/opt/sw", "slurm": {"nodes": 2, "extra_args": ["--x"]}, "keep_going": True}

FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,
    derandomize=False,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: the failing input is in the message
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)

NASTY = st.sampled_from(
    [
        "",
        ".",
        "..",
        "../x",
        "../../escaped",
        "/",
        "/etc/passwd",
        "a/b",
        "a\x00b",
        "a\nb",
        "-rf",
        "x" * 300,
        "\u00e9" * 150,
        "\udcff",
        "[",
        "{",
        "[a",
        "~",
        "$HOME",
        "%s",
        "1e999",
        "NaN",
        "2024-13-45",
        "0x10",
        "-1",
        "true",
        "null",
        "\t",
        " ",
        "*",
        "!!python/object:os.system",
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    NASTY,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=8), NASTY), inner, max_size=4)
    ),
    max_leaves=12,
)


@pytest.fixture(scope="module", autouse=True)
def isolated(tmp_path_factory) -> Iterator[None]:
    """No user configuration, no DEDAL_* of the caller's; data and cache under a temporary home."""
    home = tmp_path_factory.mktemp("home")
    saved = dict(os.environ)
    for k in [k for k in os.environ if k.startswith("DEDAL_")]:
        del os.environ[k]
    os.environ.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local/share"),
        XDG_CACHE_HOME=str(home / ".cache"),
    )
    cwd = os.getcwd()
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


def _tree(root: Path) -> List[Tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*"))


def run(argv: List[str], files: Dict[str, Any]) -> Tuple[int, str]:
    """``dedal ARGV`` in a fresh directory holding ``files``; asserts the properties."""
    work = Path(tempfile.mkdtemp(prefix="dedal-fuzz-"))
    try:
        for rel, content in files.items():
            path = work / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content if isinstance(content, bytes) else str(content).encode("utf-8", "surrogateescape"))
        home = Path(os.environ["HOME"])
        before, home_before = _tree(work), _tree(home)
        os.chdir(work)
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                rc = cli.main(argv)
            except SystemExit as exc:  # argparse
                rc = exc.code if isinstance(exc.code, int) else 2
        text = err.getvalue()
        assert "Traceback" not in text, text
        assert rc in (0, 2), (argv, rc, text[-500:])
        lines = [line for line in text.splitlines() if line.strip()]
        if rc == 2 and lines and not lines[0].startswith("usage:"):  # argparse: usage, then its error
            assert len(lines) == 1 and lines[0].startswith("dedal: error: "), text
        assert _tree(work) == before, f"{argv}: files written"
        assert _tree(home) == home_before, f"{argv}: files written under HOME"
        return rc, text
    finally:
        os.chdir("/")
        shutil.rmtree(work, ignore_errors=True)


# ----------------------------------------------------------------------------- documents bent in one place


def _paths(doc: Any, prefix: Tuple = ()) -> List[Tuple]:
    found = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            found += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found += _paths(v, prefix + (i,))
    return found


@st.composite
def bent(draw: Any, doc: Any) -> Any:
    """``doc`` with one place replaced, deleted or nested deeply."""
    doc = json.loads(json.dumps(doc))
    paths = _paths(doc)
    where = draw(st.sampled_from(paths[1:] if len(paths) > 1 else paths))
    how = draw(st.sampled_from(["replace", "replace", "delete", "nest"]))
    parent = doc
    for part in where[:-1]:
        parent = parent[part]
    last = where[-1]
    if how == "delete":
        del parent[last]
    elif how == "nest":
        depth = draw(st.integers(min_value=50, max_value=150))  # past MAX_DEPTH; the parsers' own limits: RAW
        value: Any = parent[last]
        for _ in range(depth):
            value = [value]
        parent[last] = value
    else:
        parent[last] = draw(VALUES)
    return doc


def _text(doc: Any, as_yaml: bool = False) -> str:
    if as_yaml:
        import yaml

        try:
            return yaml.safe_dump(doc, allow_unicode=True)
        except (yaml.YAMLError, RecursionError, UnicodeEncodeError):
            return json.dumps(doc)
    try:
        return json.dumps(doc)
    except (RecursionError, ValueError):
        return "[" * 5000 + "]" * 5000


RAW = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200),
    st.integers(1000, 100_000).map(lambda n: "[" * n + "]" * n),
    st.integers(70, 1500).map(lambda n: "a: " + "{b: " * n + "1" + "}" * n),
    st.builds(lambda s, n: s[:n], st.just(LOCK_TEXT), st.integers(0, len(LOCK_TEXT))),
)


@FUZZ
@given(data=st.data())
def test_locks(data: Any) -> None:
    content = data.draw(st.one_of(bent(LOCK).map(_text), RAW))
    run(["plan", "x.lock"], {"x.lock": content})


@FUZZ
@given(data=st.data())
def test_plans(data: Any) -> None:
    content = data.draw(st.one_of(bent(PLAN).map(_text), RAW))
    command = data.draw(
        st.sampled_from(
            [["plan", "p.json"], ["layers", "--layers", "L", "gc", "--plan", "p.json"], ["plan", "p.json", "--json"]]
        )
    )
    run(command, {"p.json": content})


@settings(FUZZ, max_examples=150)
@given(data=st.data())
def test_configuration_files(data: Any) -> None:
    content = data.draw(st.one_of(bent(CONFIG).map(lambda d: _text(d, as_yaml=True)), RAW))
    run(["-c", "c.yaml", "config", "show", "--json"], {"c.yaml": content})


@settings(FUZZ, max_examples=150)
@given(data=st.data())
def test_environment_files(data: Any) -> None:
    content = data.draw(st.one_of(bent(ENV).map(lambda d: _text(d, as_yaml=True)), RAW))
    run(["plan", "env/env.yaml"], {"env/env.yaml": content, "env/spack.lock": LOCK_TEXT})


KEYS = st.one_of(st.sampled_from([s.key for s in SETTINGS]), st.text(max_size=12), NASTY)


@FUZZ
@given(
    pairs=st.lists(st.tuples(KEYS, st.one_of(st.text(max_size=40), NASTY)), min_size=1, max_size=3),
    raw=st.lists(st.one_of(st.text(max_size=20), NASTY), max_size=2),
)
def test_settings(pairs: List[Tuple[str, str]], raw: List[str]) -> None:
    argv: List[str] = []
    for key, value in pairs:
        argv += ["-s", f"{key}={value}"]
    for item in raw:
        argv += ["-s", item]
    run([*argv, "config", "show", "--json"], {})


WORDS = st.one_of(
    st.sampled_from(
        [
            "plan",
            "config",
            "show",
            "layers",
            "list",
            "verify",
            "gc",
            "--json",
            "-o",
            "--layers",
            "--plan",
            "--simulate",
            "--nodes",
            "--cores",
            "-c",
            "-s",
            "x.lock",
            "--dry-run",
            "--install-root",
            "0",
            "-1",
            "99999999999999999999",
        ]
    ),
    NASTY,
    st.text(max_size=10),
)


@FUZZ
@given(argv=st.lists(WORDS, min_size=1, max_size=6))
def test_argument_vectors(argv: List[str]) -> None:
    """Only commands that read: plan, config, layers (list, show, verify, gc on an empty store)."""
    if argv[0] not in ("plan", "config", "layers"):
        argv = ["plan", *argv]
    if argv[0] == "layers":
        argv = ["layers", "--layers", "L", *argv[1:]]
    run(argv, {"x.lock": LOCK_TEXT})


@settings(max_examples=300, deadline=None, database=None)
@given(
    text=st.one_of(
        st.text(max_size=80),
        NASTY,
        st.builds(
            lambda h, p, r, t: f"oras://{h}{p}/{r}:{t}",
            st.one_of(st.text(max_size=12), NASTY),
            st.one_of(st.just(""), st.integers(-5, 10**6).map(lambda n: f":{n}")),
            st.one_of(st.text(max_size=12), NASTY),
            st.one_of(st.text(max_size=12), NASTY),
        ),
    )
)
def test_references(text: str) -> None:
    """A reference parses or is a UserError: nothing else (no network: parsing only)."""
    try:
        ref = parse_reference(text)
    except UserError as exc:
        assert "\n" not in exc.one_line()
        return
    port = ref.host.rsplit(":", 1)[1] if ":" in ref.host and not ref.host.endswith("]") else "443"
    assert 0 < int(port) < 65536 and ".." not in ref.repository.split("/")
