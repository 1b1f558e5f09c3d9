"""The trained-model claims' decisions on planted measurements (no training): each design's
effect gives `supported`, its opposite `not supported`, noise `inconclusive`; and every
prediction is checked on its own: a world where only prediction k is broken gives that
prediction `not supported` and every other one `supported`.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from normlab.study.claims import CLAIMS, common_lrs, make_claim
from normlab.study.experiments import trajectory_pair
from normlab.study.external import c10_predictions
from normlab.study.profiles import PROFILES
from normlab.study.verdict import decide_interval

SEEDS = 5
LRS = (1e-3, 2e-3)



@pytest.fixture(autouse=True)
def figure_calls(stub_figures):
    from normlab.study import claims

    return stub_figures(claims, ["plot_bars", "plot_curves", "plot_per_block"])

class Fake:
    """A StudyContext serving planted numbers: `p[key]` plus `noise * N(0, 1)` per seed.
    Keys: `val_<family>` (with warmup) and `val_<family>_nowarmup`, each optionally
    `@<lr>` for one lr; `fn<blocks>` the cost of dropping the final norm; `merge_<pl>`,
    `drop_<pl>` the late merge and drop KLs of the matched-loss probes."""

    def __init__(self, tmp: Path, noise: float = 0.01, profile: str = "standard",
                 **p: float) -> None:
        self.out, self.p, self.noise = tmp, p, noise
        self.rng = random.Random(0)
        self.fig_dir = tmp / "figures"
        self.fig_dir.mkdir(exist_ok=True)
        self.runs_root = tmp / "runs"
        self.profile = PROFILES[profile]
        self.log = lambda _m: None
        self.claims = None
        self.stalled = tuple(k[len("stalled_"):] for k in p if k.startswith("stalled_"))
        self.tuned_calls: list[tuple[str, int]] = []
        self.prefetched: list[Any] = []
        self.deep_asked: list[str] = []

    def draw(self, key: str, lr: float | None = None) -> float:
        value = self.p.get(f"{key}@{lr:g}", self.p[key]) if lr is not None else self.p[key]
        return value + self.noise * self.rng.gauss(0.0, 1.0)

    def _records(self, family: str, lr: float, warmup: int) -> list[dict[str, Any]]:
        key = f"val_{family}" + ("_nowarmup" if warmup == 0 else "")
        out = []
        for s in range(SEEDS):
            v = self.draw(key, lr)
            out.append({"run_id": f"{key}-{lr:g}-{s}", "seed": s, "outcome": "completed",
                        "val_loss": v, "score": v, "failed": False})
        return out

    def tuned(self, family: str, warmup: int | None = None) -> dict[str, Any]:
        w = self.profile.warmup if warmup is None else warmup
        self.tuned_calls.append((family, w))
        recs = {f"{lr:g}": self._records(family, lr, w) for lr in LRS}
        best = self.p.get(f"best_lr_{family}") or min(
            LRS, key=lambda lr: sum(r["score"] for r in recs[f"{lr:g}"]))
        return {"family": family, "warmup": w, "lrs": list(LRS), "best_lr": best,
                "bracketed": f"unbracketed_{family}" not in self.p, "extensions": [],
                "mean_score": {}, "records": recs,
                "best": recs[f"{best:g}"], "all_stalled": family in self.stalled}

    def runs(self, family: str, lrs: list[float], warmup: int, blocks: int | None = None):
        return {lr: self._records(family, lr, warmup) for lr in lrs}

    def prefetch(self, specs: list) -> None:
        self.prefetched.append(specs)

    def prefetch_deep(self) -> None:
        self.prefetched.append("deep")

    def deep_runs(self, placement: str) -> dict[str, Any]:
        self.deep_asked.append(placement)
        if "fn12" not in self.p:
            return {"lr": None, "records": []}
        seeds = int(self.p.get("deep_seeds", SEEDS))
        return {"lr": 2e-3, "records": [{"run_id": f"deep-{s}", "seed": s, "failed": False}
                                        for s in range(seeds)]}

    def final_norm_costs(self, records: list[dict[str, Any]]) -> list[float]:
        key = "fn12" if records and records[0]["run_id"].startswith("deep") else "fn6"
        return [self.draw(key) for _ in records]

    def trained_probes(self) -> dict[str, Any]:
        pair = {"matched": True, "tolerance": 0.05, "pre_lr": 2e-3, "post_lr": 2e-3,
                "pre_val_loss": 2.2, "post_val_loss": 2.21, "gap": -0.01}
        out: dict[str, Any] = {"pair": pair}
        L = 6
        for pl in ("pre", "post"):
            seeds = []
            for _ in range(SEEDS):
                merge = math.exp(self.draw(f"merge_{pl}"))
                drop = math.exp(self.draw(f"drop_{pl}"))
                seeds.append({"per_block": {
                    "ang_prev": [0.4] * L, "merge_kl": [merge] * (L - 1),
                    "drop_kl": [drop] * L, "drop_dloss": [drop] * L,
                    "lens_raw": [3.0] * L, "lens_normed": [3.0] * L},
                    "summary": {"effective_depth_kl": 3.0}})
            out[pl] = {"lr": 2e-3, "seeds": seeds}
        return out


def verdicts(result) -> list[str]:
    return [p["verdict"] for p in result.predictions]


def check_each_prediction(cid: str, good: dict[str, float], breaks: list[dict[str, float]],
                          tmp: Path, profile: str = "standard") -> None:
    """`good` supports every prediction; `breaks[k]` (merged into it) breaks only the k-th."""
    result = CLAIMS[cid](Fake(tmp, profile=profile, **good))
    assert verdicts(result) == ["supported"] * len(breaks), result.predictions
    assert result.verdict == "supported"
    for k, change in enumerate(breaks):
        result = CLAIMS[cid](Fake(tmp, profile=profile, **(good | change)))
        expected = ["supported"] * len(breaks)
        expected[k] = "not supported"
        assert verdicts(result) == expected, (k, change, [
            (p["subject"], p["effect"]["estimate"]) for p in result.predictions])
        assert result.verdict == "not supported"


# -- C6a: both placements at a common peak lr ------------------------------------------------

C6_GOOD = {"val_post": 2.2, "val_post_nowarmup": 3.0, "val_pre": 2.2, "val_pre_nowarmup": 2.1}


def test_c6a_every_prediction_at_every_common_lr(tmp_path):
    # per lr: [post's cost > 0, pre's cost < 0, pre without - post with < 0]; post's tuned lr
    # (2e-3 here: post's lowest loss) comes first
    breaks = []
    for lr in (2e-3, 1e-3):
        at = f"@{lr:g}"
        breaks += [{f"val_post_nowarmup{at}": 2.1}, {f"val_pre{at}": 2.0},
                   {f"val_post{at}": 2.0}]
    good = C6_GOOD | {"best_lr_post": 2e-3}  # post's tuned lr, whatever a break plants
    check_each_prediction("C6a", good, breaks, tmp_path)
    result = CLAIMS["C6a"](Fake(tmp_path, **good))
    assert [p["subject"] for p in result.predictions][0] == "post, lr 0.002 (post's tuned)"
    assert all(p["threshold_source"].startswith("Xiong") for p in result.predictions)


def test_c6a_opposite_and_noise(tmp_path):
    opposite = {"val_post": 2.2, "val_post_nowarmup": 2.1, "val_pre": 2.2,
                "val_pre_nowarmup": 3.0}
    assert CLAIMS["C6a"](Fake(tmp_path, **opposite)).verdict == "not supported"
    noisy = CLAIMS["C6a"](Fake(tmp_path, noise=3.0, **C6_GOOD))
    assert noisy.verdict == "inconclusive" and "too few seeds" in noisy.diagnosis
    assert "the source names no size" in noisy.diagnosis


def test_c6a_compares_only_where_both_placements_train():
    ok = [{"failed": False}]
    bad = [{"failed": True}]
    pre = {"records": {"0.001": ok, "0.002": ok, "0.004": bad}, "best_lr": 0.004}
    post = {"records": {"0.001": ok, "0.002": ok, "0.004": ok, "0.0005": ok}, "best_lr": 0.002}
    assert common_lrs(pre, post) == [0.002, 0.001]  # post's tuned first; 4e-3 failed for pre


# -- C6b: each placement's best over its own grid --------------------------------------------

def test_c6b_every_prediction(tmp_path):
    check_each_prediction("C6b", C6_GOOD, [{"val_post_nowarmup": 2.1},
                                           {"val_pre_nowarmup": 2.3}], tmp_path)


def test_c6b_tunes_each_placement_without_warmup_on_its_own_grid(tmp_path):
    ctx = Fake(tmp_path, **C6_GOOD)
    CLAIMS["C6b"](ctx)
    assert {("pre", 0), ("post", 0), ("pre", ctx.profile.warmup),
            ("post", ctx.profile.warmup)} <= set(ctx.tuned_calls)
    noisy = CLAIMS["C6b"](Fake(tmp_path, noise=3.0, **C6_GOOD))
    assert noisy.verdict == "inconclusive"


# -- C9: the placements under one init, each family tuned ------------------------------------

C9_GOOD = {"val_pre_xavier": 2.3, "val_post": 2.2, "val_pre": 2.3, "val_post_gpt2": 2.2}


def test_c9_every_same_init_pairing(tmp_path):
    check_each_prediction("C9", C9_GOOD, [{"val_pre_xavier": 2.1}, {"val_post_gpt2": 2.4}],
                          tmp_path)


def test_c9_paper_inits_are_context_and_crossed_families_are_tuned(tmp_path):
    # pre beats post only at the paper inits (two things differ): not what C9 decides
    world = C9_GOOD | {"val_pre": 2.3, "val_post": 2.2, "val_post_gpt2": 2.25}
    ctx = Fake(tmp_path, **world)
    result = CLAIMS["C9"](ctx)
    assert [p["subject"] for p in result.predictions] == [
        "post vs pre (both Xavier)", "post vs pre (both GPT-2 scaled)"]
    assert "paper_inits_context" in result.numbers
    families = {f for f, _ in ctx.tuned_calls}
    assert {"pre_xavier", "post_gpt2"} <= families  # tuned on their own grids
    quick = CLAIMS["C9"](Fake(tmp_path, profile="quick", **C9_GOOD))
    assert [p["subject"] for p in quick.predictions] == ["post vs pre (both Xavier)"]
    assert CLAIMS["C9"](Fake(tmp_path, **{k: 4.5 - v for k, v in C9_GOOD.items()})
                        ).verdict == "not supported"
    assert CLAIMS["C9"](Fake(tmp_path, noise=3.0, **C9_GOOD)).verdict == "inconclusive"


# -- C3: the merge cost in units of the block's own drop cost --------------------------------

def test_c3_normalised_merge(tmp_path):
    good = {"merge_pre": -3.0, "drop_pre": 0.0, "merge_post": 0.0, "drop_post": 0.0}
    assert verdicts(CLAIMS["C3"](Fake(tmp_path, **good))) == ["supported"]
    opposite = {"merge_pre": 0.0, "drop_pre": 0.0, "merge_post": -3.0, "drop_post": 0.0}
    assert verdicts(CLAIMS["C3"](Fake(tmp_path, **opposite))) == ["not supported"]
    # pre's merges are cheap only because its blocks matter less: the raw merge ratio says
    # "supported", the normalised one does not
    confounded = {"merge_pre": -3.0, "drop_pre": -3.0, "merge_post": 0.0, "drop_post": 0.0}
    result = CLAIMS["C3"](Fake(tmp_path, noise=0.05, **confounded))
    assert result.verdict != "supported"
    raw = result.numbers["late_merge_kl"]
    assert raw["post"]["mean"] / raw["pre"]["mean"] > 10  # both raw numbers reported
    assert "late_drop_kl" in result.numbers and "late_merge_per_drop" in result.numbers
    assert CLAIMS["C3"](Fake(tmp_path, noise=20.0, **good)).verdict == "inconclusive"


# -- C10: transfer against the same architecture from init -----------------------------------

MAJORITY = 0.4


def _acc(rng: random.Random, **v: float) -> dict[str, dict[str, list[float]]]:
    return {arm: {p: [v[f"{arm}_{p}"] + 0.005 * rng.gauss(0, 1) for _ in range(SEEDS)]
                  for p in ("pre", "post")} for arm in ("pretrained", "scratch")}


C10_GOOD = {"scratch_pre": 0.5, "scratch_post": 0.5, "pretrained_pre": 0.6,
            "pretrained_post": 0.7}


def _c10(**v: float):
    preds = c10_predictions(_acc(random.Random(1), **v), MAJORITY)
    return make_claim("C10", "t", "s", "src", "m", preds, "paper", {}, [])


def test_c10_every_prediction_and_premises_never_refute():
    assert verdicts(_c10(**C10_GOOD)) == ["supported"] * 5
    assert _c10(**C10_GOOD).verdict == "supported"
    breaks = [{"scratch_pre": 0.3}, {"scratch_post": 0.3}, {"pretrained_pre": 0.45},
              {"scratch_post": 0.75}, {"pretrained_pre": 0.8}]
    for k, change in enumerate(breaks):
        result = _c10(**(C10_GOOD | change))
        expected = ["supported"] * 5
        expected[k] = "not supported"
        assert verdicts(result) == expected, k
        # a broken premise (no learning from init, or no transfer) leaves C10 undecided
        assert result.verdict == ("not supported" if k == 4 else "inconclusive"), k
        if k < 4:
            assert "premise does not hold" in result.note


def test_c10_with_and_without_transfer():
    opposite = C10_GOOD | {"pretrained_pre": 0.7, "pretrained_post": 0.6}
    assert _c10(**opposite).verdict == "not supported"
    no_transfer = C10_GOOD | {"pretrained_pre": 0.5, "pretrained_post": 0.5}
    result = _c10(**no_transfer)
    assert result.verdict == "inconclusive" and "pre transfer" in result.note


# -- C11: the cost of dropping the final norm at two depths ----------------------------------

C11_GOOD = {"val_pre": 2.2, "val_pre_nofinal": 2.5, "fn6": 0.5, "fn12": 1.0}


def test_c11_every_prediction(tmp_path):
    check_each_prediction("C11", C11_GOOD, [{"val_pre_nofinal": 2.0}, {"fn6": -0.1},
                                            {"fn12": 0.2}], tmp_path)


def test_c11_without_a_deeper_model_says_so(tmp_path):
    world = {k: v for k, v in C11_GOOD.items() if k != "fn12"}
    result = CLAIMS["C11"](Fake(tmp_path, profile="quick", **world))
    # quick trains neither a deeper model nor pre without a final norm: the ablation decides
    assert [p["subject"] for p in result.predictions] == ["pre, 6 blocks"]
    assert result.verdict == "supported"
    assert "No deeper model" in result.note and "mechanism decides alone" in result.note
    broken = CLAIMS["C11"](Fake(tmp_path, profile="quick", **{**world, "fn6": -0.1}))
    assert broken.verdict == "not supported"
    assert CLAIMS["C11"](Fake(tmp_path, noise=3.0, **C11_GOOD)).verdict == "inconclusive"


# -- C12: pairs along the trajectories -------------------------------------------------------

def test_trajectory_pair_takes_the_most_trained_pair_within_tolerance():
    pre = [(100, 2.9), (200, 2.5), (300, 2.3), (None, 2.2)]
    post = [(100, 3.1), (200, 2.8), (300, 2.55), (None, 2.48)]
    a, b = trajectory_pair(pre, post, 0.05)
    assert (a, b) == ((200, 2.5), (None, 2.48))
    # none within tolerance: the closest pair, which the matching then leaves out
    a, b = trajectory_pair([(None, 2.0)], [(100, 3.0), (None, 2.5)], 0.05)
    assert b == (None, 2.5)


@pytest.mark.parametrize("cid,world,side", [("C9", C9_GOOD, "post"),
                                             ("C6a", C6_GOOD, "post"),
                                             ("C6b", C6_GOOD, "pre"),
                                             ("C11", C11_GOOD, "pre_nofinal")])
def test_stalled_side_is_reported_not_compared(cid, world, side, tmp_path):
    result = CLAIMS[cid](Fake(tmp_path, **world, **{f"stalled_{side}": 1.0}))
    assert result.verdict == "inconclusive" and side in result.stalled
    assert "stalled" in result.note


def test_c12_rows_each_prediction():
    from normlab.study.external import c12_predictions, decide_c12

    rng = random.Random(3)

    def world(pre: float, post: float) -> dict[str, list[float]]:
        return {"pre": [pre + 0.01 * rng.gauss(0, 1) for _ in range(SEEDS)],
                "post": [post + 0.01 * rng.gauss(0, 1) for _ in range(SEEDS)]}

    good = world(-1.0, 0.0)
    assert verdicts(SimpleNamespace(predictions=[p.to_dict() for p in c12_predictions(good)])
                    ) == ["supported", "supported"]
    assert decide_c12(good)["verdict"] == "supported"
    for k, (pre, post) in enumerate([(0.5, 1.5), (-1.0, -2.0)]):
        expected = ["supported", "supported"]
        expected[k] = "not supported"
        broken = world(pre, post)
        assert [p.verdict for p in c12_predictions(broken)] == expected, k
        assert decide_c12(broken)["verdict"] == "not supported"


def test_a_best_lr_left_at_the_grid_edge_is_said(tmp_path):
    result = CLAIMS["C9"](Fake(tmp_path, **C9_GOOD, unbracketed_pre_xavier=1.0))
    assert "Not bracketed: pre_xavier" in result.note
    assert "Not bracketed" not in CLAIMS["C9"](Fake(tmp_path, **C9_GOOD)).note


@pytest.mark.draws
def test_every_threshold_names_its_source(tmp_path):
    worlds = {"C6a": C6_GOOD, "C6b": C6_GOOD, "C9": C9_GOOD, "C11": C11_GOOD,
              "C3": {"merge_pre": -3.0, "drop_pre": 0.0, "merge_post": 0.0, "drop_post": 0.0}}
    for cid, world in worlds.items():
        for p in CLAIMS[cid](Fake(tmp_path, **world)).predictions:
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
    assert PROFILES["standard"].same_inits == ("xavier", "gpt2_scaled")
    assert SimpleNamespace(**PROFILES["quick"].to_dict()).same_inits == ("xavier",)


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
    c6b = CLAIMS["C6b"](Fake(tmp_path, **(C6_GOOD | {"val_pre_nowarmup": 2.3}))).to_dict()
    c6b["calibration"] = "passed"
    return [c6b, {"id": "C12", "title": "Deep Pre-LN layers are removable",
                  "verdict": "not run", "note": LONG_NOTE, "predictions": []}]


def test_markdown_table_has_a_row_per_prediction(tmp_path):
    from normlab.study.table import markdown_table

    lines = markdown_table(_table_claims(tmp_path)).splitlines()
    assert lines[0].startswith("| claim | verdict | prediction | measured")
    c6b_post, c6b_pre, c12 = lines[2:]
    assert c6b_post.startswith("| **C6b** Pre-LN needs no warmup") and "**not supported**" in \
        c6b_post and "| post |" in c6b_post and "| supported |" in c6b_post
    assert c6b_post.endswith("| passed |")
    assert c6b_pre.startswith("|  |  | pre |") and "| < 0 | not supported |" in c6b_pre
    assert LONG_NOTE in c12 and c12.endswith("| not run | — |")


def test_terminal_summary_wraps_and_never_cuts(tmp_path):
    from rich.console import Console

    from normlab.study.command import summary_table

    console = Console(width=90, record=True)
    console.print(summary_table({"claims": _table_claims(tmp_path)}, "study"))
    text = " ".join(console.export_text().split())
    words = [w for w in LONG_NOTE.split()]
    assert all(w in text for w in words)
    assert "C6b" in text and "passed" in text, text


def test_the_claims_effect_is_the_prediction_that_decides_it(tmp_path):
    result = CLAIMS["C6b"](Fake(tmp_path, **(C6_GOOD | {"val_pre_nowarmup": 2.3})))
    assert result.verdict == "not supported"
    assert result.effect.name == result.predictions[1]["quantity"]
    assert result.effect.estimate == result.predictions[1]["effect"]["estimate"]  # pre's


# -- the words each claim shows --------------------------------------------------------------

C3_GOOD = {"merge_pre": -3.0, "drop_pre": 0.0, "merge_post": 0.0, "drop_post": 0.0}
WORDS = {"C3": C3_GOOD, "C6a": C6_GOOD, "C6b": C6_GOOD, "C9": C9_GOOD, "C11": C11_GOOD}


@pytest.mark.parametrize("cid", sorted(WORDS))
def test_the_claim_s_words_are_the_recorded_ones(cid, tmp_path, recorded_words, figure_calls):
    recorded_words(f"empirical_{cid}", CLAIMS[cid](Fake(tmp_path, **WORDS[cid])), figure_calls)


@pytest.mark.parametrize(("name", "cid", "profile", "world"), [
    ("C9_post_stalled", "C9", "standard", C9_GOOD | {"stalled_post": 1.0}),
    ("C9_quick_unbracketed", "C9", "quick", C9_GOOD | {"unbracketed_pre_xavier": 1.0}),
    ("C6a_noise", "C6a", "standard", C6_GOOD | {"noise": 3.0}),
    ("C6b_unbracketed", "C6b", "standard", C6_GOOD | {"unbracketed_post": 1.0}),
    ("C11_quick", "C11", "quick", {k: v for k, v in C11_GOOD.items() if k != "fn12"}),
    ("C11_without_final_stalled", "C11", "standard", C11_GOOD | {"stalled_pre_nofinal": 1.0}),
])
def test_the_words_of_stalled_unbracketed_noisy_and_short_runs(name, cid, profile, world,
                                                               tmp_path, recorded_words,
                                                               figure_calls):
    world = dict(world)
    noise = world.pop("noise", 0.01)
    recorded_words(f"empirical_{name}",
                   CLAIMS[cid](Fake(tmp_path, noise=noise, profile=profile, **world)),
                   figure_calls)


def test_c10_s_prediction_words_are_the_recorded_ones(recorded_words):
    recorded_words("empirical_C10_predictions", _c10(**C10_GOOD))
    recorded_words("empirical_C10_no_transfer",
                   _c10(**(C10_GOOD | {"pretrained_pre": 0.5, "pretrained_post": 0.5})))


def test_the_numbers_each_claim_reports_are_the_planted_ones(tmp_path):
    """Without noise every reported mean is the planted value it summarises."""
    def mean(ci):
        return ci["mean"]

    c6a = CLAIMS["C6a"](Fake(tmp_path, noise=0.0, **C6_GOOD)).numbers
    assert c6a["common_lrs"] == [1e-3, 2e-3]  # post's tuned lr (the first of equals) first
    at = c6a["lr 0.001"]
    assert mean(at["cost"]["post"]) == pytest.approx(0.8)
    assert mean(at["cost"]["pre"]) == pytest.approx(-0.1)
    assert mean(at["pre without - post with"]) == pytest.approx(-0.1)
    assert at["outcomes_without_warmup"] == {pl: ["completed"] * SEEDS for pl in ("pre", "post")}
    assert c6a["tuning"]["post"] == {
        "lrs": list(LRS), "best_lr": 1e-3, "bracketed": True, "extensions": [],
        "mean_val_loss": {}, "outcomes": {f"{lr:g}": ["completed"] * SEEDS for lr in LRS}}

    c6b = CLAIMS["C6b"](Fake(tmp_path, noise=0.0, **(C6_GOOD | {"val_pre_nowarmup@0.002": 1.9}))
                        ).numbers
    assert mean(c6b["cost"]["post"]) == pytest.approx(0.8)
    assert mean(c6b["cost"]["pre"]) == pytest.approx(1.9 - 2.2)  # its best cell, 2e-3
    assert c6b["tuning_without_warmup"]["pre"]["best_lr"] == 2e-3
    assert c6b["tuning_with_warmup"]["pre"]["best_lr"] == 1e-3

    c9 = CLAIMS["C9"](Fake(tmp_path, noise=0.0, **C9_GOOD)).numbers
    assert mean(c9["paper_inits_context"]["pre (GPT-2 scaled) - post (Xavier)"]) == \
        pytest.approx(2.3 - 2.2)
    assert set(c9["tuning"]) == {"pre", "post", "pre_xavier", "post_gpt2"}

    c11 = CLAIMS["C11"](Fake(tmp_path, noise=0.0, **C11_GOOD)).numbers
    assert mean(c11["final_norm_dropped_6_blocks"]) == pytest.approx(0.5)
    assert mean(c11["final_norm_dropped_12_blocks"]) == pytest.approx(1.0)
    assert c11["deep_lr"] == 2e-3
    assert set(c11["tuning"]) == {"with", "without"}

    c3 = CLAIMS["C3"](Fake(tmp_path, noise=0.0, **C3_GOOD)).numbers
    assert mean(c3["late_merge_per_drop"]["pre"]) == pytest.approx(math.exp(-3.0))
    assert mean(c3["late_merge_per_drop"]["post"]) == pytest.approx(1.0)
    assert mean(c3["late_merge_kl"]["pre"]) == pytest.approx(math.exp(-3.0))
    assert mean(c3["late_drop_kl"]["pre"]) == pytest.approx(1.0)
    assert mean(c3["late_drop_dloss"]["post"]) == pytest.approx(1.0)
    assert mean(c3["effective_depth"]["pre"]) == pytest.approx(3.0)


def test_c6a_trains_the_no_warmup_runs_of_both_placements_in_one_go(tmp_path):
    ctx = Fake(tmp_path, noise=0.0, **C6_GOOD)  # post's tuned lr: the first of equals, 1e-3
    CLAIMS["C6a"](ctx)
    assert ctx.prefetched == [[("pre", [1e-3, 2e-3], 0), ("post", [1e-3, 2e-3], 0)]]
    stalled = Fake(tmp_path, **C6_GOOD, stalled_post=1.0)
    CLAIMS["C6a"](stalled)
    assert stalled.prefetched == []


@pytest.mark.parametrize(("claims", "prefetched"), [(None, ["deep"]), (["C11", "C12"], ["deep"]),
                                                    (["C11"], []), ("absent", ["deep"])])
def test_c11_trains_both_placements_deep_models_only_when_c12_reads_them(claims, prefetched,
                                                                         tmp_path):
    ctx = Fake(tmp_path, **C11_GOOD)
    if claims == "absent":  # a context that does not say which claims run: all of them
        del ctx.claims
    else:
        ctx.claims = claims
    CLAIMS["C11"](ctx)
    assert ctx.prefetched == prefetched
    assert ctx.deep_asked == ["pre"]


def test_c11_compares_the_seeds_both_depths_have(tmp_path):
    result = CLAIMS["C11"](Fake(tmp_path, noise=0.0, **C11_GOOD, deep_seeds=3))
    deep = next(p for p in result.predictions if p["subject"] == "pre, 12 vs 6 blocks")
    assert deep["effect"]["n"] == 3 and deep["effect"]["estimate"] == pytest.approx(0.5)
    assert result.numbers["final_norm_dropped_12_blocks"]["n"] == 3


def test_c11_says_when_the_profile_s_deep_pre_model_did_not_train(tmp_path, recorded_words,
                                                                  figure_calls):
    world = {k: v for k, v in C11_GOOD.items() if k != "fn12"}  # standard: 12 blocks, none
    result = CLAIMS["C11"](Fake(tmp_path, **world))
    assert "No 12-block pre model trained: the cost of dropping the final norm is measured at " \
        "6 blocks only" in result.note
    recorded_words("empirical_C11_no_deep_model_trained", result, figure_calls)


class _Probes(Fake):
    """Fake with trained probes given block by block: `probes[pl]` is one per-block dict per
    seed."""

    def __init__(self, tmp: Path, probes: dict[str, list[dict[str, list[float]]]]) -> None:
        super().__init__(tmp)
        self.probes = probes

    def trained_probes(self) -> dict[str, Any]:
        pair = {"matched": True, "tolerance": 0.05, "pre_lr": 2e-3, "post_lr": 2e-3,
                "pre_val_loss": 2.2, "post_val_loss": 2.21, "gap": -0.01}
        return {"pair": pair} | {pl: {"lr": 2e-3, "seeds": [
            {"per_block": pb, "summary": {"effective_depth_kl": 3.0}} for pb in seeds]}
            for pl, seeds in self.probes.items()}


def _blocks(merge: list[float], drop: list[float]) -> dict[str, list[float]]:
    return {"merge_kl": merge, "drop_kl": drop, "drop_dloss": drop, "ang_prev": [0.4] * len(drop),
            "lens_raw": [3.0] * len(drop), "lens_normed": [3.0] * len(drop)}


def test_c3_pairs_the_seeds_both_placements_have_and_skips_a_ratio_it_cannot_take(tmp_path):
    drop = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # block t's own drop cost
    merge = [0.5] * 5
    pre = [_blocks(merge, drop) for _ in range(4)] + [_blocks([0.0] * 5, drop)]
    post = [_blocks([1.0] * 5, drop) for _ in range(3)] + [_blocks([0.0] * 5, drop)]
    result = CLAIMS["C3"](_Probes(tmp_path, {"pre": pre, "post": post}))
    # 4 seeds paired (post has 4); the 4th seed's post ratio is 0: left out of the effect
    assert result.numbers["late_merge_per_drop"]["pre"]["n"] == 4
    assert result.predictions[0]["effect"]["n"] == 3
    assert result.predictions[0]["effect"]["estimate"] == pytest.approx(math.log(2.0))
    # drop KL of blocks 2..L (block 1 is compared with the embedding), deeper half: 4, 5, 6
    assert result.numbers["late_drop_kl"]["pre"]["mean"] == pytest.approx(5.0)
    zero_pre = CLAIMS["C3"](_Probes(tmp_path, {"pre": pre[3:], "post": post[:2]}))
    assert zero_pre.predictions[0]["effect"]["n"] == 1  # seed 2's pre ratio is 0


class _NoCommonLr(Fake):
    """Pre's seeds fail at 1e-3, post's at 2e-3: no lr where both trained with warmup."""

    def _records(self, family: str, lr: float, warmup: int) -> list[dict[str, Any]]:
        out = super()._records(family, lr, warmup)
        if warmup and (family, lr) in (("pre", 1e-3), ("post", 2e-3)):
            out[0] = out[0] | {"outcome": "diverged", "failed": True}
        return out


def test_c6a_says_when_no_lr_of_the_grid_has_both_placements_trained(tmp_path, recorded_words,
                                                                     figure_calls):
    ctx = _NoCommonLr(tmp_path, **C6_GOOD)
    result = CLAIMS["C6a"](ctx)
    assert result.predictions == [] and result.numbers["common_lrs"] == []
    assert result.note == ("No lr of the grid where both placements trained with warmup: no "
                           "common lr to compare at.")
    assert ctx.prefetched == [] and figure_calls == []
    recorded_words("empirical_C6a_no_common_lr", result, figure_calls)
    edge = CLAIMS["C6a"](_NoCommonLr(tmp_path, **C6_GOOD, unbracketed_post=1.0))
    assert edge.note.startswith("Not bracketed: post (best lr ")
    assert edge.note.endswith(" its grid after the profile's extensions, so its tuned loss may "
                              "be lower still. No lr of the grid where both placements trained "
                              "with warmup: no common lr to compare at.")
