"""The environment of the processes the tests start (`subprocess_env.py`): the repository first on
PYTHONPATH, what PYTHONPATH already held kept after it, and no test that replaces it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from subprocess_env import REPO, subprocess_env

TESTS = Path(__file__).parent


def test_the_repository_comes_first_and_the_entries_already_there_are_kept(monkeypatch):
    """An installation whose packages come through PYTHONPATH (an HPC module stack, `pip install
    --target`) keeps them in the process a test starts."""
    given = os.pathsep.join(["/opt/site-a", "/opt/site-b"])
    monkeypatch.setenv("PYTHONPATH", given)
    env = subprocess_env(MPLBACKEND="Agg")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO), "/opt/site-a", "/opt/site-b"]
    assert env["MPLBACKEND"] == "Agg" and os.environ["PYTHONPATH"] == given  # a copy
    assert TESTS.parent == REPO and (REPO / "normlab" / "__init__.py").is_file()


def test_without_a_pythonpath_it_is_the_repository_alone(monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert subprocess_env()["PYTHONPATH"] == str(REPO)
    monkeypatch.setenv("PYTHONPATH", "")
    assert subprocess_env()["PYTHONPATH"] == str(REPO)


def test_a_given_environment_is_the_base_and_is_not_changed():
    base = {"HOME": "/h", "PYTHONPATH": "/x"}
    env = subprocess_env(base, HOME="/other")
    assert env == {"HOME": "/other", "PYTHONPATH": os.pathsep.join([str(REPO), "/x"])}
    assert base == {"HOME": "/h", "PYTHONPATH": "/x"}


def test_a_started_python_sees_both(tmp_path, monkeypatch):
    extra = tmp_path / "site"
    extra.mkdir()
    (extra / "planted_by_pythonpath.py").write_text("WHERE = 'kept'\n")
    monkeypatch.setenv("PYTHONPATH", str(extra))
    code = ("import normlab, planted_by_pythonpath, pathlib; "
            "print(pathlib.Path(normlab.__file__).parents[1]); print(planted_by_pythonpath.WHERE)")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=subprocess_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(REPO), "kept"]


def test_no_test_replaces_pythonpath_with_the_repository():
    """The way PYTHONPATH was lost: `os.environ | {"PYTHONPATH": str(REPO)}` in a test's
    subprocess environment, which drops the entries already there."""
    replacing = re.compile(r"""["']PYTHONPATH["']\s*:\s*str\(""")
    found = [str(p.relative_to(TESTS)) for p in sorted(TESTS.rglob("*.py"))
             if p != Path(__file__) and replacing.search(p.read_text())]
    assert not found, f"use subprocess_env() in {found}"
