"""The Spack stand-in (tests/standin/bin/spack), run directly on the real recorded locks.

These tests pin the stand-in to how the real Spack 0.23.0.dev0 behaves (notes:
../shared/notes/spack-offline.md §4.4-4.5, §6), so that tests of dedal that use it
where no Spack is present exercise the same contract as a real Spack.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import yaml

from tests.conftest import SPACK_DATA
from tests.standin import STANDIN_SPACK, install_standin, standin_env

FIXTURES = SPACK_DATA / "fixtures"
TINY_IDS = {
    "gcc-runtime": "gcc-runtime-12.2.0-bwhvedyrmjmhx2bjrx7tfwmzlypytfoh",
    "libdedal": "libdedal-1.0-suuk3yz4xpajdofpjlxvqkx3ldb7j6sm",
    "dedal-bootstrap": "dedal-bootstrap-1.0-y53voqk4yh3m3r3ufh4tq5wrnb7y5ngc",
    "dedal-tool": "dedal-tool-1.0-rwfh5ofxwigjngu43bxdlwbxssdkszst",
    "dedal-app": "dedal-app-1.0-jqiwi5fvmfnuwwespap26l5ducyj4evg",
}


# ----------------------------------------------------------------------------- lock model
def edge_types(edge: dict) -> List[str]:
    if "parameters" in edge:
        return list(edge["parameters"]["deptypes"])
    return list(edge["type"])


class LockModel:
    """Just enough of a spack.lock to drive the stand-in like dedal would."""

    def __init__(self, path: Path):
        self.data = json.loads(Path(path).read_text())
        self.nodes: Dict[str, dict] = self.data["concrete_specs"]
        self.roots = [r["hash"] for r in self.data["roots"]]

    def external(self, h: str) -> bool:
        return "external" in self.nodes[h]

    def edges(self, h: str):
        return [(e["hash"], edge_types(e)) for e in self.nodes[h].get("dependencies", [])]

    def closure(self, start, types) -> List[str]:
        out: List[str] = []
        stack = list(start)
        while stack:
            h = stack.pop()
            for d, t in self.edges(h):
                if d not in out and set(t) & set(types):
                    out.append(d)
                    stack.append(d)
        return out

    def required(self, h: str) -> List[str]:
        """Layers a build node needs: direct deps of every type + their link/run closure."""
        direct = [d for d, _t in self.edges(h)]
        need = list(dict.fromkeys(direct + self.closure(direct, ("link", "run"))))
        return [d for d in need if not self.external(d)]

    def runtime(self, h: str) -> List[str]:
        return [d for d in self.closure([h], ("link", "run")) if not self.external(d)]

    def topo(self) -> List[str]:
        order: List[str] = []

        def visit(h):
            if h in order:
                return
            for d, _t in self.edges(h):
                visit(d)
            order.append(h)

        for h in sorted(self.nodes):
            visit(h)
        return [h for h in order if not self.external(h)]

    def dirname(self, h: str) -> str:
        n = self.nodes[h]
        return "%s-%s-%s" % (n["name"], n["version"], h)

    def node_id(self, h: str) -> str:
        return self.dirname(h)

    def value(self, h: str, memo=None) -> int:
        """What the stand-in's executable prints: 1 + value of each non-external link dep."""
        memo = {} if memo is None else memo
        if h not in memo:
            v = 1
            for d, t in self.edges(h):
                if "link" in t and not self.external(d):
                    v += self.value(d, memo)
            memo[h] = v % (1 << 64)
        return memo[h]

    def by_name(self, name: str) -> str:
        (h,) = [h for h, n in self.nodes.items() if n["name"] == name]
        return h


# ----------------------------------------------------------------------------- fixtures
class Spack:
    def __init__(self, root: Path, tmp: Path):
        self.root = root
        self.exe = root / "bin" / "spack"
        self.env = standin_env(cache=tmp / "spack-cache")
        self.env.pop("DEDAL_SHARED_DIR", None)

    def __call__(
        self, *args: str, check: bool = True, env: Optional[dict] = None, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        p = subprocess.run([str(self.exe), *args], env=env or self.env, text=True, capture_output=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(
                "spack %s -> rc %d\nstdout:\n%s\nstderr:\n%s" % (" ".join(args), p.returncode, p.stdout, p.stderr)
            )
        return p


@pytest.fixture
def spack(tmp_path: Path) -> Spack:
    return Spack(install_standin(tmp_path / "spack-root"), tmp_path)


def controlled(tmp_path: Path, **controls) -> Spack:
    return Spack(install_standin(tmp_path / "spack-ctl", **controls), tmp_path)


class Node:
    """One 'build node': an env dir like dedal generates, an install root, stage, mirror."""

    def __init__(
        self,
        tmp: Path,
        lock_file: Path,
        view=False,
        lock_data: Optional[dict] = None,
        user_section: Optional[dict] = None,
        flow_mirrors: bool = False,
        install_tree: Optional[dict] = None,
    ):
        self.tmp = tmp
        self.envdir = tmp / "env"
        self.root = tmp / "install-root"
        self.stage = tmp / "stage"
        self.mirror = tmp / "mirror"
        self.envdir.mkdir(parents=True)
        lock_text = json.dumps(lock_data, separators=(",", ":")) if lock_data else Path(lock_file).read_text()
        (self.envdir / "spack.lock").write_text(lock_text)
        self.lock = LockModel(self.envdir / "spack.lock")
        recorded = yaml.safe_load(Path(str(lock_file).replace(".lock", ".yaml")).read_text())["spack"]
        section = dict(user_section if user_section is not None else recorded)
        section.pop("include", None)  # host paths of the recording machine
        tree = {"root": str(self.root), "projections": {"all": "{name}-{version}-{hash}"}}
        tree.update(install_tree or {})
        section["config"] = dict(
            section.get("config") or {},
            install_tree=tree,
            build_stage=[str(self.stage)],
            source_cache=str(tmp / "source-cache"),
        )
        section.pop("mirrors", None)
        section["view"] = view
        if flow_mirrors:  # the form Spack users write by hand: `mirrors:: {...}`
            text = yaml.safe_dump({"spack": section}, sort_keys=False)
            text += "  mirrors:: {dedal: 'file://%s'}\n" % self.mirror
        else:
            section["mirrors:"] = {"dedal": "file://%s" % self.mirror}
            text = yaml.safe_dump({"spack": section}, sort_keys=False)
        (self.envdir / "spack.yaml").write_text(text)

    def prefix(self, h: str) -> Path:
        return self.root / self.lock.dirname(h)

    def wipe(self):
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.stage, ignore_errors=True)
        self.root.mkdir(parents=True)

    def db(self) -> dict:
        return json.loads((self.root / ".spack-db" / "index.json").read_text())


def install_args(h: str, *extra: str) -> List[str]:
    return ["install", "--only-concrete", "--only", "package", "--no-cache", *extra, "/" + h[:7]]


def per_node_build(spack: Spack, node: Node, layers: Path) -> List[str]:
    """Build every package on its own 'node': wipe, copy the needed layers, reindex, install."""
    e = str(node.envdir)
    lock = node.lock
    built = []
    for h in lock.topo():
        node.wipe()
        need = lock.required(h)
        for d in need:
            shutil.copytree(layers / d, node.prefix(d), symlinks=True)
        spack("-e", e, "reindex")
        p = spack("-e", e, *install_args(h))
        assert "[+] %s" % node.prefix(h) in p.stdout.splitlines()
        assert "==> Installing %s [1/1]" % lock.node_id(h) in p.stdout
        assert all(x.startswith(("==> ", "[+] ", "  Stage: ")) for x in p.stdout.splitlines()), p.stdout
        assert p.stderr == ""
        # exactly one new prefix: nothing else was built on this node
        on_disk = {x for x in os.listdir(node.root) if not x.startswith(".")}
        assert on_disk == {lock.dirname(d) for d in need} | {lock.dirname(h)}
        shutil.copytree(node.prefix(h), layers / h, symlinks=True)
        built.append(h)
    return built


# ----------------------------------------------------------------------------- tests
def test_version_and_unimplemented_commands(spack: Spack, tmp_path: Path):
    assert spack("--version").stdout == "0.23.0.dev0 (dedal test stand-in)\n"
    node = Node(tmp_path / "n", SPACK_DATA / "tiny-dedal.spack.lock")
    for args in (
        ["-e", str(node.envdir), "find"],
        ["-e", str(node.envdir), "install", "/jqiwi5f"],  # no --only package
        ["-e", str(node.envdir), "install", "--only", "dependencies", "/jqiwi5f"],
        ["-e", str(node.envdir), "mirror", "create", "-d", "x", "zlib"],
        ["spec", "zlib"],
    ):
        p = spack(*args, check=False)
        assert p.returncode == 2, args
        assert p.stderr.startswith("==> Error: the dedal test stand-in does not implement: "), p.stderr


@pytest.mark.parametrize("lockname", ["tiny-dedal", "mpi-cuda"])
def test_per_node_builds_then_runtime_closure_runs(spack: Spack, tmp_path: Path, lockname: str):
    node = Node(tmp_path / "node", SPACK_DATA / ("%s.spack.lock" % lockname))
    lock = node.lock
    p = spack("-e", str(node.envdir), "mirror", "create", "-d", str(node.mirror), "--all")
    n_src = len(lock.topo())
    assert "==> Archive stats:" in p.stdout
    assert "    %-4d added" % n_src in p.stdout.splitlines()
    for h in lock.topo():
        n = lock.nodes[h]
        assert (node.mirror / n["name"] / ("%s-%s.tar.gz" % (n["name"], n["version"]))).is_file()

    layers = tmp_path / "layers"
    built = per_node_build(spack, node, layers)
    assert len(built) == n_src

    for h in built:
        spec = json.loads((layers / h / ".spack" / "spec.json").read_text())
        nodes = spec["spec"]["nodes"]
        assert spec["spec"]["_meta"] == {"version": 4}
        assert nodes[0] == lock.nodes[h]  # Spack's own node dict
        assert {n["hash"] for n in nodes} == {h} | set(lock.closure([h], ("build", "link", "run", "test")))
        for n in nodes:
            assert n == lock.nodes[n["hash"]]
        manifest = json.loads((layers / h / ".spack" / "install_manifest.json").read_text())
        assert str(node.prefix(h) / ".spack" / "spec.json") in manifest
        assert str(node.prefix(h)) in manifest
        times = json.loads((layers / h / ".spack" / "install_times.json").read_text())
        assert times["hash"] == h and times["cache"] is False and times["total"] > 0

    # assembly: only the runtime closure of the roots, at the same install root
    node.wipe()
    for r in lock.roots:
        if lock.external(r):
            continue
        for d in [r] + lock.runtime(r):
            if not node.prefix(d).exists():
                shutil.copytree(layers / d, node.prefix(d), symlinks=True)
    for r in lock.roots:
        if lock.external(r):
            continue
        n = lock.nodes[r]
        out = subprocess.run([str(node.prefix(r) / "bin" / n["name"])], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout == "%s %s ok %d\n" % (n["name"], n["version"], lock.value(r))


def test_install_without_reindex_reports_uninstalled_dependencies(spack: Spack, tmp_path: Path):
    node = Node(tmp_path / "node", SPACK_DATA / "tiny-dedal.spack.lock")
    e = str(node.envdir)
    spack("-e", e, "mirror", "create", "-d", str(node.mirror), "--all")
    node.wipe()
    spack("-e", e, *install_args(TINY_IDS["gcc-runtime"].rsplit("-", 1)[1]))
    layer = tmp_path / "gcc-runtime-layer"
    shutil.copytree(node.root / TINY_IDS["gcc-runtime"], layer, symlinks=True)

    node.wipe()  # a new node: the files, but no reindex
    shutil.copytree(layer, node.root / TINY_IDS["gcc-runtime"], symlinks=True)
    p = spack("-e", e, *install_args("suuk3yz"), check=False)
    assert p.returncode == 1
    assert p.stdout == ""
    assert p.stderr.splitlines() == [  # byte for byte what Spack 0.23.0.dev0 printed
        "==> Error: Detected uninstalled dependencies for %s: {'%s'}" % (TINY_IDS["libdedal"], TINY_IDS["gcc-runtime"]),
        "==> Error: Cannot proceed with %s: 1 uninstalled dependency: %s"
        % (TINY_IDS["libdedal"], TINY_IDS["gcc-runtime"]),
    ]
    assert not (node.root / TINY_IDS["libdedal"]).exists()

    spack("-e", e, "reindex")
    p = spack("-e", e, *install_args("suuk3yz"))
    assert "[+] %s" % (node.root / TINY_IDS["libdedal"]) in p.stdout


def test_build_dependency_needed_but_not_its_build_dependencies(spack: Spack, tmp_path: Path):
    node = Node(tmp_path / "node", SPACK_DATA / "tiny-dedal.spack.lock")
    e = str(node.envdir)
    spack("-e", e, "mirror", "create", "-d", str(node.mirror), "--all")
    node.wipe()
    for name in ("gcc-runtime", "libdedal", "dedal-bootstrap", "dedal-tool"):
        spack("-e", e, *install_args(TINY_IDS[name].rsplit("-", 1)[1]))
    layers = tmp_path / "layers"
    shutil.copytree(node.root, layers, symlinks=True)

    # dedal-app on a node without dedal-tool (a build dependency): refused
    node.wipe()
    for name in ("gcc-runtime", "libdedal"):
        shutil.copytree(layers / TINY_IDS[name], node.root / TINY_IDS[name])
    spack("-e", e, "reindex")
    p = spack("-e", e, *install_args("jqiwi5f"), check=False)
    assert p.returncode == 1
    assert p.stderr.splitlines()[-1] == (
        "==> Error: Cannot proceed with %s: 1 uninstalled dependency: %s"
        % (TINY_IDS["dedal-app"], TINY_IDS["dedal-tool"])
    )

    # ... but dedal-bootstrap (a build dep of the build dep) is not needed (notes §4.5 node 5)
    node.wipe()
    for name in ("gcc-runtime", "libdedal", "dedal-tool"):
        shutil.copytree(layers / TINY_IDS[name], node.root / TINY_IDS[name])
    p = spack("-e", e, "reindex")
    assert p.stderr == ""  # a missing build-only dep is recorded without a warning
    db = node.db()["database"]["installs"]
    assert db["y53voqk4yh3m3r3ufh4tq5wrnb7y5ngc"]["installed"] is False
    spack("-e", e, *install_args("jqiwi5f"))
    out = subprocess.run([str(node.root / TINY_IDS["dedal-app"] / "bin" / "dedal-app")], capture_output=True, text=True)
    assert out.stdout == "dedal-app 1.0 ok 4\n"

    # the build runs its build tools: a layer the DB believes in but that is gone fails the build
    node.wipe()
    for name in ("gcc-runtime", "libdedal", "dedal-tool"):
        shutil.copytree(layers / TINY_IDS[name], node.root / TINY_IDS[name])
    spack("-e", e, "reindex")
    os.unlink(node.root / TINY_IDS["dedal-tool"] / "bin" / "dedal-tool")
    p = spack("-e", e, *install_args("jqiwi5f"), check=False)
    assert p.returncode == 1
    assert p.stderr.startswith("==> Error: ProcessError: ")
    assert not (node.root / TINY_IDS["dedal-app"]).exists()


def test_missing_or_misplaced_layer_makes_the_binary_fail_to_load(spack: Spack, tmp_path: Path):
    node = Node(tmp_path / "node", SPACK_DATA / "tiny-dedal.spack.lock")
    e = str(node.envdir)
    spack("-e", e, "mirror", "create", "-d", str(node.mirror), "--all")
    node.wipe()
    # several packages in one call, given in any order: built in dependency order
    hashes = [
        TINY_IDS[n].rsplit("-", 1)[1] for n in ("dedal-app", "libdedal", "dedal-tool", "dedal-bootstrap", "gcc-runtime")
    ]
    p = spack("-e", e, "install", "--only-concrete", "--only=package", "--no-cache", *["/" + h for h in hashes])
    assert p.stdout.count("==> Installing ") == 5
    app = node.root / TINY_IDS["dedal-app"] / "bin" / "dedal-app"
    assert subprocess.run([str(app)], capture_output=True, text=True).stdout == "dedal-app 1.0 ok 4\n"
    readelf = shutil.which("readelf")
    if readelf:
        dyn = subprocess.run(
            [readelf, "-d", str(node.root / TINY_IDS["dedal-app"] / "lib" / "libstandin_dedal_app.so")],
            capture_output=True,
            text=True,
        ).stdout
        assert "(RPATH)" in dyn and "(RUNPATH)" not in dyn
        assert str(node.root / TINY_IDS["libdedal"] / "lib") in dyn

    # misplaced: the same layers under another root do not load (no relocation)
    moved = tmp_path / "elsewhere"
    shutil.copytree(node.root, moved, symlinks=True)
    shutil.rmtree(node.root / TINY_IDS["libdedal"])
    out = subprocess.run([str(moved / TINY_IDS["dedal-app"] / "bin" / "dedal-app")], capture_output=True, text=True)
    assert out.returncode != 0
    assert "libstandin_libdedal.so" in out.stderr
    # missing: a dependency layer left out
    out = subprocess.run([str(app)], capture_output=True, text=True)
    assert out.returncode != 0
    assert "libstandin_libdedal.so: cannot open shared object file" in out.stderr


def test_installed_package_is_a_noop_but_still_needs_its_link_deps(spack: Spack, tmp_path: Path):
    node = Node(tmp_path / "node", SPACK_DATA / "tiny-dedal.spack.lock", flow_mirrors=True)
    e = str(node.envdir)
    spack("-e", e, "mirror", "create", "-d", str(node.mirror), "--all")
    node.wipe()
    spack("-e", e, *install_args("bwhvedy"))
    spack("-e", e, *install_args("suuk3yz"))
    p = spack("-e", e, *install_args("suuk3yz"))
    assert p.stdout == "[+] %s\n" % (node.root / TINY_IDS["libdedal"])
    # like the real Spack: an installed package whose link dep vanished is refused
    shutil.rmtree(node.root / TINY_IDS["gcc-runtime"])
    spack("-e", e, "reindex")
    p = spack("-e", e, *install_args("suuk3yz"), check=False)
    assert p.returncode == 1
    assert "Detected uninstalled dependencies for %s" % TINY_IDS["libdedal"] in p.stderr


def test_unknown_hash_and_missing_environment(spack: Spack, tmp_path: Path):
    node = Node(tmp_path / "node", SPACK_DATA / "tiny-dedal.spack.lock")
    p = spack("-e", str(node.envdir), *install_args("zzzzzzz"), check=False)
    assert p.returncode == 1
    assert p.stderr.startswith(
        "==> Error: Cannot install '/zzzzzzz' because no matching specs are in the current environment."
    )
    p = spack("-e", str(tmp_path / "nope"), "reindex", check=False)
    assert (p.returncode, p.stderr) == (1, "==> Error: no environment in %s\n" % (tmp_path / "nope"))


def test_missing_include_fails_like_spack(spack: Spack, tmp_path: Path):
    node = Node(tmp_path / "node", SPACK_DATA / "tiny-dedal.spack.lock")
    y = yaml.safe_load((node.envdir / "spack.yaml").read_text())
    y["spack"]["include"] = ["/srv/probe/config/externals-host.yaml"]
    (node.envdir / "spack.yaml").write_text(yaml.safe_dump(y))
    p = spack("-e", str(node.envdir), "reindex", check=False)
    assert p.returncode == 1
    assert p.stderr == ("==> Error: Detected 1 missing include path(s):\n   /srv/probe/config/externals-host.yaml\n")


def test_missing_source_fails_like_an_offline_fetch(spack: Spack, tmp_path: Path):
    node = Node(tmp_path / "node", SPACK_DATA / "tiny-dedal.spack.lock")
    node.wipe()
    node.mirror.mkdir()
    p = spack("-e", str(node.envdir), *install_args("bwhvedy"), check=False)
    assert p.returncode == 1
    assert p.stdout == "==> Installing %s [1/1]\n" % TINY_IDS["gcc-runtime"]
    assert p.stderr == "==> Error: FetchError: All fetchers failed for spack-stage-%s\n" % TINY_IDS["gcc-runtime"]
    assert not (node.root / TINY_IDS["gcc-runtime"]).exists()


def test_fail_control_gives_a_spack_build_error_and_no_prefix(tmp_path: Path):
    spack = controlled(tmp_path, fail=["libdedal"])
    node = Node(tmp_path / "node", SPACK_DATA / "tiny-dedal.spack.lock")
    e = str(node.envdir)
    spack("-e", e, "mirror", "create", "-d", str(node.mirror), "--all")
    node.wipe()
    spack("-e", e, *install_args("bwhvedy"))
    p = spack("-e", e, *install_args("suuk3yz", "-v"), check=False)
    assert p.returncode == 1
    err = p.stderr.splitlines()
    assert err[0] == "==> Error: ProcessError: Command exited with status 2:"
    assert "1 error found in build log:" in err
    log = Path(err[err.index("See build log for details:") + 1].strip())
    assert log.name == "spack-build-out.txt" and log.is_file()
    assert log.parent.name == "spack-stage-" + TINY_IDS["libdedal"]
    assert "fails on request" in log.read_text()
    assert not (node.root / TINY_IDS["libdedal"]).exists()
    assert not node.db()["database"]["installs"].get("suuk3yz4xpajdofpjlxvqkx3ldb7j6sm", {}).get("installed")
    p = spack("-e", e, *install_args("suuk3yz", "--fail-fast"), check=False)
    assert p.returncode == 1
    assert "==> Error: Terminating after first install failure: ProcessError: Command exited with status 2:" in p.stderr


def _wait_for(pred, timeout=60.0):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_sleep_control_and_an_interrupted_build_leaves_no_complete_prefix(tmp_path: Path, sig):
    spack = controlled(tmp_path, sleep={"libdedal": 60})
    node = Node(tmp_path / "node", SPACK_DATA / "tiny-dedal.spack.lock")
    e = str(node.envdir)
    spack("-e", e, "mirror", "create", "-d", str(node.mirror), "--all")
    node.wipe()
    spack("-e", e, *install_args("bwhvedy"))
    proc = subprocess.Popen(
        [str(spack.exe), "-e", e, *install_args("suuk3yz")],
        env=spack.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert _wait_for(
            lambda: (
                list(node.stage.glob("*/spack-stage-*/spack-build-out.txt"))
                and any("sleeping" in p.read_text() for p in node.stage.glob("*/spack-stage-*/spack-build-out.txt"))
            )
        )
        os.killpg(proc.pid, sig)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    prefix = node.root / TINY_IDS["libdedal"]
    assert not (prefix / ".spack" / "spec.json").exists()
    if sig == signal.SIGTERM:
        assert not prefix.exists()
    # a partial prefix from a kill is neither indexed nor reused: reindex + install rebuild it
    (prefix / "lib").mkdir(parents=True, exist_ok=True)
    (prefix / "lib" / "libstandin_libdedal.so").write_text("half written")
    spack2 = controlled(tmp_path / "again")
    spack2("-e", e, "reindex")
    assert not node.db()["database"]["installs"].get("suuk3yz4xpajdofpjlxvqkx3ldb7j6sm", {}).get("installed")
    spack2("-e", e, *install_args("suuk3yz"))
    assert (prefix / ".spack" / "spec.json").is_file()


def test_database_has_the_shape_of_spacks(spack: Spack, tmp_path: Path):
    fixture = json.loads((FIXTURES / "dedal.spack-db.index.json").read_text())
    node = Node(tmp_path / "node", SPACK_DATA / "tiny-dedal.spack.lock")
    e = str(node.envdir)
    spack("-e", e, "mirror", "create", "-d", str(node.mirror), "--all")
    node.wipe()
    for name in ("gcc-runtime", "libdedal", "dedal-bootstrap", "dedal-tool", "dedal-app"):
        spack("-e", e, *install_args(TINY_IDS[name].rsplit("-", 1)[1]))
    raw = (node.root / ".spack-db" / "index.json").read_text()
    assert "\n" not in raw and ", " not in raw[:200]  # compact, like Spack's
    db = json.loads(raw)
    assert list(db) == list(fixture) == ["database"]
    assert list(db["database"]) == list(fixture["database"]) == ["version", "installs"]
    assert db["database"]["version"] == "7"
    installs, finst = db["database"]["installs"], fixture["database"]["installs"]
    assert set(installs) == set(finst)
    for h, rec in installs.items():
        assert list(rec) == list(finst[h]), h
        assert rec["spec"] == finst[h]["spec"]
        assert rec["installed"] is True
        assert rec["ref_count"] == finst[h]["ref_count"], h
        if "external" in rec["spec"]:
            assert rec["path"] == "/usr" and rec["explicit"] is False
        else:
            assert rec["path"] == str(node.root / node.lock.dirname(h))

    # reindex on a node with libdedal but not its link dep gcc-runtime: registered as not
    # installed, with the warning the real Spack printed in exactly this situation
    for name in ("gcc-runtime", "dedal-app", "dedal-tool", "dedal-bootstrap"):
        shutil.rmtree(node.root / TINY_IDS[name])
    (node.root / ".spack-db" / "index.json").unlink()
    p = spack("-e", e, "reindex")
    assert p.stdout == ""
    gone = node.root / TINY_IDS["gcc-runtime"]
    assert (
        "==> Warning: gcc-runtime@12.2.0%gcc@12.2.0 build_system=generic arch=linux-debian12-x86_64_v3/bwhvedy "
        "is being registered in the database with prefix {0}, but this directory does not contain an "
        "installation of the spec, due to: Install prefix {0} does not exist.".format(gone)
    ) in p.stderr
    installs = node.db()["database"]["installs"]
    assert installs["bwhvedyrmjmhx2bjrx7tfwmzlypytfoh"]["installed"] is False
    assert installs["suuk3yz4xpajdofpjlxvqkx3ldb7j6sm"]["installed"] is True
    assert installs["suuk3yz4xpajdofpjlxvqkx3ldb7j6sm"]["explicit"] is True
    assert installs["bvqfy73zr3su2dnlqwc3y4e4ywpxurno"]["installed"] is True  # external glibc


def test_prefix_spec_json_is_byte_identical_to_spacks(spack: Spack, tmp_path: Path):
    node = Node(tmp_path / "node", SPACK_DATA / "tiny-dedal.spack.lock")
    e = str(node.envdir)
    spack("-e", e, "mirror", "create", "-d", str(node.mirror), "--all")
    node.wipe()
    hashes = [TINY_IDS[n].rsplit("-", 1)[1] for n in TINY_IDS]
    spack("-e", e, "install", "--only-concrete", "--only=package", "--no-cache", *["/" + h for h in hashes])
    prefix = node.root / TINY_IDS["dedal-app"]
    assert (prefix / ".spack" / "spec.json").read_bytes() == (FIXTURES / "dedal-app.prefix.spec.json").read_bytes()
    for name in ("install_times.json", "install_environment.json"):
        mine = json.loads((prefix / ".spack" / name).read_text())
        real = json.loads((FIXTURES / ("dedal-app." + name)).read_text())
        assert list(mine) == list(real), name
    times = json.loads((prefix / ".spack" / "install_times.json").read_text())
    real_times = json.loads((FIXTURES / "dedal-app.install_times.json").read_text())
    assert [p["name"] for p in times["phases"]] == [p["name"] for p in real_times["phases"]]
    manifest = json.loads((prefix / ".spack" / "install_manifest.json").read_text())
    exe = manifest[str(prefix / "bin" / "dedal-app")]
    assert set(exe) == {"mode", "owner", "group", "hash", "time", "size"} and len(exe["hash"]) == 32
    assert manifest[str(prefix)]["mode"] == 0o42755  # setgid dirs, as Spack leaves them


def _to_lockfile_v4(lock: dict) -> dict:
    lock = json.loads(json.dumps(lock))
    lock["_meta"] = {"file-type": "spack-lockfile", "lockfile-version": 4, "specfile-version": 3}
    for node in lock["concrete_specs"].values():
        for edge in node.get("dependencies", []):
            edge["type"] = edge.pop("parameters")["deptypes"]
    return lock


def test_lockfile_v4_dependency_form(spack: Spack, tmp_path: Path):
    v5 = json.loads((SPACK_DATA / "tiny-dedal.spack.lock").read_text())
    node = Node(tmp_path / "node", SPACK_DATA / "tiny-dedal.spack.lock", lock_data=_to_lockfile_v4(v5))
    assert '"type":["build","link"]' in (node.envdir / "spack.lock").read_text()
    spack("-e", str(node.envdir), "mirror", "create", "-d", str(node.mirror), "--all")
    layers = tmp_path / "layers"
    built = per_node_build(spack, node, layers)
    assert len(built) == 5
    app = "jqiwi5fvmfnuwwespap26l5ducyj4evg"
    out = subprocess.run([str(node.prefix(app) / "bin" / "dedal-app")], capture_output=True, text=True)
    # the runtime closure is on the last node (libdedal, gcc-runtime were materialized)
    assert out.stdout == "dedal-app 1.0 ok 4\n"
    nodes = json.loads((layers / app / ".spack" / "spec.json").read_text())["spec"]["nodes"]
    edges = {e["name"]: e["parameters"]["deptypes"] for e in nodes[0]["dependencies"]}
    assert edges == {
        "dedal-tool": ["build"],
        "gcc-runtime": ["link"],
        "glibc": ["link"],
        "gmake": ["build"],
        "libdedal": ["build", "link"],
    }


def test_padded_install_root(spack: Spack, tmp_path: Path):
    node = Node(tmp_path / "node", SPACK_DATA / "tiny-dedal.spack.lock", install_tree={"padded_length": 128})
    e = str(node.envdir)
    spack("-e", e, "mirror", "create", "-d", str(node.mirror), "--all")
    p = spack("-e", e, *install_args("bwhvedy"))
    line = [x for x in p.stdout.splitlines() if x.startswith("[+] ")][0]
    padded_root = os.path.dirname(line[4:])
    # Spack's add_padding: exactly 128 characters, or 127 when the padding would end in
    # an empty component (it then ends with a '/', which the prefix path swallows)
    assert len(padded_root) in (127, 128) and "__spack_path_placeholder__" in padded_root
    assert padded_root.startswith(str(node.root) + "/")


def test_concretize_picks_the_recorded_lock(spack: Spack, tmp_path: Path):
    envdir = tmp_path / "env"
    envdir.mkdir()
    recorded = yaml.safe_load((SPACK_DATA / "mpi-cuda.spack.yaml").read_text())["spack"]
    recorded.pop("include")
    recorded["view"] = False
    (envdir / "spack.yaml").write_text(yaml.safe_dump({"spack": recorded}))
    p = spack("-e", str(envdir), "concretize")
    assert p.stdout.startswith("==> Concretized 7 specs:\n")
    assert (envdir / "spack.lock").read_bytes() == (SPACK_DATA / "mpi-cuda.spack.lock").read_bytes()
    assert spack("-e", str(envdir), "concretize").stdout == "==> No new specs to concretize.\n"

    # same roots as mpi-cuda-pure: told apart by packages:
    pure = yaml.safe_load((SPACK_DATA / "mpi-cuda-pure.spack.yaml").read_text())["spack"]
    (envdir / "spack.yaml").write_text(yaml.safe_dump({"spack": dict(pure, view=False)}))
    spack("-e", str(envdir), "concretize", "-f")
    assert (envdir / "spack.lock").read_bytes() == (SPACK_DATA / "mpi-cuda-pure.spack.lock").read_bytes()

    (envdir / "spack.yaml").write_text(yaml.safe_dump({"spack": {"specs": ["zlib", "hdf5+mpi"], "view": False}}))
    p = spack("-e", str(envdir), "concretize", "-f", check=False)
    assert p.returncode == 1
    assert "the dedal test stand-in cannot concretize" in p.stderr


@pytest.mark.parametrize(
    "specs,name,closest",
    [
        (["dedal-appp"], "dedal-appp", "dedal-app"),
        (["dedal-app ^libdedall"], "libdedall", "libdedal"),  # a dependency's name too
        (["qqqqqqqq"], "qqqqqqqq", ""),
    ],
)
def test_concretize_an_unknown_package_fails_as_spack_does(
    spack: Spack, tmp_path: Path, specs: list, name: str, closest: str
):
    """The shape of Spack e8f8cf85's UnknownPackageError, as it prints it for `zlibb`:
    ``==> Error: Package 'spack.pkg.builtin.zlibb' not found.``, Spack's advice, then
    "Did you mean" with one to five close names (none: no such paragraph); exit 1."""
    envdir = tmp_path / "env"
    envdir.mkdir()
    (envdir / "spack.yaml").write_text(yaml.safe_dump({"spack": {"specs": specs, "view": False}}))
    p = spack("-e", str(envdir), "concretize", "-f", check=False)
    assert p.returncode == 1 and not (envdir / "spack.lock").exists()
    lines = p.stderr.splitlines()
    assert lines[:2] == [
        f"==> Error: Package 'spack.pkg.builtin.{name}' not found.",
        "Use 'spack create' to create a new package.",
    ]
    if closest:
        assert lines[2:4] == ["", "Did you mean one of the following packages?"] and lines[4] == f"  {closest}"
        assert 1 <= len(lines[4:]) <= 5 and all(line.startswith("  ") for line in lines[4:])
    else:
        assert len(lines) == 2


def test_view_and_activation(spack: Spack, tmp_path: Path):
    view = tmp_path / "view"
    node = Node(
        tmp_path / "node", SPACK_DATA / "tiny-dedal.spack.lock", view={"default": {"root": str(view), "link": "all"}}
    )
    e = str(node.envdir)
    spack("-e", e, "mirror", "create", "-d", str(node.mirror), "--all")
    node.wipe()
    for name in ("gcc-runtime", "libdedal", "dedal-bootstrap", "dedal-tool", "dedal-app"):
        spack("-e", e, *install_args(TINY_IDS[name].rsplit("-", 1)[1]))
    p = spack("-e", e, "env", "view", "regenerate")
    assert p.stdout in ("", "==> Updating view at %s\n" % view)  # install already updated it
    assert view.is_symlink() and Path(os.readlink(view)).parent == tmp_path / "._view"
    assert (view / "bin" / "dedal-app").is_symlink()
    assert not (view / "bin" / "dedal-tool").exists()  # build-only: not in the view
    assert os.readlink(view / "lib" / "libstandin_libdedal.so") == str(
        node.root / TINY_IDS["libdedal"] / "lib" / "libstandin_libdedal.so"
    )
    assert (view / ".spack" / "dedal-app" / "spec.json").is_file()
    out = subprocess.run([str(view / "bin" / "dedal-app")], capture_output=True, text=True)
    assert out.stdout == "dedal-app 1.0 ok 4\n"

    env = dict(spack.env, PATH="/usr/bin:/bin")
    for k in ("ACLOCAL_PATH", "CMAKE_PREFIX_PATH", "MANPATH", "PKG_CONFIG_PATH", "LD_LIBRARY_PATH"):
        env.pop(k, None)
    act = spack("env", "activate", "--sh", "-d", e, env=env).stdout
    recorded = (SPACK_DATA / "tiny-dedal.activate.sh").read_text()

    def exports(text, vroot):
        out = {}
        for line in text.splitlines():
            if line.startswith("export "):
                k, v = line[len("export ") :].rstrip(";").split("=", 1)
                out[k] = (
                    [x for x in v.split(":") if x.startswith(vroot)] if k not in ("SPACK_ENV", "SPACK_ENV_VIEW") else v
                )
        return out

    mine, real = exports(act, str(view)), exports(recorded, "/dev/shm/spack-view")
    assert list(mine) == list(real)
    for k in real:
        if k == "SPACK_ENV":
            assert mine[k] == str(node.envdir)
        elif k == "SPACK_ENV_VIEW":
            assert mine[k] == real[k] == "default"
        else:
            assert mine[k] == [x.replace("/dev/shm/spack-view", str(view)) for x in real[k]], k
    assert "LD_LIBRARY_PATH" not in act
    assert "alias despacktivate='spack env deactivate';" in act.splitlines()
    assert "export PATH=%s/bin:/usr/bin:/bin;" % view in act.splitlines()
    if os.path.isdir("/usr/share/aclocal"):
        assert "export ACLOCAL_PATH=/usr/share/aclocal:%s/share/aclocal;" % view in act.splitlines()

    # no view: only the environment itself
    node2 = Node(tmp_path / "node2", SPACK_DATA / "tiny-dedal.spack.lock", view=False)
    act = spack("env", "activate", "--sh", "-d", str(node2.envdir), env=env).stdout
    assert act == "export SPACK_ENV=%s;\nalias despacktivate='spack env deactivate';\n" % node2.envdir


def test_standin_runs_with_python_39_syntax():
    """The stand-in must run on the python3 of a minimal Debian root (3.9+), stdlib only."""
    import ast

    src = STANDIN_SPACK.read_text()
    tree = ast.parse(src, feature_version=(3, 9))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    stdlib = getattr(sys, "stdlib_module_names", None)
    if stdlib:
        assert imported <= set(stdlib) | {"__future__"}, imported - set(stdlib)
    assert os.access(STANDIN_SPACK, os.X_OK)
    assert src.startswith("#!/usr/bin/python3\n")  # Debian host and root fs; no pyenv shim


def _standin_module():
    from importlib.machinery import SourceFileLoader
    import types

    loader = SourceFileLoader("dedal_spack_standin", str(STANDIN_SPACK))
    mod = types.ModuleType(loader.name)
    mod.__file__ = str(STANDIN_SPACK)
    loader.exec_module(mod)
    return mod


def test_minimal_yaml_reader_agrees_with_pyyaml():
    """The stand-in reads spack.yaml without PyYAML: it must agree with it on real files."""
    standin = _standin_module()
    texts = [p.read_text() for p in sorted(SPACK_DATA.glob("*.spack.yaml"))]
    texts += [p.read_text() for p in sorted(SPACK_DATA.glob("externals-host*.yaml"))]
    for p in sorted(SPACK_DATA.glob("*.spack.yaml")):
        doc = yaml.safe_load(p.read_text())
        doc["spack"]["mirrors:"] = {"dedal": "file:///srv/mirror", "other": {"url": "file:///x", "signed": False}}
        doc["spack"]["view"] = {"default": {"root": "/opt/view", "link": "all", "link_type": "symlink"}}
        doc["spack"]["config"] = {
            "install_tree": {
                "root": "/opt/esd",
                "padded_length": 128,
                "projections": {"all": "{name}-{version}-{hash}"},
            },
            "build_stage": ["$tempdir/$user/spack-stage"],
            "build_jobs": 4,
        }
        texts.append(yaml.safe_dump(doc, sort_keys=False))
        texts.append(yaml.safe_dump(doc, default_flow_style=True))
        texts.append(json.dumps(doc, indent=1))
    texts.append(
        "spack:\n  specs: [zlib, 'hdf5 +mpi']  # roots\n  mirrors:: {dedal: file:///m}\n"
        "  view:\n    default:\n      root: /opt/view\n  packages:\n    all:\n      target: [x86_64_v3]\n"
        "  note: |\n    two\n    lines\n"
    )
    for text in texts:
        expected = yaml.safe_load(text)
        if "mirrors::" in text:  # YAML reads `mirrors::` as the key 'mirrors:' too
            assert expected["spack"]["mirrors:"] == {"dedal": "file:///m"}
        assert standin.yaml_load(text) == expected, text


def test_spec_strings_compare_token_wise():
    standin = _standin_module()
    key = standin.spec_key
    assert key("openmpi@5 fabrics=ucx schedulers=slurm +cuda") == key("openmpi@5+cuda fabrics=ucx schedulers=slurm")
    assert key("ucx +cuda") == key("ucx+cuda")
    assert key("ucx +cuda") != key("ucx ~cuda")
    assert key("hdf5+mpi ^openmpi@5") != key("hdf5+mpi")
