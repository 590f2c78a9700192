"""`dedal completion bash`: the script is generated from the parser and completes in a real
bash (the completion function called as bash calls it, with COMP_WORDS and COMP_CWORD)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

from dedal.commands import build_parser
from dedal.commands.completion import describe

COMPLETE = """source "$1"; shift
COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
_dedal; printf '%s\\n' "${COMPREPLY[@]}"
"""


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    from tests.conftest import dedal_exe

    res = subprocess.run([dedal_exe(), "completion", "bash"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    path = tmp_path_factory.mktemp("completion") / "dedal.bash"
    path.write_text(res.stdout)
    return path


def complete(script: Path, *words: str, cwd: Path = Path(".")) -> List[str]:
    """What bash offers for the last word of ``dedal WORDS...``."""
    res = subprocess.run(
        ["bash", "-c", COMPLETE, "complete", str(script), "dedal", *words],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    return sorted(line for line in res.stdout.splitlines() if line)


def test_commands_and_subcommands(script):
    assert complete(script, "bu") == ["build", "build-image"]
    assert complete(script, "-c", "my.yaml", "pl") == ["plan"]  # a global option's value is skipped
    assert complete(script, "base", "") == ["build", "list", "show"]


def test_options_and_their_fixed_values(script):
    assert complete(script, "build", "--exe") == ["--executor"]
    assert complete(script, "build", "--executor", "") == ["local", "slurm"]
    assert complete(script, "completion", "") == ["bash"]


def test_setting_names_after_set(script):
    assert complete(script, "-s", "verify_g") == ["verify_gate="]
    assert complete(script, "--set", "layer_st") == ["layer_store="]


def test_paths_where_a_command_takes_them(script, tmp_path):
    (tmp_path / "envs" / "demo").mkdir(parents=True)
    assert complete(script, "build", "envs/de", cwd=tmp_path) == ["envs/demo"]
    assert complete(script, "build", "--layers", "en", cwd=tmp_path) == ["envs"]


def test_every_command_of_the_parser_is_in_the_script(script):
    text = script.read_text()
    levels = describe(build_parser())
    commands = levels["dedal"].subcommands
    assert {"build-image", "plan", "fetch", "publish", "pull", "completion"} <= set(commands)
    for command in commands:
        assert command in complete(script, command[:-1] if len(command) > 1 else command), command
    assert all(f"[{p!r}]" in text or f"[{p}]" in text for p, lv in levels.items() if lv.options)
