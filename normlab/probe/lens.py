"""Logit lens (claim C13, docs/reference.md section 2): the model's LM head read off each block.

For each block l, the head is applied to the block's output stream (tap `blocks.{l}.mlp.stream_out`)
twice, and the next-token loss of each reading is reported:

    lens_normed[l]   head(FinalNorm(x_{l+1})): the model's final norm (`final.norm`), its
                     statistics computed afresh on x_{l+1} (not frozen at the last block's:
                     that is the cache's `apply_ln_to_stack`); when the placement has none
                     (post, deepnorm, admin, b2t, ...), a fresh LayerNorm without affine
                     parameters, and `lens_norm` says so
    lens_raw[l]      head(x_{l+1}): no norm at the extraction point
    lens_free[l]     head(Norm(x_{l+1})) through a norm without parameters, the kind of the
                     model's own (RMSNorm for rmsnorm models, else LayerNorm; gain 1, bias
                     0), on the statistics of the block's own stream: a norm at the extraction
                     point that nothing was trained into, so `lens_raw - lens_free` is what the
                     normalization itself gives the head (C13), where `lens_raw - lens_normed`
                     also removes the trained final norm's gain and bias

ResiDual's output is `a_L + Norm(d_L)`, so its normed reading is `a_l + FinalNorm(d_l)` (the
model's own output rule applied at block l), its raw reading `a_l + d_l` and its free reading
`a_l + Norm(d_l)`. SiameseNorm's is `FinalNorm(Norm(a_L) + Norm(d_L))`: its normed reading is
that rule at block l, its raw reading `a_l + d_l` and its free reading `Norm(Norm(a_l) +
Norm(d_l))`, every norm without parameters.
At the last block the normed reading is the model's output whenever the model has a final norm.
Decoder only: an encoder's head reads a pooled stream, not per-position next-token logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from normlab.config import ConfigError
from normlab.probe.hooks import eval_mode, hooked
from normlab.probe.measures import model_loss

Batch = tuple[torch.Tensor, torch.Tensor]


def lens_norm(model: nn.Module) -> tuple[nn.Module, str]:
    """The norm applied at the extraction points, and a sentence saying which it is."""
    if model.plan.final_norm is not None:
        return model.final.norm, f"the model's final norm ({model.plan.final_norm})"
    cfg = model.cfg
    fresh = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, elementwise_affine=False)
    fresh.to(next(model.parameters()).device)
    return fresh, ("a fresh LayerNorm without affine parameters (gain 1, bias 0), since the "
                   "model has no final norm")


def free_norm(model: nn.Module):
    """The norm without parameters of `lens_free`: `x` normalized by its own statistics over
    the model dimension, as the model's own norm kind does it (RMS for rmsnorm; mean and
    variance otherwise, since a DyT, Derf, identity or batch norm has no per-token
    statistics)."""
    cfg = model.cfg
    shape, eps = (cfg.d_model,), cfg.norm_eps
    if cfg.norm == "rmsnorm":
        return lambda x: F.rms_norm(x, shape, eps=eps)
    return lambda x: F.layer_norm(x, shape, eps=eps)


@torch.no_grad()
def logit_lens(model: nn.Module, batches: Sequence[Batch]) -> dict[str, object]:
    """Loss of the head on every block's stream, with and without a norm; mean over batches."""
    if model.cfg.kind != "decoder":
        raise ConfigError("logit lens: needs kind=decoder (an encoder has no per-position head)")
    L = len(model.blocks)
    norm, which = lens_norm(model)
    free = free_norm(model)
    dual = model.plan.dual_stream
    siamese = dual and model.plan.dual_out_norm is not None
    head = model.lm_head
    normed = torch.zeros(L, dtype=torch.float64)
    raw = torch.zeros(L, dtype=torch.float64)
    freed = torch.zeros(L, dtype=torch.float64)
    model_losses = []
    with eval_mode(model):
        for idx, targets in batches:
            def make(i: int, targets=targets):
                def hook(_m, _args, block_out) -> None:
                    x, carry = block_out  # a block returns the stream and its carry
                    if dual:  # the model's own output rule, applied at block i
                        d = carry.dual
                        on, off = model.head_input(x, carry), x + d
                        bare = free(free(x) + free(d)) if siamese else x + free(d)
                    else:
                        on, off, bare = norm(x), x, free(x)
                    normed[i] += model_loss("decoder", head(on), targets).item()
                    raw[i] += model_loss("decoder", head(off), targets).item()
                    freed[i] += model_loss("decoder", head(bare), targets).item()
                return hook

            with hooked(model, {f"blocks.{i}": make(i) for i in range(L)}):
                out = model(idx, targets)
            model_losses.append(out.loss.item())
    n = len(batches)
    return {"lens_normed": (normed / n).tolist(), "lens_raw": (raw / n).tolist(),
            "lens_free": (freed / n).tolist(), "lens_norm": which,
            "model_loss": sum(model_losses) / n}
