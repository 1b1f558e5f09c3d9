"""Every study figure agrees with the table and verdicts beside it: a ladder's points are the
rungs' measured values in their verdict's colour, the band or line behind each rung is that
rung's own prediction (so a point drawn as supported lies inside it), a title's numbers are the
claim's or its profile's, and C6a's lr is the one its predictions were made at, called post's
tuned lr only when the tuning table says so. Drawn on the fake study's planted worlds."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
from fake_study import FakeStudy, Planted

import normlab.study.figures as study_figures
from normlab.study.claims import measures, profile_settings
from normlab.study.figures import VERDICT_COLORS, expected_shape
from normlab.study.verdict import base_subject

pytestmark = pytest.mark.draws
CLAIMS = measures()
THEORY = ("C1", "C4", "C5", "C7", "C8")
# planted worlds in which the empirical claims train (tests/study/test_study_empirical.py)
C6 = {"val_post": 2.2, "val_post_nowarmup": 3.0, "val_pre": 2.2, "val_pre_nowarmup": 2.1}
WORLDS = {"C6b": C6 | {"fails_post_nowarmup": 5},
          "C9": {"val_pre_xavier": 2.3, "val_post": 2.2, "val_pre": 2.3, "val_post_gpt2": 2.2},
          "C11": {"val_pre": 2.2, "val_pre_nofinal": 2.5, "fn6": 0.5, "fn12": 1.0},
          "C14": {}}


@pytest.fixture
def drawn(monkeypatch) -> list[dict[str, Any]]:
    """Every figure the study draws, as its matplotlib figure, path, alt text and caption."""
    out: list[dict[str, Any]] = []
    save = study_figures.save_figure

    def record(fig, path, *, alt, caption, **kw):
        out.append({"fig": fig, "path": Path(path), "alt": alt, "caption": caption})
        return save(fig, path, alt=alt, caption=caption, **kw)

    monkeypatch.setattr(study_figures, "save_figure", record)
    return out


def _numbers(value: Any) -> list[float]:
    """Every number in a nested result (and in its texts)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [float(value)] if math.isfinite(value) else []
    if isinstance(value, str):
        return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", value)]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _numbers(k) + _numbers(v)]
    if isinstance(value, list | tuple):
        return [x for v in value for x in _numbers(v)]
    return []


def _title_numbers_are_the_claims(fig, result, profile) -> None:
    known = _numbers(result.to_dict()) + _numbers(profile_settings(profile))
    for ax in fig.axes:
        for x in re.findall(r"\d+(?:\.\d+)?(?:e-?\d+)?", ax.get_title()):
            assert any(math.isclose(float(x), k, rel_tol=1e-3) for k in known), (
                result.id, ax.get_title(), x)


def _expected(artist) -> bool:
    """Whether `artist` is a drawn prediction (gid `expected-<rung>`, unique in the page)."""
    return str(artist.get_gid()).startswith("expected-")


def _bands(ax) -> list[tuple[float, float, float, float]]:
    """(x0, x1, low, high) of each expected band drawn on `ax`."""
    out = []
    for c in ax.collections:
        if _expected(c) and c.get_paths() and hasattr(c, "get_facecolor") \
                and type(c).__name__ != "LineCollection":
            v = c.get_paths()[0].vertices
            out.append((v[:, 0].min(), v[:, 0].max(), v[:, 1].min(), v[:, 1].max()))
    return out


def _lines(ax) -> list[tuple[float, float, float]]:
    """(x0, x1, y) of each expected threshold drawn on `ax`."""
    return [(s[0][0], s[1][0], s[0][1]) for c in ax.collections
            if _expected(c) and type(c).__name__ == "LineCollection"
            for s in c.get_segments()]


def _points(ax) -> dict[int, tuple[float, str]]:
    """Per rung, the point drawn there and its colour."""
    return {round(line.get_xdata()[0]): (line.get_ydata()[0], line.get_color())
            for line in ax.get_lines() if line.get_marker() == "o"}


@pytest.mark.parametrize("cid", THEORY)
def test_a_ladder_draws_each_rungs_own_prediction_and_verdict(cid, tmp_path, drawn):
    study = FakeStudy(tmp_path, profile="quick", world=Planted())
    result = CLAIMS[cid](study)
    ladder = [d for d in drawn if d["path"].name == f"{cid.lower()}_ladder.svg"]
    assert len(ladder) == 1
    fig = ladder[0]["fig"]
    assert fig.axes[0].get_title().startswith(f"{cid}:")
    _title_numbers_are_the_claims(fig, result, study.profile)
    rows = result.ladder
    subjects = list(dict.fromkeys(base_subject(p["subject"]) for r in rows
                                  for p in r["predictions"]))
    panels = [ax for ax in fig.axes if _points(ax)]
    assert panels
    checked = 0
    for ax in panels:
        points, bands, lines = _points(ax), _bands(ax), _lines(ax)
        # the panel's subject: the one whose estimates are its points
        subject = next(s for s in subjects if all(any(
            base_subject(p["subject"]) == s and math.isclose(
                p["effect"]["estimate"], y, rel_tol=1e-9, abs_tol=1e-12)
            for p in rows[i]["predictions"]) for i, (y, _) in points.items()))
        for i, row in enumerate(rows):
            pred = next((p for p in row["predictions"]
                         if base_subject(p["subject"]) == subject), None)
            if pred is None:
                continue
            e = pred["effect"]
            if i in points:
                y, color = points[i]
                assert y == pytest.approx(e["estimate"]), (cid, subject, row["rung"])
                assert color == VERDICT_COLORS[pred["verdict"]], (cid, subject, row["rung"])
            kind, a, b = expected_shape(e["expected"])
            if kind == "band":
                here = [(lo, hi) for x0, x1, lo, hi in bands if x0 < i < x1]
                assert here == [pytest.approx((a, b))], (cid, subject, row["rung"], here,
                                                         e["expected"])
                if pred["verdict"] == "supported":  # a supported point lies in its band
                    assert a <= e["ci_low"] <= e["ci_high"] <= b
            else:
                here = [y for x0, x1, y in lines if x0 < i < x1]
                assert here == [pytest.approx(a)], (cid, subject, row["rung"], here)
            checked += 1
    assert checked >= len(rows)


def test_c1s_source_rung_band_is_its_own(tmp_path, drawn):
    """C1's FFN-only source rung expects d/2 +- d/4 and the others 0.5-1.5: each is drawn behind
    its own rung (one band across the ladder put supported points outside it)."""
    result = CLAIMS["C1"](FakeStudy(tmp_path, profile="quick", world=Planted()))
    fig = next(d["fig"] for d in drawn if d["path"].name == "c1_ladder.svg")
    pre = fig.axes[0]
    expected = [next(p["effect"]["expected"] for p in r["predictions"]
                     if base_subject(p["subject"]) == "pre") for r in result.ladder]
    assert expected[0] == "in [0.25, 0.75]" and expected[1] == "in [0.5, 1.5]"
    assert sorted((round(x0 + 0.5), lo, hi) for x0, _x1, lo, hi in _bands(pre))[:2] == [
        (0, 0.25, 0.75), (1, 0.5, 1.5)]


@pytest.mark.parametrize("post_tuned_is_common", [True, False])
def test_c6a_title_names_the_lr_its_predictions_compare_at(post_tuned_is_common, tmp_path,
                                                          drawn, monkeypatch):
    world = C6 | {"best_lr_post": 1e-3}
    if not post_tuned_is_common:  # pre fails at post's tuned lr: 2e-3 is the only common lr
        world |= {"fails_pre@0.001": 5}
    monkeypatch.setattr(study_figures, "read_metrics", lambda path: [
        {"step": s, "train_loss": 3.0 - 0.1 * s, "val_loss": 3.1 - 0.1 * s} for s in range(4)])
    study = FakeStudy(tmp_path, profile="quick", **world)
    result = CLAIMS["C6a"](study)
    (fig,) = [d["fig"] for d in drawn if d["path"].name == "c6a_warmup_curves.svg"]
    title = fig.axes[0].get_title()
    best = result.numbers["tuning"]["post"]["best_lr"]
    lr = result.numbers["common_lrs"][0]
    assert (lr == best) is post_tuned_is_common
    assert f"lr {lr:g}" in title
    assert ("post's tuned" in title) is (lr == best), (title, best)
    # the same words as the predictions made at that lr
    tags = {p["subject"].split(", ", 1)[-1] for p in result.predictions
            if p["subject"].startswith("post, ")}
    assert any(t in title for t in tags), (title, tags)
    _title_numbers_are_the_claims(fig, result, study.profile)


def _lrs(value: Any) -> list[float]:
    """Every tuned lr (`best_lr`, `lr`) recorded in a nested result."""
    if isinstance(value, dict):
        return [float(v) for k, v in value.items() if k in ("best_lr", "lr")
                and isinstance(v, int | float)] + [x for v in value.values() for x in _lrs(v)]
    if isinstance(value, list):
        return [x for v in value for x in _lrs(v)]
    return []


@pytest.mark.parametrize("cid", sorted(WORLDS))
def test_a_bar_chart_shows_the_claims_numbers(cid, tmp_path, drawn):
    """Each bar is a mean the claim records, each lr in a bar's label a tuned lr it records,
    each number of the title the claim's or its profile's."""
    study = FakeStudy(tmp_path, 0.01, "long" if cid == "C14" else "quick", **WORLDS[cid])
    result = CLAIMS[cid](study)
    figs = [d for d in drawn if d["path"].name.startswith(cid.lower() + "_")]
    assert figs, cid
    recorded, lrs = _numbers(result.numbers), _lrs(result.numbers)
    for d in figs:
        _title_numbers_are_the_claims(d["fig"], result, study.profile)
        ax = d["fig"].axes[0]
        for bar in ax.patches:
            assert any(math.isclose(bar.get_height(), x, rel_tol=1e-9) for x in recorded), (
                cid, bar.get_height())
        for label in (t.get_text() for t in ax.get_xticklabels()):
            for lr in re.findall(r"lr (\d[\d.e-]*)", label):
                assert any(math.isclose(float(lr), x, rel_tol=1e-3) for x in lrs), (
                    cid, label, lrs)
