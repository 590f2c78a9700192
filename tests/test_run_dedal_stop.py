"""The tests' ``run_dedal`` stops a dedal that outlives its time as scancel would, with
SIGTERM first: dedal then unmounts what it mounted. subprocess.run's SIGKILL left a
verification's image mounted under /tmp (seen when pytest-timeout stopped a slow build)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.reliability


def _dedal_mounts() -> set:
    return {
        line.split()[1] for line in Path("/proc/mounts").read_text().splitlines() if "/dedal-root-" in line.split()[1]
    }


def test_a_timed_out_verify_leaves_no_mount(run_dedal, bench_image, native_cache, tmp_path: Path) -> None:
    before = _dedal_mounts()
    with pytest.raises(subprocess.TimeoutExpired):
        # 200 repetitions take many minutes (a warm native cache makes 3 fit in 25 s); the image is mounted within seconds
        run_dedal(
            "verify",
            str(bench_image.sif),
            "-o",
            str(tmp_path / "report"),
            "--repetitions",
            "200",
            env={"DEDAL_CACHE_DIR": str(native_cache)},
            timeout=25,
        )
    assert _dedal_mounts() <= before
