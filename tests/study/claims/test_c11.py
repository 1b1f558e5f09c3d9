"""Tests of C11 (Pre-LN needs a final norm): normlab/study/claims/c11_final_norm.py, on the planted
study (tests/fake_study.py) and on what it measures.

C11's measurements on a real trained model: the cost of dropping the final norm and the raw
final stream's RMS (the depth clause), trained and at init, against computations written here
from the model's own parts.
"""

from __future__ import annotations

import math

import pytest
import torch
from fake_study import FakeStudy
from planted_runs import C11_GOOD, CLAIMS, check_each_prediction, verdicts

from normlab.config import load_run_config
from normlab.nn import build_model
from normlab.probe import text_batches
from normlab.study.claims.c11_final_norm import run_final_norm
from normlab.train import load_trained_model, train_run


def test_c11_every_prediction(tmp_path):
    # decided by pre trained without vs with its final norm only; the ablation of the trained
    # norm (at 6 blocks, and 12 against 6) is a diagnostic: one that fails leaves C11 alone; so
    # is the depth clause, the raw final stream's RMS at 12 over 6 blocks, trained and at init
    check_each_prediction("C11", C11_GOOD, [{"val_pre_nofinal": 2.0}], tmp_path,
                          diagnostics=[{"fn6": -0.1}, {"fn12": 0.2}, {"rms12": 3.0},
                                       {"rms12_init": 1.0}])
    both = CLAIMS["C11"](FakeStudy(tmp_path, **(C11_GOOD | {"fn6": -0.1, "fn12": -0.5})))
    assert verdicts(both) == ["supported", "not supported", "not supported", "supported",
                              "supported"]
    assert both.verdict == "supported"
    rms = both.numbers["final_stream_rms"]
    assert rms["6_blocks"]["trained"]["mean"] == pytest.approx(4.0)
    assert rms["12_blocks"]["init"]["mean"] == pytest.approx(1.6)
    depth = {p["subject"]: p["effect"]["estimate"] for p in both.predictions}
    assert depth["pre, 12 vs 6 blocks, raw final stream"] == pytest.approx(math.log(6 / 4))
    assert depth["pre, 12 vs 6 blocks, raw final stream at init"] == pytest.approx(
        math.log(1.6 / 1.2))


def test_c11_without_a_deeper_model_says_so(tmp_path):
    world = {k: v for k, v in C11_GOOD.items() if k != "fn12"}
    result = CLAIMS["C11"](FakeStudy(tmp_path, profile="quick", **world))
    # quick trains neither a deeper model nor pre without a final norm: only the diagnostic
    # is measured, and a diagnostic never decides
    assert [(p["subject"], p["role"]) for p in result.predictions] == [
        ("pre, 6 blocks", "diagnostic")]
    assert verdicts(result) == ["supported"] and result.verdict == "not run"
    assert "No deeper model" in result.note and "the claim is not run" in result.note
    broken = CLAIMS["C11"](FakeStudy(tmp_path, profile="quick", **{**world, "fn6": -0.1}))
    assert verdicts(broken) == ["not supported"] and broken.verdict == "not run"
    assert CLAIMS["C11"](FakeStudy(tmp_path, noise=3.0, **C11_GOOD)).verdict == "inconclusive"


@pytest.mark.parametrize(("claims", "prefetched"), [(None, ["deep"]), (["C11", "C12"], ["deep"]),
                                                    (["C11"], [])])
def test_c11_trains_both_placements_deep_models_only_when_c12_reads_them(claims, prefetched,
                                                                         tmp_path):
    ctx = FakeStudy(tmp_path, **C11_GOOD)
    ctx.claims = claims
    CLAIMS["C11"](ctx)
    assert ctx.prefetched == prefetched
    assert ctx.deep_asked == ["pre"]


def test_c11_compares_the_seeds_both_depths_have(tmp_path):
    result = CLAIMS["C11"](FakeStudy(tmp_path, noise=0.0, **C11_GOOD, deep_seeds=3))
    deep = next(p for p in result.predictions if p["subject"] == "pre, 12 vs 6 blocks")
    assert deep["effect"]["n"] == 3 and deep["effect"]["estimate"] == pytest.approx(0.5)
    assert result.numbers["final_norm_dropped_12_blocks"]["n"] == 3


def test_c11_says_when_the_profile_s_deep_pre_model_did_not_train(tmp_path, recorded_words,
                                                                  figure_calls):
    world = {k: v for k, v in C11_GOOD.items() if k != "fn12"}  # standard: 12 blocks, none
    result = CLAIMS["C11"](FakeStudy(tmp_path, **world))
    assert "No 12-block pre model trained: the cost of dropping the final norm is measured at " \
        "6 blocks only" in result.note
    recorded_words("empirical_C11_no_deep_model_trained", result, figure_calls)


TINY = ["model.placement=pre", "model.n_blocks=2", "model.d_model=32", "model.n_heads=2",
        "model.max_seq_len=32", "data.seq_len=32", "train.batch_size=8", "train.eval_batches=2",
        "train.eval_every=10", "train.steps=10", "train.lr=3e-3", "train.device=cpu"]


def stream_rms_by_hand(model, batches) -> float:
    """The stream after the last block, as the blocks compute it, its RMS per batch, averaged."""
    seen = []

    def keep(_module, args):
        seen.append(args[0].float().pow(2).mean().sqrt().item())

    handle = model.final.norm.register_forward_pre_hook(keep)
    with torch.no_grad():
        for x, _y in batches:
            model(x)
    handle.remove()
    return sum(seen) / len(seen)


def test_final_norm_measures_against_the_model_s_parts(tmp_path):
    cfg = load_run_config(None, TINY)
    train_run(cfg, tmp_path, progress=False)
    batches = text_batches("shakespeare", n_batches=2, batch_size=4, seq_len=32)
    got = run_final_norm(tmp_path / cfg.run_id(), batches)

    _, trained = load_trained_model(tmp_path / cfg.run_id())
    trained.eval()
    with torch.no_grad():
        with_norm = sum(trained(x, y).loss.item() for x, y in batches) / 2
        stream = [trained.stream(x) for x, _ in batches]  # after the final norm
    assert got["with"] == pytest.approx(with_norm, rel=1e-6)
    assert got["stream_rms"] == pytest.approx(stream_rms_by_hand(trained, batches), rel=1e-6)
    # the raw stream is not the normalized one the head reads with the norm
    normed = sum(s.pow(2).mean().sqrt().item() for s in stream) / 2
    assert abs(got["stream_rms"] - normed) > 1e-3
    trained.final.norm = torch.nn.Identity()
    with torch.no_grad():
        without = sum(trained(x, y).loss.item() for x, y in batches) / 2
    assert got["without"] == pytest.approx(without, rel=1e-6)
    assert got["cost"] == pytest.approx(without - with_norm, rel=1e-6, abs=1e-9)

    at_init = build_model(cfg.model, seed=cfg.train.seed).eval()
    assert got["stream_rms_init"] == pytest.approx(stream_rms_by_hand(at_init, batches),
                                                   rel=1e-6)
    assert got["stream_rms_init"] != pytest.approx(got["stream_rms"], rel=1e-3)  # trained moved it


def test_final_norm_measures_run_on_the_study_s_device(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from normlab.study.claims import c11_final_norm
    from normlab.study.experiments import StudyFolder
    from normlab.study.profiles import PROFILES

    seen = []
    monkeypatch.setattr(c11_final_norm, "run_final_norm",
                        lambda run_dir, batches, device="cpu": seen.append(
                            (run_dir.name, device)) or {"cost": 0.0})
    folder = StudyFolder(tmp_path, PROFILES["tiny"], log=lambda _m: None, device="cuda")
    records = [SimpleNamespace(run_id=r, failed=False) for r in ("a", "b")]
    assert c11_final_norm.final_norm_measures(folder, records) == [{"cost": 0.0}] * 2
    assert seen == [("a", "cuda"), ("b", "cuda")]
