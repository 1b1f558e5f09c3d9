"""BERT (`transformers.BertModel` / `BertForSequenceClassification`) <-> normlab post-LN encoder.

BERT (Devlin et al. 2018, arXiv 1810.04805) is the post-LN encoder of normlab: learned positions,
a LayerNorm on the embedding (`embed_norm=True`), `x = LN(x + Attn(x))`, `x = LN(x + MLP(x))`,
exact GELU, no final norm. What does not carry over, by design:

- **Token types.** BERT adds a token-type (segment) embedding. The import folds type 0 into the
  position table (`pos_emb = position + token_type[0]`), so a normlab model reproduces BERT on
  single-segment input (token_type_ids all 0, the default); segment-B embeddings are dropped.
  The export writes a single token type whose embedding is zero.
- **The pooler and the classifier.** `BertForSequenceClassification` reads
  `classifier(dropout(tanh(W h_CLS + b)))`; normlab's encoder head reads `classifier(h_CLS)`
  (`pooling="first"`) without the tanh dense layer. The import copies the classifier and drops
  the pooler (a warning says so); the export writes an identity pooler. Class logits therefore
  differ; the hidden states (`model.stream(idx, attention_mask)` vs `last_hidden_state`) match.
- Masked-LM heads are not imported (normlab encoders have no token head).

Padding works as in BERT: `attention_mask` (1 = token, 0 = padding) masks keys.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from normlab.interop._common import check_exportable, load_exact, new_model, or_zeros
from normlab.interop.errors import InteropError, require_transformers
from normlab.interop.hf_gpt2 import gelu_approx_of
from normlab.nn.model import NormTransformer
from normlab.warnings import NormlabWarning

BERT_TYPES = ("bert",)


def _base(hf_model: nn.Module) -> nn.Module:
    """The `BertModel` inside a BERT head model (or the model itself)."""
    base = getattr(hf_model, "bert", hf_model)
    if not hasattr(base, "embeddings") or not hasattr(base, "encoder"):
        raise InteropError(f"{type(hf_model).__name__} is not a BERT model (no embeddings/"
                           "encoder); give a transformers BertModel or "
                           "BertForSequenceClassification")
    return base


def bert_config_fields(hf_config: Any, n_classes: int | None = None) -> dict[str, Any]:
    """normlab `ModelConfig` fields of a `BertConfig`; unsupported options are refused by name."""
    c = hf_config
    problems = []
    if getattr(c, "model_type", "bert") not in BERT_TYPES:
        problems.append(f"model_type: {c.model_type!r} is not one of {BERT_TYPES}")
    if getattr(c, "is_decoder", False):
        problems.append("is_decoder: causal BERT is not supported")
    if getattr(c, "position_embedding_type", "absolute") != "absolute":
        problems.append(f"position_embedding_type: {c.position_embedding_type!r}; only "
                        "absolute positions are supported")
    if not isinstance(getattr(c, "hidden_act", None), str):
        problems.append("hidden_act: must name a GELU")
    if problems:
        raise InteropError("cannot import this BERT config:\n  " + "\n  ".join(problems))
    return dict(
        kind="encoder", vocab_size=c.vocab_size, n_blocks=c.num_hidden_layers,
        d_model=c.hidden_size, n_heads=c.num_attention_heads, d_ff=c.intermediate_size,
        max_seq_len=c.max_position_embeddings, positions="learned", mlp="gelu",
        gelu_approx=gelu_approx_of(c.hidden_act, "hidden_act"), bias=True, dropout=0.0,
        n_classes=max(2, n_classes or 2), pooling="first", norm="layernorm", norm_bias=True,
        norm_eps=c.layer_norm_eps, placement="post", final_norm="off", embed_norm=True,
        init="xavier",
    )


@torch.no_grad()
def bert_to_normlab(hf_model: nn.Module) -> NormTransformer:
    """A normlab post-LN encoder whose stream equals `hf_model`'s `last_hidden_state` (for
    token type 0). A `BertForSequenceClassification`'s classifier is copied (its pooler is not:
    see the module doc); other models get normlab's default classifier init."""
    base = _base(hf_model)
    classifier = getattr(hf_model, "classifier", None)
    n_labels = getattr(hf_model.config, "num_labels", 2)
    if classifier is not None and n_labels < 2:
        warnings.warn("BERT classifier with one output (regression) not imported; normlab's "
                      "classifier has n_classes=2", NormlabWarning, stacklevel=2)
        classifier = None
    fields = bert_config_fields(hf_model.config, n_labels if classifier is not None else None)
    model = new_model(fields)
    emb = base.embeddings
    s: dict[str, torch.Tensor] = {
        "tok_emb.weight": emb.word_embeddings.weight,
        "pos_emb.weight": emb.position_embeddings.weight + emb.token_type_embeddings.weight[0],
        "embed_norm.weight": emb.LayerNorm.weight, "embed_norm.bias": emb.LayerNorm.bias,
    }
    for i, layer in enumerate(base.encoder.layer):
        p = f"blocks.{i}"
        att = layer.attention
        q, k, v = att.self.query, att.self.key, att.self.value
        s |= {
            f"{p}.attn.fn.qkv.weight": torch.cat([q.weight, k.weight, v.weight]),
            f"{p}.attn.fn.qkv.bias": torch.cat([q.bias, k.bias, v.bias]),
            f"{p}.attn.fn.proj.weight": att.output.dense.weight,
            f"{p}.attn.fn.proj.bias": att.output.dense.bias,
            f"{p}.attn.post_norm.weight": att.output.LayerNorm.weight,
            f"{p}.attn.post_norm.bias": att.output.LayerNorm.bias,
            f"{p}.mlp.fn.fc_in.weight": layer.intermediate.dense.weight,
            f"{p}.mlp.fn.fc_in.bias": layer.intermediate.dense.bias,
            f"{p}.mlp.fn.fc_out.weight": layer.output.dense.weight,
            f"{p}.mlp.fn.fc_out.bias": layer.output.dense.bias,
            f"{p}.mlp.post_norm.weight": layer.output.LayerNorm.weight,
            f"{p}.mlp.post_norm.bias": layer.output.LayerNorm.bias,
        }
    if classifier is not None:
        s["classifier.weight"], s["classifier.bias"] = classifier.weight, classifier.bias
        warnings.warn("BERT's pooler (tanh dense on [CLS]) has no normlab counterpart and was "
                      "dropped: hidden states match, class logits do not", NormlabWarning,
                      stacklevel=2)
    else:
        s["classifier.weight"] = model.classifier.weight
        s["classifier.bias"] = model.classifier.bias
    load_exact(model, s, "BERT -> normlab")
    return model.eval()


def bert_config_of(model: NormTransformer) -> Any:
    """The `BertConfig` of a normlab model (post-LN encoder with a LayerNorm on the embedding,
    learned positions, GELU MLP, no final norm)."""
    transformers = require_transformers("exporting to BERT")
    cfg = check_exportable(model, target="BERT", kind="encoder", placement="post",
                           embed_norm=True, final_norm=False)
    return transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_blocks,
        num_attention_heads=cfg.n_heads, intermediate_size=cfg.ff_width,
        hidden_act="gelu_pytorch_tanh" if cfg.gelu_approx == "tanh" else "gelu",
        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout,
        max_position_embeddings=cfg.max_seq_len, type_vocab_size=1,
        layer_norm_eps=cfg.norm_eps, pad_token_id=None, num_labels=cfg.n_classes,
    )


@torch.no_grad()
def normlab_to_bert(model: NormTransformer, head: str = "none") -> nn.Module:
    """A `transformers.BertModel` (`head="none"`, no pooler) whose `last_hidden_state` equals the
    normlab model's stream, or a `BertForSequenceClassification` (`head="classifier"`) with
    normlab's classifier behind an identity pooler (its logits read tanh(h_CLS): see the module
    doc). Models without biases export with zero biases."""
    transformers = require_transformers("exporting to BERT")
    if head not in ("none", "classifier"):
        raise InteropError(f"head: {head!r}; use none or classifier")
    hf_cfg = bert_config_of(model)
    with torch.random.fork_rng(devices=[]):
        if head == "none":
            hf = transformers.BertModel(hf_cfg, add_pooling_layer=False)
            prefix = ""
        else:
            hf = transformers.BertForSequenceClassification(hf_cfg)
            prefix = "bert."
    s: dict[str, torch.Tensor] = {}

    def lin(dst: str, m: nn.Linear) -> None:
        s[f"{prefix}{dst}.weight"] = m.weight
        s[f"{prefix}{dst}.bias"] = or_zeros(m.bias, m.weight[:, 0])

    def ln(dst: str, m: nn.Module) -> None:
        s[f"{prefix}{dst}.weight"] = m.weight
        s[f"{prefix}{dst}.bias"] = or_zeros(m.bias, m.weight)

    d = model.cfg.d_model
    s[f"{prefix}embeddings.word_embeddings.weight"] = model.tok_emb.weight
    s[f"{prefix}embeddings.position_embeddings.weight"] = model.pos_emb.weight
    s[f"{prefix}embeddings.token_type_embeddings.weight"] = torch.zeros(1, d)
    ln("embeddings.LayerNorm", model.embed_norm)
    for i, blk in enumerate(model.blocks):
        p = f"encoder.layer.{i}"
        qkv = blk.attn.fn.qkv
        bias = or_zeros(qkv.bias, qkv.weight[:, 0])
        for j, name in enumerate(("query", "key", "value")):
            s[f"{prefix}{p}.attention.self.{name}.weight"] = qkv.weight[j * d:(j + 1) * d]
            s[f"{prefix}{p}.attention.self.{name}.bias"] = bias[j * d:(j + 1) * d]
        lin(f"{p}.attention.output.dense", blk.attn.fn.proj)
        ln(f"{p}.attention.output.LayerNorm", blk.attn.post_norm)
        lin(f"{p}.intermediate.dense", blk.mlp.fn.fc_in)
        lin(f"{p}.output.dense", blk.mlp.fn.fc_out)
        ln(f"{p}.output.LayerNorm", blk.mlp.post_norm)
    if head == "classifier":
        s["bert.pooler.dense.weight"] = torch.eye(d)
        s["bert.pooler.dense.bias"] = torch.zeros(d)
        s["classifier.weight"] = model.classifier.weight
        s["classifier.bias"] = model.classifier.bias
    own = hf.state_dict()
    s |= {k: v for k, v in own.items() if k not in s and "position_ids" in k}  # buffers
    s |= {k: v for k, v in own.items() if k not in s and k.endswith("token_type_ids")}
    load_exact(hf, s, "normlab -> BERT")
    return hf.eval()


def load_bert(folder: str | Path) -> NormTransformer:
    """Import a BERT checkpoint folder into normlab, offline (`AutoModel`: the encoder)."""
    transformers = require_transformers("loading a BERT checkpoint")
    hf = transformers.AutoModel.from_pretrained(
        str(folder), local_files_only=True, trust_remote_code=False, dtype=torch.float32)
    return bert_to_normlab(hf)
