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
- `subln`: `xavier`, then V, `proj` and both MLP maps multiplied by the gain sqrt(log(2L));
  Q and K are not scaled (Sub-LN of Magneto, "Foundation Transformers", arXiv 2210.06423, as
  torchscale's `subln` branch of `Decoder.__init__` multiplies `v_proj`, `out_proj`, `fc1` and
  `fc2`; torchscale draws them first from PyTorch's default `nn.Linear` init, normlab from
  `xavier`, as for `deepnorm`).
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


def embedding_stds(embedding: str, d: int, std: float, has_positions: bool
                   ) -> tuple[float, float, float]:
    """Init std of the token table, the position table and an untied LM head.

    - `normal`: all `std` (GPT-2);
    - `unit`: token and position tables of variance 1/2 each (1 for tokens alone without a
      position table), so that x_0 ~ N(0, I_d) as Xiong et al.'s Lemma 2 assumes (arXiv
      2002.04745); the head `std`;
    - `fairseq`: tokens N(0, d^-1/2), multiplied by sqrt(d) at the input (unit variance), positions
      `std`, an untied head N(0, d^-1/2): fairseq's `embed_scale` and output projection, so the
      logits are of order 1 whether the head is tied or not.
    """
    if embedding == "unit":
        tok = 2 ** -0.5 if has_positions else 1.0
        return tok, 2 ** -0.5, std
    if embedding == "fairseq":
        return d ** -0.5, std, d ** -0.5
    if embedding == "normal":
        return std, std, std
    raise ValueError(f"unknown embedding {embedding!r}")


@torch.no_grad()
def init_weights(model: nn.Module, scheme: str, plan: ModelPlan, std: float = 0.02,
                 embedding: str = "normal") -> None:
    """`embedding` draws the tables (see `embedding_stds`); `scheme` the blocks' linear maps."""
    n_blocks = len(plan.blocks)
    d = model.tok_emb.weight.shape[1]
    tok_std, pos_std, head_std = embedding_stds(embedding, d, std,
                                                getattr(model, "pos_emb", None) is not None)
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            p.zero_()
        elif "emb" in name and p.dim() == 2:
            p.normal_(0.0, pos_std if name.startswith("pos_emb") else tok_std)
    for name in ("lm_head", "classifier"):
        head = getattr(model, name, None)
        if head is not None and head.weight is not getattr(model.tok_emb, "weight", None):
            head.weight.normal_(0.0, head_std if name == "lm_head" else std)

    beta = plan.constants.get("deepnorm_beta", 1.0)
    for i, block in enumerate(model.blocks):
        attn, mlp = block.attn.fn, block.mlp.fn
        swiglu_slices = 2 if mlp.swiglu else 1
        maps = [(mlp.fc_in.weight, swiglu_slices), (mlp.fc_out.weight, 1)]
        outputs = [mlp.fc_out.weight]  # the maps that write into the residual stream
        if hasattr(attn, "qkv"):  # `attention: none` has no weights
            maps = [(attn.qkv.weight, 3), (attn.proj.weight, 1)] + maps
            outputs = [attn.proj.weight] + outputs
        if scheme in ("normal", "gpt2_scaled"):
            for w, _ in maps:
                w.normal_(0.0, std)
            if scheme == "gpt2_scaled":  # std / sqrt(number of residual sublayers)
                for w in outputs:
                    w.normal_(0.0, std / math.sqrt(len(outputs) * n_blocks))
        elif scheme in ("xavier", "deepnorm", "admin", "ds_init", "subln"):
            for w, k in maps:
                _xavier_slices(w, k)
            if scheme in ("deepnorm", "subln"):  # DeepNet's beta; Sub-LN's gain
                factor = beta if scheme == "deepnorm" else plan.constants["subln_gain"]
                if hasattr(attn, "qkv"):
                    d = attn.proj.weight.shape[0]
                    attn.qkv.weight[2 * d:].mul_(factor)  # V only; Q and K keep their xavier scale
                    attn.proj.weight.mul_(factor)
                for w in (mlp.fc_in.weight, mlp.fc_out.weight):
                    w.mul_(factor)
            elif scheme == "ds_init":
                for w, _ in maps:
                    w.div_(math.sqrt(i + 1))
        else:
            raise ValueError(f"unknown init scheme {scheme!r}")
