"""The Spack stand-in for tests where no real Spack is present (see README.md here).

Helpers for tests in any area::

    from tests.standin import install_standin, standin_env
    root = install_standin(tmp_path / "spack", fail=["libdedal"], sleep={"*": 5})
    spack = root / "bin" / "spack"          # a Spack root: use it as dedal's Spack checkout

``install_standin`` copies the stand-in Spack root to ``dest`` and writes the test
controls (``standin.json``) there, so the repository copy is never modified and dedal
needs no test hooks.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Dict, Iterable, Optional

from tests.conftest import SPACK_DATA

STANDIN_ROOT = Path(__file__).resolve().parent
STANDIN_SPACK = STANDIN_ROOT / "bin" / "spack"


def install_standin(
    dest: Path,
    fail: Optional[Iterable[str]] = None,
    sleep: Optional[Dict[str, float]] = None,
    lock_dirs: Optional[Iterable[os.PathLike]] = None,
    unreachable: Optional[Iterable[str]] = None,
) -> Path:
    """Copy the stand-in Spack root to ``dest`` with its controls; return ``dest``."""
    dest = Path(dest)
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(STANDIN_SPACK, dest / "bin" / "spack")
    shutil.copy2(STANDIN_ROOT / "README.md", dest / "README.md")
    controls = {
        "fail": list(fail or []),
        "sleep": dict(sleep or {}),
        "lock_dirs": [str(Path(d).resolve()) for d in (lock_dirs or [SPACK_DATA])],
        "unreachable": list(unreachable or []),
    }
    (dest / "standin.json").write_text(json.dumps(controls, indent=2) + "\n")
    return dest


def standin_env(base: Optional[Dict[str, str]] = None, cache: Optional[Path] = None) -> Dict[str, str]:
    """Process environment the way dedal runs Spack (no local config, private cache)."""
    env = dict(os.environ if base is None else base)
    env["SPACK_DISABLE_LOCAL_CONFIG"] = "1"
    if cache is not None:
        env["SPACK_USER_CACHE_PATH"] = str(cache)
    return env
