"""``ruff check`` and ``ruff format --check`` over the checkout, with the settings in
pyproject.toml ([tool.ruff]: pyflakes and pycodestyle's errors; the formatter's style). CI
runs the test suite and nothing else, so this test is how it lints; ruff comes with the test
extras (``pip install -e .[test]``), pinned to one version, as another formats differently."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.conftest import ROOT


NO_RUFF = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None,
    reason="ruff is not installed (it comes with the test extras: pip install -e '.[test]')",
)


@NO_RUFF
def test_ruff_check_finds_nothing() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, (
        f"ruff check found problems (fix them; see [tool.ruff] in pyproject.toml):\n{res.stdout}{res.stderr}"
    )


@NO_RUFF
def test_the_code_is_formatted() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, (
        f"ruff format would change these files (run `.venv/bin/ruff format .`):\n{res.stdout}{res.stderr}"
    )
