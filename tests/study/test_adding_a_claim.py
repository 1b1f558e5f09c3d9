"""docs/design.md's worked example of adding a claim ("Adding a claim"), checked: its blocks
name at most three files, the claim module and its test file in the study's layout and the
registry; the module loads and its own setting and runs work on the fake study; its test file's
tests pass; the registry lines its diff changes are the registry's own."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from normlab.study.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"


def example_blocks() -> dict[str, str]:
    """The code blocks of the worked example, by the file their first line names."""
    text = DESIGN.read_text()
    section = text[text.index("## Adding a claim"):]
    section = section[:section.find("\n## ", 3)] if "\n## " in section[3:] else section
    blocks = re.findall(r"```(?:python|diff)\n# (\S+)\n(.*?)```", section, re.S)
    return {path: code for path, code in blocks}


@pytest.fixture
def example(monkeypatch):
    """The example's claim module, loaded as `normlab.study.claims.<name>`."""
    blocks = example_blocks()
    path = next(p for p in blocks if p.startswith("normlab/study/claims/c"))
    name = "normlab.study.claims." + Path(path).stem
    module = types.ModuleType(name)
    module.__file__ = str(ROOT / path)
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(blocks[path], path, "exec"), module.__dict__)
    import normlab.study.claims

    monkeypatch.setattr(normlab.study.claims, Path(path).stem, module, raising=False)
    return module


def test_the_example_touches_three_files_in_the_study_s_layout():
    blocks = example_blocks()
    assert len(blocks) <= 3
    module = next(p for p in blocks if p.startswith("normlab/study/claims/c"))
    number = re.match(r"c(\d\d)_", Path(module).name).group(1)
    assert set(blocks) == {module, f"tests/study/claims/test_c{number}.py",
                           "normlab/study/claims/__init__.py"}
    for path in blocks:  # the folders exist; the new files are new
        assert (ROOT / path).parent.is_dir()
    assert not (ROOT / module).exists()


def test_the_registry_lines_the_example_changes_are_the_registry_s(example):
    registry = (ROOT / "normlab/study/claims/__init__.py").read_text()
    diff = example_blocks()["normlab/study/claims/__init__.py"]
    kept_or_removed = [line[1:] for line in diff.splitlines() if line[:1] in (" ", "-")]
    assert kept_or_removed and all(line in registry.splitlines() for line in kept_or_removed)
    added = [line[1:] for line in diff.splitlines() if line.startswith("+")]
    assert any(example.__name__.rsplit(".", 1)[1] in line for line in added)


def test_the_example_claim_has_its_own_setting_and_runs(example, tmp_path):
    from fake_study import FakeStudy

    from normlab.study.claims import REGISTRY

    claim = example.CLAIM
    assert claim.id not in REGISTRY and claim.measure is not None and claim.work is not None
    own = claim.settings(PROFILES["tiny"])
    assert own == example.SETTINGS["tiny"] and claim.settings(PROFILES["quick"]) == own.__class__()
    changed = claim.with_settings(PROFILES["quick"], c15_lrs=(1e-2,))
    assert claim.settings(changed).c15_lrs == (1e-2,)
    result = claim.measure(FakeStudy(tmp_path))
    assert result.id == claim.id and result.verdict in ("supported", "not supported",
                                                        "inconclusive")


def test_the_example_s_tests_pass_on_the_fake_study(example, tmp_path):
    blocks = example_blocks()
    path = next(p for p in blocks if p.startswith("tests/study/claims/"))
    namespace: dict = {"__name__": Path(path).stem}
    exec(compile(blocks[path], path, "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_")]
    assert len(tests) >= 2
    for i, test in enumerate(tests):
        folder = tmp_path / str(i)
        folder.mkdir()
        test(folder)
