"""Fine-tunings stacked (normlab.finetune.loop, normlab.train.group): fine-tunings that differ
only in per-member settings, of models of one shape, train as one stacked group, each member
within float rounding of its fine-tuning alone; a fine-tuning the engine cannot hold trains
alone and says why; C10's fine-tuning arms train as groups."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from test_finetune import assert_same_finetuning, small_task

from normlab.config import make_model_config
from normlab.finetune import FinetuneConfig, finetune_model, finetune_models, plan_finetunes
from normlab.finetune.runs import Wanted
from normlab.nn import build_model
from normlab.train import read_run_config
from normlab.train.group import (
    PER_MEMBER_FINETUNE,
    SHARED_FINETUNE,
    finetune_stack_key,
    finetune_unstackable_reason,
)

SHAPE = dict(placement="pre", n_blocks=2, d_model=32, n_heads=2, max_seq_len=64)


@pytest.fixture(scope="module")
def task():
    return small_task("genre", n_train=128, n_test=48)


def test_stacked_fine_tuning_trains_on_the_shared_loop():
    from normlab.finetune.loop import _FinetuneLoop, _StackedFinetuneLoop
    from normlab.train.loop import TrainLoop

    for kind in (_FinetuneLoop, _StackedFinetuneLoop):  # the loop itself is never rewritten
        assert issubclass(kind, TrainLoop)
        for name in ("run", "train_step", "after_step", "drop", "end"):
            assert getattr(kind, name) is getattr(TrainLoop, name), (kind, name)


def test_a_stacked_group_is_each_fine_tuning_alone(task):
    """Members of two models, at different lrs, seeds, steps, schedules, optimizer settings,
    clipping, standardizations and curve cadences, one of them diverging (it leaves the stack):
    each member's result is its `finetune_model` alone's (tests/train/test_batched.py's
    equality: the same steps and scores, losses within float rounding), the models are left
    alone, and progress is told for the group."""
    models = [build_model(make_model_config(**SHAPE), seed=s) for s in (0, 1)]
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in models]
    base = FinetuneConfig(steps=4, batch_size=8, warmup=1, standardize=16, train_eval_max=16,
                          log_every=2)
    members = [(models[0], base.replace(lr=1e-3)),
               (models[1], base.replace(lr=3e-3, seed=1, steps=6, min_lr_ratio=0.1)),
               (models[0], base.replace(lr=1e36, seed=2)),  # diverges
               (models[1], base.replace(lr=2e-3, beta2=0.98, eps=1e-6, weight_decay=0.1,
                                        grad_clip=None, standardize=0, log_every=1,
                                        warmup=0))]
    told: list[str] = []
    got = finetune_models(members, data=task, device="cpu", progress=told.append)
    assert [(r["engine"], r["group_size"]) for r in got] == [("stacked", 4)] * 4
    assert [r["outcome"] for r in got] == ["completed", "completed", "diverged", "completed"]
    assert got[2]["steps_done"] < 4 and got[1]["steps_done"] == 6
    for (model, cfg), result in zip(members, got, strict=True):
        assert_same_finetuning(result, finetune_model(model, cfg, data=task, device="cpu"))
    for m, b in zip(models, before, strict=True):
        assert all(torch.equal(v, b[k]) for k, v in m.state_dict().items())
    assert told[0].startswith("4 stacked fine-tunings: step 1/6, train loss ")
    assert told[-2].startswith("4 stacked fine-tunings: step 6/6, train loss ")
    assert told[-1] == f"evaluating on {len(task.test_y)} test passages"


def test_fine_tunings_of_other_shapes_or_shared_settings_are_other_groups(task):
    small, wide = (build_model(make_model_config(**SHAPE | extra), seed=0)
                   for extra in ({}, {"d_model": 48}))
    base = FinetuneConfig(steps=2, batch_size=4, warmup=1, standardize=8, train_eval_max=8)
    members = [(small, base), (wide, base), (small, base.replace(lr=1e-3)),
               (wide, base.replace(pooling="last")), (small, base.replace(seed=3))]
    got = finetune_models(members, data=task, device="cpu")
    assert [r.get("group_size") for r in got] == [3, None, 3, None, 3]
    key = finetune_stack_key(base, small.cfg, "cpu")
    for name in PER_MEMBER_FINETUNE:
        assert name not in json.loads(key)["finetune"], name
    for name in SHARED_FINETUNE:
        assert name in json.loads(key)["finetune"], name
    assert finetune_stack_key(base.replace(lr=1.0, seed=4, steps=9, beta1=0.5), small.cfg,
                              "cpu") == key
    assert finetune_stack_key(base.replace(test_max=5), small.cfg, "cpu") != key
    assert finetune_stack_key(base, small.cfg, "cuda") != key


class SmoothedFinetuneConfig(FinetuneConfig):
    """FinetuneConfig with a setting added the obvious way, not taught to the stacked engine."""

    label_smoothing: float = 0.0


def test_a_fine_tuning_the_engine_cannot_hold_trains_alone_and_says_why(task):
    cfg = make_model_config(**SHAPE)
    assert finetune_unstackable_reason(FinetuneConfig(), cfg) is None
    assert finetune_unstackable_reason(FinetuneConfig(freeze=True), cfg) == (
        "finetune.freeze=True (a frozen body (a linear probe: its features are computed once "
        "for all its lrs, and each head trains on them alone) is not implemented by the "
        "stacked engine: the fine-tuning trains alone)")
    assert finetune_unstackable_reason(
        FinetuneConfig(), make_model_config(**SHAPE | {"dropout": 0.1})).startswith(
        "model: dropout=0.1")
    odd = SmoothedFinetuneConfig(label_smoothing=0.1)
    assert finetune_unstackable_reason(odd, cfg) == (
        "finetune.label_smoothing=0.1 (not implemented by the stacked engine: the fine-tuning "
        "trains alone)")
    plain = SmoothedFinetuneConfig()
    assert finetune_unstackable_reason(plain, cfg) is None
    assert finetune_stack_key(plain, cfg, "cpu") == finetune_stack_key(FinetuneConfig(), cfg,
                                                                       "cpu")
    assert finetune_stack_key(odd, cfg, "cpu") != finetune_stack_key(plain, cfg, "cpu")
    # trained: the frozen ones alone (sharing their body's features), said so
    model = build_model(cfg, seed=0)
    base = FinetuneConfig(steps=2, batch_size=4, warmup=1, standardize=8, train_eval_max=8)
    told: list[str] = []
    got = finetune_models([(model, base), (model, base.replace(freeze=True)),
                           (model, base.replace(freeze=True, lr=1e-2)),
                           (model, base.replace(seed=1))], data=task, device="cpu",
                          progress=told.append)
    assert [r.get("group_size") for r in got] == [2, None, None, 2]
    assert "fine-tuning 2 of 4 alone: finetune.freeze=True (a frozen body" in told[0]
    assert got[2] == got[2] | {k: finetune_model(model, base.replace(freeze=True, lr=1e-2),
                                                 data=task, device="cpu")[k]
                               for k in ("loss_curve", "test_loss", "confusion")}


# -- run folders: the plan of finetune_many, and C10 ----------------------------------------------

@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Pre and post runs of two seeds (C10's pairs), trained for 4 steps."""
    from pretrained_pairs import pretrained_pairs

    return pretrained_pairs(tmp_path_factory.mktemp("runs"), blocks=2, steps=4)


def test_the_plan_stacks_each_shape_s_fine_tunings_across_runs_lrs_and_seeds(pairs):
    base = FinetuneConfig(steps=2, batch_size=4, passage_bytes=256, window=64)
    wanted = [Wanted(p.run_dir, base.replace(lr=lr, seed=p.seed), init, None, "cpu",
                     Path("unused")) for init in (False, True) for p in pairs
              for lr in (1e-3, 3e-3)]
    # d_model 32 x 4 passages x 256 bytes = 32,768: stacking pays on 2 CPU threads a worker
    tasks, notes = plan_finetunes(wanted, threads=2)
    placement = [wanted[t[0]].run_dir.name.split("-")[0] for t in tasks]
    assert placement == ["pre", "post"] and [len(t) for t in tasks] == [8, 8]
    assert all(wanted[i].run_dir.name.startswith(p) for t, p in zip(tasks, placement,
                                                                   strict=True) for i in t)
    assert notes == ["16 fine-tunings in 2 stacked group(s) (8+8), 0 apart"]
    tasks, _ = plan_finetunes(wanted, workers=2, threads=2)  # a group for each worker
    assert [len(t) for t in tasks] == [4, 4, 4, 4]
    # the sweep's CPU rule: on one thread it does not pay (16,384 a thread), and they train
    # alone, saying why; on a GPU stacking always pays
    tasks, notes = plan_finetunes(wanted, threads=1)
    assert [len(t) for t in tasks] == [1] * 16
    assert notes == ["16 fine-tuning(s) alone: auto: d_model*batch_size*passage_bytes = 32,768 "
                     "above 16,384 (16,384 per CPU thread), where stacking does not pay on CPU"]
    on_gpu = [dataclasses.replace(w, device="cuda") for w in wanted]
    assert [len(t) for t in plan_finetunes(on_gpu, threads=1)[0]] == [8, 8]
    frozen = [dataclasses.replace(w, config=w.config.replace(freeze=True)) for w in wanted]
    tasks, notes = plan_finetunes(frozen[:4])  # one run's lrs, twice (seeds): by seed
    assert [len(t) for t in tasks] == [2, 2]
    assert notes == ["4 fine-tuning(s) alone: " + finetune_unstackable_reason(
        frozen[0].config, read_run_config(pairs[0].run_dir).model)]


def test_c10_s_fine_tuning_arms_train_as_groups(pairs, tmp_path, monkeypatch):
    """C10's grid (both arms, every lr and seed) trains as stacked groups, one per placement
    (at most 8 fine-tunings each), where stacking pays (here made to on any CPU: the rule is
    tested above): every result file it wrote says so, and a member's numbers are its
    fine-tuning alone's."""
    import normlab.train.machine

    monkeypatch.setattr(normlab.train.machine, "AUTO_CPU_WORK_PER_THREAD", 10**9)
    from dataclasses import replace

    from normlab.finetune import finetune
    from normlab.study.claims import with_settings
    from normlab.study.claims.c10_transfer import c10_finetune
    from normlab.study.experiments import StudyFolder
    from normlab.study.profiles import PROFILES

    profile = with_settings(replace(PROFILES["tiny"], workers=1), finetune_steps=3,
                            finetune_batch_size=4, finetune_test_max=24, finetune_val_max=12,
                            finetune_lrs=(1e-3, 3e-3), finetune_lr_extensions=0,
                            finetune_train_eval_max=8, finetune_standardize=16)
    res = c10_finetune(StudyFolder(tmp_path, profile, log=lambda _: None), pairs)
    assert res["seeds"] == [0, 1]
    files = [json.loads(f.read_text()) for p in pairs
             for f in (p.run_dir / "finetune").glob("genre-*.json")]
    assert len(files) == 2 * 2 * 2 * 2  # arms x placements x lrs x seeds
    assert {(r["engine"], r["group_size"]) for r in files} == {("stacked", 8)}
    one = next(r for r in files if r["from_init"] and r["settings"]["lr"] == 3e-3)
    alone = finetune(one["run_dir"], FinetuneConfig.parse(
        {k: v for k, v in one["settings"].items() if k in FinetuneConfig.model_fields}),
        from_init=True, device="cpu", force=True)
    assert "engine" not in alone
    assert_same_finetuning(one, alone)
