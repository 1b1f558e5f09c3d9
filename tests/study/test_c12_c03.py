"""C12 and C3 on statistics a near-zero denominator cannot break: C12 decides on the deep
half's drop cost in nats with every seed kept (a trained Pre-LN's deep blocks can cost nothing,
or less than nothing); C3 computes its merge/drop ratio only above a minimum drop KL stated
before the runs. Each is tested on planted worlds where pre's deep blocks cost exactly 0."""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
from fake_study import FakeStudy

from normlab.study.claims import c12_removable_layers as c12
from normlab.study.claims import measures
from normlab.study.claims.c03_depth_as_width import MIN_DROP_KL, merge_per_drop
from normlab.study.claims.c12_removable_layers import (
    DROP_MARGIN,
    decide_c12,
    drop_cost_profile,
)
from normlab.study.context import MatchedPair, ProbedPair, ProbedRun
from normlab.study.schema import Pretrained

L = 12  # blocks of the deep models: their deeper half starts past block 6 ("large t")
SEEDS = 4
CLAIMS = measures()


def _curve(deep: float, interior: float = 0.1, first: float = 1.0, last: float = 0.5
           ) -> list[float]:
    """A drop-cost curve: heavy ends, `interior` for blocks 2-6 and `deep` for blocks 7-11."""
    return [first] + [interior] * 5 + [deep] * 5 + [last]


# -- C12 ---------------------------------------------------------------------------------------

def test_the_deep_half_cost_is_the_mean_of_the_deep_interior_blocks_in_nats():
    prof = drop_cost_profile([1.0, 0.2, 0.2, 0.2, 0.2, 0.2, 0.1, 0.2, 0.3, 0.4, 0.5, 9.0])
    assert prof["deep_blocks"] == [7, 8, 9, 10, 11]  # 1-based; the last block apart
    assert prof["deep_cost"] == pytest.approx(0.3)
    # a pre whose deep blocks cost nothing, or lower the loss: defined, not left out
    assert drop_cost_profile(_curve(0.0, interior=0.0))["deep_cost"] == 0.0
    negative = drop_cost_profile(_curve(-0.001, interior=-0.0005))
    assert negative["deep_cost"] == pytest.approx(-0.001)
    assert negative["depth_slope"] is None  # the old statistic had no unit there
    assert drop_cost_profile([1.0, math.nan] + [0.0] * 10)["deep_cost"] is None
    # 4 blocks: block 3 is the only deep interior block
    assert drop_cost_profile([1.0, 0.2, 0.05, 1.0])["deep_cost"] == pytest.approx(0.05)


def _world(pre: list[float], post: float, noise: float = 0.01, seed: int = 0
           ) -> dict[str, list[float]]:
    rng = random.Random(seed)
    return {"pre": list(pre), "post": [post + noise * rng.gauss(0, 1) for _ in pre]}


def test_c12_pre_s_deep_blocks_costing_nothing_is_the_claim_s_strongest_case():
    # exactly 0 in three seeds, slightly negative (dropping lowers the loss) in the fourth
    res = decide_c12(_world([0.0, 0.0, 0.0, -0.002], post=0.16))
    assert res["verdict"] == "supported"
    assert res["intervals"]["pre"]["n"] == res["intervals"]["post - pre"]["n"] == SEEDS
    assert [(p.subject, p.role, p.verdict) for p in res["predictions"]] == [
        ("pre", "claim", "supported"), ("post vs pre", "claim", "supported"),
        ("post", "diagnostic", "supported")]
    assert res["effect"].expected == f"> {DROP_MARGIN:g}"


def test_c12_both_placements_costing_the_same_is_not_supported():
    cheap = decide_c12(_world([0.001, 0.0, 0.002, 0.001], post=0.001, noise=0.001))
    assert [p.verdict for p in cheap["predictions"][:2]] == ["supported", "not supported"]
    assert cheap["verdict"] == "not supported"
    assert cheap["reason"] == "post's deep blocks do not cost 0.02 nats more than pre's"
    # both costly: pre's own prediction fails first
    dear = decide_c12(_world([0.15, 0.16, 0.14, 0.15], post=0.15))
    assert dear["predictions"][0].verdict == "not supported"
    assert dear["verdict"] == "not supported"
    assert dear["reason"] == "pre's deep blocks cost 0.02 nats or more to drop"


def test_c12_a_contrast_below_the_margin_is_not_a_contrast():
    # post's deep blocks cost 0.01 nats more than pre's, every seed: below the 0.02 margin
    res = decide_c12(_world([0.0] * SEEDS, post=0.01, noise=0.001))
    assert res["predictions"][1].verdict == "not supported" and res["verdict"] == "not supported"
    # an interval across the margin is not decided
    wide = decide_c12(_world([0.0] * SEEDS, post=0.02, noise=0.05, seed=3))
    assert wide["predictions"][1].verdict == "inconclusive" and wide["verdict"] == "inconclusive"
    assert decide_c12({"pre": [0.0], "post": [0.2]})["verdict"] == "inconclusive"


def test_c12_reports_the_contrast_at_init_and_calls_one_there_architectural():
    trained = _world([0.0] * SEEDS, post=0.16)
    same = decide_c12(trained, init=_world([0.05] * SEEDS, post=0.05, noise=0.001))
    assert same["predictions"][3].subject == "post vs pre at init"
    assert same["predictions"][3].role == "diagnostic"
    assert same["verdict"] == "supported" and same["reason"].endswith(
        "at init the contrast is absent (at or below 0.02 nats): learned")
    there = decide_c12(trained, init=_world([0.0] * SEEDS, post=0.2))
    assert there["verdict"] == "supported"  # the trained models decide; the note says why
    assert "present at init" in there["reason"] and "architectural, not learned" in \
        there["reason"]
    assert there["intervals"]["post - pre at init"]["n"] == SEEDS


class _Ctx:
    """What c12_own_models reads of a study: its profile, a cache and probe batches."""

    profile = SimpleNamespace(match_tolerance=0.05)

    def __init__(self) -> None:
        self.cached_names: list[str] = []

    def cached(self, name, compute):
        self.cached_names.append(name)
        return compute()

    def probe_batches(self, seq_len=None):
        return []


def _pairs() -> list[Pretrained]:
    return [Pretrained(pl, s, Path(f"/runs/{pl}-{s}"), 2.5, step=400)
            for pl in ("pre", "post") for s in range(SEEDS)]


def test_c12_own_models_keeps_every_seed_the_old_median_rule_left_out(monkeypatch):
    """The recorded long study's case: pre's deep blocks cost 0 (three seeds) or lower the
    loss (one seed, whose median interior cost is below 0: the old statistic left it out)."""
    trained = {"pre-0": _curve(0.0), "pre-1": _curve(0.0), "pre-2": _curve(0.0),
               "pre-3": _curve(-0.002, interior=-0.0005)}
    trained |= {f"post-{s}": _curve(0.15 + 0.01 * s, interior=0.2) for s in range(SEEDS)}

    def curve(run_dir, batches, step=None, *, at_init=False):
        name = Path(run_dir).name
        return {"drop_dloss": _curve(0.01) if at_init else trained[name], "n_blocks": L}

    monkeypatch.setattr(c12, "own_drop_curve", curve)
    ctx = _Ctx()
    res = c12.c12_own_models(ctx, _pairs())
    assert res["left_out"] == [] and sorted(res["per_seed"]) == list(range(SEEDS))
    assert res["per_seed"][3]["pre"]["depth_slope"] is None  # the old statistic: undefined
    assert res["deep_costs"]["pre"] == pytest.approx([0.0, 0.0, 0.0, -0.002])
    assert res["verdict"] == "supported"
    # each run's model at step 0 measured beside it, cached apart
    assert res["init_deep_costs"] == {"pre": [0.01] * SEEDS, "post": [0.01] * SEEDS}
    assert "c12_drop_pre-0_init" in ctx.cached_names and "c12_drop_pre-0_step400" in \
        ctx.cached_names
    assert "absent" in res["reason"]
    # a world where post's deep blocks cost what pre's do: not supported, every seed kept
    trained |= {f"post-{s}": _curve(0.0, interior=0.2) for s in range(SEEDS)}
    flat = c12.c12_own_models(_Ctx(), _pairs())
    assert flat["verdict"] == "not supported" and flat["left_out"] == []


def test_c12_measure_decides_on_the_deep_half_cost(monkeypatch, tmp_path):
    from normlab.interop import CheckpointNotFound

    def curve(run_dir, batches, step=None, *, at_init=False):
        pl = Path(run_dir).name.split("-")[0]
        deep = 0.0 if at_init or pl == "pre" else 0.15
        return {"drop_dloss": _curve(deep), "n_blocks": L}

    def no_real(ctx):
        raise CheckpointNotFound("not in the local cache (planted)")

    monkeypatch.setattr(c12, "own_drop_curve", curve)
    monkeypatch.setattr(c12, "c12_real_models", no_real)
    ctx = FakeStudy(tmp_path)
    ctx.probe_batches = lambda seq_len=None: []
    res = c12.measure(ctx, _pairs())
    assert res.verdict == "supported", res.note
    assert [p["subject"] for p in res.predictions] == [
        "large t", "trained pairs", "pre", "post vs pre", "post", "post vs pre at init"]
    assert res.numbers["pairs"] == SEEDS
    assert res.effect.name == "deep-half drop cost (nats): post - pre"
    assert res.numbers["own_models"]["init_deep_costs"]["post"] == [0.0] * SEEDS


# -- C3 ----------------------------------------------------------------------------------------

def _blocks(merge: float, drop: float) -> dict[str, list[float]]:
    """A model whose deep pairs' merge KL is `merge` and whose blocks' drop KL is `drop`."""
    return {"merge_kl": [merge] * (L - 1), "drop_kl": [drop] * L, "drop_dloss": [drop] * L,
            "ang_prev": [0.4] * L, "lens_raw": [3.0] * L, "lens_normed": [3.0] * L}


class _Probed(FakeStudy):
    """The fake study at 12 blocks with planted per-block probes, trained and at init
    (`init[pl]`: one per-block dict per seed, or None for init probes without merge and
    drop)."""

    def __init__(self, tmp: Path, trained: dict, init: dict | None = None) -> None:
        super().__init__(tmp, settings={"train_blocks": L})
        self.trained, self.init = trained, init

    def _probed(self, probes: dict) -> ProbedPair:
        pair = MatchedPair(True, tolerance=0.05, pre_lr=2e-3, post_lr=2e-3, pre_val_loss=2.2,
                           post_val_loss=2.21, gap=-0.01, seed_gaps=(0.01,) * SEEDS)
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
    return [_blocks(merge * math.exp(0.05 * rng.gauss(0, 1)), drop) for _ in range(SEEDS)]


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
    assert preds["post vs pre"]["effect"]["n"] == SEEDS
    assert good.verdict == "supported"
    bad = CLAIMS["C3"](_Probed(tmp_path, {"pre": _seeds(0.04, 0.05),
                                          "post": _seeds(0.01, 0.2)}))
    assert bad.verdict == "not supported"
    # the minimum is a bound: a drop KL of exactly 0.02 nats is a denominator
    assert merge_per_drop(_blocks(0.01, MIN_DROP_KL)) == pytest.approx(0.5)
    assert math.isnan(merge_per_drop(_blocks(0.01, MIN_DROP_KL * 0.99)))


def test_c3_ratio_is_one_of_means_over_the_deeper_half():
    pb = _blocks(0.0, 0.0)
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
    assert there.numbers["late_merge_per_drop_init"]["pre"]["n"] == SEEDS
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
    from normlab.study.profiles import PROFILES
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
