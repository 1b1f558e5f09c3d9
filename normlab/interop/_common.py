"""Helpers shared by the GPT-2 and BERT converters."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from normlab.config import ModelConfig, make_model_config
from normlab.interop.errors import InteropError
from normlab.nn.model import NormTransformer
from normlab.nn.plan import SublayerPlan


def new_model(fields: Mapping[str, object]) -> NormTransformer:
    """A normlab model of `fields` whose weights are about to be overwritten. Its init draws
    from a forked RNG, so importing a model leaves the caller's random state untouched."""
    cfg = make_model_config(**fields)
    with torch.random.fork_rng(devices=[]):
        return NormTransformer(cfg)


def load_exact(module: nn.Module, state: Mapping[str, torch.Tensor], what: str) -> None:
    """`load_state_dict(strict=True)` with a message that names the keys that do not match."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    if missing or extra:
        raise InteropError(f"{what}: weights do not line up (missing {missing[:6]}, "
                           f"unexpected {extra[:6]})")
    for key, value in state.items():
        if tuple(own[key].shape) != tuple(value.shape):
            raise InteropError(f"{what}: {key} has shape {tuple(value.shape)}, expected "
                               f"{tuple(own[key].shape)}")
    module.load_state_dict({k: v.detach() for k, v in state.items()}, strict=True)


def or_zeros(p: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """A bias, or zeros where the normlab model has none (a model without biases is the same
    function as one whose biases are zero)."""
    return p.detach() if p is not None else torch.zeros_like(like)


def check_exportable(model: NormTransformer, *, target: str, kind: str, placement: str,
                     embed_norm: bool, final_norm: bool) -> ModelConfig:
    """Refuse a normlab model whose wiring the target architecture cannot express; each problem
    names the config field."""
    cfg = model.cfg
    plan = model.plan
    problems = []
    if cfg.kind != kind:
        problems.append(f"kind: {target} needs kind={kind}, got {cfg.kind}")
    if cfg.norm != "layernorm":
        problems.append(f"norm: {target} uses layernorm, got {cfg.norm}")
    if cfg.positions != "learned":
        problems.append(f"positions: {target} uses learned positions, got {cfg.positions}")
    if cfg.mlp != "gelu":
        problems.append(f"mlp: {target} uses a GELU MLP, got {cfg.mlp}")
    if cfg.residual_attention:
        problems.append(f"residual_attention: {target} has no residual attention scores")
    n = cfg.norm
    want = {"pre": (SublayerPlan("attn", in_norm=n), SublayerPlan("mlp", in_norm=n)),
            "post": (SublayerPlan("attn", post_norm=n), SublayerPlan("mlp", post_norm=n))}
    if any(b.sublayers != want[placement] for b in plan.blocks):
        names = sorted({b.placement for b in plan.blocks})
        problems.append(f"placement: {target} is {placement}-norm in every block; this model's "
                        f"blocks are {', '.join(names)} (placement={cfg.placement})")
    if (plan.embed_norm is not None) != embed_norm:
        problems.append(f"embed_norm: {target} {'has' if embed_norm else 'has no'} norm on the "
                        f"embedding; set embed_norm={embed_norm}")
    if (plan.final_norm is not None) != final_norm:
        problems.append(f"final_norm: {target} {'has' if final_norm else 'has no'} final norm; "
                        f"set final_norm={'on' if final_norm else 'off'}")
    if problems:
        raise InteropError(f"cannot export to {target}:\n  " + "\n  ".join(problems))
    return cfg
