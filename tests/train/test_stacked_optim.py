"""The optimizer has one home (`normlab.train.optim`); `StackedAdamW`, one fused call per
setting, computes exactly what the per-member fused calls computed; the stacked engine refuses
every setting it does not implement, naming it."""

import ast
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import normlab
from normlab.config import ModelConfig, TrainConfig, load_run_config, make_model_config
from normlab.nn import build_model
from normlab.nn.stacked import StackedTransformer
from normlab.sweep.grouping import GroupTask, RunTask, plan_tasks
from normlab.sweep.spec import PlannedRun
from normlab.train import group
from normlab.train.checkpoint import kept_steps
from normlab.train.group import (
    GroupError,
    check_group,
    run_unstackable_reason,
    stack_key,
    train_group,
)
from normlab.train.optim import adamw, adamw_hyper, decayed_names
from normlab.train.stacked_adamw import StackedAdamW

TINY = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=8", "train.eval_batches=2", "train.log_every=1",
        "train.eval_every=4", "train.steps=6", "train.checkpoint_every=3", "train.device=cpu"]


# -- one home ---------------------------------------------------------------------------------

def test_adamw_is_built_only_in_optim():
    """`torch.optim.AdamW` is constructed in `normlab/train/optim.py` and nowhere else in the
    package, so an optimizer option added there reaches every kind of training."""
    root = Path(normlab.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "train" / "optim.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if name == "AdamW":
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not found, f"AdamW built outside normlab/train/optim.py: {found}"


def test_the_scan_finds_a_construction(tmp_path):
    """The scan above recognises the forms it must (a guard for the guard)."""
    for source in ("opt = torch.optim.AdamW(ps, lr=1e-3)", "from torch.optim import AdamW\n"
                   "opt = AdamW(ps)"):
        calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
        names = [c.func.attr if isinstance(c.func, ast.Attribute) else c.func.id for c in calls]
        assert "AdamW" in names


def test_adamw_takes_every_setting_from_the_config():
    model = build_model(make_model_config(placement="pre", n_blocks=1, d_model=16, n_heads=2,
                                          max_seq_len=8), seed=0)
    tc = TrainConfig(lr=3e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.3)
    opt = adamw(model, tc)
    decay, no_decay = opt.param_groups
    assert (decay["lr"], decay["betas"], decay["eps"]) == (3e-3, (0.8, 0.99), 1e-6)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.3, 0.0)
    assert not opt.defaults["fused"] and adamw(model, tc, fused=True).defaults["fused"]
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in decay["params"]} == decayed_names(model)
    assert all(p.dim() >= 2 and "emb" not in names[id(p)] for p in decay["params"])
    model.blocks.requires_grad_(False)  # frozen parameters are left out, empty groups dropped
    frozen = adamw(model, tc)
    assert all(p.requires_grad for g in frozen.param_groups for p in g["params"])
    assert len(frozen.param_groups) == 1  # only embeddings and the final norm train
    assert adamw_hyper(tc, 1e-4) == {"lr": 1e-4, "weight_decay": 0.3, "beta1": 0.8,
                                     "beta2": 0.99, "eps": 1e-6}


def test_finetuning_keeps_its_betas():
    """Fine-tuning's AdamW comes from optim.py with the betas it always used (0.9, 0.999)."""
    from normlab.finetune.config import FinetuneConfig

    c = FinetuneConfig()
    assert (c.beta1, c.beta2, c.eps) == (0.9, 0.999, 1e-8)
    tc = c.train_config()
    assert (tc.beta1, tc.beta2, tc.eps) == (0.9, 0.999, 1e-8)


# -- StackedAdamW against the per-member fused kernel it replaced ----------------------------------

def reference_step(optim: StackedAdamW, steps: list[int], grads, hp) -> None:
    """`StackedAdamW.step` as it was: torch's fused AdamW kernel on each member's row, its
    decayed and undecayed columns apart."""
    n, total = optim.n_decayed, optim.flat.shape[1]
    parts = [(slice(0, n), True)] * (n > 0) + [(slice(n, total), False)] * (total > n)
    for i, h in enumerate(hp):
        step = torch.tensor(float(steps[i]))
        for cols, decayed in parts:
            torch._fused_adamw_(
                [optim.flat[i, cols]], [grads[i, cols]], [optim.exp_avg[i, cols]],
                [optim.exp_avg_sq[i, cols]], [], [step], amsgrad=False, maximize=False,
                lr=h["lr"], beta1=h["beta1"], beta2=h["beta2"], eps=h["eps"],
                weight_decay=h["weight_decay"] if decayed else 0.0)


HP = [dict(lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8),
      dict(lr=3e-3, weight_decay=0.0, beta1=0.8, beta2=0.99, eps=1e-6),
      dict(lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8),  # shares member 0's
      dict(lr=2e-4, weight_decay=0.01, beta1=0.5, beta2=0.9, eps=1e-7)]


def stacked_pair(states=None):
    cfg = make_model_config(placement="admin", n_blocks=2, d_model=24, n_heads=2, max_seq_len=8)
    made = []
    for _ in range(2):
        stacked = StackedTransformer([build_model(cfg, seed=s) for s in range(len(HP))])
        made.append(StackedAdamW(stacked, decayed_names(build_model(cfg, seed=0)), states))
    return made


def test_stacked_adamw_equals_the_per_member_fused_kernel():
    """Ten steps of four members with different lr, betas, eps and decay (two of them sharing a
    setting, so one kernel call updates both), from random gradients of very different scales:
    weights and moments equal the old per-member kernel calls' bit for bit."""
    new, old = stacked_pair()
    assert torch.equal(new.flat, old.flat)
    assert 0 < new.n_decayed < new.flat.shape[1]
    gen = torch.Generator().manual_seed(0)
    scales = torch.tensor([1.0, 1e-3, 30.0, 1e-6]).view(-1, 1)
    for k in range(1, 11):
        g = torch.randn(new.flat.shape, generator=gen) * scales
        hp = [h | {"lr": h["lr"] * (1 - k / 20)} for h in HP]  # each its own schedule
        new.step(g.clone(), hp)
        reference_step(old, [k] * len(HP), g.clone(), hp)
    assert torch.equal(new.exp_avg, old.exp_avg)
    assert torch.equal(new.exp_avg_sq, old.exp_avg_sq)
    assert torch.equal(new.flat, old.flat)
    assert new.steps == [10] * len(HP)


def test_members_that_share_a_setting_share_a_kernel_call(monkeypatch):
    """An lr x seed grid's members of one lr are updated by one call per column group."""
    new, _ = stacked_pair()
    calls = []
    fused = torch._fused_adamw_

    def counting(params, *args, **kwargs):
        calls.append(len(params))
        return fused(params, *args, **kwargs)

    monkeypatch.setattr(torch, "_fused_adamw_", counting)
    new.step(torch.randn(new.flat.shape), HP)
    # decayed columns: 3 distinct settings (members 0 and 2 share); undecayed: the same 3
    assert sorted(calls) == [1, 1, 1, 1, 2, 2]


def test_stacked_adamw_resumes_each_member_at_its_own_step():
    """Members restored at different steps (a group resumed from checkpoints written at
    different steps) get their own bias corrections; their state reads back as torch's AdamW
    keeps it."""
    new, old = stacked_pair()
    gen = torch.Generator().manual_seed(1)
    for k in range(1, 4):  # every member at step 3
        g = torch.randn(new.flat.shape, generator=gen)
        new.step(g.clone(), HP)
        reference_step(old, [k] * len(HP), g.clone(), HP)
    states = [new.member_state(i) for i in range(len(HP))]
    for name, slot in states[0].items():
        assert slot["step"].dtype == torch.float32 and slot["step"].shape == ()
        assert slot["exp_avg"].shape == new.model.shapes[name][1:] or slot["exp_avg"].dim() >= 0
    states[2] = {}  # a member that starts fresh beside resumed ones
    resumed, _ = stacked_pair(states)
    resumed.flat.copy_(new.flat)
    assert resumed.steps == [3, 3, 0, 3]
    old.exp_avg[2].zero_()
    old.exp_avg_sq[2].zero_()
    old.flat.copy_(new.flat)
    g = torch.randn(new.flat.shape, generator=gen)
    resumed.step(g.clone(), HP)
    reference_step(old, [4, 4, 1, 4], g.clone(), HP)
    assert torch.equal(resumed.exp_avg, old.exp_avg)
    assert torch.equal(resumed.flat, old.flat)
    resumed.keep([3, 0])  # the step counts follow their members
    assert resumed.steps == [4, 4]
    assert resumed.member_state(0)["tok_emb.weight"]["step"].item() == 4.0


def test_stacked_adamw_is_torch_adamw():
    """Each member's update is `torch.optim.AdamW(fused=True)`'s on its own model, within float
    rounding (a single run's kernel calls split its weights per parameter, not per member)."""
    new, _ = stacked_pair()
    cfg = new.model.cfg
    members = [build_model(cfg, seed=s) for s in range(len(HP))]
    opts = [adamw(m, TrainConfig(**{k: h[k] for k in ("lr", "weight_decay", "beta1", "beta2",
                                                      "eps")}), fused=True)
            for m, h in zip(members, HP, strict=True)]
    gen = torch.Generator().manual_seed(2)
    for _ in range(4):
        for p in new.model.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        named = dict(new.model.named_parameters())
        for i, (m, opt) in enumerate(zip(members, opts, strict=True)):
            for name, p in m.named_parameters():
                p.grad = named[name].grad[i].reshape(p.shape).clone()
            opt.step()
        new.step(new.gather_grads(), HP)
    for i, m in enumerate(members):
        got = new.model.member_tensors(i)
        for name, p in m.named_parameters():
            torch.testing.assert_close(got[name], p.detach(), rtol=1e-6, atol=1e-7)


# -- what the stacked engine honours ----------------------------------------------------------

def test_every_config_field_is_classified():
    """Every field of TrainConfig, ModelConfig and FinetuneConfig is in exactly one of the
    stacked engine's lists: a new field fails here until someone says what stacking does with
    it."""
    from normlab.finetune import FinetuneConfig

    train = [group.PER_MEMBER_TRAIN, set(group.SHARED_TRAIN), set(group.UNSTACKABLE_TRAIN)]
    model = [group.SHARED_MODEL, set(group.UNSTACKABLE_MODEL)]
    finetune = [group.PER_MEMBER_FINETUNE, set(group.SHARED_FINETUNE),
                set(group.UNSTACKABLE_FINETUNE)]
    for fields, lists in ((TrainConfig.model_fields, train), (ModelConfig.model_fields, model),
                          (FinetuneConfig.model_fields, finetune)):
        listed = [f for fs in lists for f in fs]
        assert len(listed) == len(set(listed)), "a field is in two lists"
        assert set(listed) == set(fields), (set(fields) - set(listed), set(listed) - set(fields))


class AmsgradTrainConfig(TrainConfig):
    """TrainConfig with an optimizer option added the obvious way (the issue's scenario)."""

    amsgrad: bool = False


def test_an_unimplemented_option_is_refused_by_name():
    """The issue's scenario: an optimizer option (amsgrad) added to TrainConfig and the single
    run's AdamW, but not to the stacked engine. A run that sets it cannot be stacked, the reason
    names the field, a sweep trains it separately and says why, and it gets its own stack key;
    left at its default it changes nothing."""
    plain = load_run_config(None, TINY)

    def with_train(**update):
        train = AmsgradTrainConfig(**plain.train.model_dump() | update)
        return plain.model_copy(update={"train": train})

    odd, off = with_train(amsgrad=True), with_train(amsgrad=False)
    assert run_unstackable_reason(off) is None and stack_key(off) == stack_key(plain)
    reason = run_unstackable_reason(odd)
    assert reason == ("train.amsgrad=True (not implemented by the stacked engine: the run trains "
                      "alone)")
    assert stack_key(odd) != stack_key(plain)
    with pytest.raises(GroupError, match="cannot be stacked: train.amsgrad=True"):
        check_group([plain, odd])
    runs = [PlannedRun(i, {}, c) for i, c in enumerate([plain, odd, with_train(lr=3e-3)])]
    tasks, notes = plan_tasks(runs, "stacked", workers=1)
    assert [type(t) for t in tasks] == [GroupTask, RunTask]
    assert f"1 run(s) separate: {reason}" in notes


def test_declared_unstackable_settings_have_reasons():
    assert run_unstackable_reason(load_run_config(None, TINY)) is None
    for option, expected in [
            ("train.grad_accum=2", "train.grad_accum=2 (gradient accumulation"),
            ("train.deterministic=true", "train.deterministic=True (deterministic algorithms"),
            ("model.dropout=0.1", "model: dropout=0.1")]:
        reason = run_unstackable_reason(load_run_config(None, TINY + [option]))
        assert reason.startswith(expected), (option, reason)


def test_per_member_settings_may_differ_and_shared_ones_may_not():
    base = load_run_config(None, TINY)
    for name in sorted(group.PER_MEMBER_TRAIN):
        assert name not in json.loads(stack_key(base))["train"], name
    for name in group.SHARED_TRAIN:
        assert name in json.loads(stack_key(base))["train"], name
    other = load_run_config(None, TINY + ["train.lr=3e-3", "train.seed=2", "train.beta2=0.99",
                                          "train.keep_checkpoints=true", "train.name=x"])
    assert stack_key(other) == stack_key(base)
    assert stack_key(load_run_config(None, TINY + ["train.eval_batches=3"])) != stack_key(base)


def test_a_group_keeps_checkpoint_weights(tmp_path):
    """`keep_checkpoints` is honoured per member by the stacked engine, as by a run alone."""
    cfgs = [load_run_config(None, TINY + m) for m in
            (["train.keep_checkpoints=true"], ["train.lr=3e-3"])]
    train_group(cfgs, tmp_path)
    assert kept_steps(tmp_path / cfgs[0].run_id()) == [3]
    assert kept_steps(tmp_path / cfgs[1].run_id()) == []


# -- checkpoints --------------------------------------------------------------------------------

def test_a_group_checkpoint_resumes_as_one_run_would(tmp_path):
    """A group checkpoint is a run's (keyed `{param}.{slot}`, step as float32): the stacked
    optimizer reads a member's back as torch's AdamW state and a resumed group continues the
    uninterrupted group's curves exactly."""
    cfgs = [load_run_config(None, TINY + m) for m in (["train.lr=3e-3"], ["train.seed=1"])]
    full = train_group(cfgs, tmp_path / "full")
    train_group(cfgs, tmp_path / "part", interrupt_at=3)
    tensors = load_file(tmp_path / "part" / cfgs[0].run_id() / "checkpoint" /
                        "optimizer.safetensors")
    steps = {k: v for k, v in tensors.items() if k.endswith(".step")}
    assert steps and all(v.dtype == torch.float32 and v.item() == 3 for v in steps.values())
    rest = train_group(cfgs, tmp_path / "part")
    for cfg in cfgs:
        assert rest[cfg.run_id()]["val_loss"] == full[cfg.run_id()]["val_loss"]
        a = load_file(tmp_path / "full" / cfg.run_id() / "checkpoint" / "model.safetensors")
        b = load_file(tmp_path / "part" / cfg.run_id() / "checkpoint" / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert not math.isnan(full[cfgs[0].run_id()]["val_loss"])
