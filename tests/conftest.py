"""Shared test helpers: where the real data lies and how to run the installed CLI."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("DEDAL_SHARED_DIR", ROOT.parent / "shared"))
SHARED_DATA = SHARED / "data"
SPACK_DATA = SHARED_DATA / "spack"
LOGS_DATA = SHARED_DATA / "logs"


def dedal_exe() -> str:
    """The installed console script (next to the running interpreter), else on PATH."""
    cand = Path(sys.executable).parent / "dedal"
    if cand.exists():
        return str(cand)
    found = shutil.which("dedal")
    if not found:
        pytest.fail("the dedal console script is not installed (run ./setup.sh)")
    return found


@pytest.fixture
def isolated_env(tmp_path: Path) -> Dict[str, str]:
    """Environment for CLI subprocesses: no user config, data and cache under tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEDAL_")}
    if "DEDAL_SPACK_ROOT" in os.environ:
        env["DEDAL_SPACK_ROOT"] = os.environ["DEDAL_SPACK_ROOT"]
    env["HOME"] = str(tmp_path / "home")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "home" / ".config")
    env["XDG_DATA_HOME"] = str(tmp_path / "home" / ".local" / "share")
    env["XDG_CACHE_HOME"] = str(tmp_path / "home" / ".cache")
    # the expensive base root filesystem may be shared between tests and runs
    env["DEDAL_BASE_CACHE"] = os.environ.get("DEDAL_BASE_CACHE", str(Path.home() / ".cache" / "dedal" / "base"))
    (tmp_path / "home").mkdir(exist_ok=True)
    return env


@pytest.fixture
def run_dedal(isolated_env: Dict[str, str], tmp_path: Path):
    """Run the installed ``dedal`` command; returns CompletedProcess (text)."""

    def _run(*args: str, cwd: Optional[Path] = None, env: Optional[Dict[str, str]] = None,
             input: Optional[str] = None, timeout: float = 600) -> subprocess.CompletedProcess:
        full_env = dict(isolated_env)
        if env:
            full_env.update(env)
        return subprocess.run([dedal_exe(), *args], cwd=cwd or tmp_path, env=full_env, text=True,
                              capture_output=True, input=input, timeout=timeout)

    return _run
