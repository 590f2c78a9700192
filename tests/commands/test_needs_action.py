"""A command of actions given none, and ``dedal`` alone: the help that lists the actions
on stderr, exit 2, the same way for each (one helper, ``commands.needs_action``)."""

from __future__ import annotations

from typing import List

import pytest

from dedal.cli import main

# each command of actions, and one action its help must name
GROUPS = [
    ([], "build-image"),
    (["layers"], "gc"),
    (["config"], "show"),
    (["ci"], "generate"),
    (["base"], "list"),
    (["verify"], "parse"),
]


@pytest.mark.parametrize("argv,action", GROUPS, ids=[" ".join(a) or "dedal" for a, _ in GROUPS])
def test_no_action_prints_the_actions_on_stderr_and_exits_2(argv: List[str], action: str, capsys) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("usage: dedal") and action in captured.err


def test_an_action_given_still_runs_its_own_function(capsys) -> None:
    assert main(["config", "show", "--json"]) == 0
    assert capsys.readouterr().out.lstrip().startswith("{")
