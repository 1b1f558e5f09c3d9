"""`--help` of every command reads as prose at 80 columns: paragraphs wrapped to the width (not
at the docstring's line breaks), whole option names, no `<bool>` labels on flags, and a command
list whose entries are whole sentences."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from normlab.cli import app, load_commands

WIDTH = 80


def _commands(cmd, path: tuple[str, ...] = ()):
    yield path, cmd
    if hasattr(cmd, "commands"):  # a group
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))


ROOT = load_commands()
COMMANDS = list(_commands(ROOT))


def _help(path: tuple[str, ...]) -> str:
    r = CliRunner().invoke(app, [*path, "--help"], terminal_width=WIDTH)
    assert r.exit_code == 0, r.output
    return r.output


def _words(text: str) -> str:
    return " ".join(text.split())


def test_every_command_is_walked():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"train", "probe", "probe-hf", "finetune", "sweep run", "sweep map"} <= names


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) or "normlab" for p, _ in COMMANDS])
def test_help_is_whole_and_wrapped_to_the_width(path, cmd):
    out = _help(path)
    assert "<bool>" not in out
    assert "…" not in out
    long_lines = [line for line in out.splitlines() if len(line) > WIDTH]
    assert not long_lines, long_lines
    for param in cmd.params:
        if param.param_type_name == "option":
            for name in (*param.opts, *param.secondary_opts):
                assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", out), (name, out)
    # The description: every word of the docstring, and wrapped greedily (a line ends early
    # only where its paragraph ends, never at a line break of the docstring).
    head = out.split("\nOptions:")[0].split("\nArguments:")[0].split("\nCommands:")[0]
    paragraphs = [p.splitlines() for p in head.split("\n\n")[1:] if p.strip()]
    assert _words(" ".join(_words(" ".join(p)) for p in paragraphs)) == _words(cmd.help or "")
    for lines in paragraphs:
        for line, nxt in zip(lines, lines[1:], strict=False):
            assert len(line) + 1 + len(nxt.split()[0]) > WIDTH, (line, nxt)


GROUPS = [(p, c) for p, c in COMMANDS if hasattr(c, "commands")]


@pytest.mark.parametrize("path,group", GROUPS, ids=[" ".join(p) or "normlab" for p, _ in GROUPS])
def test_command_lists_show_whole_first_sentences(path, group):
    out = _help(path)
    listed = out.split("\nCommands:\n")[1].splitlines()
    assert len(listed) == len(group.commands)
    for line, (name, sub) in zip(listed, group.commands.items(), strict=True):
        shown = line.split(None, 1)[1]
        assert line.split()[0] == name
        assert not shown.endswith("..."), line
        assert _words(sub.help or "").startswith(shown), (shown, sub.help)


def test_study_help_shows_the_executor_and_the_address():
    text = _words(_help(("study",)))
    assert "--executor" in text and "local (processes on this machine) or ray" in text
    assert "--address" in text and "Ray cluster address" in text
