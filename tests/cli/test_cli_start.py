"""The command line starts fast: `import normlab.cli` (what `normlab --help` and `--version` pay
for) imports no torch, matplotlib or transformers; every other command module is imported only
when its command runs. `benchmarks/bench_cli_start.py` times it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

import normlab
from normlab.cli import LAZY_COMMANDS, app, load_commands

HEAVY = ("torch", "matplotlib", "transformers", "numpy")


def _imported_by(code: str) -> set[str]:
    script = f"{code}\nimport sys\nprint(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout
    return set(out.split())


def test_importing_the_cli_imports_no_heavy_library():
    loaded = _imported_by("import normlab.cli")
    assert not [m for m in HEAVY if m in loaded]
    assert not [m for m, _ in LAZY_COMMANDS.values() if m in loaded]


def test_help_lists_every_command_without_importing_them():
    code = ("from typer.testing import CliRunner\nfrom normlab.cli import app\n"
            "r = CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0, r.output\n"
            "assert 'probe-hf' in r.output and 'sweep' in r.output")
    loaded = _imported_by(code)
    assert "torch" not in loaded
    assert not [m for m, _ in LAZY_COMMANDS.values() if m in loaded]


def test_a_lazy_command_runs_and_shows_its_help():
    r = CliRunner().invoke(app, ["probe-hf", "--help"])
    assert r.exit_code == 0, r.output
    assert "--hf" in r.output


def test_the_listed_first_sentences_are_the_commands_own():
    root = load_commands()
    assert list(root.commands)[-len(LAZY_COMMANDS):] == list(LAZY_COMMANDS)
    for name, (_, first) in LAZY_COMMANDS.items():
        assert root.commands[name].get_short_help_str(200) == first


def test_version():
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0
    assert r.output.strip() == f"normlab {normlab.__version__}"


def test_the_readme_command_table_names_every_command():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    table = readme.split("## Commands", 1)[1].split("\n## ", 1)[0]
    for name in load_commands().commands:
        assert f"| `normlab {name}" in table, name
    assert "| `normlab --version`" in table


def test_a_mistyped_command_is_matched_against_every_command():
    # in a fresh process, where no lazily imported command is loaded yet
    r = subprocess.run([sys.executable, "-m", "normlab", "prob"], capture_output=True,
                       text=True, cwd=Path(__file__).parents[2])
    assert r.returncode == 2
    assert "Did you mean 'probe', 'probe-hf'?" in r.stderr


def test_the_version_is_the_packages():
    import tomllib

    meta = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert meta["project"]["version"] == normlab.__version__
