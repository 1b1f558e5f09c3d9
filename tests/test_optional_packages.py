"""The tests of optional packages skip, saying how to install the package, where it is missing
(`optional_packages.py`), and the install hints name the extras pyproject defines."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from optional_packages import EXTRAS, installed, needs, reason, require

TESTS = Path(__file__).parent
PYPROJECT = TESTS.parent / "pyproject.toml"


def test_each_hint_names_the_extra_that_installs_the_package():
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    for module, (dist, extra) in EXTRAS.items():
        names = [re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0] for req in extras[extra]]
        assert dist in names, (module, extra, names)
        assert f"pip install 'normlab[{extra}]'" in reason(module)
    # every optional package normlab's code uses has its hint (the dev and mutate tools aside)
    listed = {dist for dist, _ in EXTRAS.values()}
    for extra, reqs in extras.items():
        if extra not in ("dev", "mutate"):
            assert {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] for r in reqs} <= listed, extra


def test_a_missing_package_skips_with_its_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    assert not installed("datasets")
    mark = needs("tokenizers", "datasets").mark
    assert mark.args == (True,) and mark.kwargs["reason"] == (
        "needs the optional package datasets, not installed: pip install 'normlab[data]' "
        "(or: pip install datasets)")
    with pytest.raises(pytest.skip.Exception, match=re.escape("pip install 'normlab[data]'")):
        require("datasets")


def test_an_installed_package_is_not_skipped(monkeypatch):
    import json

    monkeypatch.setitem(EXTRAS, "json", ("json", "data"))  # a package every Python has
    assert installed("json") and needs("json").mark.args == (False,)
    assert require("json") is json


def test_no_test_module_imports_an_optional_package_at_its_top():
    """A module-level `import transformers` fails the whole module's collection where it is not
    installed; such a module starts with `pytest.importorskip(..., reason=reason(...))`."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(TESTS)}:{node.lineno}" for n in names
                      if n.split(".")[0] in EXTRAS]
    assert not found, found
