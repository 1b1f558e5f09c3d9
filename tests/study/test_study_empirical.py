"""The trained-model claims' decisions on planted measurements (no training): each design's
effect gives `supported`, its opposite `not supported`, noise `inconclusive`; and every
prediction is checked on its own: a world where only claim prediction k is broken gives that
prediction `not supported`, every other claim prediction and premise `supported`, and the claim
`not supported`; a world where only a diagnostic is broken leaves the claim `supported`; a scale
premise that fails gives `not tested at this scale`.

"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest
from fake_study import LRS, SEEDS, FakeStudy
from planted_runs import (
    C6_GOOD,
    C6B_GOOD,
    C9_GOOD,
    C10_GOOD,
    C11_GOOD,
    CLAIMS,
    DEEP,
    MAJORITY,
    _acc,
)

from normlab.study.claims.c10_transfer import c10_predictions
from normlab.study.claims.common import same_lr_words
from normlab.study.context import MatchedPair, RunRecord, TunedGrid
from normlab.study.experiments import trajectory_pair
from normlab.study.profiles import PROFILES
from normlab.study.verdict import decide_interval


@pytest.fixture(autouse=True)
def figure_calls(stub_figures):
    import normlab.probe.figures
    import normlab.study.figures

    calls = stub_figures(normlab.study.figures, ["plot_bars", "plot_curves"])
    return stub_figures(normlab.probe.figures, ["plot_per_block"], calls)


# -- C12: pairs along the trajectories -------------------------------------------------------

def test_trajectory_pair_takes_the_most_trained_pair_within_tolerance():
    pre = [(100, 2.9), (200, 2.5), (300, 2.3), (None, 2.2)]
    post = [(100, 3.1), (200, 2.8), (300, 2.55), (None, 2.48)]
    a, b = trajectory_pair(pre, post, 0.05)
    assert (a, b) == ((200, 2.5), (None, 2.48))
    # none within tolerance: the closest pair, which the matching then leaves out
    a, b = trajectory_pair([(None, 2.0)], [(100, 3.0), (None, 2.5)], 0.05)
    assert b == (None, 2.5)


@pytest.mark.parametrize("cid,world,side", [("C9", C9_GOOD, "post_wsd"),
                                             ("C6a", C6_GOOD, "post"),
                                             ("C6b", C6B_GOOD, "pre"),
                                             ("C11", C11_GOOD, "pre_nofinal")])
def test_stalled_side_is_reported_not_compared(cid, world, side, tmp_path):
    result = CLAIMS[cid](FakeStudy(tmp_path, **world, **{f"stalled_{side}": 1.0}))
    assert result.verdict == "inconclusive" and side in result.stalled
    assert "stalled" in result.note


def test_a_best_lr_left_at_the_grid_edge_is_said(tmp_path):
    result = CLAIMS["C9"](FakeStudy(tmp_path, **C9_GOOD, unbracketed_pre_xavier_wsd=1.0))
    assert "Not bracketed: pre_xavier_wsd" in result.note
    assert "Not bracketed" not in CLAIMS["C9"](FakeStudy(tmp_path, **C9_GOOD)).note


@pytest.mark.draws
def test_every_threshold_names_its_source(tmp_path):
    worlds = {"C6a": C6_GOOD, "C6b": C6B_GOOD, "C9": C9_GOOD, "C11": C11_GOOD,
              "C3": {"merge_pre": -3.0, "drop_pre": 0.0, "merge_post": 0.0, "drop_post": 0.0}}
    for cid, world in worlds.items():
        for p in CLAIMS[cid](FakeStudy(tmp_path, **world)).predictions:
            assert p["threshold_source"], (cid, p["subject"])
    assert all(p.threshold_source for p in c10_predictions(
        _acc(random.Random(0), **C10_GOOD), MAJORITY))


def test_an_interval_touching_the_threshold_is_not_a_decision():
    assert decide_interval(0.5, 0.0, 1.0, ">", 0.0) == "inconclusive"  # low == threshold
    assert decide_interval(-0.5, -1.0, 0.0, ">", 0.0) == "not supported"  # high == threshold
    assert decide_interval(-0.5, -1.0, 0.0, "<", 0.0) == "inconclusive"
    assert decide_interval(0.5, 0.0, 1.0, "<", 0.0) == "not supported"
    two = math.log(2)
    assert decide_interval(1.0, two, 1.2, ">", two) == "inconclusive"
    assert decide_interval(1.0, two + 1e-9, 1.2, ">", two) == "supported"


def test_quick_and_tiny_profiles_train_what_the_claims_read():
    from normlab.study.claims.c09_post_ends_better import CLAIM as C9

    assert C9.settings(PROFILES["standard"]).same_inits == ("xavier", "gpt2_scaled")
    assert C9.settings(PROFILES["quick"]).same_inits == ("xavier",)


def test_a_run_keeps_its_trajectory_when_asked(tmp_path):
    from normlab.config import load_run_config
    from normlab.study.experiments import trajectory
    from normlab.train import load_trained_model, train_run
    from normlab.train.checkpoint import kept_steps

    cfg = load_run_config(None, [
        "model.n_blocks=1", "model.d_model=16", "model.n_heads=2", "model.max_seq_len=16",
        "data.seq_len=16", "train.batch_size=2", "train.steps=4", "train.eval_every=2",
        "train.eval_batches=1", "train.checkpoint_every=2", "train.keep_checkpoints=true",
        "train.device=cpu"])
    s = train_run(cfg, tmp_path, progress=False)
    run = tmp_path / s["run_id"]
    assert kept_steps(run) == [2]  # the last step is the run's checkpoint/ itself
    _, early = load_trained_model(run, step=2)
    _, last = load_trained_model(run)
    assert any((a != b).any() for a, b in zip(early.parameters(), last.parameters(),
                                              strict=True))
    assert [step for step, _ in trajectory(run)] == [2, None]
    # runs trained as one stacked model keep theirs too, each its own
    from normlab.train.group import train_group

    seeds = [cfg.model_copy(update={"train": cfg.train.model_copy(update={"seed": k})})
             for k in (1, 2)]
    group = train_group(seeds, tmp_path / "group")
    runs = [tmp_path / "group" / run_id for run_id in group]
    assert [kept_steps(r) for r in runs] == [[2], [2]]
    a, b = (load_trained_model(r, step=2)[1] for r in runs)
    assert any((x != y).any() for x, y in zip(a.parameters(), b.parameters(), strict=True))
    with pytest.raises(Exception, match="no weights kept at step 3"):
        load_trained_model(runs[0], step=3)


# -- the verdict table -------------------------------------------------------------------------

LONG_NOTE = ("the study provided no matched pre/post models for C12 because every deep run "
             "stalled at the unigram plateau, which this sentence must show to its last word")


def _table_claims(tmp_path) -> list[dict[str, Any]]:
    c6b = CLAIMS["C6b"](FakeStudy(tmp_path, **(C6B_GOOD | {"val_pre_nowarmup": 2.3}))).to_dict()
    c6b["calibration"] = "passed"
    return [c6b, {"id": "C12", "title": "Deep Pre-LN layers are removable",
                  "verdict": "not run", "note": LONG_NOTE, "predictions": []}]


def test_markdown_table_has_a_row_per_prediction(tmp_path):
    from normlab.study.table import markdown_table

    lines = markdown_table(_table_claims(tmp_path)).splitlines()
    assert lines[0].startswith("| claim | verdict | prediction | measured")
    c6b_rate, c6b_pre, c6b_at_best, c6b_vs, c6b_post, c12 = lines[2:]
    assert c6b_rate.startswith("| **C6b** Pre-LN needs no warmup") and "**not supported**" in \
        c6b_rate and "| post diverges |" in c6b_rate and "| > 0.5 | supported |" in c6b_rate
    assert c6b_rate.endswith("| passed |")
    # pre's cost is a non-inferiority test at 0.02: its interval's upper end must lie below
    assert c6b_pre.startswith("|  |  | pre |") and "| < 0.02 | not supported |" in c6b_pre
    assert c6b_at_best.startswith("|  |  | pre at its best lr (") and \
        "| < 0.02 | not supported |" in c6b_at_best
    assert c6b_vs.startswith("|  |  | post vs pre |") and "| > 0 | supported |" in c6b_vs
    assert c6b_post.startswith("|  |  | post |") and "| supported (diagnostic) |" in c6b_post
    assert LONG_NOTE in c12 and c12.endswith("| not run | — |")


def test_terminal_summary_wraps_and_never_cuts(tmp_path):
    from rich.console import Console

    from normlab.cli.study import summary_table

    console = Console(width=90, record=True)
    console.print(summary_table({"claims": _table_claims(tmp_path)}, "study"))
    text = " ".join(console.export_text().split())
    words = [w for w in LONG_NOTE.split()]
    assert all(w in text for w in words)
    assert "C6b" in text and "passed" in text, text


def test_the_claims_effect_is_the_prediction_that_decides_it(tmp_path):
    result = CLAIMS["C6b"](FakeStudy(tmp_path, **(C6B_GOOD | {"val_pre_nowarmup": 2.3})))
    assert result.verdict == "not supported"
    assert result.effect.name == result.predictions[1]["quantity"]
    assert result.effect.estimate == result.predictions[1]["effect"]["estimate"]  # pre's


# -- the words each claim shows --------------------------------------------------------------

C3_GOOD = {"merge_pre": -3.0, "drop_pre": 0.0, "merge_post": 0.0, "drop_post": 0.0}


WORDS = {"C3": C3_GOOD, "C6a": C6_GOOD, "C6b": C6B_GOOD, "C9": C9_GOOD, "C11": C11_GOOD}


@pytest.mark.parametrize("cid", sorted(WORDS))
def test_the_claim_s_words_are_the_recorded_ones(cid, tmp_path, recorded_words, figure_calls):
    settings = DEEP if cid == "C3" else None
    recorded_words(f"empirical_{cid}", CLAIMS[cid](FakeStudy(tmp_path, settings=settings,
                                                             **WORDS[cid])), figure_calls)


@pytest.mark.parametrize(("name", "cid", "profile", "world"), [
    ("C9_post_stalled", "C9", "standard", C9_GOOD | {"stalled_post_wsd": 1.0}),
    ("C9_quick_unbracketed", "C9", "quick", C9_GOOD | {"unbracketed_pre_xavier_wsd": 1.0}),
    ("C6a_noise", "C6a", "standard", C6_GOOD | {"noise": 3.0}),
    ("C6b_unbracketed", "C6b", "standard", C6B_GOOD | {"unbracketed_post": 1.0}),
    ("C9_not_near_convergence", "C9", "standard", C9_GOOD | {"stable_post_wsd": 0.1}),
    ("C9_long", "C9", "long", C9_GOOD),
    ("C11_quick", "C11", "quick", {k: v for k, v in C11_GOOD.items() if k != "fn12"}),
    ("C11_without_final_stalled", "C11", "standard", C11_GOOD | {"stalled_pre_nofinal": 1.0}),
])
def test_the_words_of_stalled_unbracketed_noisy_and_short_runs(name, cid, profile, world,
                                                               tmp_path, recorded_words,
                                                               figure_calls):
    world = dict(world)
    noise = world.pop("noise", 0.01)
    recorded_words(f"empirical_{name}",
                   CLAIMS[cid](FakeStudy(tmp_path, noise=noise, profile=profile, **world)),
                   figure_calls)


def test_the_numbers_each_claim_reports_are_the_planted_ones(tmp_path):
    """Without noise every reported mean is the planted value it summarises."""
    def mean(ci):
        return ci["mean"]

    c6a = CLAIMS["C6a"](FakeStudy(tmp_path, noise=0.0, **C6_GOOD)).numbers
    assert c6a["common_lrs"] == [1e-3, 2e-3]  # post's tuned lr (the first of equals) first
    at = c6a["lr 0.001"]
    assert mean(at["cost"]["post"]) == pytest.approx(0.8)
    assert mean(at["cost"]["pre"]) == pytest.approx(-0.1)
    assert mean(at["pre without - post with"]) == pytest.approx(-0.1)
    assert at["outcomes_without_warmup"] == {pl: ["completed"] * SEEDS for pl in ("pre", "post")}
    assert c6a["tuning"]["post"] == {
        "lrs": list(LRS), "best_lr": 1e-3, "bracketed": True, "extensions": [],
        "mean_val_loss": {f"{lr:g}": C6_GOOD["val_post"] for lr in LRS},
        "outcomes": {f"{lr:g}": ["completed"] * SEEDS for lr in LRS}}

    c6b = CLAIMS["C6b"](FakeStudy(tmp_path, noise=0.0,
                                  **(C6_GOOD | {"val_pre_nowarmup@0.002": 1.9}))).numbers
    assert mean(c6b["cost"]["post"]) == pytest.approx(0.8)
    assert mean(c6b["cost"]["pre"]) == pytest.approx(1.9 - 2.2)  # its best cell, 2e-3
    assert c6b["tuning_without_warmup"]["pre"]["best_lr"] == 2e-3
    assert c6b["tuning_with_warmup"]["pre"]["best_lr"] == 1e-3
    assert c6b["post_without_warmup_at_its_best_lr"] == {
        "lr": c6b["tuning_with_warmup"]["post"]["best_lr"], "outcomes": ["completed"] * SEEDS}

    c9 = CLAIMS["C9"](FakeStudy(tmp_path, noise=0.0, **C9_GOOD)).numbers
    assert mean(c9["paper_inits_context"]["pre (GPT-2 scaled) - post (Xavier)"]) == \
        pytest.approx(2.3 - 2.2)
    assert set(c9["tuning"]) == {"pre_wsd", "post_wsd", "pre_xavier_wsd", "post_gpt2_wsd"}

    c11 = CLAIMS["C11"](FakeStudy(tmp_path, noise=0.0, **C11_GOOD)).numbers
    assert mean(c11["final_norm_dropped_6_blocks"]) == pytest.approx(0.5)
    assert mean(c11["final_norm_dropped_12_blocks"]) == pytest.approx(1.0)
    assert c11["deep_lr"] == 2e-3
    assert set(c11["tuning"]) == {"with", "without"}

    c3 = CLAIMS["C3"](FakeStudy(tmp_path, noise=0.0, **C3_GOOD)).numbers
    assert mean(c3["late_merge_per_drop"]["pre"]) == pytest.approx(math.exp(-3.0))
    assert mean(c3["late_merge_per_drop"]["post"]) == pytest.approx(1.0)
    assert mean(c3["late_merge_kl"]["pre"]) == pytest.approx(math.exp(-3.0))
    assert mean(c3["late_drop_kl"]["pre"]) == pytest.approx(1.0)
    assert mean(c3["late_drop_dloss"]["post"]) == pytest.approx(1.0)
    assert mean(c3["effective_depth"]["pre"]) == pytest.approx(3.0)


# -- StudyContext.tuned: the grid of a family that fails to train ----------------------------

def _tuning_context(tmp_path, monkeypatch, trains_at_or_below: float, extensions: int = 2,
                    least_bad_stall: float = 0.0):
    """A StudyFolder whose runs are planted: every seed of a cell above
    `trains_at_or_below` stalls (near the unigram loss, 3.3, least bad at `least_bad_stall`);
    a cell at or below it trains, its loss lowest at 5e-4."""
    from normlab.study.experiments import StudyFolder

    p = replace(PROFILES["tiny"], lrs=(1e-3, 2e-3, 4e-3), max_lr_extensions=extensions)
    ctx = StudyFolder(tmp_path, p, log=lambda _m: None)
    asked: list[tuple[float, ...]] = []

    def planted_runs(self, family, lrs, warmup, blocks=None):
        if (family, warmup) == ("post", p.warmup):
            asked.append(tuple(lrs))
        out = {}
        for lr in lrs:
            stalled = lr > trains_at_or_below
            loss = 3.3 + abs(lr - least_bad_stall) if stalled else 2.0 + abs(lr - 5e-4) * 100
            out[lr] = [RunRecord(f"{family}-{lr:g}-{s}", s,
                                 "stalled" if stalled else "completed", loss, stalled,
                                 val_loss=loss) for s in range(p.seeds)]
        return out

    monkeypatch.setattr(StudyFolder, "runs", planted_runs)
    monkeypatch.setattr(StudyFolder, "prefetch", lambda self, specs: None)
    monkeypatch.setattr(StudyFolder, "train", lambda self, configs: [])
    return ctx, asked


def test_tuned_extends_an_all_stalled_grid_downward_and_never_calls_it_bracketed(
        tmp_path, monkeypatch):
    # nothing trains at any lr: the grid is halved below twice, never extended above, and the
    # least bad cell (the lowest lr) is no bracketed optimum
    ctx, asked = _tuning_context(tmp_path, monkeypatch, trains_at_or_below=0.0)
    t = ctx.tuned("post")
    assert asked == [(1e-3, 2e-3, 4e-3), (5e-4,), (2.5e-4,)]
    assert list(t.lrs) == [2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3]
    assert list(t.extensions) == ["every cell stalled or diverged: added 0.0005 below",
                               "every cell stalled or diverged: added 0.00025 below"]
    assert t.all_stalled and not t.bracketed
    assert t.best_lr == 2.5e-4  # the least bad, reported, not an optimum
    # the least bad stall inside the grid is no bracketed optimum either
    ctx, asked = _tuning_context(tmp_path / "a", monkeypatch, trains_at_or_below=0.0,
                                 least_bad_stall=2e-3)
    t = ctx.tuned("post")
    assert t.best_lr == 2e-3 and len(t.extensions) == 2
    assert list(t.lrs)[:2] == [2.5e-4, 5e-4] and t.all_stalled and not t.bracketed
    # the first extension finds a cell that trains, at the low edge: extended once more below,
    # and the trained optimum (5e-4) is then inside the grid
    ctx, asked = _tuning_context(tmp_path / "b", monkeypatch, trains_at_or_below=5e-4)
    t = ctx.tuned("post")
    assert list(t.lrs) == [2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3] and t.best_lr == 5e-4
    assert list(t.extensions) == ["every cell stalled or diverged: added 0.0005 below",
                               "best lr 0.0005 at the low edge: added 0.00025"]
    assert t.bracketed and not t.all_stalled
    # the extensions run out with the only trained cell at the low edge: not bracketed
    ctx, _ = _tuning_context(tmp_path / "c", monkeypatch, trains_at_or_below=5e-4, extensions=1)
    t = ctx.tuned("post")
    assert list(t.lrs) == [5e-4, 1e-3, 2e-3, 4e-3] and t.best_lr == 5e-4
    assert not t.bracketed and not t.all_stalled
    # with a single extension and nothing trained: still all stalled, still not bracketed
    ctx, _ = _tuning_context(tmp_path / "d", monkeypatch, trains_at_or_below=0.0, extensions=1)
    t = ctx.tuned("post")
    assert list(t.lrs) == [5e-4, 1e-3, 2e-3, 4e-3] and t.all_stalled and not t.bracketed


def test_tuned_grids_extend_together_and_end_as_each_would_alone(tmp_path, monkeypatch):
    """The families a study tunes at one depth are tuned in lockstep: each round of every
    family's extensions goes to the workers in one go, and each family's grid ends as tuning it
    alone ends."""
    from normlab.study.experiments import StudyFolder

    p = replace(PROFILES["tiny"], lrs=(1e-3, 2e-3, 4e-3), max_lr_extensions=2)

    def planted(self, family, lrs, warmup, blocks=None):
        # pre is best at its highest lr every time; post stalls above 6e-4, best at 5e-4
        out = {}
        for lr in lrs:
            stalled = family == "post" and lr > 6e-4
            loss = 3.3 if stalled else (2.0 - lr * 10 if family == "pre"
                                        else 2.5 + abs(lr - 5e-4) * 100)
            out[lr] = [RunRecord(f"{family}-{lr:g}-{s}", s,
                                 "stalled" if stalled else "completed", loss, stalled,
                                 val_loss=loss) for s in range(p.seeds)]
        return out

    batches: list[list] = []
    monkeypatch.setattr(StudyFolder, "runs", planted)
    monkeypatch.setattr(StudyFolder, "prefetch", lambda self, specs: None)
    monkeypatch.setattr(StudyFolder, "train", lambda self, cfgs: batches.append(cfgs) or [])
    monkeypatch.setattr(StudyFolder, "tuned_specs",
                        lambda self: [("pre", p.warmup), ("post", p.warmup)])
    ctx = StudyFolder(tmp_path / "together", p, log=lambda _m: None)
    pre = ctx.tuned("pre")
    assert ctx.tuned("post") is ctx.tuned("post")  # tuned with pre, not again
    post = ctx.tuned("post")
    assert [sorted({(c.model.placement, c.train.lr) for c in b}) for b in batches] == [
        sorted((pl, lr) for pl in ("pre", "post") for lr in p.lrs),
        [("post", 5e-4), ("pre", 8e-3)],
        [("post", 2.5e-4), ("pre", 1.6e-2)]]
    assert all(len(b) == len({(c.model.placement, c.train.lr) for c in b}) * p.seeds
               for b in batches)
    assert list(pre.lrs) == [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2] and not pre.bracketed
    assert list(post.lrs) == [2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3] and post.best_lr == 5e-4
    # alone: the same grids, and nothing trained in one go with another family
    monkeypatch.setattr(StudyFolder, "tuned_specs", lambda self: [])
    batches.clear()
    alone = StudyFolder(tmp_path / "alone", p, log=lambda _m: None)
    assert alone.tuned("pre") == pre and alone.tuned("post") == post and batches == []


def test_tuned_never_takes_a_failed_cell_for_the_optimum(tmp_path, monkeypatch):
    # trains at or below 2e-3; the stalled 4e-3 cell is planted with a loss (1.0) lower than
    # every trained cell's
    ctx, _ = _tuning_context(tmp_path, monkeypatch, trains_at_or_below=2e-3)
    from normlab.study.experiments import StudyFolder

    planted = StudyFolder.runs

    def with_a_cheap_stall(self, family, lrs, warmup, blocks=None):
        out = planted(self, family, lrs, warmup, blocks)
        for lr, recs in out.items():
            if recs[0].failed:
                out[lr] = [replace(r, score=1.0, val_loss=1.0) for r in recs]
        return out

    monkeypatch.setattr(StudyFolder, "runs", with_a_cheap_stall)
    t = ctx.tuned("post")
    # 1e-3 (the best trained cell) sits at the low edge: 5e-4 added below, the optimum there;
    # then 2.5e-4 below it; the stalled 4e-3 (score 1.0) is never the best, nor extended
    assert t.best_lr == 5e-4 and t.bracketed
    assert list(t.lrs) == [2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3]
    assert not any("high edge" in e for e in t.extensions)


def test_the_matched_pair_records_each_seed_s_gap(tmp_path, monkeypatch):
    """The cells are matched on their mean losses; the pair also records, seed by seed (paired
    by index), post's loss minus pre's, which the matched-loss premise checks, and a JSON round
    trip keeps them."""
    from normlab.study.experiments import StudyFolder

    p = replace(PROFILES["tiny"], lrs=(1e-3, 2e-3), max_lr_extensions=0)
    ctx = StudyFolder(tmp_path, p, log=lambda _m: None)
    planted = {"pre": [2.0, 2.1, 2.2], "post": [2.05, 2.0, 2.35]}

    def grid(self, family, warmup=None, blocks=None):
        recs = {lr: tuple(RunRecord(f"{family}-{lr:g}-{s}", s, "completed", v + 1e3 * lr, False,
                                    val_loss=v + 1e3 * lr) for s, v in enumerate(planted[family]))
                for lr in p.lrs}
        return TunedGrid(family, 0, p.lrs, recs, 1e-3, False)

    monkeypatch.setattr(StudyFolder, "tuned", grid)
    pair = ctx.matched_pair()
    assert (pair.pre_lr, pair.post_lr) == (1e-3, 1e-3)
    assert pair.seed_gaps == pytest.approx((-0.05, 0.1, -0.15))  # pre - post, as the gap
    assert pair.gap == pytest.approx(sum(pair.seed_gaps) / 3)
    assert MatchedPair.from_json(pair.to_json()) == pair
    assert "seed_gaps" not in MatchedPair(False, reason="x").to_json()


def test_the_same_lr_pair_is_the_common_lr_nearest_both_optima(tmp_path, monkeypatch):
    """The same-lr, same-step pair: among the lrs where every seed of both placements trained,
    the one whose worse placement lies least above its own best mean; failed cells are no
    candidates; no such lr gives no pair, with the reason; the deep grids with probe_deep."""
    from normlab.study.experiments import StudyFolder

    lrs = (1e-3, 2e-3, 4e-3, 8e-3)
    p = replace(PROFILES["tiny"], lrs=lrs, max_lr_extensions=0)
    # pre's best at 8e-3 (post failed there), post's at 1e-3; at 2e-3 pre is 0.3 above its
    # best and post 0.1, at 4e-3 pre 0.1 and post 0.2: 4e-3 has the smaller worse excess
    means = {"pre": {1e-3: 2.5, 2e-3: 2.3, 4e-3: 2.1, 8e-3: 2.0},
             "post": {1e-3: 2.0, 2e-3: 2.1, 4e-3: 2.2, 8e-3: 3.3}}
    failed = {("post", 8e-3)}

    def grid(self, family, warmup=None, blocks=None):
        recs = {lr: tuple(RunRecord(f"{family}-{lr:g}-{s}", s, "completed", means[family][lr]
                                    + 0.01 * s, (family, lr) in failed,
                                    val_loss=means[family][lr] + 0.01 * s * (family == "pre"))
                          for s in range(3)) for lr in lrs}
        return TunedGrid(family, 0, lrs, recs, 1e-3, False)

    monkeypatch.setattr(StudyFolder, "tuned", grid)
    ctx = StudyFolder(tmp_path, p, log=lambda _m: None)
    pair = ctx.same_lr_pair()
    assert (pair.pre_lr, pair.post_lr) == (4e-3, 4e-3) and pair.blocks is None
    assert pair.runs == {"pre": ("pre-0.004-0", "pre-0.004-1", "pre-0.004-2"),
                         "post": ("post-0.004-0", "post-0.004-1", "post-0.004-2")}
    assert pair.seed_gaps == pytest.approx((-0.1, -0.09, -0.08))
    assert pair.matched is False  # 0.1 nats apart in a seed: not matched, and said so
    assert "Same lr and step" in same_lr_words(pair) and "lr 0.004" in same_lr_words(pair)
    failed |= {("pre", lr) for lr in lrs[:3]}
    none = ctx.same_lr_pair()
    assert not none.found and "every seed of pre and of post trained" in none.reason
    # with probe_deep, the deep grids at deep_blocks
    asked = []
    deep = replace(p, probe_deep=True, deep_blocks=12)
    failed.clear()
    monkeypatch.setattr(StudyFolder, "deep_grid",
                        lambda self, pl: asked.append(pl) or grid(self, pl))
    pair = StudyFolder(tmp_path / "deep", deep, log=lambda _m: None).same_lr_pair()
    assert sorted(asked) == ["post", "pre"] and pair.blocks == 12 and pair.pre_lr == 4e-3


def test_late_improvement_reads_each_runs_evaluations_over_its_own_length(tmp_path):
    """The shared convergence reading (C9's and C14's premises): the validation loss at the
    last evaluation at or before the window's start minus the one at its end; the window a
    quarter of the runs' own length (`steps`, a claim's own runs) ending at the run's end or
    at `end` (a wsd run's stable end); nan for a failed run or one with no evaluation early
    enough."""
    import json

    from normlab.study.experiments import StudyFolder, late_improvement

    folder = StudyFolder(tmp_path, PROFILES["quick"], lambda _m: None)
    losses = {100: 1.0, 200: 0.8, 300: 0.7, 400: 0.65, 480: 0.64, 500: 0.6}
    for name in ("a", "b"):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        rows = [{"step": s, "val_loss": v} for s, v in losses.items()] + [{"step": 50,
                                                                         "loss": 3.0}]
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ok = RunRecord("a", 0, "completed", 0.6, False, val_loss=0.6)
    failed = RunRecord("b", 1, "diverged", 5.5, True, val_loss=None)
    # 500 steps: the window 375..500 reads 300 (0.7) against the final 0.6
    got = late_improvement(folder, [ok, failed], 0.25, None, 500)
    assert got[0] == pytest.approx(0.1) and math.isnan(got[1])
    # ending at a stable end of 480: from 355 (the 300 evaluation) to 480 (0.64)
    assert late_improvement(folder, [ok], 0.25, 480, 500) == [pytest.approx(0.06)]
    # a run of 2000 steps ending at 480: its window starts at -20, before every evaluation
    assert math.isnan(late_improvement(folder, [ok], 0.25, 480, 2000)[0])
    # by default the profile's own length
    assert folder.profile.steps != 500
    assert late_improvement(folder, [ok]) == late_improvement(folder, [ok], 0.25, None,
                                                              folder.profile.steps)
