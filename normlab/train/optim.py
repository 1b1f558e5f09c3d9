"""The optimizer of every training in normlab: AdamW (Loshchilov & Hutter, "Decoupled Weight
Decay Regularization", ICLR 2019) with the settings of a `TrainConfig`.

One home for it, so that an optimizer setting reaches every kind of training or none: a single
run (`normlab.train.trainer`), each member of a stacked group (`normlab.train.group`, through
`StackedAdamW`, which takes the same per-member settings from `adamw_hyper`), fine-tuning
(`normlab.finetune`), the update-size probe (`normlab.probe.sensitivity`) and the study's step
timing (`normlab.study.runner`). Weight decay applies to weight matrices only, never to norms,
biases, gates or embeddings (`param_groups`), as in GPT-2/nanoGPT-style training.

Two model settings reach the optimizer here, so that every training that builds its AdamW here
applies them:

- `model.depth_param: completep` (Dey et al. 2025, arXiv 2505.01618): every parameter inside the
  blocks (`blocks.*`: weight matrices, biases, norms, gates) in groups of their own whose lr is
  the schedule's times `completep_lr_scale` (`lr_scale`, which `normlab.train.step.set_lr`
  applies), and AdamW's eps times `completep_eps_scale` in every group, as the authors'
  `configure_optimizers` does (see `param_groups`).
- `placement: ngpt` (Loshchilov et al. 2024, arXiv 2410.01131): a post-step hook renormalizes
  the model's matrices along the width after every `step()` (`normlab.nn.sphere`), as the
  authors' train.py calls `normalize_matrices()` after each `optimizer.step()`.

A setting added to `TrainConfig` for the optimizer goes into `adamw` and `adamw_hyper` here; the
stacked engine refuses runs that set a train field it does not list as honoured
(`normlab.train.group.PER_MEMBER_TRAIN`), so it cannot be dropped there silently.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from normlab.config import TrainConfig
from normlab.nn.plan import completep_eps_scale, completep_lr_scale
from normlab.nn.sphere import renormalize_, sphere_matrices

# The `TrainConfig` fields the optimizer reads (the schedule of lr is `normlab.train.schedules`).
OPTIMIZER_FIELDS = ("lr", "weight_decay", "beta1", "beta2", "eps")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on weight matrices only; none on norms, biases, gates, embeddings.

    A model of `depth_param: completep` has four: the decayed and the undecayed parameters
    outside the blocks (embeddings, final norm, head: lr as scheduled), then those inside the
    blocks with `lr_scale` = `completep_lr_scale` (the authors' `hidden_weight_params`,
    `hidden_ln_params`, `hidden_bias_params` at `depth_lr_scaling`); weight decay is not scaled
    with depth (their `weight_decay / width_lr_scaling`, with no width multiplier here)."""
    cfg = getattr(model, "cfg", None)
    completep = getattr(cfg, "depth_param", "standard") == "completep"
    decay, no_decay, block_decay, block_no_decay, seen = [], [], [], [], set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        is_embedding = "emb" in name
        decayed = p.dim() >= 2 and not is_embedding
        if completep and name.startswith("blocks."):
            (block_decay if decayed else block_no_decay).append(p)
        else:
            (decay if decayed else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if completep:
        scale = completep_lr_scale(cfg.n_blocks, cfg.depth_base, cfg.depth_alpha)
        groups += [{"params": block_decay, "weight_decay": weight_decay, "lr_scale": scale},
                   {"params": block_no_decay, "weight_decay": 0.0, "lr_scale": scale}]
    return groups


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


def adamw(model: nn.Module, tc: TrainConfig, *, fused: bool = False) -> torch.optim.AdamW:
    """The AdamW of `tc` over `model`'s trainable parameters (`param_groups`; a group left empty
    by frozen parameters is dropped). `fused`: torch's fused kernel (training runs, where
    `fused_available`); otherwise torch's default implementation, with which fine-tuning and the
    probes recorded their numbers."""
    groups = []
    for group in param_groups(model, tc.weight_decay):
        params = [p for p in group["params"] if p.requires_grad]
        if params:
            groups.append(group | {"params": params}
                          | ({"lr": tc.lr * group["lr_scale"]} if "lr_scale" in group else {}))
    optimizer = torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2),
                                  eps=eps_of(model, tc.eps), fused=True if fused else None)
    matrices = [(p, dim) for p, dim in sphere_matrices(model) if p.requires_grad]
    if matrices:  # nGPT: back onto the sphere after every step (`normalize_matrices`)
        optimizer.register_step_post_hook(lambda opt, args, kwargs: renormalize_(matrices))
    return optimizer


def adamw_hyper(tc: TrainConfig, lr: float) -> dict[str, float]:
    """One member's AdamW settings for a `StackedAdamW` step at learning rate `lr` (its schedule's
    value at the step): the same as `adamw` gives a single run."""
    return {"lr": lr, "weight_decay": tc.weight_decay, "beta1": tc.beta1, "beta2": tc.beta2,
            "eps": tc.eps}

