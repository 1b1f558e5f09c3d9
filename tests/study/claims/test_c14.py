"""Tests of C14 (Pre-LN is effectively shallower: it solves fewer hops at equal depth):
normlab/study/claims/c14_khop_depth.py, on the planted study (tests/fake_study.py) and on what it
measures.

C14 (effective depth on the k-hop task) and the long profile's deep-run settings: the claim's
rule on planted worlds (tests/fake_study.py), the study's k-hop runs, and the deep models'
trajectory pairs that C2, C3 and C13 read in the long profile.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
from fake_study import FakeStudy

from normlab.study.claims import REGISTRY
from normlab.study.claims.c14_khop_depth import (
    CAL_HOPS,
    PAPER_SOLVED,
    calibration_decision,
    equivalent_words,
    hop_score,
    hops_solved,
    khop_accuracy,
    khop_calibration_config,
    khop_cells,
    khop_config,
    khop_tuned,
    place_on_ladder,
    pre_equivalent_depths,
)
from normlab.study.context import MatchedPair, RunRecord, TunedGrid
from normlab.study.experiments import StudyFolder
from normlab.study.khop_source import load_table, solved_depths
from normlab.study.profiles import PROFILES
from normlab.study.schema import Pretrained

C14 = REGISTRY["C14"].measure


DEEP = {"khop_depths": (12, 24)}  # deep k-hop models


def test_hops_solved_counts_the_run_of_solved_hop_counts_from_one():
    assert hops_solved({1: 0.95, 2: 0.91, 3: 0.5}) == 2
    assert hops_solved({1: 0.5, 2: 0.99, 3: 0.99}) == 0  # k=2 solved alone does not count
    assert hops_solved({1: 0.9, 2: 0.9}) == 2  # the level is inclusive
    assert hops_solved({1: 0.99, 2: math.nan, 3: 0.99}) == 1
    assert hop_score({1: 1.0, 2: 0.5, 3: 0.0}) == pytest.approx(0.5)


def test_a_profile_without_khop_depths_does_not_run_c14(tmp_path):
    result = C14(FakeStudy(tmp_path, 0.01, "standard"))
    assert result.verdict == "not run" and "long profile" in result.note


def test_at_two_and_three_blocks_c14_is_decided_without_a_premise_about_depth(
        tmp_path, recorded_words):
    """No fixed "large t" (the seed's mechanism is graded): the long profile's 2-3 blocks
    decide C14 in the world where the sources hold, once the task separates the depths."""
    result = C14(FakeStudy(tmp_path, 0.01, "long"))
    assert result.verdict == "supported", result.note
    recorded_words("c14_long_profile", result)
    assert [p["subject"] for p in result.predictions if p["role"] == "premise"] == [
        "calibration: pre, 3 - 2 blocks", "trained to a plateau"]
    # everything is measured and reported, per placement and depth
    by = result.numbers["by_placement"]
    assert set(by) == {"pre", "post", "deepnorm", "mix", "lns"}
    assert set(by["pre"]) == set(by["post"]) == {"1", "2", "3"}  # with the 1-block control
    assert set(by["mix"]) == {"2", "3"}
    assert by["post"]["3"]["hops_solved_per_seed"] == [2.0] * 5
    assert by["pre"]["2"]["hops_solved_per_seed"] == [1.0] * 5
    assert result.numbers["paper_hops_solved"]["3"] == 3


def test_a_run_still_learning_before_the_decay_leaves_c14_not_tested(tmp_path):
    """The plateau premise: pre or post whose loss still fell by 0.02 nats or more over the
    quarter before the wsd decay, at any depth compared, leaves C14 not tested at this scale
    (a gap may be learning speed); read from each cell's tuned runs at the stable end."""
    from normlab.config import TrainConfig
    from normlab.train.schedules import stable_end

    for fall in ({"stable_khop_post": 0.05}, {"stable_khop_pre": 0.03}):
        ctx = FakeStudy(tmp_path, 0.01, "long", **fall)
        result = C14(ctx)
        assert result.verdict == "not tested at this scale", fall
        plateau = next(p for p in result.predictions if p["subject"] == "trained to a plateau")
        assert plateau["verdict"] == "not supported"
        steps = 1200  # the long profile's k-hop runs
        end = stable_end(TrainConfig(steps=steps, schedule="wsd"))
        asked = [r for r in ctx.requests if r["kind"] == "late"]
        assert asked == [{"kind": "late", "frac": 0.25, "end": end, "steps": steps}] * 4
    # a successor still learning does not count: only the compared placements
    assert C14(FakeStudy(tmp_path, 0.01, "long", stable_khop_mix=0.5)).verdict == "supported"
    assert C14(FakeStudy(tmp_path, 0.01, "long", stable_khop_post=0.015)).verdict == "supported"


def test_the_control_at_one_block_is_a_diagnostic_beside_the_gaps(tmp_path):
    """With `khop_control` pre and post also train at 1 block, where nothing can merge: their
    gap there is reported as a diagnostic and never decides; a gap at 1 block as large as at
    depth leaves the verdict alone but is there to read."""
    offset = {"khop_post@1": [1.0, 0.75, 0.6]}
    for world in ({}, offset):
        result = C14(FakeStudy(tmp_path, 0.01, "long", **world))
        control = next(p for p in result.predictions
                       if p["subject"] == "post vs pre, 1 block (control)")
        assert control["role"] == "diagnostic" and result.verdict == "supported"
    assert control["verdict"] == "supported"  # the offset, measured
    off = C14(FakeStudy(tmp_path, 0.01, "long", settings={"khop_control": False}))
    assert not any("control" in p["subject"] for p in off.predictions)
    assert "1" not in off.numbers["by_placement"]["pre"]


def test_the_cells_add_pre_and_post_at_one_block_only_with_the_control():
    from normlab.study.claims.c14_khop_depth import SETTINGS, Settings

    assert khop_cells(Settings(khop_depths=(2, 3), khop_placements=("pre", "post", "mix"),
                               khop_control=True)) == [
        ("pre", 2), ("pre", 3), ("post", 2), ("post", 3), ("mix", 2), ("mix", 3),
        ("pre", 1), ("post", 1)]
    assert khop_cells(Settings(khop_depths=(1, 2), khop_placements=("pre",),
                               khop_control=True)) == [("pre", 1), ("pre", 2)]
    assert khop_cells(Settings(khop_depths=(), khop_control=True)) == []
    assert SETTINGS["long"].khop_control and SETTINGS["gpu"].khop_control


def test_a_hop_score_is_placed_on_pres_ladder_in_blocks():
    ladder = {1: 0.2, 2: 0.5, 4: 0.9}
    assert place_on_ladder(ladder, 0.5) == (2.0, "")
    assert place_on_ladder(ladder, 0.35) == (pytest.approx(1.5), "")
    assert place_on_ladder(ladder, 0.8) == (pytest.approx(3.5), "")  # 2 blocks between 2 and 4
    assert place_on_ladder(ladder, 0.2) == (1.0, "") and place_on_ladder(ladder, 0.9) == (4.0, "")
    assert place_on_ladder(ladder, 0.1) == (None, "below")
    assert place_on_ladder(ladder, 0.95) == (None, "beyond")
    assert place_on_ladder({1: 0.2, 2: 0.6, 3: 0.5}, 0.55) == (None, "ladder not rising")
    assert place_on_ladder({1: 0.2, 2: 0.2}, 0.2) == (None, "ladder not rising")
    assert place_on_ladder(ladder, math.nan) == (None, "not measured")
    assert place_on_ladder({2: 0.5}, 0.5) == (None, "not measured")


def test_pre_equivalent_depths_place_each_seed_on_pres_mean_ladder():
    scores = {("pre", 1): [0.1, 0.3], ("pre", 2): [0.5, 0.5], ("pre", 3): [0.8, 1.0],
              ("post", 2): [0.35, 0.7], ("post", 3): [0.95, 1.0], ("mix", 2): [0.1, 0.5]}
    out = pre_equivalent_depths(scores)  # pre's ladder: 0.2, 0.5, 0.9
    assert set(out) == {"post", "mix"}
    assert out["post"]["2"]["per_seed"] == [pytest.approx(1.5), pytest.approx(2.5)]
    assert out["post"]["2"]["mean"] == pytest.approx(2.0) and out["post"]["2"]["n"] == 2
    assert out["post"]["3"]["per_seed"] == [None, None]
    assert out["post"]["3"]["not_placed"] == {"beyond": 2} and out["post"]["3"]["n"] == 0
    assert out["mix"]["2"]["not_placed"] == {"below": 1} and out["mix"]["2"]["mean"] == 2.0


def test_the_study_reports_posts_pre_equivalent_depth(tmp_path):
    result = C14(FakeStudy(tmp_path, 0.0, "long"))
    eq = result.numbers["pre_equivalent_depth"]
    assert eq["ladder_depths"] == [1, 2, 3]
    # the world: pre 0.533, 0.7, 0.867 by depth; post 0.783 at 2 blocks, 0.933 at 3
    assert eq["by_placement"]["post"]["2"]["mean"] == pytest.approx(2.5)
    assert eq["by_placement"]["post"]["3"]["not_placed"] == {"beyond": 5}
    assert "Post's pre-equivalent depth" in result.note and "at 2 blocks 2.50" in result.note
    assert "at 3 blocks not placed (5 beyond)" in result.note


def test_where_the_sources_hold_c14_is_supported(tmp_path, recorded_words):
    result = C14(FakeStudy(tmp_path, 0.01, "long", settings=DEEP))
    assert result.verdict == "supported", result.note
    recorded_words("c14_supported", result)
    subjects = {p["subject"]: p for p in result.predictions}
    assert subjects["calibration: pre, 24 - 12 blocks"]["role"] == "premise"
    assert subjects["post vs pre, 12 blocks"]["verdict"] == "supported"
    assert subjects["deepnorm vs pre, 24 blocks"]["role"] == "diagnostic"


@pytest.mark.parametrize("depth", [12, 24])
def test_post_no_better_than_pre_at_one_depth_is_not_supported(tmp_path, depth):
    world = {f"khop_post@{depth}": [1.0, 0.5, 0.35] if depth == 12 else [1.0, 0.9, 0.5]}
    result = C14(FakeStudy(tmp_path, 0.01, "long", settings=DEEP, **world))
    assert result.verdict == "not supported"


def test_no_depth_relation_for_pre_means_not_tested(tmp_path):
    flat = {"khop_pre@12": [1.0, 0.6, 0.5], "khop_pre@24": [1.0, 0.58, 0.48]}
    result = C14(FakeStudy(tmp_path, 0.01, "long", settings=DEEP, **flat))
    assert result.verdict == "not tested at this scale"
    assert "calibration" in result.note


def test_a_successor_worse_than_pre_leaves_the_verdict_alone(tmp_path):
    result = C14(FakeStudy(tmp_path, 0.01, "long", settings=DEEP,
                           **{"khop_lns@12": [0.1, 0.1, 0.1], "khop_lns@24": [0.1, 0.1, 0.1]}))
    assert result.verdict == "supported"
    lns = next(p for p in result.predictions if p["subject"] == "lns vs pre, 12 blocks")
    assert lns["verdict"] == "not supported"


def test_post_stalled_everywhere_leaves_c14_inconclusive(tmp_path):
    result = C14(FakeStudy(tmp_path, 0.01, "long", settings=DEEP, stalled_khop_post=1))
    assert result.verdict == "inconclusive" and result.stalled == ["post"]


# -- the study's k-hop runs ------------------------------------------------------------------
def test_khop_config_is_the_feasibility_searchs_run(tmp_path):
    """The study's k-hop run at the feasibility search's size S2 is the same run (same id), so
    the search's runs are reused and the claim's size is the searched one."""
    path = Path(__file__).resolve().parents[3] / "scripts" / "khop_feasibility.py"
    spec = importlib.util.spec_from_file_location("khop_feasibility", path)
    search = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(search)
    folder = StudyFolder(tmp_path, PROFILES["long"], lambda _m: None)
    ours = khop_config(folder, "pre", 3e-3, 1, 3)
    assert ours.data.task == "khop" and ours.model.vocab_size == 4 + 3
    # since the fifth edition the study's runs take the wsd schedule and evaluate every tenth
    # of the run (the plateau premise); everything else is the searched run
    assert ours.train.schedule == "wsd" and ours.train.eval_every == 120
    theirs = search.configs(search.SIZES["S2"], 3, 1)
    same = ours.model_copy(update={"train": ours.train.model_copy(update={
        "schedule": theirs.train.schedule, "eval_every": theirs.train.eval_every})})
    assert same.run_id() == theirs.run_id()


def test_khop_accuracy_reads_each_runs_summary(tmp_path):
    import json

    folder = StudyFolder(tmp_path, PROFILES["long"], lambda _m: None)
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"outcome": "completed", "val_acc_hop1": 1.0,
                                                  "val_acc_hop3": 0.5}))
    rec = RunRecord("r1", 0, "completed", 0.3, False)
    acc = khop_accuracy(folder, [rec])[0]
    assert acc[1] == 1.0 and acc[3] == 0.5 and math.isnan(acc[2])


# -- the long profile's deep runs ------------------------------------------------------------
def test_deep_runs_have_their_own_budget_warmup_and_grid_in_the_long_profile(tmp_path):
    p = PROFILES["long"]
    assert (p.deep_train_steps, p.deep_warmup, p.deep_start_lrs) == (800, 200,
                                                                     (3.75e-4, 1.5e-3, 6e-3))
    assert p.warmup == 64  # 4% of 1600 steps
    folder = StudyFolder(tmp_path, p, lambda _m: None)
    deep = folder.run_config("post", 3.75e-4, p.deep_warmup, 0, p.deep_blocks)
    assert deep.train.steps == 800 and deep.train.keep_checkpoints
    assert deep.train.eval_every == 80 and deep.model.n_blocks == 12
    shallow = folder.run_config("post", 1.5e-3, p.warmup, 0)
    assert shallow.train.steps == 1600 and not shallow.train.keep_checkpoints


def test_the_standard_profiles_deep_runs_are_unchanged():
    p = PROFILES["standard"]
    assert (p.deep_train_steps, p.deep_warmup, p.deep_start_lrs) == (p.steps, p.warmup, p.lrs)


def _folder_with_pairs(tmp_path, pairs):
    """A StudyFolder whose C12 trajectory pairs are `pairs` (seed -> ((pre step, loss,
    outcome), (post step, loss, outcome)))."""
    p = PROFILES["long"]
    folder = StudyFolder(tmp_path, p, lambda _m: None)
    own = []
    for seed, ends in pairs.items():
        for pl, (step, loss, outcome) in zip(("pre", "post"), ends, strict=True):
            own.append(Pretrained(pl, seed, tmp_path / f"{pl}-{seed}", loss, outcome, step=step))
    folder.c12_checkpoints = lambda: own  # type: ignore[method-assign]
    grid = TunedGrid("x", p.deep_warmup, (1e-3,), {1e-3: ()}, 1e-3, True)
    folder.deep_grid = lambda _pl: grid  # type: ignore[method-assign]
    return folder


def test_deep_matched_pair_leaves_out_failed_seeds_and_pairs_inside_warmup(tmp_path):
    folder = _folder_with_pairs(tmp_path, {
        0: ((400, 2.40, "completed"), (480, 2.42, "completed")),
        1: ((160, 3.00, "completed"), (800, 3.01, "completed")),   # pre's step inside warmup
        2: ((None, 2.30, "completed"), (None, 3.33, "stalled")),
        3: ((560, 2.35, "completed"), (None, 2.33, "completed"))})
    pair = folder.deep_matched_pair()
    assert pair.runs == {"pre": ("pre-0", "pre-3"), "post": ("post-0", "post-3")}
    assert pair.steps == {"pre": (400, 560), "post": (480, None)}
    assert pair.seed_gaps == pytest.approx((-0.02, 0.02)) and pair.matched
    assert pair.blocks == 12 and "seed 1" in pair.reason and "seed 2" in pair.reason
    again = MatchedPair.from_json(pair.to_json())
    assert again == pair


def test_deep_matched_pair_without_a_trained_seed_is_not_found(tmp_path):
    folder = _folder_with_pairs(tmp_path, {
        0: ((None, 2.3, "completed"), (None, 3.33, "stalled"))})
    pair = folder.deep_matched_pair()
    assert not pair.found and "no seed" in pair.reason


def test_c2_is_decided_at_the_probed_models_depth_whatever_it_is(tmp_path):
    """C2 has no premise about depth: standard's 6-block and long's 12-block probes decide it
    alike in the same world."""
    world = {"ang_slope_pre": -0.2, "ang_slope_post": 0.0}
    shallow = REGISTRY["C2"].measure(FakeStudy(tmp_path, 0.01, "standard", **world))
    deep = REGISTRY["C2"].measure(FakeStudy(tmp_path, 0.01, "long", **world))
    assert shallow.verdict == deep.verdict == "supported"
    assert not any(p["subject"] == "large t" for r in (shallow, deep) for p in r.predictions)


def test_khop_grids_are_tuned_together_each_on_its_own_cells(tmp_path, monkeypatch):
    """Every placement and depth of the k-hop task is tuned in lockstep: the first grids go to
    the workers in one go, then each round's extensions of every grid together; each grid reads
    the summaries of its own runs (placement, depth, lr and seed)."""
    from normlab.study.claims import with_settings

    profile = with_settings(PROFILES["long"], khop_placements=("pre", "post"),
                            khop_depths=(2, 3), khop_lrs=(1e-3, 2e-3, 4e-3), khop_seeds=2,
                            max_lr_extensions=1, khop_control=False)
    p = REGISTRY["C14"].settings(profile)
    folder = StudyFolder(tmp_path, profile, lambda _m: None)
    batches: list[list] = []

    def planted(cfg):  # best at 2e-3 (inside), but 8e-3 for pre at 2 blocks and post at 3
        lr, pl, depth = cfg.train.lr, cfg.model.placement, cfg.model.n_blocks
        best = 8e-3 if (pl, depth) in (("pre", 2), ("post", 3)) else 2e-3
        return {"outcome": "completed", "val_loss": 1.0 + abs(lr - best) * 100
                + cfg.train.seed * 1e-3, "step": p.khop_steps}

    monkeypatch.setattr(StudyFolder, "train",
                        lambda self, cfgs: batches.append(cfgs) or [planted(c) for c in cfgs])
    grids = {(pl, d): khop_tuned(folder, pl, d) for pl in ("pre", "post") for d in (2, 3)}
    cells = [{(c.model.placement, c.model.n_blocks, c.train.lr) for c in b} for b in batches]
    first = {(pl, d, lr) for pl in ("pre", "post") for d in (2, 3) for lr in p.khop_lrs}
    # the first round in one go, then read grid by grid (finished runs, in a study); then the
    # two grids that extend, in one go, and each read
    own = [{(pl, d, lr) for lr in p.khop_lrs} for pl in ("pre", "post") for d in (2, 3)]
    ext = [{("pre", 2, 8e-3)}, {("post", 3, 8e-3)}]
    assert cells == [first, *own, ext[0] | ext[1], *ext]
    for key in [("pre", 2), ("post", 3)]:
        assert grids[key].lrs == (1e-3, 2e-3, 4e-3, 8e-3)
        assert grids[key].best_lr == 8e-3 and not grids[key].bracketed
    for key in [("pre", 3), ("post", 2)]:
        g = grids[key]
        assert g.lrs == p.khop_lrs and g.best_lr == 2e-3 and g.bracketed
        assert [r.seed for r in g.cell(2e-3)] == [0, 1]
        assert [r.score for r in g.cell(2e-3)] == [1.0, 1.0 + 1e-3]
    assert khop_tuned(folder, "post", 3) is grids[("post", 3)]


# -- the calibration rung: Sanford et al.'s released table -----------------------------------
TABLE = Path(__file__).resolve().parents[3] / "normlab" / "study" / "data" / "sanford_khop.json"


# Read by hand from the file (width 128, fresh samples): for each hop count 1..16, the first
# depth whose error is at most 0.1. Depth 2 solves k=1 only (k=2: 0.140); depth 3 up to k=3
# (k=4: 0.150); depth 4 up to k=6 (k=7: 0.109); depth 5 up to k=9 (k=10: 0.103); depth 6 all.
BY_HAND = {1: 2, 2: 3, 3: 3, 4: 4, 5: 4, 6: 4, 7: 5, 8: 5, 9: 5, 10: 6, 11: 6, 12: 6, 13: 6,
           14: 6, 15: 6, 16: 6}


def test_the_released_table_is_the_authors_file_with_its_provenance():
    raw = json.loads(TABLE.read_text())
    src = raw["source"]
    assert src["repository"] == "github.com/chsanford/hop-induction-heads"
    assert src["commit"] == "5735bca9545545774098994e21392b51b285bcc5"
    assert src["file"] == "local/errors.json"
    # values as local/errors.json gives them: "((2, 4, -1), 2)", "((4, 4, -1), 7)",
    # "((5, 8, -1), 16)"
    assert raw["errors"]["128"]["2"][2] == 0.14010989665985107
    assert raw["errors"]["128"]["4"][7] == 0.10868420451879501
    assert raw["errors"]["256"]["5"][16] == 0.027346938848495483
    assert {w: sorted(map(int, d)) for w, d in raw["errors"].items()} == {
        "128": [2, 3, 4, 5, 6], "256": [2, 3, 4, 5, 6]}
    assert all(len(row) == 17 for d in raw["errors"].values() for row in d.values())
    table = load_table()
    assert table.errors[128][4][7] == raw["errors"]["128"]["4"][7]
    assert table.setting["steps"] == 100000 and table.setting["seq_len"] == 100


def test_the_solved_depth_per_hop_count_is_read_from_the_file():
    raw = json.loads(TABLE.read_text())["errors"]["128"]
    mine = {}
    for k in range(1, 17):  # the rule written out: the first depth at error <= 0.1
        for depth in sorted(raw, key=int):
            if raw[depth][k] <= 0.1:
                mine[k] = int(depth)
                break
    assert mine == BY_HAND
    assert solved_depths(load_table().error(128), CAL_HOPS) == BY_HAND
    assert PAPER_SOLVED == {2: 1, 3: 3, 4: 6, 5: 9, 6: 16}


def _errors(solved: dict[int, int | None], depths=range(2, 7)) -> dict[int, dict[int, float]]:
    """An error table in which hop count k is solved (error 0.05) from depth `solved[k]` on and
    not below it (error 0.4); None: at no depth."""
    return {d: {k: 0.05 if s is not None and d >= s else 0.4 for k, s in solved.items()}
            for d in depths}


def test_the_calibration_decision_allows_one_block_either_way():
    theirs = _errors(BY_HAND)
    assert calibration_decision(_errors(BY_HAND), theirs)["status"] == "passed"
    deeper = {k: (d + 1 if d < 6 else None) for k, d in BY_HAND.items()}  # None: 7, one past
    shallower = {k: max(2, d - 1) for k, d in BY_HAND.items()}
    for ours in (deeper, shallower):
        out = calibration_decision(_errors(ours), theirs)
        assert out["status"] == "passed" and not out["misses"]
    two_off = {**BY_HAND, 4: 6}
    out = calibration_decision(_errors(two_off), theirs)
    assert out["status"] == "failed" and out["misses"] == [4] and out["gap_blocks"]["4"] == 2
    never = {**BY_HAND, 7: None}  # theirs 5: ours at best 7
    assert calibration_decision(_errors(never), theirs)["misses"] == [7]
    hole = _errors(BY_HAND)
    hole[3][5] = math.nan
    out = calibration_decision(hole, theirs)
    assert out["status"] == "inconclusive" and out["unmeasured_depths"] == [3]


CAL = {**DEEP, "khop_calibration": True}


def _planted(solved: dict[int, int | None]) -> dict[str, list[float]]:
    """`khopcal@<depth>` accuracies (hop counts 1..16) solving hop count k from depth solved[k]."""
    return {f"khopcal@{d}": [1.0 - e for _k, e in sorted(row.items())]
            for d, row in _errors(solved).items()}


def test_c14_reports_a_calibration_that_passes_on_the_source_world(tmp_path):
    study = FakeStudy(tmp_path, 0.01, "long", settings=CAL)
    result = C14(study)
    assert result.verdict == "supported" and result.calibration == "passed"
    assert study.requests[0] == {"kind": "khop calibration"}  # before the placements
    cal = result.numbers["calibration"]
    assert cal["theirs"] == {str(k): d for k, d in BY_HAND.items()}
    assert cal["tolerance_blocks"] == 1 and cal["solved_at_error"] == 0.1
    assert cal["source_commit"].startswith("5735bca")
    assert "Calibration passed" in result.note


def test_c14_passes_a_calibration_one_block_deeper(tmp_path):
    deeper = {k: (d + 1 if d < 6 else None) for k, d in BY_HAND.items()}
    result = C14(FakeStudy(tmp_path, 0.01, "long", settings=CAL, **_planted(deeper)))
    assert result.calibration == "passed" and result.verdict == "supported"


def test_a_failed_calibration_leaves_c14_undecided(tmp_path):
    off = {**BY_HAND, **{k: 6 for k in (4, 5, 6)}}  # theirs 4: two blocks deeper
    result = C14(FakeStudy(tmp_path, 0.01, "long", settings=CAL, **_planted(off)))
    assert result.verdict == "calibration failed" and result.calibration == "failed"
    assert result.numbers["calibration"]["misses"] == [4, 5, 6]
    assert result.note.startswith("Calibration failed")
    # the placements are still measured and reported
    assert set(result.numbers["by_placement"]["post"]) == {"1", "12", "24"}  # with the control


def test_an_unreadable_calibration_leaves_a_decided_c14_inconclusive(tmp_path):
    planted = _planted(BY_HAND)
    planted["khopcal@3"] = [math.nan] * 16
    result = C14(FakeStudy(tmp_path, 0.01, "long", settings=CAL, **planted))
    assert result.calibration == "inconclusive" and result.verdict == "inconclusive"


def test_without_the_flag_c14_has_no_calibration(tmp_path):
    study = FakeStudy(tmp_path, 0.01, "long", settings=DEEP)
    result = C14(study)
    assert result.calibration is None and "calibration" not in result.numbers
    assert {"kind": "khop calibration"} not in study.requests


def test_the_calibration_runs_are_pre_in_the_sources_setting(tmp_path):
    p = REGISTRY["C14"].settings(PROFILES["gpu"])
    assert p.khop_calibration and p.khop_cal_steps == 10_000 and p.khop_cal_lr == 1e-3
    folder = StudyFolder(tmp_path, PROFILES["gpu"], lambda _m: None)
    cfg = khop_calibration_config(folder, 1, 5)
    m, d, t = cfg.model, cfg.data, cfg.train
    assert (m.placement, m.n_blocks, m.d_model, m.n_heads, m.max_seq_len) == ("pre", 5, 128, 4,
                                                                              99)
    assert (d.khop_alphabet, d.khop_min_hops, d.khop_max_hops, d.seq_len, d.khop_unanswered) \
        == (4, 0, 16, 99, "token")
    assert m.vocab_size == 23 and (m.dropout, m.gelu_approx, m.tie_embeddings) == (0.1, "tanh",
                                                                                    False)
    assert (t.batch_size, t.schedule, t.min_lr_ratio, t.weight_decay, t.beta2, t.grad_clip) == (
        32, "linear", 0.0, 0.01, 0.999, None)
    assert (t.steps, t.lr, t.warmup, t.seed) == (10_000, 1e-3, 100, 1)
    assert t.eval_batches * t.batch_size / 17 >= 100  # as many sequences per hop as theirs


def test_the_newer_placements_take_part_where_a_profile_lists_them(tmp_path):
    """A profile's C14 placements may be any placement (here SiameseNorm and OLMo 2 beside
    pre): each is trained and tuned at each depth, reported in C14's numbers, and drawn as its
    own rows of the report's stability map."""
    from normlab.report.study_map import tuned_grids
    from normlab.study.claims import with_settings

    profile = with_settings(PROFILES["tiny"], khop_placements=("pre", "siamese", "olmo2"))
    folder = StudyFolder(tmp_path, profile, lambda _m: None)
    result = C14(folder)
    tuning = result.numbers["tuning"]
    depths = REGISTRY["C14"].settings(profile).khop_depths
    assert set(tuning) == {f"{pl}, {d} blocks" for pl in ("pre", "siamese", "olmo2")
                           for d in depths}
    trained = {json.loads((r / "summary.json").read_text())["run_id"].split("-")[0]
               for r in (tmp_path / "runs").iterdir() if (r / "summary.json").exists()}
    assert {"siamese", "olmo2"} <= trained
    rows = tuned_grids([("C14", result.numbers)]).rows
    assert {row.family.split(",")[0] for row in rows} >= {"pre", "siamese", "olmo2"}
    assert all(row.cells for row in rows)


def test_the_note_gives_posts_pre_equivalent_depths_in_order_of_depth():
    equiv = {"post": {
        "12": {"mean": 13.0, "ci95": [12.5, 13.5], "n": 2, "not_placed": {"below": 1,
                                                                          "beyond": 2}},
        "2": {"mean": 2.5, "ci95": [math.nan, math.nan], "n": 1, "not_placed": {}},
        "1": {"mean": math.nan, "ci95": [math.nan, math.nan], "n": 0,
              "not_placed": {"ladder not rising": 3}}},
        "mix": {"2": {"mean": 9.0, "ci95": [9.0, 9.0], "n": 3, "not_placed": {}}}}
    assert equivalent_words(equiv, [1, 2, 12]) == (
        "Post's pre-equivalent depth (its hop score on pre's ladder over 1, 2, 12 blocks; above "
        "its own depth if pre is effectively shallower): at 1 block (the control) not placed "
        "(3 ladder not rising); at 2 blocks 2.50; at 12 blocks 13.00 [12.50, 13.50] (1 below, "
        "2 beyond).")
    assert equivalent_words({"mix": equiv["mix"]}, [1, 2]) == ""
