"""Every command that talks to a registry takes the same --insecure (one definition)."""

from __future__ import annotations

import argparse

import pytest

from dedal.cli import build_parser
from dedal.commands import _registry

REGISTRY_COMMANDS = ("publish", "pull", "images", "inspect", "build-image", "build")


def _subparsers(parser: argparse.ArgumentParser) -> dict:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", REGISTRY_COMMANDS)
def test_registry_commands_take_insecure(command):
    sub = _subparsers(build_parser())[command]
    option = next(a for a in sub._actions if "--insecure" in a.option_strings)
    reference = argparse.ArgumentParser()
    _registry.add_insecure_option(reference)
    same = next(a for a in reference._actions if "--insecure" in a.option_strings)
    assert (option.help, option.default, option.const) == (same.help, same.default, same.const)


def test_insecure_override_leaves_the_setting_alone_without_the_flag():
    assert _registry.insecure_override(argparse.Namespace(insecure=None)) is None
    assert _registry.insecure_override(argparse.Namespace(insecure=True)) is True
    assert _registry.insecure_override(argparse.Namespace()) is None
