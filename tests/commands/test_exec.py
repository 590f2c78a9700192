"""`dedal exec --nv` through the installed CLI on this machine, which has no NVIDIA driver: the
command runs, nothing is bound, and the user reads one note saying why (not an error)."""

from __future__ import annotations

import pytest

from dedal.adapters.runtime import find_driver
from tests.fixtures import base as helpers


@pytest.mark.parametrize("backend", ["bwrap", "charliecloud"])
def test_nv_without_a_driver_runs_with_one_note(run_dedal, trixie_base, backend):
    helpers.require_tools({"bwrap": "bwrap", "charliecloud": "ch-run"}[backend])
    if find_driver().found:
        pytest.skip("this machine has an NVIDIA driver")
    p = run_dedal(
        "exec",
        "--nv",
        "--runtime",
        backend,
        "--no-cwd",
        str(trixie_base.rootfs_dir),
        "--",
        "/bin/sh",
        "-c",
        "test ! -e /.singularity.d/libs && echo nothing-bound",
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "nothing-bound"
    notes = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert (
        len(notes) == 1 and notes[0].startswith("note: no NVIDIA driver on this host") and "binds nothing" in notes[0]
    )
