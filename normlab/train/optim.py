"""The optimizer of every training in normlab: AdamW (Loshchilov & Hutter, "Decoupled Weight
Decay Regularization", ICLR 2019) with the settings of a `TrainConfig`.

One home for it, so that an optimizer setting reaches every kind of training or none: a single
run (`normlab.train.trainer`), each member of a stacked group (`normlab.train.group`, through
`StackedAdamW`, which takes the same per-member settings from `adamw_hyper`), fine-tuning
(`normlab.finetune`), the update-size probe (`normlab.probe.sensitivity`) and the study's step
timing (`normlab.study.runner`). Weight decay applies to weight matrices only, never to norms,
biases, gates or embeddings (`param_groups`), as in GPT-2/nanoGPT-style training.

A setting added to `TrainConfig` for the optimizer goes into `adamw` and `adamw_hyper` here; the
stacked engine refuses runs that set a train field it does not list as honoured
(`normlab.train.group.PER_MEMBER_TRAIN`), so it cannot be dropped there silently.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from normlab.config import TrainConfig

# The `TrainConfig` fields the optimizer reads (the schedule of lr is `normlab.train.schedules`).
OPTIMIZER_FIELDS = ("lr", "weight_decay", "beta1", "beta2", "eps")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on weight matrices only; none on norms, biases, gates, embeddings."""
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        is_embedding = "emb" in name
        (decay if p.dim() >= 2 and not is_embedding else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def decayed_names(model: nn.Module) -> set[str]:
    """The names of `model`'s parameters that `param_groups` decays."""
    decayed = {id(p) for p in param_groups(model, 1.0)[0]["params"]}
    return {n for n, p in model.named_parameters() if id(p) in decayed}


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
            groups.append(group | {"params": params})
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.eps,
                             fused=True if fused else None)


def adamw_hyper(tc: TrainConfig, lr: float) -> dict[str, float]:
    """One member's AdamW settings for a `StackedAdamW` step at learning rate `lr` (its schedule's
    value at the step): the same as `adamw` gives a single run."""
    return {"lr": lr, "weight_decay": tc.weight_decay, "beta1": tc.beta1, "beta2": tc.beta2,
            "eps": tc.eps}

