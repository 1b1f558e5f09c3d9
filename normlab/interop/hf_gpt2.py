"""GPT-2 (`transformers.GPT2LMHeadModel`) <-> normlab pre-LN decoder.

GPT-2 (Radford et al. 2019) is the pre-LN decoder of normlab exactly: learned positions,
`x = x + Attn(LN(x))`, `x = x + MLP(LN(x))`, a final LayerNorm, an LM head tied to the token
embedding. Two details of the checkpoint format:

- GPT-2's linear maps are `Conv1D` modules whose weight is stored `[in, out]`: the transpose of a
  `torch.nn.Linear` weight. Its fused `c_attn` holds q | k | v row blocks with the heads contiguous
  in each, the layout of normlab's `qkv`.
- GPT-2's activation is `gelu_new`, the tanh approximation of GELU; the import sets normlab's
  `gelu_approx="tanh"` (exact `gelu` checkpoints map to `gelu_approx="none"`).

    from transformers import GPT2LMHeadModel
    model = gpt2_to_normlab(GPT2LMHeadModel.from_pretrained(folder, local_files_only=True))
    hf = normlab_to_gpt2(model)          # back, as a GPT2LMHeadModel
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from normlab.interop._common import check_exportable, load_exact, new_model, or_zeros
from normlab.interop.errors import InteropError, require_transformers
from normlab.nn.model import NormTransformer

# 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) under three names
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
EXACT_GELUS = ("gelu",)


def _base(hf_model: nn.Module) -> nn.Module:
    """The `GPT2Model` inside a `GPT2LMHeadModel` (or the model itself)."""
    base = getattr(hf_model, "transformer", hf_model)
    if not hasattr(base, "h") or not hasattr(base, "wte"):
        raise InteropError(f"{type(hf_model).__name__} is not a GPT-2 model (no transformer.h); "
                           "give a transformers GPT2LMHeadModel or GPT2Model")
    return base


def gelu_approx_of(activation: str, field: str) -> str:
    if activation in TANH_GELUS:
        return "tanh"
    if activation in EXACT_GELUS:
        return "none"
    raise InteropError(f"{field}: {activation!r} has no normlab counterpart; supported: "
                       f"{', '.join(EXACT_GELUS + TANH_GELUS)}")


def gpt2_config_fields(hf_config: Any) -> dict[str, Any]:
    """normlab `ModelConfig` fields of a `GPT2Config`; unsupported options are refused by name."""
    c = hf_config
    problems = []
    if getattr(c, "model_type", "gpt2") != "gpt2":
        problems.append(f"model_type: {c.model_type!r} is not gpt2")
    if getattr(c, "add_cross_attention", False):
        problems.append("add_cross_attention: cross-attention blocks are not supported")
    if getattr(c, "scale_attn_by_inverse_layer_idx", False):
        problems.append("scale_attn_by_inverse_layer_idx: not supported (normlab scales scores "
                        "by 1/sqrt(head_dim) only)")
    if not getattr(c, "scale_attn_weights", True):
        problems.append("scale_attn_weights: False is not supported")
    if problems:
        raise InteropError("cannot import this GPT-2 config:\n  " + "\n  ".join(problems))
    return dict(
        kind="decoder", vocab_size=c.vocab_size, n_blocks=c.n_layer, d_model=c.n_embd,
        n_heads=c.n_head, d_ff=c.n_inner or 4 * c.n_embd, max_seq_len=c.n_positions,
        positions="learned", mlp="gelu",
        gelu_approx=gelu_approx_of(c.activation_function, "activation_function"),
        bias=True, tie_embeddings=bool(getattr(c, "tie_word_embeddings", True)),
        dropout=0.0, norm="layernorm", norm_bias=True, norm_eps=c.layer_norm_epsilon,
        placement="pre", final_norm="on", embed_norm=False, init="normal",
    )


@torch.no_grad()
def gpt2_to_normlab(hf_model: nn.Module) -> NormTransformer:
    """A normlab pre-LN decoder computing the same logits as `hf_model` (`GPT2LMHeadModel`; a
    bare `GPT2Model` gets the LM head tied to its token embedding, as GPT-2's is)."""
    base = _base(hf_model)
    fields = gpt2_config_fields(hf_model.config)
    head = getattr(hf_model, "lm_head", None)
    if head is not None and head.weight is not base.wte.weight:
        fields["tie_embeddings"] = False
    elif head is None:
        fields["tie_embeddings"] = True
    model = new_model(fields)
    s: dict[str, torch.Tensor] = {"tok_emb.weight": base.wte.weight,
                                  "pos_emb.weight": base.wpe.weight,
                                  "final.norm.weight": base.ln_f.weight,
                                  "final.norm.bias": base.ln_f.bias}
    for i, blk in enumerate(base.h):
        p = f"blocks.{i}"
        s |= {
            f"{p}.attn.in_norm.weight": blk.ln_1.weight, f"{p}.attn.in_norm.bias": blk.ln_1.bias,
            f"{p}.attn.fn.qkv.weight": blk.attn.c_attn.weight.t(),
            f"{p}.attn.fn.qkv.bias": blk.attn.c_attn.bias,
            f"{p}.attn.fn.proj.weight": blk.attn.c_proj.weight.t(),
            f"{p}.attn.fn.proj.bias": blk.attn.c_proj.bias,
            f"{p}.mlp.in_norm.weight": blk.ln_2.weight, f"{p}.mlp.in_norm.bias": blk.ln_2.bias,
            f"{p}.mlp.fn.fc_in.weight": blk.mlp.c_fc.weight.t(),
            f"{p}.mlp.fn.fc_in.bias": blk.mlp.c_fc.bias,
            f"{p}.mlp.fn.fc_out.weight": blk.mlp.c_proj.weight.t(),
            f"{p}.mlp.fn.fc_out.bias": blk.mlp.c_proj.bias,
        }
    s["lm_head.weight"] = base.wte.weight if fields["tie_embeddings"] else head.weight
    load_exact(model, s, "GPT-2 -> normlab")
    return model.eval()


def gpt2_config_of(model: NormTransformer) -> Any:
    """The `GPT2Config` of a normlab model (which must be GPT-2-shaped: pre-LN decoder, learned
    positions, GELU MLP, LayerNorm, final norm, no embedding norm)."""
    transformers = require_transformers("exporting to GPT-2")
    cfg = check_exportable(model, target="GPT-2", kind="decoder", placement="pre",
                           embed_norm=False, final_norm=True)
    return transformers.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.max_seq_len, n_embd=cfg.d_model,
        n_layer=cfg.n_blocks, n_head=cfg.n_heads, n_inner=cfg.ff_width,
        activation_function="gelu_new" if cfg.gelu_approx == "tanh" else "gelu",
        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,
        layer_norm_epsilon=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=None, eos_token_id=None,  # normlab models have no special tokens
    )


@torch.no_grad()
def normlab_to_gpt2(model: NormTransformer) -> nn.Module:
    """A `transformers.GPT2LMHeadModel` computing the same logits as the normlab `model`.
    A model without biases (`bias=False`, `norm_bias=False`) exports with zero biases."""
    transformers = require_transformers("exporting to GPT-2")
    hf_cfg = gpt2_config_of(model)
    with torch.random.fork_rng(devices=[]):
        hf = transformers.GPT2LMHeadModel(hf_cfg)
    src = model.state_dict()
    s: dict[str, torch.Tensor] = {}

    def ln(dst: str, norm: nn.Module) -> None:
        s[f"{dst}.weight"] = norm.weight
        s[f"{dst}.bias"] = or_zeros(norm.bias, norm.weight)

    def conv(dst: str, lin: nn.Linear) -> None:
        s[f"{dst}.weight"] = lin.weight.t().contiguous()
        s[f"{dst}.bias"] = or_zeros(lin.bias, lin.weight[:, 0])

    s["transformer.wte.weight"] = src["tok_emb.weight"]
    s["transformer.wpe.weight"] = src["pos_emb.weight"]
    for i, blk in enumerate(model.blocks):
        p = f"transformer.h.{i}"
        ln(f"{p}.ln_1", blk.attn.in_norm)
        conv(f"{p}.attn.c_attn", blk.attn.fn.qkv)
        conv(f"{p}.attn.c_proj", blk.attn.fn.proj)
        ln(f"{p}.ln_2", blk.mlp.in_norm)
        conv(f"{p}.mlp.c_fc", blk.mlp.fn.fc_in)
        conv(f"{p}.mlp.c_proj", blk.mlp.fn.fc_out)
    ln("transformer.ln_f", model.final.norm)
    s["lm_head.weight"] = model.lm_head.weight
    own = hf.state_dict()
    s = {k: v for k, v in s.items() if k in own}  # a tied lm_head is not its own entry
    load_exact(hf, s, "normlab -> GPT-2")
    if model.cfg.tie_embeddings and hf.lm_head.weight is not hf.transformer.wte.weight:
        raise InteropError("normlab -> GPT-2: the exported LM head is not tied to wte")
    return hf.eval()


def load_gpt2(folder: str | Path) -> NormTransformer:
    """Import a GPT-2 checkpoint folder (config.json + weights) into normlab, offline."""
    transformers = require_transformers("loading a GPT-2 checkpoint")
    hf = transformers.GPT2LMHeadModel.from_pretrained(
        str(folder), local_files_only=True, trust_remote_code=False, dtype=torch.float32)
    return gpt2_to_normlab(hf)
