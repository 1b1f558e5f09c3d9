import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The tests use tiny models, which run fastest on one thread; more threads only oversubscribe
# the cores when anything else runs.
torch.set_num_threads(1)
# The scripts of scripts/ are imported by their tests as modules (`import config_docs`), and
# import each other (`doc_writer`) as `python scripts/<name>.py` lets them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


# -- parallel runs ------------------------------------------------------------------------------
# `make test` runs the suite on every core: pytest-xdist's `-n auto`, with `--dist loadgroup`
# (pyproject's addopts). Tests are handed out to the workers one at a time, so that a slow file
# does not hold up the rest; the tests that share an expensive fixture go to one worker together,
# so that the fixture is built once: the tests that read the session's tiny study (one group
# across files), and each file's tests that use one of its module-scoped fixtures (trained runs,
# a loaded model, the browser). A test's own `xdist_group` mark names its group.
#
# xdist 3.8 forms its groups by appending the group to each test's node id, which pytest 9.2's
# structured node ids ignore (pytest-xdist issue 1386: the tests are then spread as if unmarked).
# The groups therefore travel apart from the node ids: each worker writes the groups it collected
# to a folder that the controller names in NORMLAB_TEST_GROUPS, and the scheduler below reads
# them (xdist's own load-scope scheduling, with a test's group as its scope).

GROUPS_ENV = "NORMLAB_TEST_GROUPS"
_SHARED_SCOPES = ("session", "package", "module", "class")


def xdist_group_of(item: pytest.Item) -> str | None:
    """The group of a test: its `xdist_group` mark's name; else the name of a session fixture of
    this folder that it uses; else its file's path when it uses a module- or class-scoped fixture
    of this folder; else None (a test that can run anywhere)."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    session, module = None, None
    for name in item.fixturenames:
        scope = _scope_of_fixture_of_this_folder(item, name)
        if scope == "session":
            session = session or name
        elif scope is not None:
            module = module or item.nodeid.split("::", 1)[0]
    return session or module


def _scope_of_fixture_of_this_folder(item: pytest.Item, name: str) -> str | None:
    """The scope of fixture `name` of `item` when it is shared (not per test) and defined under
    tests/; None for others (pytest's own, such as tmp_path_factory, cost nothing to build
    twice)."""
    defs = item._fixtureinfo.name2fixturedefs.get(name) or ()
    if not defs or defs[-1].scope not in _SHARED_SCOPES:
        return None
    code = getattr(defs[-1].func, "__code__", None)
    if code is None or Path(__file__).parent not in Path(code.co_filename).parents:
        return None
    return defs[-1].scope


def _is_session_fixture_of_this_folder(item: pytest.Item, name: str) -> bool:
    return _scope_of_fixture_of_this_folder(item, name) == "session"


def pytest_configure(config):
    """On the controller of a parallel run: the folder where the workers leave their groups."""
    if (hasattr(config, "workerinput") or config.getoption("dist", "no") != "loadgroup"
            or not config.getoption("numprocesses", None)):
        return
    folder = tempfile.mkdtemp(prefix="normlab-test-groups-")
    os.environ[GROUPS_ENV] = folder  # the workers, started after this, inherit it
    config.add_cleanup(lambda: (os.environ.pop(GROUPS_ENV, None),
                                shutil.rmtree(folder, ignore_errors=True)))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    folder, worker = os.environ.get(GROUPS_ENV), os.environ.get("PYTEST_XDIST_WORKER")
    if not (folder and worker):
        return
    groups = {item.nodeid: group for item in items if (group := xdist_group_of(item))}
    # the groups of session fixtures (the tiny study: minutes) are handed out first
    first = sorted({name for item in items for name in item.fixturenames
                    if _is_session_fixture_of_this_folder(item, name)})
    tmp = Path(folder) / f"{worker}.json.tmp"
    tmp.write_text(json.dumps({"groups": groups, "first": first}))
    tmp.replace(tmp.with_suffix(""))  # whole before the worker reports its collection


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup" or not os.environ.get(GROUPS_ENV):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        """Load-scope scheduling whose scope is a test's group, or the test alone."""

        groups: dict[str, str] | None = None
        first: list[str] = []

        def _read(self) -> None:  # once every worker has reported its collection
            self.groups = {}
            for path in sorted(Path(os.environ[GROUPS_ENV]).glob("*.json")):
                written = json.loads(path.read_text())
                self.groups.update(written["groups"])
                self.first = sorted({*self.first, *written["first"]})

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self._read()
            return self.groups.get(nodeid, nodeid)

        def _assign_work_unit(self, node) -> None:
            for scope in self.first:
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return SharedFixtureScheduling(config, log)


@pytest.fixture(scope="session")
def tiny_study_dir(tmp_path_factory):
    """A real study at profile `tiny` (its runs on the profile's 2 worker processes: about two
    minutes on 2 cores), run once for every test that reads one: in a parallel run, those tests
    are one group, on one worker, handed out first."""
    from normlab.study.runner import run_study

    out = tmp_path_factory.mktemp("tiny-study")
    run_study(out, "tiny", log=lambda m: None)
    return out


# -- the words a claim shows, recorded --------------------------------------------------------
# A claim's report is read as much as its numbers are: its statement, the source's quote, what
# each prediction measures and the rule that decides it. `recorded_words` compares those words
# (and the names of the numbers it reports) with tests/claim_words/<name>.json, so a change to
# any of them is a reviewed change of that file: `NORMLAB_RECORD_WORDS=1 pytest <test>` writes it.

CLAIM_WORDS = Path(__file__).parent / "claim_words"
_CLAIM_FIELDS = ("id", "title", "statement", "source", "method", "verdict", "rule", "caveat",
                 "paper", "note", "calibration", "departure", "diagnosis", "stalled")
_PREDICTION_FIELDS = ("subject", "quantity", "paper", "rule", "verdict", "meaningful",
                      "diagnosis", "threshold_source", "role")


def key_tree(value):
    """The names (and kinds) of a nested numbers table, with its words but not its numbers."""
    if isinstance(value, dict):
        return {str(k): key_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [key_tree(v) for v in value] if any(isinstance(v, dict) for v in value) \
            else "list"
    if isinstance(value, str):
        return value  # a reported word (an outcome, a reason) is part of what is said
    return "none" if value is None else type(value).__name__


def _effect_words(effect):
    return None if effect is None else {"name": effect["name"], "expected": effect["expected"]}


def _prediction_words(p):
    return {k: p[k] for k in _PREDICTION_FIELDS} | {"effect": _effect_words(p["effect"])}


def claim_words(result) -> dict:
    """The words of a ClaimResult (or its dict): every text field, each prediction's and each
    ladder rung's words, the figures' names and the numbers' names."""
    d = result if isinstance(result, dict) else result.to_dict()
    out = {k: d[k] for k in _CLAIM_FIELDS}
    out["effect"] = _effect_words(d["effect"])
    out["figures"] = [Path(f).name for f in d["figures"]]
    out["numbers"] = key_tree(d["numbers"])
    out["predictions"] = [_prediction_words(p) for p in d["predictions"]]
    out["ladder"] = [{k: r[k] for k in ("rung", "key", "change", "calibration", "verdict")}
                     | {"predictions": [_prediction_words(p) for p in r["predictions"]]}
                     for r in d["ladder"]]
    return out


def _figure_words(value):
    if isinstance(value, str):
        return value
    if isinstance(value, Path):
        return value.name
    if isinstance(value, dict):
        return {str(k): _figure_words(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return list(value)  # the runs a curve figure draws
    return type(value).__name__


@pytest.fixture
def stub_figures(request, monkeypatch):
    """`stub_figures(module, names[, calls])`: replace `module`'s plotting functions `names` by
    recorders that return the figure's path and note what would be drawn (the figure's file,
    its labels and titles), unless the test is marked `draws`. Drawing is most of a planted
    claim's time; the tests marked `draws` draw the claims' figures, and tests/report/test_report.py
    tests the drawing. Returns the list of recorded calls (`calls`, when given, so that the
    functions of several modules record into one list)."""
    def apply(module, names, calls: list[dict] | None = None) -> list[dict]:
        calls = [] if calls is None else calls
        if request.node.get_closest_marker("draws"):
            return calls
        for name in names:
            def record(*args, _name=name, **kwargs):
                path = next(a for a in [*args, *kwargs.values()]
                            if isinstance(a, Path) and a.suffix == ".svg")
                calls.append({"plot": _name, "args": [_figure_words(a) for a in args],
                              "kwargs": {k: _figure_words(v) for k, v in kwargs.items()}})
                return path
            monkeypatch.setattr(module, name, record)
        return calls
    return apply


def _first_difference(got, want, path="") -> str:
    if isinstance(got, dict) and isinstance(want, dict):
        for k in sorted(set(got) | set(want)):
            if got.get(k, "<missing>") != want.get(k, "<missing>"):
                return _first_difference(got.get(k, "<missing>"), want.get(k, "<missing>"),
                                         f"{path}.{k}")
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            if a != b:
                return _first_difference(a, b, f"{path}[{i}]")
    return f"{path or '<root>'}:\n  now:      {got!r}\n  recorded: {want!r}"


@pytest.fixture
def recorded_words():
    def check(name: str, result, figures: list[dict] | None = None) -> None:
        words = claim_words(result) | ({"drawn": figures} if figures is not None else {})
        got = json.loads(json.dumps(words))  # tuples as lists, as recorded
        path = CLAIM_WORDS / f"{name}.json"
        if os.environ.get("NORMLAB_RECORD_WORDS"):
            CLAIM_WORDS.mkdir(exist_ok=True)
            path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
            return
        assert path.exists(), (f"{path} is not recorded: run this test with "
                               "NORMLAB_RECORD_WORDS=1 and review the file")
        want = json.loads(path.read_text())
        assert got == want, ("the claim's words differ from " + str(path) + " (if the change "
                             "is meant, record it again with NORMLAB_RECORD_WORDS=1): "
                             + _first_difference(got, want))
    return check
