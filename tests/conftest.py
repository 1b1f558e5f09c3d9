import json
import os
import sys
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


@pytest.fixture(scope="session")
def tiny_study_dir(tmp_path_factory):
    """A real study at profile `tiny` (about a minute on one core), run once for every test
    module that reads one."""
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
