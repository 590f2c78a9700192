"""recipes/repo's application benchmarks of the EBRAINS/EUHPC container paper, the parts
that run without Spack: dedal.neuron-ringtest (NEURON's ringtest). What the recipe does is
held against the pinned tree (the archive recipes/gitsrc/archive.py put into this machine's
mirror; skipped where it has not run): its launcher runs the files the tree has, and the
reference spikes are what its docstring says. The recipes' constants are read from their
text (a recipe imports spack, which is not here)."""
from __future__ import annotations

import ast
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Dict

import pytest

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
                files[member.name[len(entry.prefix):]] = tar.extractfile(member).read()
    return files


# ----------------------------------------------------------------------------- neuron-ringtest

def test_ringtest_tree_has_what_the_launcher_runs():
    tree = pinned_tree("neuron-ringtest")
    for name in ("ringtest.py", "args.py", "ring.py", "commonutils.py", "settings.py", "cell.hoc",
                 "mod/halfgap.mod", "reference_data/spk1.100ms.std.ref"):
        assert name in tree, name
    # ringtest writes its spikes as spk<nhost>.std in the working directory
    assert b"fname = folder + '/spk%d.std' % nhost" in tree["commonutils.py"]
    assert b'spikeout(".")' in tree["ringtest.py"] and b'h.load_file("cell.hoc")' in tree["ringtest.py"]


def test_ringtest_reference_spikes_are_the_defaults_on_one_rank():
    """spk1.100ms.std.ref: 'time gid' lines, sorted, of 16 rings x 8 cells (the defaults of
    args.py) over 100 ms at dt 0.025 ms."""
    tree = pinned_tree("neuron-ringtest")
    args = tree["args.py"].decode()
    assert 'help="number of rings (default 16)",\n                    type=int,\n                    default=16)' in args
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
    res = subprocess.run([str(launcher), "-nring", "256", "-tstop", "100"], env=env, cwd=tmp_path,
                         text=True, capture_output=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [str(share), str(share), "-mpi", "-python", f"{share}/ringtest.py",
                                       "-nring", "256", "-tstop", "100"]
    res = subprocess.run([str(launcher)], env=dict(env, PYTHONPATH="/x", HOC_LIBRARY_PATH="/y"),
                         text=True, capture_output=True, timeout=30)
    assert res.stdout.splitlines()[:2] == [f"{share}:/x", f"{share}:/y"]

