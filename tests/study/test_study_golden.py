"""The tiny study's numbers, recorded: a restructuring of the study code must leave every
number and verdict of `study.json` as it was (words are checked by tests/claim_words).

A change of a rule that is meant to move a number or a verdict is recorded again with
`NORMLAB_RECORD_GOLDEN=1 pytest tests/study/test_study_golden.py`, and docs/study.md says why.
Floats are compared to a relative 1e-4 or an absolute 1e-5: the same code on another CPU's
kernels differs in the last digits (a difference of two nearly equal losses, about 1e-3, by a
few 1e-6 between an AMD EPYC and an Intel Xeon), a changed rule by far more.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from optional_packages import needs

GOLDEN = Path(__file__).parents[1] / "golden" / "study_tiny.json"
# what differs between two runs of the same code: time, machine (its device, CUDA build and
# numerics flags, and so where the runs trained), commit
VOLATILE = {"created", "elapsed_s", "elapsed_total_s", "parts", "git_commit", "machine",
            "time_s", "traceback", "wall_s", "normlab", "torch", "cuda", "numerics",
            "runs_by_device"}


def numbers_and_verdicts(value, path=""):
    """Every number, boolean, None and verdict of a study.json, by its path."""
    out = {}
    if isinstance(value, dict):
        for k in sorted(value):
            if k not in VOLATILE:
                out |= numbers_and_verdicts(value[k], f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out |= numbers_and_verdicts(v, f"{path}[{i}]")
    elif not isinstance(value, str) or path.endswith(("verdict", ".id", ".status")):
        out[path] = value
    return out


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-4,
                                                                  abs_tol=1e-5)
    return a == b


# C12's real-models illustration (recorded among the numbers) probes MiniLM and SmolLM2 through
# the hf extra; a study without it leaves the illustration out
@needs("transformers", "gguf", "accelerate")
def test_the_tiny_study_s_numbers_are_the_recorded_ones(tiny_study_dir):
    got = numbers_and_verdicts(json.loads((tiny_study_dir / "study.json").read_text()))
    if os.environ.get("NORMLAB_RECORD_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=0, sort_keys=True) + "\n")
        return
    want = json.loads(GOLDEN.read_text())
    missing = sorted(set(want) - set(got))
    added = sorted(set(got) - set(want))
    changed = [k for k in sorted(set(got) & set(want)) if not same(got[k], want[k])]
    assert not (missing or added or changed), (
        f"the tiny study's numbers differ from {GOLDEN} (record again with "
        f"NORMLAB_RECORD_GOLDEN=1 if the change is meant): missing {missing[:5]}, added "
        f"{added[:5]}, changed " + "; ".join(f"{k}: {got[k]!r} (recorded {want[k]!r})"
                                             for k in changed[:5]))


def test_the_comparison_sees_a_changed_number_and_a_changed_verdict():
    study = {"claims": [{"id": "C1", "verdict": "supported", "effect": {"estimate": 0.5},
                         "note": "words are not compared", "elapsed_s": 3.0}]}
    base = numbers_and_verdicts(study)
    assert base == {".claims[0].id": "C1", ".claims[0].verdict": "supported",
                    ".claims[0].effect.estimate": 0.5}
    assert same(0.5, 0.5 * (1 + 1e-6)) and not same(0.5, 0.5 * (1 + 1e-3))
    assert same(-6.358e-4, -6.325e-4) and not same(-6.358e-4, -6.158e-4)  # kernels, not rules
    assert same(math.nan, math.nan) and not same(math.nan, 0.0)
