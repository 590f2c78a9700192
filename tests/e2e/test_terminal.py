"""dedal typed in a terminal: a pseudo-terminal as stdin, stdout and stderr, controlling
the command's session, dedal in its foreground group (tests/fixtures/terminal.py).

The README's first command failed this way only: the build jobs, in sessions of their own,
inherited the terminal as stdin and Spack's log writer failed on it. The Spack stand-in
does what Spack does with a terminal as stdin (``tcgetpgrp``), so these fail as the real
one did when a child inherits the terminal. Ctrl-C is the terminal's interrupt character."""

from __future__ import annotations

import json
import re
import time

import pytest

from dedal.model.layers import LayerStore
from tests.conftest import dedal_exe
from tests.fixtures.terminal import CTRL_C, Terminal, in_terminal
from tests.fixtures.tiny import TINY_PACKAGES, TinyEnv, make_env, stage_leftovers

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("as_root")]


def test_build_in_a_terminal(isolated_env, tmp_path):
    tiny = make_env(tmp_path)
    term = in_terminal(
        [dedal_exe(), "build", str(tiny.env_file), "-j", "2"], dict(isolated_env, **tiny.env), timeout=300, cwd=tmp_path
    )
    assert term.rc == 0, term.text[-3000:]
    assert sorted(m.name for m in LayerStore(tiny.store).manifests()) == TINY_PACKAGES
    assert "Inappropriate ioctl" not in term.text


def test_ctrl_c_in_a_terminal_stops_the_build_and_the_rerun_resumes(isolated_env, tmp_path):
    tiny = make_env(tmp_path, sleep={"dedal-tool": 60})
    env = dict(isolated_env, **tiny.env)
    store = LayerStore(tiny.store)
    term = Terminal([dedal_exe(), "build", str(tiny.env_file), "-j", "2"], env=env, cwd=tmp_path)
    _ctrl_c_while_dedal_tool_builds(term, tiny)
    names = {m.name for m in store.manifests()}
    assert "dedal-tool" not in names and "dedal-app" not in names
    assert store.verify().clean, store.verify().to_json()
    assert stage_leftovers(tiny.stage) == [], "the interrupted build removed its stage"

    tiny.reconfigure()  # no more sleeping; the rerun, in a terminal too, builds only what is missing
    again = in_terminal(
        [dedal_exe(), "build", str(tiny.env_file), "--json"], env, timeout=300, cwd=tmp_path, stdout_pipe=True
    )
    assert again.rc == 0, again.text[-3000:]
    built = sorted(b.split("@")[0] for b in json.loads(again.stdout)["built"])
    assert built == sorted({"dedal-tool", "dedal-app"} | ({"libdedal"} - names))
    assert sorted(m.name for m in store.manifests()) == TINY_PACKAGES
    assert not re.search(r"Traceback|Inappropriate ioctl", term.text + again.text)


def test_ctrl_c_in_build_image_says_where_it_stopped(isolated_env, tmp_path):
    """Ctrl-C in build-image, whichever stage it falls in, is one stop: the table marks the
    stage interrupted, one line names it without "error", the exit code is the shell's for
    SIGINT (130). Before, the build stage said "dedal: error: build: interrupted" and exited 1,
    verify and assemble exited 143 "dedal: error: verify: verify interrupted by signal
    SIGINT", and fetch printed no table at all."""
    tiny = make_env(tmp_path, sleep={"dedal-tool": 60})
    env = dict(isolated_env, **tiny.env)
    term = Terminal([dedal_exe(), "build-image", str(tiny.env_file), "--until", "build"], env=env, cwd=tmp_path)
    _ctrl_c_while_dedal_tool_builds(term, tiny)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", term.text)  # the terminal's colours and cursor moves
    assert re.search(r"build\s*│\s*interrupted\s*│.*│\s*by signal SIGINT", text), text[-3000:]
    assert "dedal: build interrupted by signal SIGINT" in text.splitlines(), text[-3000:]
    assert not re.search(r"dedal: error|Traceback", text), text[-3000:]
    assert stage_leftovers(tiny.stage) == [], "the interrupted build removed its stage"


def _ctrl_c_while_dedal_tool_builds(term: Terminal, tiny: TinyEnv) -> None:
    """Ctrl-C typed once dedal-tool is building (its dependencies are layers, its stage
    exists); dedal must end with 130, the shell's code for SIGINT."""
    store = LayerStore(tiny.store)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and term.proc.poll() is None:
        names = {m.name for m in store.manifests()} if tiny.store.is_dir() else set()
        if {"dedal-bootstrap", "gcc-runtime"} <= names and stage_leftovers(tiny.stage):
            break
        time.sleep(0.2)
    assert term.proc.poll() is None, f"the build ended before dedal-tool was building:\n{term.text[-3000:]}"
    time.sleep(1.0)
    term.press(CTRL_C)
    assert term.wait(90) == 130, term.text[-3000:]
