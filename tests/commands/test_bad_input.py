"""Every input the issue-22 tester found ending in a traceback, through the installed CLI:
exit 2, one line naming the file and what is wrong, nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Union

import pytest
import yaml

from tests.conftest import ROOT, SPACK_DATA
from tests.standin import install_standin

pytestmark = pytest.mark.reliability

LOCK = (SPACK_DATA / "tiny-zlib.spack.lock").read_text()
BAD = b"\xff\xfe\x00bad"
ENV = "spack:\n  specs: [zlib]\n"
BAD_ENV = ROOT / "tests" / "fixtures" / "data" / "bad-env"  # one file per fault, shared with tests/model


def _bad_env(fault: str) -> str:
    return (BAD_ENV / f"{fault}.yaml").read_text()


def _lock(mutate) -> str:  # noqa: ANN001
    data = json.loads(LOCK)
    mutate(data)
    return json.dumps(data)


def _virtuals(data: dict) -> None:
    for spec in data["concrete_specs"].values():
        for dep in spec.get("dependencies", []):
            dep["parameters"] = {"deptypes": ["link"], "virtuals": 5}


CASES: Dict[str, tuple] = {
    "non-UTF-8 plan": (["plan", "plan.json"], {"plan.json": BAD}, "not UTF-8"),
    "non-UTF-8 env file": (["plan", "env.yaml"], {"env.yaml": BAD}, "not UTF-8"),
    "non-UTF-8 lock": (["plan", "x.lock"], {"x.lock": BAD}, "not UTF-8"),
    "non-UTF-8 config": (["-c", "c.yaml", "config", "show"], {"c.yaml": BAD}, "not UTF-8"),
    "non-UTF-8 base definition": (["base", "show", "b.yaml"], {"b.yaml": BAD}, "not UTF-8"),
    "deep JSON plan": (["plan", "p.json"], {"p.json": "[" * 100_000 + "]" * 100_000}, "nested deeper"),
    "deep JSON lock": (["plan", "p.lock"], {"p.lock": "[" * 100_000 + "]" * 100_000}, "nested deeper"),
    "deep YAML env file": (["plan", "env.yaml"], {"env.yaml": "spack: " + "[" * 5000 + "]" * 5000}, "nested deeper"),
    "deep YAML config": (
        ["-c", "c.yaml", "config", "show"],
        {"c.yaml": "jobs: " + "[" * 5000 + "]" * 5000},
        "nested deeper",
    ),
    "lock virtuals not a list": (["plan", "v.lock"], {"v.lock": _lock(_virtuals)}, "'virtuals' must be a list"),
    "lock include_concrete specs a list": (
        ["plan", "i.lock"],
        {"i.lock": _lock(lambda d: d.__setitem__("include_concrete", {"x": {"concrete_specs": [1], "roots": []}}))},
        "include_concrete",
    ),
    "layers gc --plan DIR": (
        ["layers", "--layers", "L", "gc", "--plan", "d", "--dry-run"],
        {"d/x": ""},
        "is a directory",
    ),
    "file name too long": (["plan", "a" * 300 + ".lock"], {}, "File name too long"),
    "file name too long: inspect": (["inspect", "a" * 300], {}, "file name too long"),
    "file name too long: status": (["status", "a" * 300], {}, "file name too long"),
    "file name too long: -c": (["-c", "a" * 300, "config", "show"], {}, "file name too long"),
    "image ..:x": (["verify", "..:x"], {}, "no such image"),
    "oras port out of range": (["pull", "oras://localhost:99999/x:tag"], {}, "not a TCP port"),
    "plan -o /": (["plan", "g.lock", "-o", "/"], {"g.lock": LOCK}, "is a directory"),
    "-s list=[a": (["-s", "slurm.extra_args=[a", "config", "show"], {}, "slurm.extra_args: not valid YAML"),
    "lock file ..lock": (["plan", "..lock"], {"..lock": LOCK}, "environment name ''"),
    "package name ../x": (
        ["plan", "n.lock"],
        {"n.lock": _lock(lambda d: next(iter(d["concrete_specs"].values())).__setitem__("name", "../x"))},
        "cannot be used as a file name",
    ),
    "build without a mirror": (["build", "g.lock", "--layers", "L"], {"g.lock": LOCK}, "source mirror"),
    "build a non-UTF-8 lock": (["-s", "mirror=.", "build", "x.lock", "--layers", "L"], {"x.lock": BAD}, "not UTF-8"),
    # issue 35: values the env file can be checked for before anything is written, YAML's line and column
    "fetch: unknown base_image": (
        ["fetch", "e/env.yaml"],
        {"e/env.yaml": _bad_env("unknown-base-image")},
        "e/env.yaml: dedal.base_image: unknown base image 'debian-trixxie'; known: debian-trixie, ",
    ),
    "build-image: unknown base_image": (
        ["build-image", "e/env.yaml"],
        {"e/env.yaml": _bad_env("unknown-base-image")},
        "dedal.base_image: unknown base image 'debian-trixxie'",
    ),
    "fetch: unknown runtime_base": (
        ["fetch", "e/env.yaml"],
        {"e/env.yaml": _bad_env("unknown-runtime-base")},
        "dedal.runtime_base: unknown base image 'nope'",
    ),
    "plan: every fault of an env file": (
        ["plan", "e/env.yaml"],
        {"e/env.yaml": _bad_env("several-faults")},
        "e/env.yaml: 5 problems: dedal: unknown key 'colour' (known: ",
    ),
    "fetch: unknown base_image setting": (
        ["-s", "base_image=bogus", "fetch", "e/env.yaml"],
        {"e/env.yaml": ENV},
        "setting base_image: unknown base image 'bogus'; known: ",
    ),
    "fetch: spack.config not a mapping": (
        ["fetch", "e/env.yaml"],
        {"e/env.yaml": _bad_env("spack-config-not-mapping")},
        "e/env.yaml: spack.config: expected object, got 5",
    ),
    "fetch: env file YAML": (
        ["fetch", "e/env.yaml"],
        {"e/env.yaml": "spack:\n  specs: [zlib\n"},
        "e/env.yaml:3:1: not valid YAML: expected ',' or ']', but got '<stream end>' "
        "(while parsing a flow sequence at 2:10)",
    ),
    "build-image: env file YAML": (
        ["build-image", "e/env.yaml"],
        {"e/env.yaml": ENV + "  x: : y\n"},
        "e/env.yaml:3:6: not valid YAML: mapping values are not allowed here",
    ),
    "fetch: spack.yaml YAML": (
        ["fetch", "s"],
        {"s/spack.yaml": "spack:\n  specs: [zlib]\n   view: false\n"},
        "s/spack.yaml:3:4: not valid YAML: expected <block end>, but found '<block mapping start>'",
    ),
    "plan: env file YAML": (
        ["plan", "e/env.yaml"],
        {"e/env.yaml": "spack:\n\tspecs: [zlib]\n"},
        "e/env.yaml:2:1: not valid YAML: found character '\\t' that cannot start any token",
    ),
    "config file YAML": (
        ["-c", "c.yaml", "config", "show"],
        {"c.yaml": "jobs: 2\nslurm:\n  nodes: [1\n"},
        "c.yaml:4:1: not valid YAML: expected ',' or ']'",
    ),
    "base definition YAML": (
        ["base", "show", "b.yaml"],
        {"b.yaml": "name: x\nsuite: trixie\npackages: {base: [a}\n"},
        "b.yaml:3:20: not valid YAML: expected ',' or ']', but got '}'",
    ),
    # issue 39: an input read whole is bounded: 8 MiB (INPUT_LIMIT), a spack.lock 64 MiB (LOCK_LIMIT)
    "env file over 8 MiB": (
        ["plan", "e/env.yaml"],
        {"e/env.yaml": ENV + "#" * (9 << 20) + "\n"},
        "e/env.yaml: too large (9437208 bytes; dedal reads at most 8 MiB of it)",
    ),
    "plan over 8 MiB": (
        ["plan", "p.json"],
        {"p.json": " " * (9 << 20) + "{}"},
        "p.json: too large (9437186 bytes; dedal reads at most 8 MiB of it)",
    ),
    "config over 8 MiB": (
        ["-c", "c.yaml", "config", "show"],
        {"c.yaml": "#" * (9 << 20)},
        "c.yaml: too large (9437184 bytes; dedal reads at most 8 MiB of it)",
    ),
    "base definition over 8 MiB": (
        ["base", "show", "b.yaml"],
        {"b.yaml": "#" * (9 << 20)},
        "b.yaml: too large (9437184 bytes; dedal reads at most 8 MiB of it)",
    ),
    "lock over 64 MiB": (["plan", "big.lock"], {"big.lock": LOCK + " " * (64 << 20)}, "big.lock: too large ("),
}


def _files(root: Path) -> List[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_writes_nothing(name: str, run_dedal, tmp_path: Path) -> None:
    argv, files, expect = CASES[name]
    content: Union[str, bytes]
    for rel, content in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = _files(tmp_path)
    r = run_dedal(*argv)
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dedal: error: ") and expect in lines[0], r.stderr
    assert _files(tmp_path) == before


def _one_error_line(r, json_output: bool) -> str:  # noqa: ANN001
    """The error line; with --json it is all of stderr, else the progress lines come before it."""
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("dedal: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], r.stderr
    assert len(lines) == 1 if json_output else all(line.startswith("[") for line in lines[:-1]), r.stderr
    return errors[0]


MISSPELLED = (
    "dedal: error: e/env.yaml: Spack cannot concretize it: ==> Error: Package 'spack.pkg.builtin.dedal-appp' "
    "not found. | Did you mean one of the following packages? dedal-app, dedal-bootstrap, dedal-tool"
)


@pytest.mark.parametrize("json_output", [True, False])
def test_a_misspelled_package_is_bad_input_in_spacks_words_and_leaves_nothing(
    run_dedal, tmp_path: Path, as_root, json_output: bool
) -> None:
    """Spack (the stand-in, as Spack prints it) finds no package `dedal-appp`: exit 2, Spack's
    own ``==> Error:`` line and its suggestions, not the command; no work dir, no mirror."""
    spack = install_standin(tmp_path / "spack")
    env_file = tmp_path / "e" / "env.yaml"
    env_file.parent.mkdir()
    env_file.write_text(yaml.safe_dump({"spack": {"specs": ["dedal-appp"]}, "dedal": {"base_image": "host"}}))
    data = tmp_path / "data"
    before = _files(tmp_path)
    env = {"DEDAL_DATA_DIR": str(data), "DEDAL_SPACK_ROOT": str(spack), "DEDAL_CACHE_DIR": str(tmp_path / "c")}
    r = run_dedal("fetch", "e/env.yaml", *(["--json"] if json_output else []), env=env)
    assert _one_error_line(r, json_output) == MISSPELLED
    assert "concretize -f" not in r.stderr and "log:" not in r.stderr
    assert not data.exists()  # no work/e (spack.yaml, fetch-env, the log), no empty mirror
    assert [f for f in _files(tmp_path) if f not in before and not f.startswith("c")] == []  # c: Spack's user cache


def test_a_misspelled_package_leaves_an_earlier_fetch_as_it_was(run_dedal, tmp_path: Path, as_root) -> None:
    """After a good fetch, the same environment with a misspelled package: exit 2, and the
    earlier manifest, lock, plan and mirror stay as they were, so that nothing builds the
    misspelled manifest with the earlier lock, and the good one is not concretized again."""
    spack = install_standin(tmp_path / "spack")
    env_file = tmp_path / "e" / "env.yaml"
    env_file.parent.mkdir()
    good = {
        "spack": {"specs": ["dedal-app"], "concretizer": {"unify": True}},
        "dedal": {"name": "tiny", "base_image": "host", "install_root": "/opt/esd/software"},
    }
    env_file.write_text(yaml.safe_dump(good))
    env = {
        "DEDAL_DATA_DIR": str(tmp_path / "data"),
        "DEDAL_SPACK_ROOT": str(spack),
        "DEDAL_CACHE_DIR": str(tmp_path / "c"),
    }
    first = run_dedal("fetch", "e/env.yaml", "--json", env=env)
    assert first.returncode == 0, first.stderr
    work = tmp_path / "data" / "work" / "tiny"
    kept = {
        p: p.read_bytes()
        for p in sorted((tmp_path / "data").rglob("*"))
        if p.is_file() and "logs" not in p.parts and "fetch-store" not in p.parts
    }
    assert {work / "spack.yaml", work / "spack.lock", work / "plan.json", work / "fetch-env" / "spack.lock"} <= set(
        kept
    )
    env_file.write_text(yaml.safe_dump({**good, "spack": {"specs": ["dedal-appp"]}}))
    r = run_dedal("fetch", "e/env.yaml", "--json", env=env)
    assert _one_error_line(r, True) == MISSPELLED
    assert {p: p.read_bytes() for p in kept if p.is_file()} == kept
    env_file.write_text(yaml.safe_dump(good))
    again = run_dedal("fetch", "e/env.yaml", "--json", env=env)
    assert again.returncode == 0 and json.loads(again.stdout)["concretized"] is False, again.stderr


REAL_SPACK = {  # spec: (exit code, what the one line says after "e/env.yaml: " / "spack concretize: ")
    "zlibb": (
        2,
        "e/env.yaml: Spack cannot concretize it: ==> Error: Package 'spack.pkg.builtin.zlibb' not found. | "
        "Did you mean one of the following packages? zlib, libxcb, libusb",
    ),
    "zlib@99": (
        2,
        "e/env.yaml: Spack cannot concretize it: ==> Error: concretization failed for the following reasons: "
        "| 1. Cannot satisfy 'zlib@99'",
    ),
    "zlib+foo": (
        2,
        'e/env.yaml: Spack cannot concretize it: ==> Error: trying to set variant "foo" in package "zlib", '
        "but the package has no such variant [happened when validating 'zlib+foo']",
    ),
    # a compiler the base lacks: not classified as the user's input, a failed tool with command and log
    "zlib%gcc@99": (
        1,
        "spack concretize: ==> Error: concretization failed for the following reasons: "
        "| 1. No valid version for 'zlib' compiler 'gcc' satisfies '@99'; log: ",
    ),
}


@pytest.mark.spack
@pytest.mark.parametrize("spec", list(REAL_SPACK))
def test_real_spack_says_what_is_wrong_with_the_input(
    run_dedal, real_spack, trixie_base, as_root, tmp_path: Path, spec: str
) -> None:
    """The real Spack concretizing in the debian-trixie base: the errors that are the user's
    (a misspelled package, a version or variant no recipe has) are bad input in Spack's own
    words, nothing written; one that is not (a compiler the base lacks) stays exit 1."""
    code, expect = REAL_SPACK[spec]
    env_file = tmp_path / "e" / "env.yaml"
    env_file.parent.mkdir()
    env_file.write_text(yaml.safe_dump({"spack": {"specs": [spec]}}))
    data = tmp_path / "data"
    env = {
        "DEDAL_DATA_DIR": str(data),
        "DEDAL_SPACK_ROOT": str(real_spack),  # Spack's repository index: cached
        "DEDAL_CACHE_DIR": os.environ.get("DEDAL_CACHE_DIR", str(Path.home() / ".cache" / "dedal")),
    }
    r = run_dedal("fetch", "e/env.yaml", "--lock-only", "--json", env=env, timeout=1800)
    assert "Traceback" not in r.stderr and r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dedal: error: " + expect), r.stderr
    if code == 2:
        assert not data.exists(), sorted(str(p) for p in data.rglob("*"))
    else:
        assert "concretize -f` exited with code 1" in lines[0]


@pytest.mark.parametrize(
    "argv,name",
    [
        (["plan", "{}"], "env.yaml"),
        (["plan", "{}"], "x.lock"),
        (["plan", "{}"], "plan.json"),
        (["-c", "{}", "config", "show"], "c.yaml"),
        (["base", "show", "{}"], "b.yaml"),
    ],
)
@pytest.mark.parametrize("kind", ["FIFO", "device"])
def test_an_input_that_is_no_regular_file_is_refused_at_once(
    argv: List[str], name: str, kind: str, run_dedal, tmp_path: Path
) -> None:
    """A FIFO nobody writes to is never waited on, /dev/zero (endless) never read."""
    path = tmp_path / name
    if kind == "FIFO":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    r = run_dedal(*[a.replace("{}", str(path)) for a in argv], timeout=60)
    lines = r.stderr.strip().splitlines()
    what = "a FIFO" if kind == "FIFO" else "a character device"
    assert r.returncode == 2 and lines == [f"dedal: error: {path}: is {what}, not a regular file"], r.stderr


def test_a_sif_object_over_its_limit_is_one_line(run_dedal, tmp_path: Path) -> None:
    """A SIF's descriptors say what they like: a labels object over OBJECT_LIMIT (16 MiB) is
    refused before it is read."""
    import subprocess

    from dedal.model import sif

    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "f").write_text("x")
    part = tmp_path / "p.sqfs"
    subprocess.run(["mksquashfs", str(tmp_path / "root"), str(part), "-quiet", "-no-progress"], check=True)
    big = {"dedal.env": "x", "pad": "a" * (17 << 20)}
    sif.write_sif(tmp_path / "big.sif", part, definition="", labels=big, metadata={})
    r = run_dedal("inspect", str(tmp_path / "big.sif"))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"dedal: error: {tmp_path / 'big.sif'}: object 3 (labels.json): too large (17825828 bytes; "
        "dedal reads at most 16 MiB of it)"
    ], r.stderr
