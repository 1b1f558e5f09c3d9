"""Tests of C3 (Pre-LN's depth acts like width): normlab/study/claims/c03_depth_as_width.py, on the
planted study (tests/fake_study.py) and on what it measures.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from fake_study import FakeStudy
from planted_runs import CLAIMS, DEEP, roles, verdicts

from normlab.study.claims import c12_removable_layers as c12
from normlab.study.claims.c03_depth_as_width import MIN_DROP_KL, merge_per_drop
from normlab.study.context import MatchedPair, ProbedPair, ProbedRun
from normlab.study.profiles import PROFILES

# pre's deeper half near-identical (angle about 0.1 < 0.2, the premise), or not (about 0.4)
NEAR, FAR = {"ang_level_pre": 0.1}, {"ang_level_pre": 0.4}


def test_c3_normalised_merge(tmp_path):
    good = {"merge_pre": -3.0, "drop_pre": 0.0, "merge_post": 0.0, "drop_post": 0.0} | NEAR
    result = CLAIMS["C3"](FakeStudy(tmp_path, settings=DEEP, **good))
    assert verdicts(result)[:4] == ["supported"] * 4 and result.verdict == "supported"
    assert roles(result) == ["premise", "premise", "premise", "claim", "diagnostic",
                             "diagnostic"]
    # at init the fake's pre and post do not differ: the contrast is learned, said so
    assert result.predictions[4]["subject"] == "post vs pre at init"
    assert verdicts(result)[4] == "not supported" and "architectural" not in result.note
    opposite = {"merge_pre": 0.0, "drop_pre": 0.0, "merge_post": -3.0, "drop_post": 0.0} | NEAR
    refuted = CLAIMS["C3"](FakeStudy(tmp_path, settings=DEEP, **opposite))
    assert verdicts(refuted)[3] == "not supported" and refuted.verdict == "not supported"
    # pre's blocks doing too little to be a unit (drop KL 0.01 nats): not decided
    idle = CLAIMS["C3"](FakeStudy(tmp_path, settings=DEEP, **(good | {"drop_pre": math.log(0.01)})))
    assert verdicts(idle)[2] == "not supported" and idle.verdict == "inconclusive"
    # pre's deeper half not near-identical (0.4 > 0.2): not tested at this scale, whichever
    # way the merge goes; at 6 blocks as at 12 (depth itself decides nothing)
    for world in (good, opposite):
        for settings in (DEEP, None):
            apart = CLAIMS["C3"](FakeStudy(tmp_path, settings=settings, **(world | FAR)))
            assert apart.predictions[0]["subject"] == "near-identical blocks"
            assert verdicts(apart)[0] == "not supported"
            assert apart.verdict == "not tested at this scale"
            assert apart.needs.startswith("trained pre models deep enough")
        assert CLAIMS["C3"](FakeStudy(tmp_path, **world)).verdict == (
            "supported" if world is good else "not supported")
    # pre's merges are cheap only because its blocks matter less: the raw merge ratio says
    # "supported", the normalised one does not
    confounded = {"merge_pre": -3.0, "drop_pre": -3.0, "merge_post": 0.0, "drop_post": 0.0} | NEAR
    result = CLAIMS["C3"](FakeStudy(tmp_path, noise=0.05, settings=DEEP, **confounded))
    assert result.verdict != "supported"
    raw = result.numbers["late_merge_kl"]
    assert raw["post"]["mean"] / raw["pre"]["mean"] > 10  # both raw numbers reported
    assert "late_drop_kl" in result.numbers and "late_merge_per_drop" in result.numbers
    # noise: every drop KL well above the minimum (planted at e^2 nats), the contrast undecided
    noisy = CLAIMS["C3"](FakeStudy(tmp_path, noise=2.0, settings=DEEP,
                                   **(good | {"drop_pre": 2.0, "drop_post": 2.0})))
    assert verdicts(noisy)[2] == "supported" and verdicts(noisy)[3] == "inconclusive"
    assert noisy.verdict == "inconclusive"


class _Probes(FakeStudy):
    """The fake study with trained probes given block by block: `probes[pl]` is one per-block
    dict per seed."""

    def __init__(self, tmp: Path, probes: dict[str, list[dict[str, list[float]]]]) -> None:
        super().__init__(tmp)
        self.probes = probes

    def trained_probes(self) -> ProbedPair:
        pair = MatchedPair(True, tolerance=0.05, pre_lr=2e-3, post_lr=2e-3, pre_val_loss=2.2,
                           post_val_loss=2.21, gap=-0.01)
        return ProbedPair(pair, {pl: tuple(ProbedRun(f"{pl}-{i}", pb,
                                                     {"effective_depth_kl": 3.0})
                                           for i, pb in enumerate(seeds))
                                 for pl, seeds in self.probes.items()})


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
    assert result.predictions[3]["effect"]["n"] == 3
    assert result.predictions[3]["effect"]["estimate"] == pytest.approx(math.log(2.0))
    # drop KL of blocks 2..L (block 1 is compared with the embedding), deeper half: 4, 5, 6
    assert result.numbers["late_drop_kl"]["pre"]["mean"] == pytest.approx(5.0)
    zero_pre = CLAIMS["C3"](_Probes(tmp_path, {"pre": pre[3:], "post": post[:2]}))
    assert zero_pre.predictions[3]["effect"]["n"] == 1  # seed 2's pre ratio is 0


def test_merge_per_drop_divides_the_late_merge_by_the_next_blocks_drop_over_the_deeper_half():
    from normlab.study.claims.c03_depth_as_width import MIN_DROP_KL, merge_per_drop

    # pairs (t, t+1): merge_kl[t] against drop_kl[t+1]; the deeper half: the last two pairs,
    # merges 3 and 4 over drops 8 and 2 (a zero drop early on does not matter)
    per_block = {"merge_kl": [1.0, 2.0, 3.0, 4.0], "drop_kl": [9.0, 0.0, 4.0, 8.0, 2.0]}
    assert merge_per_drop(per_block) == pytest.approx(((3 + 4) / 2) / ((8 + 2) / 2))
    # a late drop KL below the minimum: the ratio is not computed, whatever the merges
    small = MIN_DROP_KL / 2
    late_small = {"merge_kl": [1.0, 2.0, 3.0, 4.0], "drop_kl": [9.0, 1.0, 4.0, small, small]}
    assert math.isnan(merge_per_drop(late_small))
    at_minimum = {"merge_kl": [1.0, 2.0, 0.01, 0.03],
                  "drop_kl": [9.0, 1.0, 4.0] + [MIN_DROP_KL] * 2}
    assert merge_per_drop(at_minimum) == pytest.approx(0.02 / MIN_DROP_KL)


L = 12  # blocks of the deep models: their deeper half starts past block 6 ("large t")


DROP_SEEDS = 4



# -- C3 ----------------------------------------------------------------------------------------

def _deep_blocks(merge: float, drop: float, angle: float = 0.1) -> dict[str, list[float]]:
    """A model whose deep pairs' merge KL is `merge`, whose blocks' drop KL is `drop` and
    whose consecutive blocks lie `angle` apart (below 0.2: near-identical)."""
    return {"merge_kl": [merge] * (L - 1), "drop_kl": [drop] * L, "drop_dloss": [drop] * L,
            "ang_prev": [angle] * L, "lens_raw": [3.0] * L, "lens_normed": [3.0] * L}


class _Probed(FakeStudy):
    """The fake study at 12 blocks with planted per-block probes, trained and at init
    (`init[pl]`: one per-block dict per seed, or None for init probes without merge and
    drop)."""

    def __init__(self, tmp: Path, trained: dict, init: dict | None = None) -> None:
        super().__init__(tmp, settings={"train_blocks": L})
        self.trained, self.init = trained, init

    def _probed(self, probes: dict) -> ProbedPair:
        pair = MatchedPair(True, tolerance=0.05, pre_lr=2e-3, post_lr=2e-3, pre_val_loss=2.2,
                           post_val_loss=2.21, gap=-0.01, seed_gaps=(0.01,) * DROP_SEEDS)
        return ProbedPair(pair, {pl: tuple(ProbedRun(f"{pl}-{i}", pb,
                                                     {"effective_depth_kl": 3.0})
                                           for i, pb in enumerate(seeds))
                                 for pl, seeds in probes.items()})

    def trained_probes(self) -> ProbedPair:
        return self._probed(self.trained)

    def init_probes(self) -> ProbedPair:
        """The planted init values; with none planted, the fake's init probes without merge or
        drop values (a study that measured only the stream at init)."""
        if self.init is not None:
            return self._probed(self.init)
        base = super().init_probes()
        return ProbedPair(base.pair, {
            pl: tuple(ProbedRun(r.run_id, {k: v for k, v in r.per_block.items()
                                           if k not in ("merge_kl", "drop_kl")}, r.summary)
                      for r in runs)
            for pl, runs in base.seeds.items()})


def _seeds(merge: float, drop: float) -> list[dict[str, list[float]]]:
    rng = random.Random(int(merge * 1e4 + drop * 1e3))
    return [_deep_blocks(merge * math.exp(0.05 * rng.gauss(0, 1)), drop,
                         0.1 * math.exp(0.05 * rng.gauss(0, 1))) for _ in range(DROP_SEEDS)]


def test_c3_ratio_is_not_computed_below_the_minimum_drop_kl(tmp_path):
    """Pre's deep blocks do nothing measurable (drop KL 0.0014, as in the long study): the
    merge cost in their units is noise over noise, so it is not computed and C3 is not
    decided, whichever way the ratio would have pointed."""
    for pre_merge in (1e-5, 1e-2):  # a "supporting" and a "refuting" ratio alike
        res = CLAIMS["C3"](_Probed(tmp_path, {"pre": _seeds(pre_merge, 0.0014),
                                              "post": _seeds(0.06, 0.2)}))
        preds = {p["subject"]: p for p in res.predictions}
        assert preds["drop cost"]["role"] == "premise"
        assert preds["drop cost"]["verdict"] == "not supported"
        assert preds["post vs pre"]["values"] == []  # no ratio taken
        assert res.verdict == "inconclusive"
        assert "not computed where the late drop KL is below 0.02 nats: pre seed 0" in res.note
        assert "drop cost does not hold" in res.note
        assert math.isnan(res.numbers["late_merge_per_drop"]["pre"]["mean"])


def test_c3_is_decided_above_the_minimum(tmp_path):
    good = CLAIMS["C3"](_Probed(tmp_path, {"pre": _seeds(0.001, 0.05),
                                           "post": _seeds(0.06, 0.2)}))
    preds = {p["subject"]: p for p in good.predictions}
    assert preds["drop cost"]["verdict"] == "supported"
    assert preds["post vs pre"]["effect"]["n"] == DROP_SEEDS
    assert good.verdict == "supported"
    bad = CLAIMS["C3"](_Probed(tmp_path, {"pre": _seeds(0.04, 0.05),
                                          "post": _seeds(0.01, 0.2)}))
    assert bad.verdict == "not supported"
    # the minimum is a bound: a drop KL of exactly 0.02 nats is a denominator
    assert merge_per_drop(_deep_blocks(0.01, MIN_DROP_KL)) == pytest.approx(0.5)
    assert math.isnan(merge_per_drop(_deep_blocks(0.01, MIN_DROP_KL * 0.99)))


def test_c3_ratio_is_one_of_means_over_the_deeper_half():
    pb = _deep_blocks(0.0, 0.0)
    # 11 pairs (t, t+1), their deeper half the last 6; drop KL of blocks 1..12, block t+1 of
    # those pairs the last 6
    pb["merge_kl"] = [9.0] * 5 + [0.1, 0.2, 0.3, 0.4, 0.5, 0.7]
    pb["drop_kl"] = [9.0] * 6 + [1.0, 1.0, 2.0, 2.0, 4.0, 2.0]
    assert merge_per_drop(pb) == pytest.approx((2.2 / 6) / 2.0)  # not the mean ratio, 0.1875


def test_c3_reports_its_value_at_init_and_calls_a_contrast_there_architectural(tmp_path):
    trained = {"pre": _seeds(0.001, 0.05), "post": _seeds(0.06, 0.2)}
    there = CLAIMS["C3"](_Probed(tmp_path, trained, init=trained))
    init = {p["subject"]: p for p in there.predictions}["post vs pre at init"]
    assert init["role"] == "diagnostic" and init["verdict"] == "supported"
    assert there.verdict == "supported"  # the trained models decide
    assert "present at init" in there.note and "architectural, not learned" in there.note
    assert there.numbers["late_merge_per_drop_init"]["pre"]["n"] == DROP_SEEDS
    # at init no block does measurable work: the init ratio is not computed, and said so
    quiet = {"pre": _seeds(1e-4, 1e-3), "post": _seeds(1e-4, 1e-3)}
    res = CLAIMS["C3"](_Probed(tmp_path, trained, init=quiet))
    assert res.verdict == "supported" and "architectural" not in res.note
    assert "at init: the merge/drop ratio is not computed" in res.note
    # init probes without merge and drop: said, no init value
    res = CLAIMS["C3"](_Probed(tmp_path, trained))
    assert "no init value is reported" in res.note and "late_drop_kl_init" not in res.numbers


def test_the_study_s_init_probes_read_merge_and_drop_on_each_run_s_model_at_step_0(
        tmp_path, monkeypatch):
    import torch

    from normlab.config import load_run_config
    from normlab.nn import build_model
    from normlab.probe.interventions import layer_drop
    from normlab.study.experiments import StudyFolder, model_at_init
    from normlab.train import train_run

    cfg = load_run_config(None, [
        "model.n_blocks=4", "model.d_model=16", "model.n_heads=2", "model.max_seq_len=16",
        "data.seq_len=16", "train.batch_size=2", "train.steps=2", "train.eval_every=0",
        "train.eval_batches=1", "train.seed=3", "train.device=cpu"])
    run = tmp_path / train_run(cfg, tmp_path, progress=False)["run_id"]
    ctx = StudyFolder(tmp_path / "study", PROFILES["tiny"], log=lambda _m: None)
    asked = []
    monkeypatch.setattr(StudyFolder, "_probe_matched",
                        lambda self, name, model_of, probes: asked.append(
                            (name, model_of(run, None), probes)))
    ctx.init_probes()
    name, model, probes = asked[0]
    assert set(probes) >= {"stream", "merge", "drop"}
    fresh = build_model(cfg.model, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(),
                                                 strict=True))
    # C12's init curve is layer_drop on the same model
    batches = [(torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16)))]
    got = c12.own_drop_curve(run, batches, at_init=True)["drop_dloss"]
    assert got == pytest.approx(layer_drop(model_at_init(run), batches)["drop_dloss"])


def test_the_matched_pair_is_probed_on_the_study_s_device(tmp_path, monkeypatch):
    """`_probe_matched` moves each model and the probe batches to the study's device."""
    from normlab.config import ModelConfig
    from normlab.nn import build_model
    from normlab.probe import inputs
    from normlab.study import experiments
    from normlab.study.experiments import StudyFolder

    asked = []
    monkeypatch.setattr(experiments, "on_device", lambda model, batches, device: asked.append(
        device) or inputs.on_device(model, batches, "cpu"))
    pair = MatchedPair(True, pre_lr=1e-3, post_lr=1e-3, runs={"pre": ("a",), "post": ("b",)})
    monkeypatch.setattr(StudyFolder, "probe_pair", lambda self: pair)
    ctx = StudyFolder(tmp_path, PROFILES["tiny"], log=lambda _m: None, device="cuda")
    cfg = ModelConfig(placement="pre", n_blocks=2, d_model=16, n_heads=2, max_seq_len=64)
    probed = ctx._probe_matched("x", lambda _run, _step: build_model(cfg, seed=0), ("stream",))
    assert asked == ["cuda", "cuda"] and probed.found


def test_c3_reports_the_same_lr_same_step_pair_beside_the_matched_one(tmp_path):
    """The merge/drop contrast of pre and post trained at one lr and read at their last step:
    a diagnostic, its drop-cost minimum applied as to the matched pair's (named in the note)."""
    good = {"merge_pre": -3.0, "drop_pre": 0.0, "merge_post": 0.0, "drop_post": 0.0} | NEAR
    result = CLAIMS["C3"](FakeStudy(tmp_path, settings=DEEP, **good))
    same = result.predictions[5]
    assert (same["subject"], same["role"], same["verdict"]) == (
        "post vs pre, same lr and step", "diagnostic", "supported")
    reversed_ = CLAIMS["C3"](FakeStudy(tmp_path, settings=DEEP, **good, same_merge_pre=0.0,
                                       same_merge_post=-3.0))
    assert reversed_.predictions[5]["verdict"] == "not supported"
    assert reversed_.verdict == "supported"  # a diagnostic: the verdict is the matched pair's
    idle = CLAIMS["C3"](FakeStudy(tmp_path, settings=DEEP, **good,
                                  same_drop_pre=math.log(0.01)))
    assert "same lr and step: the merge/drop ratio is not computed" in idle.note
    assert idle.verdict == "supported"
    assert "Same lr and step (a diagnostic)" in result.note


def test_the_same_lr_probes_read_the_same_lr_pairs_runs_at_their_last_step(tmp_path,
                                                                            monkeypatch):
    """`same_lr_probes` probes the runs of `same_lr_pair` (not the matched pair's), each at
    its last checkpoint, with the trained probes' set, cached under a name of its own."""
    from normlab.config import ModelConfig
    from normlab.nn import build_model
    from normlab.study import experiments
    from normlab.study.experiments import StudyFolder

    loaded = []
    cfg = ModelConfig(placement="pre", n_blocks=2, d_model=16, n_heads=2, max_seq_len=64)
    monkeypatch.setattr(experiments, "load_trained_model", lambda run_dir, step=None: (
        loaded.append((run_dir.name, step)), build_model(cfg, seed=0)))
    same = MatchedPair(False, pre_lr=2e-3, post_lr=2e-3, gap=-0.2,
                       runs={"pre": ("p0", "p1"), "post": ("q0", "q1")})
    other = MatchedPair(True, pre_lr=1e-3, post_lr=4e-3, runs={"pre": ("x",), "post": ("y",)})
    monkeypatch.setattr(StudyFolder, "same_lr_pair", lambda self: same)
    monkeypatch.setattr(StudyFolder, "probe_pair", lambda self: other)
    ctx = StudyFolder(tmp_path, PROFILES["tiny"], log=lambda _m: None)
    probed = ctx.same_lr_probes()
    assert loaded == [("p0", None), ("p1", None), ("q0", None), ("q1", None)]
    assert probed.pair == same and [r.run_id for r in probed.seeds["post"]] == ["q0", "q1"]
    assert {"lens_raw", "merge_kl", "drop_kl", "ang_prev"} <= set(probed.seeds["pre"][0]
                                                                   .per_block)
    assert [f.name for f in (tmp_path / "cache").iterdir()] == ["same_lr_probes_0.002_0.002.json"]
