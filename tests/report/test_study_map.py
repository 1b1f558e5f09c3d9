"""The study's stability map (normlab/report/study_map.py): the grids read from a planted
study.json (one row per grid and warmup however many claims read it, labels that say what sets a
row apart, failures counted), the figure's cells read back against those numbers, the recorded
studies of docs/results rendered with the map by the command line, no map for a study that tuned
nothing, and a damaged entry left out with a note."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from xml.etree import ElementTree

import pytest
from matplotlib.colors import to_hex
from typer.testing import CliRunner

from normlab.cli import app
from normlab.report.study_map import (
    best_gid,
    cell_gid,
    study_map_figure,
    study_map_svg,
    tuned_grids,
)
from normlab.sweep.maps import COLORS, loss_colormap

RESULTS = Path(__file__).parents[2] / "docs" / "results"


def _grid(lrs, losses, outcomes, best, bracketed=True):
    return {"lrs": lrs, "best_lr": best, "bracketed": bracketed, "extensions": [],
            "mean_val_loss": {str(lr): v for lr, v in zip(lrs, losses, strict=True)},
            "outcomes": {str(lr): o for lr, o in zip(lrs, outcomes, strict=True)}}


OK = ["completed"] * 3
PRE = _grid([0.001, 0.002, 0.004], [2.6, 2.4, 2.5], [OK, OK, OK], 0.002)
POST = _grid([0.001, 0.002, 0.004], [2.9, 3.1, 5.5],
             [OK, ["completed", "stalled", "stalled"], ["diverged"] * 3], 0.001, False)
PRE_COLD = _grid([0.0005, 0.001, 0.002], [2.7, 2.65, 2.8],
                 [OK, OK, ["completed", "diverged", "completed"]], 0.001)
OLMO2 = _grid([0.002, 0.004, 0.008], [2.5, 2.45, 2.44], [OK, OK, OK], 0.008, False)
KHOP = _grid([0.001, 0.002], [0.6, 0.4], [OK, OK], 0.002)
DEEP_PRE = _grid([0.001, 0.002], [2.3, 2.2], [OK, OK], 0.002)


def planted_claims():
    """Claims' numbers as a study writes them: the pre and post grids read by three claims
    under three keys (C11 names the pre grid `with`), the same families without warmup, a
    family of a placement no claim of today tunes, a k-hop grid per depth and a claim's grid at
    another depth."""
    return [
        ("C6a", {"tuning": {"pre": PRE, "post": POST}, "common_lrs": [0.001]}),
        ("C6b", {"tuning_with_warmup": {"pre": PRE, "post": POST},
                 "tuning_without_warmup": {"pre": PRE_COLD, "post": POST}}),
        ("C9", {"tuning": {"pre": PRE, "olmo2_wsd": OLMO2}}),
        ("C11", {"tuning": {"with": PRE}}),
        ("C11b", {"blocks": 12, "tuning": {"with": DEEP_PRE}}),
        ("C14", {"task": {"hops": [1, 3]}, "tuning": {"siamese, 2 blocks": KHOP,
                                                      "siamese, 3 blocks": PRE_COLD}}),
        ("C1", {"slopes": {"pre": 1.0}}),
    ]


def _row(grids, label_start):
    (row,) = [r for r in grids.rows if r.label.startswith(label_start)]
    return row


def test_grids_are_read_once_each_with_what_sets_them_apart():
    grids = tuned_grids(planted_claims())
    assert grids.notes == []
    assert [r.label for r in grids.rows] == [
        "pre; warmup (C6a, C6b, C9, C11)",
        "post; warmup (C6a, C6b)",
        "pre; no warmup (C6b)",
        # the same recorded cells as the row above it, but trained with warmup: its own row
        "post; no warmup (C6b)",
        "olmo2_wsd; warmup (C9)",
        "C11b with, 12 blocks; warmup (C11b)",
        "k-hop siamese, 2 blocks; warmup (C14)",
        "k-hop siamese, 3 blocks; warmup (C14)",
    ]
    post = _row(grids, "post; warmup")
    assert post.lrs == [0.001, 0.002, 0.004]
    assert post.best_lr == 0.001 and not post.bracketed
    assert [(c.diverged, c.stalled, c.n) for c in post.cells] == [(0, 0, 3), (0, 2, 3),
                                                                  (3, 0, 3)]
    assert [c.text() for c in post.cells] == ["2.900", "3.100\n2/3 stalled", "5.500\n3/3 div"]
    cold = _row(grids, "pre; no warmup")
    assert cold.cells[2].text() == "2.800\n1/3 div"
    assert cold.best_loss == 2.65
    assert cold.above_best(cold.cells[0]) == pytest.approx(0.05)


def test_a_claim_word_row_takes_the_placement_name_of_the_grid_it_shares():
    """C11 read first: its `with` is the pre grid, so the merged row is named `pre`."""
    claims = planted_claims()
    c11 = claims.pop(3)
    grids = tuned_grids([c11, *claims])
    assert grids.rows[0].label == "pre; warmup (C11, C6a, C6b, C9)"
    alone = tuned_grids([c11])
    assert alone.rows[0].label == "C11 with; warmup (C11)"


def _drawn(fig):
    """What the figure drew, by gid: cell -> (face colour, text), row -> best-lr linestyle."""
    ax = fig.axes[0]
    cells, texts, best = {}, {}, {}
    for p in ax.patches:
        gid = p.get_gid() or ""
        if gid.startswith("map cell"):
            cells[gid] = to_hex(p.get_facecolor())
        elif gid.startswith("map best"):
            best[gid] = (p.get_linestyle(), p.get_x(), p.get_x() + p.get_width())
    for t in ax.texts:
        gid = t.get_gid() or ""
        if gid.startswith("map cell"):
            texts[gid.removesuffix(" text")] = t.get_text()
    return cells, texts, best


def test_the_figure_draws_each_cell_as_the_numbers_say():
    grids = tuned_grids(planted_claims())
    fig = study_map_figure(grids)
    cells, texts, best = _drawn(fig)
    assert len(cells) == sum(len(r.cells) for r in grids.rows) == len(texts)
    colormap = loss_colormap()
    top = max(r.above_best(c) for r in grids.rows for c in r.cells if not c.all_failed)
    for i, row in enumerate(grids.rows):
        for c in row.cells:
            gid = cell_gid(i, c.lr)
            assert texts[gid] == c.text()
            if c.all_failed:
                expected = COLORS["diverged" if c.diverged else "stalled"]
            else:
                expected = colormap(min(row.above_best(c) / top, 1.0))
            assert cells[gid] == to_hex(expected), (row.label, c.lr)
        style, left, right = best[best_gid(i)]
        assert left < row.best_lr < right
        assert all(not left < lr < right for lr in row.lrs if lr != row.best_lr)
        assert (style == "-") == row.bracketed, row.label
    # each row's best lr is its darkest cell; the diverged cell is red, with its count
    post = next(i for i, r in enumerate(grids.rows) if r.label.startswith("post; warmup"))
    assert cells[cell_gid(post, 0.004)] == to_hex(COLORS["diverged"])
    assert texts[cell_gid(post, 0.004)] == "5.500\n3/3 div"
    assert cells[cell_gid(post, 0.001)] == to_hex(colormap(0.0))
    # the cells sit at their lrs on a log axis, the columns the union of every grid's lrs
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert [float(t.get_text()) for t in ax.get_xticklabels()] == [
        0.0005, 0.001, 0.002, 0.004, 0.008]
    assert "nats" in fig.axes[1].get_ylabel()  # the colorbar says its unit


def test_the_svg_carries_the_cells_and_a_caption():
    svg = study_map_svg(tuned_grids(planted_claims()), 60)
    root = ElementTree.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    ids = {el.get("id") for el in root.iter()}
    assert cell_gid(1, 0.004) in ids and best_gid(0) in ids
    caption = root.find(f"{ns}desc").text
    assert "60 steps" in caption and "dashed" in caption and "k/n div" in caption
    assert "3/3 div" in "".join(root.itertext())


def test_no_map_when_nothing_was_tuned():
    grids = tuned_grids([("C1", {"slopes": {"pre": 1.0}}), ("C2", {})])
    assert grids.rows == [] and grids.notes == []
    assert study_map_figure(grids) is None and study_map_svg(grids) is None


@pytest.mark.parametrize("damage, why", [
    (lambda g: g.update(lrs="0.001"), "lrs are not a list"),
    (lambda g: g.update(lrs=[0.001, -1]), "lrs are not a list"),
    (lambda g: g.update(mean_val_loss=[2.5]), "mean_val_loss is list"),
    (lambda g: g["outcomes"].update({"0.001": "completed"}), "outcomes at lr 0.001"),
    (lambda g: g["mean_val_loss"].update({"fast": 1.0}), "'fast', not a learning rate"),
    (lambda g: [g.pop("mean_val_loss"), g.pop("outcomes")], "neither a loss nor an outcome"),
])
def test_a_damaged_entry_is_left_out_with_a_note(damage, why):
    claims = planted_claims()
    broken = copy.deepcopy(POST)
    damage(broken)
    claims[0] = ("C6a", {"tuning": {"pre": PRE, "post": broken}, "also": 1})
    grids = tuned_grids(claims)
    (note,) = grids.notes
    assert note.startswith("C6a's tuning, post: left out of the map") and why in note, note
    # the undamaged copies of post's grid, read by C6b, still make their rows
    assert _row(grids, "post; warmup").claims == ["C6b"]
    assert study_map_figure(grids) is not None


def test_a_tuning_key_that_is_not_a_table_is_noted():
    grids = tuned_grids([("C6a", {"tuning": [1, 2]}), ("C9", {"tuning": {"pre": PRE}})])
    assert grids.notes == ["C6a's tuning: left out of the map (a list, not a table of grids)"]
    assert [r.label for r in grids.rows] == ["pre; warmup (C9)"]


def _report(folder: Path, out: Path) -> str:
    result = CliRunner().invoke(app, ["report", str(folder), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out.read_text(encoding="utf-8")


def _map_section(page: str) -> str:
    start = page.index('id="stability-map"')
    return page[start:page.index("<h2", start + 1)]


@pytest.mark.parametrize("profile", ["quick", "standard", "long"])
def test_recorded_studies_render_with_the_map(profile, tmp_path):
    folder = RESULTS / f"study_{profile}"
    page = _report(folder, tmp_path / "report.html")
    # after the verdicts, before the claims
    assert page.index('id="verdicts"') < page.index('id="stability-map"') < page.index(
        'class="claim"')
    section = _map_section(page)
    assert "<svg" in section and "Figure 1." in section and "Stability map" in section
    study = json.loads((folder / "study.json").read_text())
    expected = tuned_grids([(c["id"], c.get("numbers") or {}) for c in study["claims"]])
    assert expected.rows and not expected.notes
    drawn = re.findall(r'id="map-map cell (\d+) ([0-9.e-]+)"', section)
    assert len(drawn) == sum(len(r.cells) for r in expected.rows)
    for row in expected.rows:  # every row is labelled on the figure
        assert row.label.split(" (")[0] in section
    if profile == "quick":  # post stalls above its best lr with and without warmup
        post = _row(expected, "post; warmup")
        assert [c.stalled for c in post.cells] == [0, 0, 3, 3] and not post.bracketed
        assert "3/3 stalled" in section


def test_a_study_that_tuned_nothing_has_no_map_and_a_damaged_one_a_note(tmp_path):
    study = json.loads((RESULTS / "study_quick" / "study.json").read_text())
    bare = copy.deepcopy(study)
    for c in bare["claims"]:
        c["numbers"] = {k: v for k, v in (c.get("numbers") or {}).items()
                        if not k.startswith("tuning")}
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "study.json").write_text(json.dumps(bare))
    page = _report(tmp_path / "bare", tmp_path / "bare.html")
    assert 'id="stability-map"' not in page and "Stability map" not in page

    damaged = copy.deepcopy(study)
    c9 = next(c for c in damaged["claims"] if c["id"] == "C9")
    c9["numbers"]["tuning"]["post_wsd"]["lrs"] = None
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "study.json").write_text(json.dumps(damaged))
    section = _map_section(_report(tmp_path / "damaged", tmp_path / "damaged.html"))
    assert "<svg" in section
    assert "C9&#39;s tuning, post_wsd: left out of the map" in section
    assert "post_wsd; warmup" not in section and "pre_xavier_wsd; warmup" in section


def test_cells_are_no_wider_than_the_closest_columns():
    """Columns 1.5x apart (0.001, 0.0015): cells never overlap on the log axis."""
    grids = tuned_grids([("C9", {"tuning": {
        "pre": _grid([0.001, 0.0015, 0.004], [2.5, 2.4, 2.6], [OK, OK, OK], 0.0015)}})])
    ax = study_map_figure(grids).axes[0]
    boxes = sorted((p.get_x(), p.get_x() + p.get_width()) for p in ax.patches
                   if (p.get_gid() or "").startswith("map cell"))
    assert all(a[1] <= b[0] * (1 + 1e-9) for a, b in zip(boxes, boxes[1:], strict=False))
    assert math.isclose(boxes[0][1] / boxes[0][0], 1.5)


def test_a_cell_without_a_loss_is_grey_and_says_so():
    """A loss written as "NaN" (JSON has none) or missing: the cell is drawn, grey, with "-"."""
    grid = _grid([0.001, 0.002], [2.5, "NaN"], [OK, OK], 0.001)
    grids = tuned_grids([("C9", {"tuning": {"pre": grid}})])
    fig = study_map_figure(grids)
    cells, texts, _ = _drawn(fig)
    assert cells[cell_gid(0, 0.002)] == to_hex(COLORS["not finished"])
    assert texts[cell_gid(0, 0.002)] == "-"
    assert "no loss recorded" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_a_tiny_study_renders_with_its_map(tiny_study_dir, tmp_path):
    """A real study at profile `tiny`: its grids as the claims recorded them, each drawn."""
    study = json.loads((tiny_study_dir / "study.json").read_text())
    expected = tuned_grids([(c["id"], c.get("numbers") or {}) for c in study["claims"]])
    assert expected.rows and not expected.notes
    section = _map_section(_report(tiny_study_dir, tmp_path / "report.html"))
    assert "<svg" in section and "Stability map" in section
    drawn = re.findall(r'id="map-map cell (\d+) ([0-9.e-]+)"', section)
    assert len(drawn) == sum(len(r.cells) for r in expected.rows)
