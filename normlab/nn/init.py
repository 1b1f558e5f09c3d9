"""Initialization schemes by name.

The same placement under another init is a different experiment, so the scheme is recorded with
every result. All schemes draw embeddings from N(0, std), zero biases and leave norm gains at 1;
they differ in the block's linear maps:

- `normal`: N(0, std), std=0.02 (GPT-2 / LLaMA code bases).
- `gpt2_scaled`: `normal`, with output projections (attention `proj`, MLP `fc_out`) at
  std/sqrt(2L) (Radford et al. 2019, GPT-2). Megatron-LM's init is the same scheme; it is
  HybridNorm's default (the released config's `init_fn: full_megatron`, arXiv 2503.04598),
  untruncated here where the release truncates at 3 std.
- `xavier`: Glorot uniform per square map (fairseq baselines; Xiong et al.'s analysis).
- `deepnorm`: `xavier`, then V, `proj` and both MLP maps multiplied by beta; Q and K are not
  scaled (DeepNet, arXiv 2203.00555).
- `admin`: `xavier`; Admin's omega lives in the placement (arXiv 2004.08249).
- `ds_init`: `xavier` divided by sqrt(l), l the 1-based block index (DS-Init, Zhang et al. 2019,
  "Improving Deep Transformer with Depth-Scaled Initialization and Merged Attention",
  arXiv 1908.11365).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from normlab.nn.plan import ModelPlan


def _xavier_slices(weight: torch.Tensor, n_slices: int, gain: float = 1.0) -> None:
    """Glorot-uniform on each of `n_slices` row blocks (a fused QKV is three d x d maps)."""
    for part in weight.chunk(n_slices, dim=0):
        fan_out, fan_in = part.shape
        bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
        with torch.no_grad():
            part.uniform_(-bound, bound)


@torch.no_grad()
def init_weights(model: nn.Module, scheme: str, plan: ModelPlan, std: float = 0.02) -> None:
    n_blocks = len(plan.blocks)
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            p.zero_()
        elif "emb" in name and p.dim() == 2:
            p.normal_(0.0, std)
    for name in ("lm_head", "classifier"):
        head = getattr(model, name, None)
        if head is not None and head.weight is not getattr(model.tok_emb, "weight", None):
            head.weight.normal_(0.0, std)

    beta = plan.constants.get("deepnorm_beta", 1.0)
    for i, block in enumerate(model.blocks):
        attn, mlp = block.attn.fn, block.mlp.fn
        swiglu_slices = 2 if mlp.swiglu else 1
        maps = [(attn.qkv.weight, 3), (attn.proj.weight, 1), (mlp.fc_in.weight, swiglu_slices),
                (mlp.fc_out.weight, 1)]
        if scheme in ("normal", "gpt2_scaled"):
            for w, _ in maps:
                w.normal_(0.0, std)
            if scheme == "gpt2_scaled":
                for w in (attn.proj.weight, mlp.fc_out.weight):
                    w.normal_(0.0, std / math.sqrt(2 * n_blocks))
        elif scheme in ("xavier", "deepnorm", "admin", "ds_init"):
            for w, k in maps:
                _xavier_slices(w, k)
            if scheme == "deepnorm":
                d = attn.proj.weight.shape[0]
                attn.qkv.weight[2 * d:].mul_(beta)  # V only; Q and K keep their xavier scale
                for w in (attn.proj.weight, mlp.fc_in.weight, mlp.fc_out.weight):
                    w.mul_(beta)
            elif scheme == "ds_init":
                for w, _ in maps:
                    w.div_(math.sqrt(i + 1))
        else:
            raise ValueError(f"unknown init scheme {scheme!r}")
