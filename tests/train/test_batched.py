"""Stacked training: M runs of one model shape as one model match their separate runs; each keeps
its own folder, divergence, resume; sweeps group runs by engine."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from normlab.config import ConfigError, load_run_config, make_model_config
from normlab.nn import build_model
from normlab.nn.stacked import StackedTransformer
from normlab.sweep import SpecError, plan_sweep, run_sweep
from normlab.sweep.grouping import GroupTask, RunTask, plan_tasks
from normlab.train import read_summary, train_run
from normlab.train.group import GroupError, check_group, run_unstackable_reason, train_group
from normlab.train.logging import read_metrics
from normlab.train.machine import AUTO_CPU_WORK_PER_THREAD
from normlab.train.optim import param_groups
from normlab.train.stacked_adamw import StackedAdamW

TINY = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=8", "train.eval_batches=2", "train.log_every=1",
        "train.eval_every=4", "train.steps=12", "train.checkpoint_every=5", "train.device=cpu"]
# Runs this short end above the byte unigram entropy: they come out `stalled`, not `completed`.
# members differing in lr, warmup, schedule, seed, clipping and weight decay
MEMBERS = [["train.lr=3e-3", "train.warmup=2"],
           ["train.lr=1e-3", "train.seed=1", "train.schedule=linear"],
           ["train.lr=1e-2", "train.warmup=5", "train.seed=2", "train.grad_clip=null",
            "train.weight_decay=0"]]
COMPARED = ("train_loss", "grad_norm", "lr", "val_loss", "token_share")


def configs(*extra: str, members=MEMBERS):
    return [load_run_config(None, TINY + list(extra) + m) for m in members]


def metrics(run_dir):
    return read_metrics(run_dir / "metrics.jsonl")


def assert_same_run(a_dir, b_dir, weights_rtol=1e-4):
    """Two folders of the same run agree within float tolerance: every logged value, the final
    weights and the optimizer state (same keys, same format). Weights are compared as a whole:
    a parameter whose gradient is zero up to rounding (the attention key bias: softmax ignores
    it) gets Adam steps of +-lr from rounding noise in any two implementations."""
    a, b = metrics(a_dir), metrics(b_dir)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert set(ra) == set(rb)
        for key in COMPARED + tuple(k for k in ra if k.startswith("blocks.")):
            if key in ra:
                assert rb[key] == pytest.approx(ra[key], rel=1e-4, abs=1e-6), (key, ra["step"])
    for name in ("model", "optimizer"):
        ta = load_file(a_dir / "checkpoint" / f"{name}.safetensors")
        tb = load_file(b_dir / "checkpoint" / f"{name}.safetensors")
        assert ta.keys() == tb.keys()
        for key in ta:
            assert ta[key].dtype == tb[key].dtype and ta[key].shape == tb[key].shape, key
        diff = sum((ta[k].double() - tb[k].double()).square().sum() for k in ta).sqrt()
        size = sum(ta[k].double().square().sum() for k in ta).sqrt()
        assert diff <= weights_rtol * size, name
    sa, sb = read_summary(a_dir), read_summary(b_dir)
    assert (sa["outcome"], sa["step"]) == (sb["outcome"], sb["step"])


# -- the stacked model -----------------------------------------------------------------------

@pytest.mark.parametrize("options", [{}, {"positions": "rope", "norm": "rmsnorm"},
                                     {"norm": "dyt", "residual_attention": True}])
def test_stacked_model_is_its_members(options):
    """Loss and gradient of each member equal its own model's, for every placement; a member
    with NaN weights touches no other member."""
    for placement in ("pre", "post", "sandwich", "deepnorm", "admin", "resi_dual", "b2t",
                      "hybrid", "hybrid_star", "rezero", "lns", "siamese"):
        if placement.startswith("hybrid") and options.get("norm") == "dyt":
            continue
        cfg = make_model_config(placement=placement, n_blocks=2, d_model=16, n_heads=2,
                                max_seq_len=8, **options)
        x, y = torch.randint(0, 256, (3, 2, 8)), torch.randint(0, 256, (3, 2, 8))
        members = [build_model(cfg, seed=s) for s in range(3)]
        stacked = StackedTransformer([build_model(cfg, seed=s) for s in range(3)])
        with torch.no_grad():
            for p in stacked.parameters():
                p[1].fill_(float("nan"))
        out = stacked(x, y)
        out.loss.sum().backward()
        assert math.isnan(out.loss[1].item())
        for i in (0, 2):
            ref = members[i](x[i], y[i]).loss
            ref.backward()
            assert out.loss[i].item() == pytest.approx(ref.item(), abs=1e-5), placement
            for name, p in members[i].named_parameters():
                got = dict(stacked.named_parameters())[name].grad[i].reshape(p.shape)
                assert torch.allclose(got, p.grad, rtol=1e-4, atol=1e-6), (placement, name)
            assert stacked.member_tensors(i).keys() == dict(members[i].named_parameters()).keys()


def test_stacked_adamw_is_adamw():
    """Per-member hyperparameters, weight decay only on weight matrices, clipping by each
    member's own norm: the same updates as torch.optim.AdamW and clip_grads_with_norm_."""
    cfg = make_model_config(placement="admin", n_blocks=2, d_model=16, n_heads=2, max_seq_len=8)
    hp = [dict(lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, clip=1.0),
          dict(lr=3e-3, weight_decay=0.0, beta1=0.8, beta2=0.99, eps=1e-6, clip=None),
          dict(lr=1e-3, weight_decay=0.5, beta1=0.9, beta2=0.999, eps=1e-8, clip=0.5)]
    members = [build_model(cfg, seed=s) for s in range(3)]
    stacked = StackedTransformer([build_model(cfg, seed=s) for s in range(3)])
    opts = [torch.optim.AdamW(param_groups(m, h["weight_decay"]), lr=h["lr"],
                              betas=(h["beta1"], h["beta2"]), eps=h["eps"])
            for m, h in zip(members, hp, strict=True)]
    decay = {id(p) for p in param_groups(members[0], 0.1)[0]["params"]}
    decayed = {n for n, p in members[0].named_parameters() if id(p) in decay}
    optim = StackedAdamW(stacked, decayed)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        for p in stacked.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        grads = optim.gather_grads()
        norms = torch.linalg.vector_norm(grads, dim=1)
        for i, (m, opt, h) in enumerate(zip(members, opts, hp, strict=True)):
            params = list(m.parameters())
            for name, p in m.named_parameters():
                p.grad = dict(stacked.named_parameters())[name].grad[i].reshape(p.shape).clone()
            total = torch.nn.utils.get_total_norm([p.grad for p in params])
            assert norms[i].item() == pytest.approx(total.item(), rel=1e-5)
            if h["clip"] is not None:
                torch.nn.utils.clip_grads_with_norm_(params, h["clip"], total)
            opt.step()
        optim.clip_(grads, norms.tolist(), [h["clip"] for h in hp])
        optim.step(grads, hp)
    for i, m in enumerate(members):
        got = stacked.member_tensors(i)
        state = optim.member_state(i)
        for name, p in m.named_parameters():
            assert torch.allclose(got[name], p.detach(), rtol=1e-5, atol=1e-7), (i, name)
            for slot in ("exp_avg", "exp_avg_sq"):
                ref = opts[i].state[p][slot]
                assert torch.allclose(state[name][slot], ref, rtol=1e-5, atol=1e-9), (i, name)
            assert state[name]["step"].item() == 5
    before = [stacked.member_tensors(i) for i in range(3)]
    optim.keep([2, 0])  # dropping a member keeps the others' weights and state
    assert stacked.members == 2
    for row, i in enumerate([2, 0]):
        after = stacked.member_tensors(row)
        assert all(torch.equal(after[k], before[i][k]) for k in after)
        ref = opts[i].state[members[i].tok_emb.weight]["exp_avg"]
        assert torch.allclose(optim.member_state(row)["tok_emb.weight"]["exp_avg"], ref,
                              rtol=1e-5, atol=1e-9)


def test_unstackable_options_have_reasons():
    assert run_unstackable_reason(load_run_config(None, TINY)) is None
    for option, word in [("model.dropout=0.1", "dropout"), ("train.grad_accum=2", "accumulation"),
                         ("train.activation_checkpointing=true", "checkpointing")]:
        assert word in run_unstackable_reason(load_run_config(None, TINY + [option])), option
    assert run_unstackable_reason(load_run_config(None, TINY + ["train.compile=true"])) is None
    enc = load_run_config(None, TINY + ["model.kind=encoder", "model.norm=batchnorm"])
    assert "encoder" in run_unstackable_reason(enc)
    with pytest.raises(GroupError, match="must share"):
        check_group(configs() + [load_run_config(None, TINY + ["train.batch_size=4"])])
    with pytest.raises(GroupError, match="cannot be stacked.*dropout"):
        check_group(configs("model.dropout=0.1"))


# -- a stacked group against separate runs ------------------------------------------------------

@pytest.mark.parametrize("placement", ["pre", "post", "admin", "resi_dual", "siamese"])
def test_group_matches_separate_runs(tmp_path, placement):
    cfgs = configs(f"model.placement={placement}")
    group = train_group(cfgs, tmp_path / "group")
    for cfg in cfgs:
        alone = train_run(cfg, tmp_path / "alone", progress=False)
        s = group[cfg.run_id()]
        assert s["outcome"] == alone["outcome"] == "stalled"
        assert s["engine"] == "stacked" and s["group_size"] == 3
        assert s["val_loss"] == pytest.approx(alone["val_loss"], rel=1e-5)
        run_dir = tmp_path / "group" / cfg.run_id()
        assert (run_dir / "config.yaml").exists() and (run_dir / "tb").exists()
        assert_same_run(tmp_path / "alone" / cfg.run_id(), run_dir)


def test_diverged_member_stops_alone(tmp_path):
    blowup = ["train.lr=50", "train.grad_clip=null", "train.schedule=constant", "train.steps=40",
              "train.eval_every=20", "train.checkpoint_every=10"]
    members = [MEMBERS[0], blowup, MEMBERS[1]]
    cfgs = configs(members=members)
    group = train_group(cfgs, tmp_path / "group")
    s = group[cfgs[1].run_id()]
    assert s["outcome"] == "diverged" and s["reason"] in ("nonfinite_loss", "nonfinite_grad",
                                                        "loss_spike")
    assert 1 <= s["step"] < 40
    rows = metrics(tmp_path / "group" / cfgs[1].run_id())
    assert rows[-1]["step"] == s["step"] and rows[-1]["diverged"] == s["reason"]
    for cfg in (cfgs[0], cfgs[2]):  # the others trained on as if alone
        train_run(cfg, tmp_path / "alone", progress=False)
        assert_same_run(tmp_path / "alone" / cfg.run_id(), tmp_path / "group" / cfg.run_id())
    # finished members are results: asking again trains nothing
    assert train_group(cfgs, tmp_path / "group") == group


def test_group_resumes_and_members_continue_alone(tmp_path):
    cfgs = configs()
    full = train_group(cfgs, tmp_path / "full")
    part = train_group(cfgs, tmp_path / "part", interrupt_at=7)
    assert {s["outcome"] for s in part.values()} == {"interrupted"}
    state = json.loads((tmp_path / "part" / cfgs[0].run_id() / "checkpoint" /
                        "trainer_state.json").read_text())
    assert state["step"] == 7
    # member 0 continues alone (as `normlab train --resume` would), the others as a group
    alone = train_run(cfgs[0], tmp_path / "part", resume="require", progress=False)
    assert alone["outcome"] == "stalled" and alone["step"] == 12
    rest = train_group(cfgs, tmp_path / "part")
    assert rest[cfgs[0].run_id()] == alone  # finished: skipped
    for cfg in cfgs:
        assert full[cfg.run_id()]["outcome"] == rest[cfg.run_id()]["outcome"] == "stalled"
        assert_same_run(tmp_path / "full" / cfg.run_id(), tmp_path / "part" / cfg.run_id())
    # the resumed group continues the uninterrupted group's curves bit for bit
    for cfg in cfgs[1:]:
        a = [{k: r[k] for k in COMPARED if k in r}
             for r in metrics(tmp_path / "full" / cfg.run_id())]
        b = [{k: r[k] for k in COMPARED if k in r}
             for r in metrics(tmp_path / "part" / cfg.run_id())]
        assert a == b


def test_members_at_different_steps_and_a_broken_checkpoint(tmp_path):
    cfgs = configs()
    train_run(cfgs[0], tmp_path, progress=False, interrupt_at=3)
    broken = tmp_path / cfgs[2].run_id() / "checkpoint"
    broken.mkdir(parents=True)
    (broken.parent / "config.yaml").write_text(cfgs[2].to_yaml())
    (broken / "trainer_state.json").write_text("{not json")
    out = train_group(cfgs, tmp_path)
    assert out[cfgs[2].run_id()]["outcome"] == "failed"
    assert out[cfgs[2].run_id()]["reason"] == "CheckpointError"
    for cfg in cfgs[:2]:
        assert out[cfg.run_id()]["outcome"] == "stalled"
        train_run(cfg, tmp_path / "alone", progress=False)
        assert_same_run(tmp_path / "alone" / cfg.run_id(), tmp_path / cfg.run_id())


def test_a_failure_after_a_member_finished_leaves_its_result(tmp_path, monkeypatch):
    """Member 0 ends at step 5; in the same step member 1's checkpoint fails: member 0 keeps its
    outcome (stalled, at 5 steps), member 1 records the failure."""
    from normlab.train import group

    cfgs = configs(members=[["train.steps=5"], ["train.lr=1e-3", "train.steps=12"]])
    real = group._GroupLoop.checkpoint

    def checkpoint(loop, row):
        if loop.active[row].run_id == cfgs[1].run_id():
            raise OSError("disk full")
        real(loop, row)

    monkeypatch.setattr(group._GroupLoop, "checkpoint", checkpoint)
    out = train_group(cfgs, tmp_path)
    assert out[cfgs[0].run_id()]["outcome"] == "stalled" and out[cfgs[0].run_id()]["step"] == 5
    assert (out[cfgs[1].run_id()]["outcome"], out[cfgs[1].run_id()]["reason"]) == (
        "failed", "OSError")
    on_disk = json.loads((tmp_path / cfgs[0].run_id() / "summary.json").read_text())
    assert on_disk["outcome"] == "stalled"


# -- sweeps ----------------------------------------------------------------------------------

def planned(n_lrs: int, *extra: str, engine: str = "auto"):
    lrs = ", ".join(f"{1e-3 * (i + 1):g}" for i in range(n_lrs))
    sets = "\n".join(f"  {k}: {v}" for k, v in (e.split("=") for e in extra))
    return plan_sweep(f"""
engine: {engine}
base:
  model: {{n_blocks: 2, d_model: 32, n_heads: 2, max_seq_len: 32}}
  data: {{seq_len: 32}}
  train: {{steps: 4, batch_size: 8, eval_batches: 1}}
axes:
  model.placement: [pre, post]
  train.lr: [{lrs}]
{sets}
""")


def test_grouping_by_engine():
    plan = planned(4)
    tasks, notes = plan_tasks(plan.runs, "auto", workers=2)
    assert all(isinstance(t, GroupTask) for t in tasks)
    assert [len(t.members) for t in tasks] == [2, 2, 2, 2]  # 4 runs per shape, 2 workers
    shapes = [{json.dumps(m.config["model"]) for m in t.members} for t in tasks]
    assert all(len(s) == 1 for s in shapes) and "4 stacked group(s)" in notes[0]
    tasks, _ = plan_tasks(planned(10).runs, "stacked", workers=1)
    assert sorted(len(t.members) for t in tasks) == [5, 5, 5, 5]  # at most 8 to a group
    tasks, _ = plan_tasks(plan.runs, "separate", workers=2)
    assert all(isinstance(t, RunTask) for t in tasks) and len(tasks) == 8
    tasks, notes = plan_tasks(planned(2, "model.dropout=[0.1]").runs, "stacked", workers=1)
    assert all(isinstance(t, RunTask) for t in tasks) and "dropout" in notes[0]
    wide = planned(2, "model.d_model=[256]", "model.max_seq_len=[128]", "data.seq_len=[128]")
    assert AUTO_CPU_WORK_PER_THREAD * 8 < 256 * 8 * 128
    tasks, notes = plan_tasks(wide.runs, "auto", workers=1, threads=8)
    assert all(isinstance(t, RunTask) for t in tasks) and "auto" in notes[0]
    # the limit grows with the threads a run gets
    small = planned(2, "model.d_model=[64]", "train.batch_size=[16]")  # 64*16*32 = 32768
    assert all(isinstance(t, RunTask) for t in plan_tasks(small.runs, "auto", 1, 1)[0])
    assert all(isinstance(t, GroupTask) for t in plan_tasks(small.runs, "auto", 1, 2)[0])
    tasks, _ = plan_tasks(wide.runs, "auto", workers=1, cuda_available=True)
    assert all(isinstance(t, GroupTask) for t in tasks)
    tasks, _ = plan_tasks(wide.runs, "stacked", workers=1)
    assert all(isinstance(t, GroupTask) for t in tasks)


def test_bad_engine_is_named():
    with pytest.raises(SpecError, match="engine: 'fast' is not one of auto, stacked, separate"):
        planned(1, engine="fast")
    with pytest.raises(ConfigError, match="engine"):
        run_sweep(planned(1), "/nonexistent", engine="turbo", progress=False)


def test_stacked_sweep_on_local_workers(tmp_path):
    plan = plan_sweep("""
engine: stacked
base:
  model: {n_blocks: 2, d_model: 32, n_heads: 2, max_seq_len: 32}
  data: {seq_len: 32}
  train: {steps: 20, batch_size: 8, eval_batches: 2, eval_every: 10, checkpoint_every: 5,
          schedule: constant, grad_clip: null, device: cpu}
axes:
  train.lr: [3e-3, 50, 1e-3]
""")
    result = run_sweep(plan, tmp_path, workers=1, progress=False)
    outcomes = {r.config.train.lr: result.outcomes[r.run_id] for r in plan.runs}
    assert outcomes == {3e-3: "stalled", 50: "diverged", 1e-3: "stalled"}
    for run in plan.runs:
        summary = read_summary(tmp_path / run.run_id)
        assert summary["engine"] == "stacked" and summary["group_size"] == 3
    again = run_sweep(plan, tmp_path, workers=1, progress=False)
    assert again.skipped == 3 and again.outcomes == result.outcomes
