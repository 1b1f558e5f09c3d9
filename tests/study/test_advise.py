"""`normlab advise`: the advice follows its own measurements, and says when it overrides a rule
of thumb. The measurement tables are stubs, so each case is exact and fast. Without measuring it
follows the recorded studies (written here as small study.json files, and the repository's own),
never a rule of thumb they do not support."""

import json

import pytest

import normlab.study.advise as advise_module
from normlab.study.advise import advise, compare_check, recommend

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
    assert (v.better["pre"], v.better["post"], v.ties, v.winner) == (2, 1, 1, None)
    assert "diverged at step 4" in v.text


def test_advise_says_each_measurement_as_it_starts(monkeypatch, tmp_path):
    """The measurements take minutes at a real shape: the init probe and every run of the
    stability check are announced, with their count, before they start."""
    told = []
    monkeypatch.setattr(advise_module, "measure_init", lambda *a, **k: INIT)
    monkeypatch.setattr(advise_module, "train_run_raising_interrupt",
                        lambda cfg, root, progress: told.append("trained") or {
                            "outcome": "completed", "step": 4, "val_loss": 2.0})
    advise(6, 128, check_steps=9, root=tmp_path, progress=told.append)
    assert told[0] == "gradients and stream of pre and post at init, 6 blocks, width 128"
    assert told[1] == "stability check 1/8: pre, lr 0.001, warmup 0, 9 steps at width 64"
    assert told[2] == "trained" and told[-2].startswith("stability check 8/8: post, lr 0.003,")
    assert told.count("trained") == 8 and len(told) == 17
    assert advise(6, 128, measure=False, progress=told.append).measured == {}
    assert len(told) == 17  # no measurement, nothing told


# -- without measuring: the recorded studies, not the rules of thumb ---------------------------

def study_json(folder, profile: str, blocks: int, width: int, c9: str, deep: int = 0) -> None:
    """A recorded study at `blocks` x `width` with C9's verdict `c9` and a C6a with numbers."""
    claims = [
        {"id": "C6a", "title": "At a common peak lr, Post-LN needs warmup and Pre-LN does not",
         "verdict": "inconclusive", "needs": "", "predictions": [
             {"role": "claim", "subject": "post, lr 0.0015", "verdict": "supported",
              "quantity": "val loss without warmup - with warmup",
              "effect": {"estimate": 0.663, "ci_low": 0.462, "ci_high": 0.863, "n": 4}},
             {"role": "premise", "subject": "hidden", "verdict": "supported",
              "quantity": "a premise", "effect": {"estimate": 1.0}}]},
        {"id": "C9", "title": "Post-LN ends better when it trains (shallow models)",
         "verdict": c9, "needs": "runs trained near convergence" if c9.startswith("not t") else "",
         "predictions": []},
        {"id": "C1", "title": "an init claim", "verdict": "supported", "predictions": []},
    ]
    path = folder / f"study_{profile}" / "study.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"profile": profile, "claims": claims, "profile_settings": {
        "train_blocks": blocks, "train_width": width, "train_heads": 2, "steps": 400,
        "seeds": 4, "deep_blocks": deep}}))


def test_no_measure_says_what_the_studies_found_at_a_shape_they_trained(tmp_path):
    """6 blocks, width 64 where the studies trained it and C9 was not tested at this scale: no
    Post-Norm rule of thumb, the record's findings instead, and what to run to measure."""
    study_json(tmp_path, "standard", 6, 64, "not tested at this scale", deep=12)
    advice = advise(6, 64, measure=False, results=tmp_path)
    assert advice.rule_recommendation == "post" and advice.recommendation == "undecided"
    assert advice.measured == {}
    text = " ".join(advice.reasons)
    assert "Post-Norm trains and tends to end better) is not given" in text
    assert "C9 (Post-LN ends better when it trains): not tested at this scale (standard)" in text
    assert "`normlab advise --blocks 6 --width 64` (without --no-measure" in text
    rows = {r["claim"]: r for r in advice.recorded.rows}
    assert list(rows) == ["C6a", "C9"]  # the training claims it has; not the init claim C1
    assert rows["C6a"]["numbers"] == ["post, lr 0.0015: val loss without warmup - with warmup "
                                      "+0.663 [+0.462, +0.863], n=4 (supported)"]
    assert rows["C9"]["verdict"] == "not tested at this scale"
    assert rows["C9"]["needs"] == "runs trained near convergence"
    # fine-tuning a Post-Norm checkpoint keeps its placement: not a rule the record can overturn
    assert advise(6, 64, finetune=True, measure=False, results=tmp_path).recommendation == "post"


def test_no_measure_follows_the_record_where_it_supports_post(tmp_path):
    study_json(tmp_path, "long", 6, 64, "supported")
    advice = advise(6, 64, measure=False, results=tmp_path)
    assert advice.recommendation == "post"
    assert "C9 (Post-LN ends better when it trains) was supported" in " ".join(advice.reasons)


def test_no_measure_at_a_shape_no_study_trained_says_so_and_what_to_run(tmp_path):
    study_json(tmp_path, "standard", 6, 64, "not tested at this scale", deep=12)
    advice = advise(48, 512, measure=False, results=tmp_path)
    assert advice.rule_recommendation == "pre" and advice.recommendation == "undecided"
    assert advice.recorded.rows == []
    text = " ".join(advice.reasons)
    assert ("nothing was measured at 48 blocks, width 512 by the recorded studies (standard); "
            "they trained 6 blocks, width 64 (standard: 400 steps, 4 seeds, 2 heads); 12 blocks, "
            "width 64 (standard: C11, C12)") in text
    assert "`normlab advise --blocks 48 --width 512`" in text and "sweep" in text


def test_no_measure_without_the_recorded_studies_says_they_are_not_available(
        tmp_path, monkeypatch):
    """An installed copy has no docs/results: nothing recorded is claimed."""
    import normlab.study.recorded

    monkeypatch.setattr(normlab.study.recorded, "REPO", tmp_path)  # a folder with no repository
    advice = advise(6, 64, measure=False)
    assert advice.recommendation == "undecided" and advice.recorded.rows == []
    assert "the recorded studies (docs/results/study_*/study.json) are not available here" in (
        advice.reasons[0])
    # a study.json that does not read (one being written) is named, the others are used
    study_json(tmp_path, "standard", 6, 64, "supported")
    (tmp_path / "study_cut").mkdir()
    (tmp_path / "study_cut" / "study.json").write_text('{"claims": [')
    advice = advise(6, 64, measure=False, results=tmp_path)
    assert advice.recommendation == "post"
    assert any("study_cut/study.json: cannot be read" in r for r in advice.reasons)


def test_advise_no_measure_reads_the_repository_studies():
    """`normlab advise --no-measure` from the repository: at 6 blocks, width 64 (the studies'
    shape) the findings of docs/results, with their verdicts, and never the Post-Norm rule; at
    48 blocks, width 512, that nothing was measured there."""
    from typer.testing import CliRunner

    from normlab.cli import app
    from normlab.study.recorded import read_studies, results_dir

    studies, _ = read_studies(results_dir())
    here = [st for st in studies if (st.settings["train_blocks"], st.settings["train_width"])
            == (6, 64)]
    assert here, "the repository records studies at 6 blocks, width 64"
    c9 = [st.claims["C9"]["verdict"] for st in here]
    r = CliRunner().invoke(app, ["advise", "--blocks", "6", "--width", "64", "--no-measure"],
                           terminal_width=250)
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "recorded studies at 6 blocks, width 64" in out
    for st in here:
        assert f"C9 Post-LN ends better when it trains (shallow models) │ {st.name} │" in out
    want = "post" if all(v == "supported" for v in c9) else "undecided"
    assert f"recommendation: {want}" in out
    if want == "undecided":
        assert "Post-Norm trains and tends to end better) is not given" in out

    r = CliRunner().invoke(app, ["advise", "--blocks", "48", "--width", "512", "--no-measure"],
                           terminal_width=250)
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "recommendation: undecided" in out and "recorded studies at" not in out
    assert "nothing was measured at 48 blocks, width 512 by the recorded studies" in out


# -- other placements measured beside pre and post ---------------------------------------------

def with_other(rows: list[dict], name: str, values: list) -> list[dict]:
    """`rows` with a third placement's cells (same lr x warmup order as `table`)."""
    cells = [(1e-3, 0), (1e-3, 3), (3e-3, 0), (3e-3, 3)]
    extra = [{"placement": name, "lr": lr, "warmup": w,
              "outcome": "completed" if not isinstance(v, str) else "diverged",
              "reason": None if not isinstance(v, str) else v, "step": 10,
              "val_loss": None if isinstance(v, str) else v}
             for (lr, w), v in zip(cells, values, strict=True)]
    return rows + extra


def test_another_placement_is_compared_with_the_recommendation_never_recommended():
    rows = with_other(table(pre=[5.4] * 4, post=[5.0] * 4), "olmo2", [4.9, 4.9, 5.0, 4.8])
    init = INIT | {"olmo2": {"grad_last_over_first": 0.7, "growth_exponent": 0.1}}
    advice = recommend(4, measured={**measured(rows), "init": init, "also": ["olmo2"]})
    assert advice.recommendation == "post"  # the rules' pair decides; olmo2 is named
    text = " ".join(advice.reasons)
    assert "olmo2 at init (its own init): last/first block gradient ratio 0.7" in text
    assert "olmo2 better in 3, post better in 0, tied" in text
    assert "olmo2 was at least as good as post in every cell of the check and better in 3" in text


def test_another_placement_that_loses_a_cell_is_not_called_worth_a_comparison():
    rows = with_other(table(pre=[5.4] * 4, post=[5.0] * 4), "keel", [4.9, "loss_spike", 5.0, 4.8])
    advice = recommend(4, measured={**measured(rows), "also": ["keel"]})
    text = " ".join(advice.reasons)
    assert "keel better in 2, post better in 1" in text and "worth a longer" not in text


def test_advise_measures_the_other_placements_in_every_cell(monkeypatch, tmp_path):
    told, trained, devices = [], [], set()
    monkeypatch.setattr(advise_module, "measure_init", lambda *a, also=(), device="cpu", **k: (
        devices.add(device) or {**INIT, **{p: INIT["pre"] for p in also}}))
    monkeypatch.setattr(advise_module, "train_run_raising_interrupt",
                        lambda cfg, root, progress: (trained.append(cfg.model.placement),
                                                     devices.add(cfg.train.device)) and {
                            "outcome": "completed", "step": 4, "val_loss": 2.0})
    advice = advise(6, 128, check_steps=9, root=tmp_path, progress=told.append,
                    also=("olmo2", "post", "olmo2"),  # pre and post and repeats: not doubled
                    device="cuda")
    assert devices == {"cuda"}  # at init and in the stability check (stubbed: no GPU used)
    assert told[0] == "gradients and stream of pre, post and olmo2 at init, 6 blocks, width 128"
    assert trained == ["pre"] * 4 + ["post"] * 4 + ["olmo2"] * 4
    assert told[-1].startswith("stability check 12/12: olmo2")
    assert advice.measured["also"] == ["olmo2"]


def test_measure_init_gives_each_other_placement_its_own_init(monkeypatch):
    asked = []
    real = advise_module.parse_config
    monkeypatch.setattr(advise_module, "parse_config",
                        lambda cls, data: asked.append(data) or real(cls, data))
    out = advise_module.measure_init(3, 32, 2, seq_len=16, also=("deepnorm",))
    assert set(out) == {"pre", "post", "deepnorm"}
    assert all(0 < v["grad_last_over_first"] < float("inf") for v in out.values())
    inits = {d["placement"]: d.get("init") for d in asked}
    assert inits == {"pre": "xavier", "post": "xavier", "deepnorm": None}  # deepnorm's own
