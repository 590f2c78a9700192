"""`dedal plan` through the installed CLI, on every real lock (cross-checked in
test_spack_lock.py) and with a layer store."""

from __future__ import annotations

import json

import pytest

from dedal.model.layers import LayerManifest, LayerStore
from tests.conftest import SPACK_DATA

LOCKS = sorted(SPACK_DATA.glob("*.spack.lock")) + sorted(SPACK_DATA.glob("*/*.spack.lock"))
KEYS = {
    "lockfile_version",
    "roots",
    "nodes",
    "runtime_closure",
    "build_only",
    "to_build",
    "cached",
    "build_requirements",
    "waves",
}


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_plan_json_on_every_real_lock(run_dedal, lock):
    res = run_dedal("plan", str(lock), "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert KEYS <= set(plan)
    raw = json.loads(lock.read_text())
    assert plan["lockfile_version"] == raw["_meta"]["lockfile-version"]
    assert set(plan["nodes"]) == set(raw["concrete_specs"])
    assert plan["roots"] == [r["hash"] for r in raw["roots"]]
    for h, node in plan["nodes"].items():
        assert {"name", "version", "external", "build_only", "deps"} <= set(node)
        assert node["external"] == bool(raw["concrete_specs"][h].get("external"))
    externals = {h for h, n in plan["nodes"].items() if n["external"]}
    assert set(plan["to_build"]) == set(plan["nodes"]) - externals  # empty store: everything is built
    assert plan["cached"] == []
    assert sorted(h for w in plan["waves"] for h in w) == sorted(plan["to_build"])
    assert set(plan["runtime_closure"]) | set(plan["build_only"]) == set(plan["nodes"])
    assert not set(plan["runtime_closure"]) & set(plan["build_only"])
    for h, reqs in plan["build_requirements"].items():
        assert not set(reqs) & externals
        assert set(plan["nodes"][h]["deps"]) - externals <= set(reqs)


def test_plan_marks_cached_layers_and_skips_their_build_deps(run_dedal, tmp_path):
    lock = SPACK_DATA / "tiny-dedal.spack.lock"
    first = json.loads(run_dedal("plan", str(lock), "--json").stdout)
    by_name = {n["name"]: h for h, n in first["nodes"].items()}
    store = LayerStore(tmp_path / "layers")
    app = by_name["dedal-app"]
    key = first["nodes"][app]["key"]
    tmp = store.temp_path(key)
    tmp.write_bytes(b"not really squashfs")
    store.add(
        LayerManifest(
            key=key,
            name="dedal-app",
            version="1.0",
            hash=app,
            namespace="dedaltest",
            prefix="p",
            install_root=first["install_root"],
            base_id=first["base_id"],
        ),
        tmp,
    )
    plan = json.loads(run_dedal("plan", str(lock), "--layers", str(tmp_path / "layers"), "--json").stdout)
    assert plan["cached"] == [app]
    names = {plan["nodes"][h]["name"] for h in plan["to_build"]}
    assert names == {"gcc-runtime", "libdedal"}  # dedal-tool/-bootstrap only served dedal-app's build
    assert plan["nodes"][by_name["dedal-tool"]]["status"] == "not_needed"
    # another install root is another key: nothing cached
    other = json.loads(
        run_dedal(
            "plan", str(lock), "--layers", str(tmp_path / "layers"), "--install-root", "/opt/other", "--json"
        ).stdout
    )
    assert other["cached"] == []


def test_human_plan_output(run_dedal):
    res = run_dedal("plan", str(SPACK_DATA / "mpi-cuda.spack.lock"))
    assert res.returncode == 0
    assert "43 packages: 11 external, 0 cached, 32 to build" in res.stdout
    assert "9 waves" in res.stdout and "critical path" in res.stdout
    # the plan's critical path is at the model's reference cores, the simulation's on the nodes' cores: it says so
    flat = " ".join(res.stdout.split())
    assert "at make -j2 per package; `dedal plan --simulate` estimates it on the build nodes' cores" in flat


def test_plan_of_an_unseen_lock(run_dedal, tmp_path):
    """A lock dedal has never seen: both real locks merged through include_concrete (v5)."""
    a = json.loads((SPACK_DATA / "tiny-dedal.spack.lock").read_text())
    b = json.loads((SPACK_DATA / "realpy.spack.lock").read_text())
    a["include_concrete"] = {"/envs/py": {"roots": b["roots"], "concrete_specs": b["concrete_specs"]}}
    path = tmp_path / "merged.lock"
    path.write_text(json.dumps(a))
    plan = json.loads(run_dedal("plan", str(path), "--json").stdout)
    assert len(plan["roots"]) == 2
    names = {plan["nodes"][h]["name"] for h in plan["runtime_closure"]}
    assert {"dedal-app", "py-six", "python-venv"} <= names


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "empty file"),
        ('{"_meta": {"file-type": "spack-lockfile", "lockfile-version": 42}}', "unsupported lockfile-version 42"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_locks_exit_2_one_line(run_dedal, tmp_path, content, message):
    path = tmp_path / "bad.lock"
    path.write_text(content)
    res = run_dedal("plan", str(path))
    assert res.returncode == 2
    assert message in res.stderr and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


def test_help_lists_only_real_subcommands(run_dedal):
    res = run_dedal("--help")
    assert res.returncode == 0
    for cmd in ("plan", "build", "fetch", "layers", "config", "base", "inspect", "publish", "pull", "verify"):
        assert cmd in res.stdout


def test_a_command_imports_its_own_module_only():
    """`dedal plan` registers and imports the plan command alone (importing every command's
    stages cost every run of dedal half a second); without a command, or with one that is
    not known, every command is there, for the listing and the error."""
    import subprocess
    import sys

    probe = (
        "import sys; from dedal.cli import build_parser; "
        "p = build_parser(sys.argv[1:]); "
        "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules "
        "if m.startswith('dedal.commands.') and not m.startswith('dedal.commands._')))"
    )

    def loaded(*argv: str) -> list:
        out = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=True)
        return eval(out.stdout)  # a printed list of names

    assert loaded("-s", "nodes=2", "plan", "x.lock") == ["plan"]
    assert loaded("--config", "c.yaml", "shell", "img.sif") == ["exec"]
    assert loaded("build-image", "--help") == ["build_image"]
    everything = loaded("--help")
    assert {"plan", "verify", "build_image", "exec", "node_build"} <= set(everything)
    assert loaded("nosuch") == everything


def test_command_modules_import_their_stages_only_when_they_run():
    """Registering a command (its --help, an argument error, `dedal --help`, `dedal completion`)
    imports no stage and no HTTP or git client: the test suite starts dedal some 370 times,
    and the build stage alone cost half a second of each start. build-image (the pipeline,
    for its stage names) and verify (its parsers, for --kind) still import theirs."""
    import subprocess
    import sys

    light = [
        "assemble",
        "base",
        "build",
        "ci",
        "completion",
        "config",
        "diff",
        "exec",
        "fetch",
        "images",
        "inspect",
        "layers",
        "node-build",
        "plan",
        "publish",
        "pull",
        "rebuild",
        "status",
    ]
    probe = (
        "import sys; from dedal.cli import build_parser\n"
        f"for name in {light!r}: build_parser([name])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('requests', 'oras', 'jsonschema', 'git')\n"
        "             or m.startswith(('dedal.stages', 'dedal.schedule', 'dedal.ci', 'dedal.adapters.registry'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_bare_lock_takes_its_base_from_the_plan_json_beside_it(run_dedal, tmp_path):
    """Spack's lock names no base image: `dedal plan LOCK` takes it from the plan.json that `dedal fetch`
    (here `plan -o`) wrote next to the lock, and says when it falls back to the setting."""
    lock = tmp_path / "gpu" / "spack.lock"
    lock.parent.mkdir()
    lock.write_bytes((SPACK_DATA / "tiny-dedal.spack.lock").read_bytes())
    bare = run_dedal("plan", str(lock))
    assert bare.returncode == 0, bare.stderr
    title = " ".join(bare.stdout.split("┏")[0].split())  # the title above the table, unwrapped
    assert title == (
        "plan for gpu (install root /opt/esd/software, base debian-trixie: setting base_image, "
        "not recorded next to the lock)"
    )
    cuda = {"DEDAL_BASE_IMAGE": "debian-trixie-cuda"}
    recorded = json.loads(run_dedal("plan", str(lock), "-o", str(lock.parent / "plan.json"), "--json", env=cuda).stdout)
    assert recorded["base_image"] == "debian-trixie-cuda" and recorded["lock_path"] == str(lock)
    again = run_dedal("plan", str(lock))
    assert "base debian-trixie-cuda)" in " ".join(again.stdout.split()) and "setting base_image" not in again.stdout
    plan = json.loads(run_dedal("plan", str(lock), "--json").stdout)
    assert (plan["base_image"], plan["base_id"]) == (recorded["base_image"], recorded["base_id"])
