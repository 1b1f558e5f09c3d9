"""`train.optimizer: muon` (`normlab.train.optim.MuonWithAdamW`): torch's Muon (Jordan et al.
2024) for the 2-D matrices inside the blocks, at AdamW's update RMS (`adjust_lr_fn=
"match_rms_adamw"`, Liu et al. 2025, arXiv 2502.16982), and AdamW for every other parameter.

Pinned here: which parameters Muon takes; a step equals torch's Muon and AdamW built by hand over
those parameters; the lr schedule (with CompleteP's lr_scale) reaches both; nGPT's renormalization
follows the step; run ids; a bit-for-bit resume; the stacked engine's refusal; a sweep over the
axis; a short run learns.
"""

from __future__ import annotations

import copy
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

from normlab.config import ConfigError, TrainConfig, load_run_config, make_model_config  # noqa: E402
from normlab.finetune.config import FinetuneConfig, FinetuneError  # noqa: E402
from normlab.nn import build_model  # noqa: E402
from normlab.nn.plan import completep_lr_scale  # noqa: E402
from normlab.nn.sphere import sphere_matrices  # noqa: E402
from normlab.train.group import GroupError, check_group, run_unstackable_reason  # noqa: E402
from normlab.train.optim import MuonWithAdamW, adamw, build_optimizer, muon_names  # noqa: E402
from normlab.train.step import set_lr  # noqa: E402

V, D, H, L, T, B = 40, 32, 2, 2, 12, 4
MUON = TrainConfig(optimizer="muon", lr=0.02, weight_decay=0.1)
# the projections inside each block, by name: what Muon's authors mean by the hidden matrices
PROJECTIONS = ("attn.fn.qkv.weight", "attn.fn.proj.weight", "mlp.fn.fc_in.weight",
               "mlp.fn.fc_out.weight")


def model_of(seed: int = 0, **fields):
    cfg = {"vocab_size": V, "d_model": D, "n_heads": H, "n_blocks": L, "max_seq_len": 16,
           "tie_embeddings": False} | fields
    return build_model(make_model_config(**cfg), seed=seed)


def hidden(n_blocks: int = L) -> set[str]:
    return {f"blocks.{i}.{p}" for i in range(n_blocks) for p in PROJECTIONS}


def backward(model, seed: int) -> None:
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))
    model(idx, idx).loss.backward()


def names_of(model, params) -> set[str]:
    ids = {id(p) for p in params}
    return {n for n, p in model.named_parameters() if id(p) in ids}


@pytest.mark.parametrize("fields", [{}, {"placement": "rezero", "mlp": "swiglu", "qk_norm": True},
                                    {"depth_param": "completep", "depth_base": 1}])
def test_muon_takes_the_projections_inside_the_blocks(fields):
    """Muon: exactly the attention and MLP projections; AdamW: the embeddings, the head, norms,
    biases, gates (and Q/K norms); each parameter in exactly one of the two."""
    model = model_of(**fields)
    assert muon_names(model) == hidden()
    opt = build_optimizer(model, MUON)
    assert isinstance(opt, MuonWithAdamW)
    to_muon = names_of(model, [p for g in opt.muon.param_groups for p in g["params"]])
    to_adamw = names_of(model, [p for g in opt.adamw.param_groups for p in g["params"]])
    assert to_muon == hidden()
    assert to_adamw == {n for n, _ in model.named_parameters()} - hidden()
    assert {"tok_emb.weight", "lm_head.weight", "blocks.0.attn.fn.qkv.bias"} <= to_adamw
    assert len(opt.param_groups) == len(opt.adamw.param_groups) + len(opt.muon.param_groups)
    # the head, a matrix outside the blocks, stays decayed under AdamW
    decayed = names_of(model, [p for g in opt.adamw.param_groups if g["weight_decay"]
                               for p in g["params"]])
    assert "lm_head.weight" in decayed and "tok_emb.weight" not in decayed
    assert all(g["weight_decay"] == 0.1 for g in opt.muon.param_groups)
    assert all(g["adjust_lr_fn"] == "match_rms_adamw" for g in opt.muon.param_groups)


def reference_step(model, tc: TrainConfig, lrs: list[float]) -> None:
    """torch's Muon over the projections named by hand, torch's AdamW over the rest (decay on the
    head only), at the schedule's `lrs`: the optimizer the docs describe, built without
    `normlab.train.optim`."""
    params = dict(model.named_parameters())
    muon = torch.optim.Muon([params[n] for n in sorted(hidden())], lr=tc.lr,
                            weight_decay=tc.weight_decay, momentum=0.95, nesterov=True,
                            ns_steps=5, adjust_lr_fn="match_rms_adamw")
    rest = [n for n in params if n not in hidden()]
    opt = torch.optim.AdamW(
        [{"params": [params[n] for n in rest if n == "lm_head.weight"],
          "weight_decay": tc.weight_decay},
         {"params": [params[n] for n in rest if n != "lm_head.weight"], "weight_decay": 0.0}],
        lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.eps)
    for step, lr in enumerate(lrs):
        backward(model, step)
        for o in (muon, opt):
            for g in o.param_groups:
                g["lr"] = lr
            o.step()
            o.zero_grad(set_to_none=True)


def test_steps_equal_torch_muon_and_adamw_by_hand():
    """Three steps at changing lrs (momentum, AdamW's moments and the schedule all in play):
    every parameter as torch's Muon plus AdamW built by hand leave it, bit for bit. Muon at
    torch's default step length ("original"), without weight decay on the matrices, or with the
    split drawn elsewhere, would not."""
    lrs = [0.02, 0.01, 0.005]
    ours, ref = model_of(), model_of()
    opt = build_optimizer(ours, MUON)
    for step, lr in enumerate(lrs):
        backward(ours, step)
        set_lr(opt, lr)
        opt.step()
        opt.zero_grad(set_to_none=True)
    reference_step(ref, MUON, lrs)
    start = dict(model_of().named_parameters())
    for (name, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b), name
        assert not torch.equal(a, start[name]), name  # every parameter moved
    # the matrices took Muon's step: AdamW over everything leaves them elsewhere
    plain = model_of()
    plain_opt = adamw(plain, MUON.model_copy(update={"optimizer": "adamw"}))
    for step, lr in enumerate(lrs):
        backward(plain, step)
        set_lr(plain_opt, lr)
        plain_opt.step()
        plain_opt.zero_grad(set_to_none=True)
    q = "blocks.0.attn.fn.qkv.weight"
    assert not torch.allclose(dict(plain.named_parameters())[q], dict(ours.named_parameters())[q])


def test_the_schedule_reaches_both_optimizers_with_completep_scales():
    """`set_lr` sets AdamW's and Muon's groups (Muon's with CompleteP's block lr_scale); an lr of
    0 leaves every parameter where it was, so Muon really steps at the scheduled lr."""
    model = model_of(n_blocks=4, depth_param="completep", depth_base=1, depth_alpha=0.5)
    opt = build_optimizer(model, MUON)
    scale = completep_lr_scale(4, 1, 0.5)
    assert scale == 0.5  # (4/1)^(0.5-1), exact in floating point
    set_lr(opt, 0.04)
    (muon_group,) = opt.muon.param_groups
    assert muon_group["lr"] == 0.02
    assert names_of(model, muon_group["params"]) == hidden(4)
    assert {g["lr"] for g in opt.adamw.param_groups} == {0.04, 0.02}
    before = copy.deepcopy(model)
    backward(model, 0)
    set_lr(opt, 0.0)
    opt.step()
    for (name, a), b in zip(model.named_parameters(), before.parameters(), strict=True):
        assert torch.equal(a, b), name
    backward(model, 1)
    set_lr(opt, 0.04)
    opt.step()
    moved = {n for (n, a), b in zip(model.named_parameters(), before.parameters(), strict=True)
             if not torch.equal(a, b)}
    assert hidden(4) <= moved


def test_ngpt_renormalizes_after_the_muon_step():
    """nGPT's matrices back on the sphere after each step of both optimizers."""
    model = model_of(placement="ngpt")
    opt = build_optimizer(model, MUON)
    assert len(opt._optimizer_step_post_hooks) == 1
    backward(model, 0)
    opt.step()
    for w, dim in sphere_matrices(model):
        norms = w.detach().float().norm(dim=dim)
        torch.testing.assert_close(norms, torch.ones_like(norms))


def test_state_dict_round_trip_numbers_both_optimizers():
    """`state_dict` numbers AdamW's parameters then Muon's; `load_state_dict` puts each state
    back on its parameter."""
    model = model_of()
    opt = build_optimizer(model, MUON)
    backward(model, 0)
    opt.step()
    sd = opt.state_dict()
    n = sum(len(g["params"]) for g in sd["param_groups"])
    assert sorted(sd["state"]) == list(range(n))
    assert len({k for s in sd["state"].values() for k in s} & {"momentum_buffer"}) == 1
    other = build_optimizer(model, MUON)
    other.load_state_dict(sd)
    for p, s in opt.state.items():
        for k, v in s.items():
            assert torch.equal(other.state[p][k], v)
    assert set(other.muon.state) == {p for g in other.muon.param_groups for p in g["params"]}


def test_config_axis_run_ids_and_refusals():
    base = load_run_config(None, [])
    assert base.run_id() == "pre-L6-d256-b018512572e8"  # the id it had before the field
    assert load_run_config(None, ["train.optimizer=adamw"]).run_id() == base.run_id()
    muon = load_run_config(None, ["train.optimizer=muon"])
    assert muon.run_id() != base.run_id()
    with pytest.raises(ConfigError, match="did you mean 'muon'"):
        load_run_config(None, ["train.optimizer=muom"])
    with pytest.raises(ValueError, match="AdamW only"):
        adamw(model_of(), MUON)
    with pytest.raises(FinetuneError, match="fine-tuning trains with AdamW only"):
        FinetuneConfig.parse({"optimizer": "muon"})


def test_the_stacked_engine_refuses_muon_with_the_reason():
    from normlab.sweep import plan_sweep
    from normlab.sweep.grouping import GroupTask, RunTask, plan_tasks

    muon = load_run_config(None, ["train.optimizer=muon"])
    reason = run_unstackable_reason(muon)
    assert reason.startswith("train.optimizer=muon") and "Newton-Schulz" in reason
    assert "StackedAdamW" in reason
    assert run_unstackable_reason(load_run_config(None, [])) is None
    with pytest.raises(GroupError, match="Newton-Schulz"):
        check_group([muon, load_run_config(None, ["train.optimizer=muon", "train.lr=2e-3"])])
    # a sweep over the axis: one run per optimizer and lr, ids apart; AdamW's runs stack,
    # Muon's train alone, saying why
    plan = plan_sweep("""
base:
  model: {n_blocks: 2, d_model: 32, n_heads: 2, max_seq_len: 32}
  data: {seq_len: 32}
  train: {steps: 5, batch_size: 4, device: cpu}
axes:
  train.optimizer: [adamw, muon]
  train.lr: [1e-3, 3e-3]
""")
    assert [r.config.train.optimizer for r in plan.runs] == ["adamw"] * 2 + ["muon"] * 2
    assert len(set(plan.run_ids)) == 4
    tasks, notes = plan_tasks(plan.runs, "stacked", 1)
    assert [type(t) for t in tasks] == [GroupTask, RunTask, RunTask]
    assert {m.run_id for m in tasks[0].members} == set(plan.run_ids[:2])
    assert any("2 run(s) separate: train.optimizer=muon" in line for line in notes)


TINY = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=8", "train.eval_batches=2", "train.log_every=1",
        "train.device=cpu", "train.optimizer=muon", "train.lr=3e-3", "train.warmup=2"]


def test_muon_run_resumes_bit_for_bit(tmp_path):
    """A muon run interrupted and resumed records every loss, lr, grad norm and val loss of the
    uninterrupted run: its checkpoint holds Muon's momentum buffers beside AdamW's moments."""
    from normlab.train import train_run
    from normlab.train.logging import read_metrics

    args = TINY + ["train.steps=10", "train.eval_every=3"]

    def records(run_dir):
        return [{k: v for k, v in r.items() if k not in ("time_s", "tokens_per_s")}
                for r in read_metrics(run_dir / "metrics.jsonl")]

    full = train_run(load_run_config(None, args), tmp_path / "a", progress=False)
    part = train_run(load_run_config(None, args), tmp_path / "b", progress=False,
                     interrupt_at=4)
    assert part["outcome"] == "interrupted" and part["step"] == 4
    ckpt = tmp_path / "b" / part["run_id"] / "checkpoint"
    with safe_open(str(ckpt / "optimizer.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "blocks.0.attn.fn.qkv.weight.momentum_buffer" in keys
    assert "lm_head.weight.exp_avg_sq" in keys or "tok_emb.weight.exp_avg_sq" in keys
    assert not any(k.startswith("blocks.0.attn.fn.qkv.weight.exp_avg") for k in keys)
    assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == 4
    resumed = train_run(load_run_config(None, args), tmp_path / "b", progress=False)
    assert resumed["outcome"] == full["outcome"]
    a, b = records(tmp_path / "a" / full["run_id"]), records(tmp_path / "b" / part["run_id"])
    assert len(a) == len(b) == 10 and a == b


def test_a_short_muon_run_learns(tmp_path):
    """40 steps: the training loss falls well below its start, and every matrix Muon steps has
    moved away from its init."""
    from normlab.train import train_run
    from normlab.train.checkpoint import load_trained_model
    from normlab.train.logging import read_metrics

    cfg = load_run_config(None, TINY + ["train.steps=40", "train.eval_every=0"])
    s = train_run(cfg, tmp_path, progress=False)
    losses = [r["train_loss"] for r in read_metrics(tmp_path / s["run_id"] / "metrics.jsonl")
              if "train_loss" in r]
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < losses[0] - 1.5, losses
    _, trained = load_trained_model(tmp_path / s["run_id"])
    init = dict(build_model(cfg.model, seed=cfg.train.seed).named_parameters())
    for name, p in trained.named_parameters():
        if name in hidden(2):
            assert not torch.allclose(p, init[name]), name
