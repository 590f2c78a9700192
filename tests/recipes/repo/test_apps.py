"""recipes/repo's two application benchmarks of the EBRAINS/EUHPC container paper, the
parts that run without Spack: dedal.neuron-ringtest (NEURON's ringtest) and
dedal.arbor-busyring (the paper's Arbor ring). What each recipe does is held against the
pinned tree (the archive recipes/gitsrc/archive.py put into this machine's mirror; skipped
where it has not run): every source edit finds its text exactly once, the launcher runs the
files the tree has, busyring-input writes what the tree's gen-inputs.py writes, and the
reference spikes are what the ringtest recipe says. The recipes' constants are read from
their text (a recipe imports spack, which is not here)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Dict

import pytest
import yaml

from dedal.model import git_sources as gs
from dedal.model.config import load_settings
from tests.conftest import ROOT

PACKAGES = ROOT / "recipes" / "repo" / "packages"
MANIFEST = ROOT / "recipes" / "repo" / gs.MANIFEST


def constants(package: str) -> Dict[str, object]:
    """The literal class attributes of the recipe of ``package``."""
    tree = ast.parse((PACKAGES / package / "package.py").read_text())
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    found: Dict[str, object] = {}
    for node in cls.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return found


def pinned_tree(package: str) -> Dict[str, bytes]:
    """The files of the archive the manifest pins for ``package``, by path below its prefix."""
    [entry] = [s for s in gs.read(MANIFEST).sources if s.package == package]
    archive = Path(load_settings().mirror) / entry.storage_path
    if not archive.is_file():
        pytest.skip(f"{entry.spec} is not in the mirror: run recipes/gitsrc/archive.py (it clones {entry.repository})")
    files: Dict[str, bytes] = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            assert (member.name + "/").startswith(entry.prefix), member.name
            if member.isfile():
                files[member.name[len(entry.prefix) :]] = tar.extractfile(member).read()
    return files


# ----------------------------------------------------------------------------- arbor-busyring


def test_busyring_edits_each_find_their_text_once():
    tree = pinned_tree("arbor-busyring")
    c = constants("arbor-busyring")
    edits = c["CMAKE_EDITS"] + c["ARBOR_09_EDITS"]
    assert {name for name, _, _ in edits} == {"CMakeLists.txt", "ring.cpp"}
    for name, old, new in edits:
        assert tree[name].decode().count(old) == 1, (name, old)
    # the submodule the upstream CMakeLists adds is not in the archive: the edits take it out
    assert not any(path.startswith("ext/json/") for path in tree)
    cmake = tree["CMakeLists.txt"].decode()
    for _, old, new in c["CMAKE_EDITS"]:
        cmake = cmake.replace(old, new.format(arbor="0.9.0"))
    assert "ext/json" not in cmake and "find_package(arbor 0.9.0 CONFIG REQUIRED)" in cmake
    assert "find_package(nlohmann_json CONFIG REQUIRED)" in cmake and "add_executable(busyring ring.cpp)" in cmake
    assert "find_package(pugixml CONFIG REQUIRED)" in cmake  # arbor::arborio's link interface names it
    assert "install(TARGETS busyring" in c["CMAKE_INSTALL"] and "install(" not in tree["CMakeLists.txt"].decode()
    # after the 0.9 edits no Arbor 0.10 name is left
    ring = tree["ring.cpp"].decode()
    for _, old, new in c["ARBOR_09_EDITS"]:
        ring = ring.replace(old, new)
    assert "arb::units" not in ring and "_from_milliseconds" not in ring and '"Um"' not in ring


def test_busyring_units_are_arbor_09s_bare_units():
    """ring.cpp's quantities are all in units whose factor is 1 in Arbor 0.9's bare numbers:
    the shim defines exactly the unit names ring.cpp uses, each as 1."""
    ring = pinned_tree("arbor-busyring")["ring.cpp"].decode()
    used = set(re.findall(r"\bU::(\w+)", ring))
    assert used == {"ms", "mV", "Ohm", "cm", "F", "m2"}
    [shim] = [new for _, old, new in constants("arbor-busyring")["ARBOR_09_EDITS"] if "arb::units" in old]
    assert set(re.findall(r"(\w+) = 1\b", shim)) == used


def run_input_script(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "busyring-input"
    script.write_text(constants("arbor-busyring")["INPUT_SCRIPT"])
    script.chmod(0o755)
    return subprocess.run([str(script), *args], text=True, capture_output=True, timeout=30)


def test_busyring_input_writes_what_gen_inputs_writes(tmp_path):
    tree = pinned_tree("arbor-busyring")
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "gen-inputs.py").write_bytes(tree["gen-inputs.py"])
    subprocess.run([sys.executable, "gen-inputs.py"], cwd=gen, check=True, timeout=60)
    written = sorted(gen.glob("input-*.json"))
    assert len(written) == 7  # 1 .. 64 nodes
    for path in written:
        theirs = json.loads(path.read_text())
        res = run_input_script(tmp_path, str(theirs["num-cells"]), str(theirs["duration"]), theirs["name"])
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout) == theirs, path.name
    res = run_input_script(tmp_path, "128000")
    assert json.loads(res.stdout)["num-cells"] == 128000 and json.loads(res.stdout)["duration"] == 200


@pytest.mark.parametrize("args", [[], ["many"], ["12", "5."], ["12", ".5"], ["12", "1.2.3"], ["12", "200", 'a"b']])
def test_busyring_input_refuses_what_is_no_json(tmp_path, args):
    res = run_input_script(tmp_path, *args)
    assert res.returncode == 2 and res.stdout == "" and res.stderr.startswith("usage: busyring-input CELLS")


# ----------------------------------------------------------------------------- neuron-ringtest


def test_ringtest_tree_has_what_the_launcher_runs():
    tree = pinned_tree("neuron-ringtest")
    for name in (
        "ringtest.py",
        "args.py",
        "ring.py",
        "commonutils.py",
        "settings.py",
        "cell.hoc",
        "mod/halfgap.mod",
        "reference_data/spk1.100ms.std.ref",
    ):
        assert name in tree, name
    # ringtest writes its spikes as spk<nhost>.std in the working directory
    assert b"fname = folder + '/spk%d.std' % nhost" in tree["commonutils.py"]
    assert b'spikeout(".")' in tree["ringtest.py"] and b'h.load_file("cell.hoc")' in tree["ringtest.py"]


def test_ringtest_reference_spikes_are_the_defaults_on_one_rank():
    """spk1.100ms.std.ref: 'time gid' lines, sorted, of 16 rings x 8 cells (the defaults of
    args.py) over 100 ms at dt 0.025 ms."""
    tree = pinned_tree("neuron-ringtest")
    args = tree["args.py"].decode()
    assert (
        'help="number of rings (default 16)",\n                    type=int,\n                    default=16)' in args
    )
    rows = [line.split() for line in tree["reference_data/spk1.100ms.std.ref"].decode().splitlines()]
    spikes = [(float(t), int(gid)) for t, gid in rows]
    assert len(spikes) == 688 and spikes == sorted(spikes)
    assert {gid for _, gid in spikes} == set(range(16 * 8)) and max(t for t, _ in spikes) < 100
    assert all(round(t / 0.025, 6).is_integer() for t, _ in spikes)  # fixed step: multiples of dt


def test_ringtest_launcher_runs_special_with_the_tree_on_the_paths(tmp_path):
    share = tmp_path / "share" / "neuron-ringtest"
    (share / "x86_64").mkdir(parents=True)
    special = share / "x86_64" / "special"
    special.write_text('#!/bin/sh\nprintf "%s\\n" "$PYTHONPATH" "$HOC_LIBRARY_PATH" "$@"\n')
    special.chmod(0o755)
    launcher = tmp_path / "ringtest"
    launcher.write_text(constants("neuron-ringtest")["LAUNCHER"].replace("@SHARE@", str(share)))
    launcher.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HOC_LIBRARY_PATH")}
    res = subprocess.run(
        [str(launcher), "-nring", "256", "-tstop", "100"],
        env=env,
        cwd=tmp_path,
        text=True,
        capture_output=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        str(share),
        str(share),
        "-mpi",
        "-python",
        f"{share}/ringtest.py",
        "-nring",
        "256",
        "-tstop",
        "100",
    ]
    res = subprocess.run(
        [str(launcher)],
        env=dict(env, PYTHONPATH="/x", HOC_LIBRARY_PATH="/y"),
        text=True,
        capture_output=True,
        timeout=30,
    )
    assert res.stdout.splitlines()[:2] == [f"{share}:/x", f"{share}:/y"]


# ----------------------------------------------------------------------------- esd-neuro


def test_esd_neuro_has_both_at_the_manifests_versions():
    """Both are specs of esd-neuro, pinned to the version of their archive."""
    spack = yaml.safe_load((ROOT / "spack-envs" / "esd-neuro" / "env.yaml").read_text())["spack"]
    names = [spec.split()[0].split("@")[0] for spec in spack["specs"]]
    manifest = gs.read(MANIFEST)
    for package in ("neuron-ringtest", "arbor-busyring"):
        assert package in names
        entry = manifest.find(package)
        assert spack["packages"][package]["require"] == f"@{entry.version}"
