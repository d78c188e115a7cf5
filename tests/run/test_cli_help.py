"""The CLI explains itself: every command's --help has its purpose, an example and its exit codes (issue 51
item 7)."""

from __future__ import annotations

import argparse

import pytest
from driftscope.cli import main, parser
from driftscope.cli_help import HELP


def _commands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_has_a_purpose_examples_and_exit_codes():
    assert set(_commands()) == set(HELP)


@pytest.mark.parametrize("command", sorted(HELP))
def test_a_commands_help_says_what_it_is_for_how_to_call_it_and_what_it_exits(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the option lines
    purpose, examples, codes = HELP[command]
    assert " ".join(purpose.split())[1:] in shown and "examples:" in shown
    assert all(f"driftscope {command}" in example and example in shown for example in examples)
    assert codes in shown and "0 " in codes and "2 " in codes
    for action in _commands()[command]._actions:
        assert action.help, f"{command}: {action.dest} is not described"


def test_the_top_level_help_starts_a_newcomer(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    assert "driftscope init /models/my-model" in shown and "driftscope run my-model.yaml" in shown
    assert "exits 0 when the verdict passes, 1 when it fails, 2 when something could not run" in shown
