"""tests/fixtures/stop.py: a test run sent SIGTERM (a CI job cancelled, ``timeout``) tears its
fixtures down. A real pytest in a subprocess, its session fixture standing for the test Slurm
cluster's daemons; without the plugin the same run dies with its teardown undone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

A_RUN = """
import pathlib, time, pytest

@pytest.fixture(scope="session")
def daemon():
    yield
    pathlib.Path({torn!r}).write_text("torn down")

def test_long(daemon):
    pathlib.Path({started!r}).write_text("running")
    try:
        time.sleep(60)
    except KeyboardInterrupt:
        if {swallow!r}:  # as cli.main run in-process answers a Ctrl-C: exit 130, no exception
            return
        raise

def test_next(daemon):
    pathlib.Path({started!r}).write_text("next ran")
"""


@pytest.mark.parametrize(
    ("plugin", "swallow"),
    [(True, False), (True, True), (False, False)],
    ids=["with-stop-plugin", "a-test-swallows-the-interrupt", "without"],
)
def test_sigterm_tears_the_fixtures_down(tmp_path: Path, plugin: bool, swallow: bool) -> None:
    started, torn = tmp_path / "started", tmp_path / "torn"
    (tmp_path / "test_a_run.py").write_text(A_RUN.format(started=str(started), torn=str(torn), swallow=swallow))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_a_run.py")]
    if plugin:
        cmd[3:3] = ["-p", "tests.fixtures.stop"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not started.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started.exists(), run.communicate()[0] if run.poll() is not None else "the test did not start"
    run.send_signal(signal.SIGTERM)
    out, _ = run.communicate(timeout=60)
    if plugin:
        assert run.returncode == pytest.ExitCode.INTERRUPTED and torn.read_text() == "torn down", out
        assert "signal SIGTERM" in out and started.read_text() == "running", out  # the next test did not run
    else:  # the premise: Python's default SIGTERM skips the teardown
        assert run.returncode == -signal.SIGTERM and not torn.exists(), out
