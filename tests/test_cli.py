"""dedal.cli: a full disk met while writing is one line and exit 1, not "internal error (a bug)".
A real full file system (a small tmpfs), a real write."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dedal import cli


@pytest.fixture
def full_fs(small_disk) -> Path:
    """A 64 KiB tmpfs, filled up: the next write to it fails with ENOSPC."""
    place = small_disk("64k")
    with open(place / "filler", "wb", buffering=0) as f:
        with pytest.raises(OSError):
            while True:
                f.write(b"\0" * 4096)
    return place


def test_a_full_disk_is_one_line_and_exit_1(full_fs: Path, monkeypatch, capsys) -> None:
    written = full_fs / "plan.json"

    def write(_args: argparse.Namespace) -> int:
        with open(written, "w") as f:
            f.write("x" * 65536)
        return 0

    class Parser:
        def parse_args(self, argv):
            return argparse.Namespace(func=write, command="plan")

    monkeypatch.setattr(cli, "build_parser", lambda argv: Parser())
    assert cli.main(["plan"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dedal: error: No space left on device")
    assert "internal error" not in err and "DEDAL_CACHE_DIR" in err


@pytest.mark.parametrize(
    ("argv", "command"), [(["verify", "x.sif"], "verify"), (["-s", "jobs=2", "build-image", "e.yaml"], "build-image")]
)
def test_ctrl_c_while_the_command_is_imported_is_one_line(argv, command, monkeypatch, capsys) -> None:
    """Ctrl-C right after the command is typed, while its module and stages are imported (up
    to half a second, before any Signals block): the one line and exit 130 of a stop, not a
    traceback of importlib (seen in a terminal at 0.1-0.3 s)."""
    import os
    import signal

    import dedal.commands

    real = dedal.commands.importlib.import_module

    def interrupted(name: str, *args):  # noqa: ANN002, ANN202
        if name.startswith("dedal.commands."):
            os.kill(os.getpid(), signal.SIGINT)  # Python's own handler: KeyboardInterrupt
        return real(name, *args)

    monkeypatch.setattr(dedal.commands.importlib, "import_module", interrupted)
    # Python's own SIGINT handler, as in a terminal, whatever ran this suite (a shell without
    # job control starts it with SIGINT ignored)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert cli.main(argv) == 130
    finally:
        signal.signal(signal.SIGINT, before)
    err = capsys.readouterr().err
    assert err == f"dedal: {command} interrupted by signal SIGINT\n"
