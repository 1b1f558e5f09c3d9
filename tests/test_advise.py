"""`normlab advise`: the advice follows its own measurements, and says when it overrides a rule
of thumb. The measurement tables are stubs, so each case is exact and fast."""

import pytest

import normlab.advise as advise_module
from normlab.advise import advise, compare_check, recommend

INIT = {p: {"grad_last_over_first": 1.0, "growth_exponent": 0.5} for p in ("pre", "post")}


def table(pre: list, post: list) -> list[dict]:
    """A stability check: lr x warmup cells, each (val loss) or a failure string."""
    rows = []
    cells = [(1e-3, 0), (1e-3, 3), (3e-3, 0), (3e-3, 3)]
    for placement, values in (("pre", pre), ("post", post)):
        for (lr, warmup), v in zip(cells, values, strict=True):
            done = not isinstance(v, str)
            rows.append({"placement": placement, "lr": lr, "warmup": warmup,
                         "outcome": "completed" if done else "diverged",
                         "reason": None if done else v, "step": 10 if done else 4,
                         "val_loss": v if done else None})
    return rows


def measured(rows: list[dict]) -> dict:
    return {"init": INIT, "stability": rows, "check_width": 32, "check_steps": 10}


def test_shallow_post_rule_is_overridden_when_pre_measures_at_or_below_post_everywhere(
        monkeypatch):
    # the reported case (--blocks 4 --width 32 --heads 2 --check-steps 10): rule post, pre at
    # or below post in every cell of the check
    rows = table(pre=[5.40, 5.30, 5.10, 5.00], post=[5.40, 5.35, 5.20, 5.10])
    monkeypatch.setattr(advise_module, "measure_init", lambda *a, **k: INIT)
    monkeypatch.setattr(advise_module, "stability_check", lambda *a, **k: rows)
    advice = advise(4, 32, 2, check_steps=10)
    assert advice.recommendation == "pre" and advice.rule_recommendation == "post"
    text = " ".join(advice.reasons)
    assert "overrides the rule of thumb (post)" in text and "better in 3" in text
    assert "tied (within 0.01 nats, or both failed) in 1 of 4 cells" in text


def test_deep_pre_rule_is_overridden_when_post_measures_better_everywhere():
    rows = table(pre=["loss_spike", 5.30, "nonfinite_loss", 5.2], post=[5.2, 5.1, 5.0, 5.0])
    advice = recommend(24, measured=measured(rows))
    assert (advice.rule_recommendation, advice.recommendation) == ("pre", "post")
    assert "overrides the rule of thumb (pre)" in " ".join(advice.reasons)
    assert not any("final norm" in r for r in advice.reasons)  # that advice is for pre


@pytest.mark.parametrize("pre, post, why", [
    ([5.0, 5.3, 5.0, 5.3], [5.3, 5.0, 5.3, 5.0], "no winner"),           # mixed
    ([5.0, 5.0, 5.0, 5.0], [5.005, 4.996, 5.0, 5.0], "no winner"),       # all within the tie
    ([5.4, 5.4, 5.4, 5.4], [5.0, 5.0, 5.0, 5.0], "agrees"),              # post, as the rule
])
def test_the_rule_stands_when_the_check_agrees_or_has_no_winner(pre, post, why):
    advice = recommend(4, measured=measured(table(pre, post)))
    assert advice.recommendation == advice.rule_recommendation == "post"
    assert why in " ".join(advice.reasons)
    assert "overrides" not in " ".join(advice.reasons)


def test_fine_tuning_keeps_the_checkpoint_placement_and_says_why():
    rows = table(pre=[5.0] * 4, post=[5.3] * 4)
    advice = recommend(4, finetune=True, measured=measured(rows))
    assert advice.recommendation == "post"
    assert "for fine-tuning the checkpoint's placement stands" in " ".join(advice.reasons)


def test_without_measurements_the_rules_decide():
    assert recommend(24).recommendation == "pre" and recommend(4).recommendation == "post"


def test_compare_check_counts_failures_as_losses():
    v = compare_check(table(pre=[5.5, "loss_spike", 5.5, 5.5], post=[5.5, 5.9, "x", "y"]))
    assert (v.pre_better, v.post_better, v.ties, v.winner) == (2, 1, 1, None)
    assert "diverged at step 4" in v.text


def test_advise_says_each_measurement_as_it_starts(monkeypatch, tmp_path):
    """The measurements take minutes at a real shape: the init probe and every run of the
    stability check are announced, with their count, before they start."""
    told = []
    monkeypatch.setattr(advise_module, "measure_init", lambda *a, **k: INIT)
    monkeypatch.setattr(advise_module, "train_many_step",
                        lambda cfg, root, progress: told.append("trained") or {
                            "outcome": "completed", "step": 4, "val_loss": 2.0})
    advise(6, 128, check_steps=9, root=tmp_path, progress=told.append)
    assert told[0] == "gradients and stream of pre and post at init, 6 blocks, width 128"
    assert told[1] == "stability check 1/8: pre, lr 0.001, warmup 0, 9 steps at width 64"
    assert told[2] == "trained" and told[-2].startswith("stability check 8/8: post, lr 0.003,")
    assert told.count("trained") == 8 and len(told) == 17
    assert advise(6, 128, measure=False, progress=told.append).measured == {}
    assert len(told) == 17  # no measurement, nothing told
