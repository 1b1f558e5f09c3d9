"""The optimizer of every training in normlab: AdamW (Loshchilov & Hutter, "Decoupled Weight
Decay Regularization", ICLR 2019) with the settings of a `TrainConfig`, or with `train.optimizer:
muon` Muon for the matrices inside the blocks and AdamW for the rest (`MuonWithAdamW`).

One home for it, so that an optimizer setting reaches every kind of training or none: a single
run (`normlab.train.trainer`), each member of a stacked group (`normlab.train.group`, through
`StackedAdamW`, which takes the same per-member settings from `adamw_hyper`), fine-tuning
(`normlab.finetune`), the update-size probe (`normlab.probe.sensitivity`) and the study's step
timing (`normlab.study.runner`). Weight decay applies to weight matrices only, never to norms,
biases, gates or embeddings (`param_groups`), as in GPT-2/nanoGPT-style training.

Two model settings reach the optimizer here, so that every training that builds its optimizer
here applies them:

- `model.depth_param: completep` (Dey et al. 2025, arXiv 2505.01618): every parameter inside the
  blocks (`blocks.*`: weight matrices, biases, norms, gates) in groups of their own whose lr is
  the schedule's times `completep_lr_scale` (`lr_scale`, which `normlab.train.step.set_lr`
  applies), and AdamW's eps times `completep_eps_scale` in every group, as the authors'
  `configure_optimizers` does (see `param_groups`).
- `placement: ngpt` (Loshchilov et al. 2024, arXiv 2410.01131): a post-step hook renormalizes
  the model's matrices along the width after every `step()` (`normlab.nn.sphere`), as the
  authors' train.py calls `normalize_matrices()` after each `optimizer.step()`.

Muon (K. Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks",
kellerjordan.github.io/posts/muon) takes the 2-D weight matrices inside the blocks (the attention
and MLP projections, `param_groups`); embeddings, the head, norms, biases and gates stay with
AdamW, as its authors recommend and torch's docs say: "Muon is an optimizer for 2D parameters of
neural network hidden layers. Other parameters, such as bias, and embedding, should be optimized
by a standard method such as AdamW." A fused projection (QKV, SwiGLU's two inputs) is one matrix
to it, as torch's Muon takes each 2-D parameter whole. Its step length is `MUON_ADJUST_LR`; its
weight decay is `TrainConfig.weight_decay`, decoupled as AdamW's (torch's Muon: theta <- theta -
lr * lambda * theta, then the orthogonalized step). Under CompleteP its matrices keep their
group's `lr_scale`; AdamW's eps scale does not reach Muon, which has no second moment.

A setting added to `TrainConfig` for the optimizer goes into `build_optimizer` and `adamw_hyper`
here; the stacked engine refuses runs that set a train field it does not list as honoured
(`normlab.train.group.PER_MEMBER_TRAIN`), so it cannot be dropped there silently.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from normlab.config import TrainConfig
from normlab.nn.plan import completep_eps_scale, completep_lr_scale
from normlab.nn.sphere import renormalize_, sphere_matrices

# The `TrainConfig` fields the optimizer reads (the schedule of lr is `normlab.train.schedules`).
OPTIMIZER_FIELDS = ("lr", "weight_decay", "beta1", "beta2", "eps")

# Muon's step length per matrix (torch.optim.Muon's `adjust_lr_fn`). torch's docs: "Moonshot's
# implementation also focuses on matching RMS of AdamW. The adjustment is computed as: gamma <-
# 0.2 gamma sqrt(max(A, B)) [...] Research results show that with this adjustment Muon can
# directly reuse the learning rate and weight decay tuned for AdamW." (Liu et al. 2025, "Muon is
# Scalable for LLM Training", arXiv 2502.16982.) So `train.lr` means one update RMS for both
# optimizers, and a depth x lr sweep over `train.optimizer` compares them on one lr axis. Under
# torch's default ("original": sqrt(max(1, A/B)), Keller Jordan's) an orthogonalized step's
# entries have an RMS of about 1/sqrt(max(A, B)), so the matrices would need an lr 0.2 sqrt(max(A,
# B)) times the AdamW rest's for the same update size, a factor that moves with the width.
MUON_ADJUST_LR = "match_rms_adamw"


def param_groups(model: nn.Module, weight_decay: float, *, muon: bool = False
                 ) -> list[dict[str, Any]]:
    """AdamW groups: decay on weight matrices only; none on norms, biases, gates, embeddings.

    A model of `depth_param: completep` has four: the decayed and the undecayed parameters
    outside the blocks (embeddings, final norm, head: lr as scheduled), then those inside the
    blocks with `lr_scale` = `completep_lr_scale` (the authors' `hidden_weight_params`,
    `hidden_ln_params`, `hidden_bias_params` at `depth_lr_scaling`); weight decay is not scaled
    with depth (their `weight_decay / width_lr_scaling`, with no width multiplier here).

    `muon`: the 2-D weight matrices inside the blocks (`blocks.*`: the attention and MLP
    projections) leave those groups for one of their own, marked `"muon": True` (decayed, and
    under CompleteP with the blocks' `lr_scale`), for Muon (Jordan et al. 2024); every other
    parameter stays in AdamW's groups."""
    cfg = getattr(model, "cfg", None)
    completep = getattr(cfg, "depth_param", "standard") == "completep"
    decay, no_decay, block_decay, block_no_decay, matrices, seen = [], [], [], [], [], set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        is_embedding = "emb" in name
        decayed = p.dim() >= 2 and not is_embedding
        inside = name.startswith("blocks.")
        if muon and inside and decayed and p.dim() == 2:
            matrices.append(p)
        elif completep and inside:
            (block_decay if decayed else block_no_decay).append(p)
        else:
            (decay if decayed else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    scale = {"lr_scale": completep_lr_scale(cfg.n_blocks, cfg.depth_base, cfg.depth_alpha)
             } if completep else {}
    if completep:
        groups += [{"params": block_decay, "weight_decay": weight_decay} | scale,
                   {"params": block_no_decay, "weight_decay": 0.0} | scale]
    if muon:
        groups.append({"params": matrices, "weight_decay": weight_decay, "muon": True} | scale)
    return groups


def muon_names(model: nn.Module) -> set[str]:
    """The names of `model`'s parameters that Muon steps under `train.optimizer: muon`."""
    taken = {id(p) for g in param_groups(model, 1.0, muon=True) if g.get("muon")
             for p in g["params"]}
    return {n for n, p in model.named_parameters() if id(p) in taken}


def decayed_names(model: nn.Module) -> set[str]:
    """The names of `model`'s parameters that `param_groups` decays."""
    decayed = {id(p) for g in param_groups(model, 1.0) if g["weight_decay"]
               for p in g["params"]}
    return {n for n, p in model.named_parameters() if id(p) in decayed}


def eps_of(model: nn.Module, eps: float) -> float:
    """AdamW's eps for `model`: `eps`, times `completep_eps_scale` under CompleteP."""
    cfg = getattr(model, "cfg", None)
    if getattr(cfg, "depth_param", "standard") != "completep":
        return eps
    return eps * completep_eps_scale(cfg.n_blocks, cfg.depth_base, cfg.depth_alpha)


def fused_available(device: torch.device) -> bool:
    """Whether torch has a fused AdamW kernel for `device`: one pass over each parameter instead
    of a dozen elementwise operations."""
    return device.type in ("cpu", "cuda")


class MuonWithAdamW:
    """Muon over the matrices inside the blocks and AdamW over the rest, as one optimizer to the
    training loop, the lr schedule and the checkpoints: `param_groups` are AdamW's then Muon's
    (the dicts themselves, so `normlab.train.step.set_lr` and each group's `lr_scale` reach
    both), `state` maps each parameter to its one optimizer's state, `state_dict` numbers the
    parameters across both in that order, as a torch optimizer numbers its groups', and
    `load_state_dict` takes it back. `step` steps AdamW, then Muon (their parameters are
    disjoint, so the order changes nothing), then the post-step hooks (nGPT's renormalization)
    once, on the parameters both have updated."""

    def __init__(self, adamw: torch.optim.AdamW, muon: torch.optim.Muon) -> None:
        self.adamw, self.muon = adamw, muon
        self._optimizer_step_post_hooks: OrderedDict[int, Callable] = OrderedDict()

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.adamw.param_groups + self.muon.param_groups

    @property
    def state(self) -> dict[torch.Tensor, dict[str, Any]]:
        """Each parameter's state (a merged view to read: the states live in the two
        optimizers)."""
        return {**self.adamw.state, **self.muon.state}

    def step(self) -> None:
        self.adamw.step()
        self.muon.step()
        for hook in self._optimizer_step_post_hooks.values():
            hook(self, (), {})

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none=set_to_none)
        self.muon.zero_grad(set_to_none=set_to_none)

    def register_step_post_hook(self, hook: Callable) -> RemovableHandle:
        """`hook(optimizer, args, kwargs)` after every `step`, as torch's optimizers call it."""
        handle = RemovableHandle(self._optimizer_step_post_hooks)
        self._optimizer_step_post_hooks[handle.id] = hook
        return handle

    def _adamw_count(self, groups: list[dict[str, Any]]) -> int:
        return sum(len(g["params"]) for g in groups[:len(self.adamw.param_groups)])

    def state_dict(self) -> dict[str, Any]:
        a, m = self.adamw.state_dict(), self.muon.state_dict()
        n = self._adamw_count(a["param_groups"])
        return {"state": a["state"] | {n + i: s for i, s in m["state"].items()},
                "param_groups": a["param_groups"] + [
                    g | {"params": [n + i for i in g["params"]]} for g in m["param_groups"]]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups, state = state_dict["param_groups"], state_dict["state"]
        k, n = len(self.adamw.param_groups), self._adamw_count(groups)
        self.adamw.load_state_dict({"state": {i: s for i, s in state.items() if i < n},
                                    "param_groups": groups[:k]})
        self.muon.load_state_dict({
            "state": {i - n: s for i, s in state.items() if i >= n},
            "param_groups": [g | {"params": [i - n for i in g["params"]]} for g in groups[k:]]})


def build_optimizer(model: nn.Module, tc: TrainConfig, *, fused: bool = False
                    ) -> torch.optim.AdamW | MuonWithAdamW:
    """The optimizer of `tc` over `model`'s trainable parameters (`param_groups`; a group left
    empty by frozen parameters is dropped): AdamW, or with `tc.optimizer: muon` a
    `MuonWithAdamW` (torch's Muon at `MUON_ADJUST_LR`, momentum 0.95 with Nesterov and 5
    Newton-Schulz steps, torch's defaults, which are Jordan et al.'s). `fused`: torch's fused
    AdamW kernel (training runs, where `fused_available`); otherwise torch's default
    implementation, with which fine-tuning and the probes recorded their numbers."""
    muon = tc.optimizer == "muon"
    groups = []
    for group in param_groups(model, tc.weight_decay, muon=muon):
        params = [p for p in group["params"] if p.requires_grad]
        if params:
            groups.append(group | {"params": params}
                          | ({"lr": tc.lr * group["lr_scale"]} if "lr_scale" in group else {}))
    optimizer: torch.optim.AdamW | MuonWithAdamW = torch.optim.AdamW(
        [g for g in groups if not g.get("muon")], lr=tc.lr, betas=(tc.beta1, tc.beta2),
        eps=eps_of(model, tc.eps), fused=True if fused else None)
    if muon:
        optimizer = MuonWithAdamW(optimizer, torch.optim.Muon(
            [g for g in groups if g.get("muon")], lr=tc.lr, weight_decay=tc.weight_decay,
            adjust_lr_fn=MUON_ADJUST_LR))
    matrices = [(p, dim) for p, dim in sphere_matrices(model) if p.requires_grad]
    if matrices:  # nGPT: back onto the sphere after every step (`normalize_matrices`)
        optimizer.register_step_post_hook(lambda opt, args, kwargs: renormalize_(matrices))
    return optimizer


def adamw(model: nn.Module, tc: TrainConfig, *, fused: bool = False) -> torch.optim.AdamW:
    """The AdamW of `tc` (`build_optimizer`), for the trainings that step AdamW's state
    themselves or take their settings elsewhere: stacked groups (`StackedAdamW`), fine-tuning,
    the probes. A `tc` of another optimizer is refused, not trained with AdamW."""
    if tc.optimizer != "adamw":
        raise ValueError(f"train.optimizer={tc.optimizer}: this training steps AdamW only")
    return build_optimizer(model, tc, fused=fused)


def adamw_hyper(tc: TrainConfig, lr: float) -> dict[str, float]:
    """One member's AdamW settings for a `StackedAdamW` step at learning rate `lr` (its schedule's
    value at the step): the same as `adamw` gives a single run."""
    return {"lr": lr, "weight_decay": tc.weight_decay, "beta1": tc.beta1, "beta2": tc.beta2,
            "eps": tc.eps}

