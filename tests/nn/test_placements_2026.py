"""nGPT (`placement: ngpt`), SiameseNorm (`placement: siamese`), ProRes (`train.prores_steps`) and
CompleteP (`model.depth_param`), each pinned to its authors' code.

- `ngpt`: an independent re-implementation of the authors' model written from github
  NVIDIA/ngpt, model.py (`Block.__init__`, `Block.forward`, `GPT.forward` with `use_nGPT == 1`;
  `AuthorsBlock`, `AuthorsGPT` below), its weights copied into normlab, gives the same logits;
  the matrices are renormalized as train.py's `normalize_matrices` does, at init and after every
  optimizer step of the one AdamW factory (`normlab.train.optim.adamw`); ngpt trains on CPU.
  The formula cases of tests/nn/test_placements.py run for it through `ref_ngpt_*` below.
- `siamese`: a re-implementation of the authors' block and model written from github
  Qwen-Applications/SiameseNorm at 70efa00, deit-model-siamesenorm.py (`Attention`, `Block`,
  `VisionTransformer.forward_features`; `AuthorsSiameseBlock`, `AuthorsSiameseModel` below),
  normlab's weights copied into it, gives the same logits, causal (a decoder) and bidirectional
  (as the authors' ViT); it trains, runs every probe and stacks.
- ProRes: the factors against the authors' `linear` schedule (github dandingsky/ProRes,
  torchrun_main.py), the branches they scale, a resumed run continuing bit for bit, run ids.
- CompleteP: the branch multiplier, the block groups' lr and AdamW's eps against the paper's
  formulas (arXiv 2505.01618, Table 1, as EleutherAI/nanoGPT-mup's completep branch computes them).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import math  # noqa: E402
from functools import partial  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from normlab.config import ConfigError, TrainConfig, load_run_config, make_model_config  # noqa: E402
from normlab.nn import build_model, build_plan, capture  # noqa: E402
from normlab.nn.block import prores_ramps, set_branch_ramps  # noqa: E402
from normlab.nn.plan import (  # noqa: E402
    completep_eps_scale,
    completep_lr_scale,
    completep_multiplier,
)
from normlab.nn.sphere import sphere_matrices  # noqa: E402
from normlab.train.group import run_unstackable_reason  # noqa: E402
from normlab.train.optim import adamw  # noqa: E402
from normlab.train.step import set_lr  # noqa: E402
from tests.nn.test_placements import (  # noqa: E402
    TOL,
    L,
    T,
    V,
    assert_differs,
    make_cfg,
    make_model,
    ref_attn,
    ref_mlp,
    ref_norm,
    ref_rope,
    tokens,
)

# --- nGPT's formula, for tests/nn/test_placements.py's `ref_stream` ---

def ref_l2(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True))


def ref_ngpt_step(sub: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """`L2(x + a*(L2(y) - L2(x)))`, `a = |alpha * (0.05 * sqrt(d))|` per channel."""
    d = x.shape[-1]
    a = (sub.eigen_lr.weight * (0.05 * math.sqrt(d))).abs()
    return ref_l2(ref_l2(x) + a * (ref_l2(y) - ref_l2(x)))


def ref_ngpt_attn(attn: nn.Module, x: torch.Tensor, *, causal: bool = True, rope: bool = False
                  ) -> torch.Tensor:
    """softmax(sqrt(dh) * (s_qk L2(q)) (s_qk L2(k))^T + mask) V, then the output projection;
    q and k normalized per head after RoPE, `s_qk = param * sqrt(d)`."""
    b, t, d = x.shape
    n_heads = attn.n_heads
    dh = d // n_heads
    qkv = x @ attn.qkv.weight.T
    if attn.qkv.bias is not None:
        qkv = qkv + attn.qkv.bias
    q, k, v = (z.reshape(b, t, n_heads, dh).transpose(1, 2)
               for z in (qkv[..., :d], qkv[..., d: 2 * d], qkv[..., 2 * d:]))
    if rope:
        q, k = ref_rope(q), ref_rope(k)
    s = (attn.qk_scale.weight * math.sqrt(d)).reshape(n_heads, 1, dh)
    q, k = s * ref_l2(q), s * ref_l2(k)
    scores = q @ k.transpose(-2, -1) * math.sqrt(dh)
    if causal:
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    y = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, t, d)
    y = y @ attn.proj.weight.T
    return y + attn.proj.bias if attn.proj.bias is not None else y


def ref_ngpt_mlp(mlp: nn.Module, x: torch.Tensor, swiglu: bool = False) -> torch.Tensor:
    """fc_out(act(s_uv * fc_in x)), `s_uv = param * sqrt(d)`."""
    h = x @ mlp.fc_in.weight.T
    if mlp.fc_in.bias is not None:
        h = h + mlp.fc_in.bias
    h = h * (mlp.uv_scale.weight * math.sqrt(x.shape[-1]))
    if swiglu:
        gate, value = h.chunk(2, dim=-1)
        h = gate * torch.sigmoid(gate) * value
    else:
        h = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
    y = h @ mlp.fc_out.weight.T
    return y + mlp.fc_out.bias if mlp.fc_out.bias is not None else y


# --- the authors' model, re-implemented from NVIDIA/ngpt model.py ---

def authors_rope(q: torch.Tensor) -> torch.Tensor:
    """RoPE in normlab's rotate-half layout, on [B, T, H, Dh]. (The authors'
    `apply_rotary_position_embeddings` pairs channels (2i, 2i+1) and takes its sin and cos
    tables as the two halves of a table that interleaves sin and cos; normlab keeps its own
    RoPE, so the transfer uses normlab's here. nGPT itself is untouched by the choice: RoPE is
    applied before the normalization of q and k in both.)"""
    return ref_rope(q.transpose(1, 2)).transpose(1, 2)


class AuthorsBlock(nn.Module):
    """`Block` of model.py with `use_nGPT == 1`, `bias=False`, in float64; flash attention
    written out (`softmax_scale = sqrt(head_dim)`, causal)."""

    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_embd, self.n_head = n_embd, n_head
        base_scale = 1.0 / n_embd ** 0.5  # train.py: base_scale = 1.0 / n_embd ** 0.5
        self.key = nn.Linear(n_embd, n_embd, bias=False)
        self.query = nn.Linear(n_embd, n_embd, bias=False)
        self.value = nn.Linear(n_embd, n_embd, bias=False)
        self.att_c_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.c_fc = nn.Linear(n_embd, 2 * 4 * n_embd, bias=False)
        self.silu = nn.SiLU()
        self.mlp_c_proj = nn.Linear(4 * n_embd, n_embd, bias=False)
        self.attn_alpha_init_value = 0.05
        self.attn_alpha_init_scaling = base_scale
        self.attn_alpha = nn.Parameter(base_scale * torch.ones(n_embd))
        self.mlp_alpha_init_value = 0.05
        self.mlp_alpha_init_scaling = base_scale
        self.mlp_alpha = nn.Parameter(base_scale * torch.ones(n_embd))
        self.sqk_init_value = 1.0
        self.sqk_init_scaling = base_scale
        self.sqk = nn.Parameter(base_scale * torch.ones(n_embd))
        self.suv_init_value = 1.0
        self.suv_init_scaling = 1.0
        self.suv = nn.Parameter(torch.ones(2 * 4 * n_embd))

    def justnorm(self, x):
        return x / x.norm(p=2, dim=-1, keepdim=True)

    def forward(self, h):
        B, T, C = h.size()
        hin = h
        q, k, v = self.query(hin), self.key(hin), self.value(hin)
        q = q.view(B, T, self.n_head, self.n_embd // self.n_head)
        k = k.view(B, T, self.n_head, self.n_embd // self.n_head)
        v = v.view(B, T, self.n_head, self.n_embd // self.n_head)
        q, k = authors_rope(q), authors_rope(k)
        sqk = (self.sqk * (self.sqk_init_value / self.sqk_init_scaling)).view(
            1, 1, self.n_head, self.n_embd // self.n_head)
        q = sqk * self.justnorm(q)
        k = sqk * self.justnorm(k)
        softmax_scale = (self.n_embd / self.n_head) ** 0.5
        scores = torch.einsum("bthd,bshd->bhts", q, k) * softmax_scale
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v)
        y = y.contiguous().view(B, T, self.n_embd)
        h_att = self.att_c_proj(y)
        lr = self.attn_alpha * (self.attn_alpha_init_value / self.attn_alpha_init_scaling)
        lr = torch.abs(lr)
        A_norm = self.justnorm(h)
        B_norm = self.justnorm(h_att)
        res = A_norm + lr * (B_norm - A_norm)
        h = self.justnorm(res)

        hin = h
        uv = self.c_fc(hin)
        suv = self.suv * ((self.suv_init_value / self.suv_init_scaling) * (self.n_embd ** 0.5))
        uv = suv * uv
        u, v = torch.chunk(uv, 2, dim=-1)
        x_mlp = u * self.silu(v)
        h_mlp = self.mlp_c_proj(x_mlp)
        lr = self.mlp_alpha * (self.mlp_alpha_init_value / self.mlp_alpha_init_scaling)
        lr = torch.abs(lr)
        A_norm = self.justnorm(h)
        B_norm = self.justnorm(h_mlp)
        res = A_norm + lr * (B_norm - A_norm)
        return self.justnorm(res)


class AuthorsGPT(nn.Module):
    """`GPT` of model.py with `use_nGPT == 1`: no final norm, untied head, `logits = sz *
    lm_head(x)`."""

    def __init__(self, vocab: int, n_embd: int, n_head: int, n_layer: int) -> None:
        super().__init__()
        base_scale = 1.0 / n_embd ** 0.5
        self.wte = nn.Embedding(vocab, n_embd)
        self.h = nn.ModuleList(AuthorsBlock(n_embd, n_head) for _ in range(n_layer))
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.sz_init_value = 1.00
        self.sz_init_scaling = base_scale
        self.sz = nn.Parameter(base_scale * torch.ones(vocab))

    def forward(self, idx):
        x = self.wte(idx)
        for block in self.h:
            x = block(x)
        sz = self.sz * (self.sz_init_value / self.sz_init_scaling)
        return sz * self.lm_head(x)


def normalize_matrices(gpt: AuthorsGPT) -> None:
    """train.py's `normalize_matrices`: rows of wte, lm_head, query, key, value, c_fc; columns of
    att_c_proj and mlp_c_proj."""
    def justnorm(x, idim):
        return x / x.norm(p=2, dim=idim, keepdim=True)

    with torch.no_grad():
        gpt.wte.weight.copy_(justnorm(gpt.wte.weight, 1))
        gpt.lm_head.weight.copy_(justnorm(gpt.lm_head.weight, 1))
        for b in gpt.h:
            for m, dim in ((b.query, 1), (b.key, 1), (b.value, 1), (b.att_c_proj, 0),
                           (b.c_fc, 1), (b.mlp_c_proj, 0)):
                m.weight.copy_(justnorm(m.weight, dim))


D_NGPT, H_NGPT, V_NGPT = 16, 2, 32
NGPT_KW = {"placement": "ngpt", "mlp": "swiglu", "d_ff": 4 * D_NGPT, "positions": "rope",
           "bias": False, "tie_embeddings": False}


@torch.no_grad()
def copy_authors_into_normlab(gpt: AuthorsGPT, model: nn.Module) -> None:
    """The authors' weights into normlab's layout: Q, K, V stacked into `qkv`; `c_fc`'s halves
    (u, v) swapped into normlab's (gate, value) = (v, u), and `suv` with them."""
    model.tok_emb.weight.copy_(gpt.wte.weight)
    model.lm_head.weight.copy_(gpt.lm_head.weight)
    model.logit_scale.weight.copy_(gpt.sz)
    f = 4 * D_NGPT
    for a, blk in zip(gpt.h, model.blocks, strict=True):
        at, ml = blk.attn, blk.mlp
        at.fn.qkv.weight.copy_(torch.cat([a.query.weight, a.key.weight, a.value.weight]))
        at.fn.proj.weight.copy_(a.att_c_proj.weight)
        at.fn.qk_scale.weight.copy_(a.sqk)
        at.eigen_lr.weight.copy_(a.attn_alpha)
        ml.fn.fc_in.weight.copy_(torch.cat([a.c_fc.weight[f:], a.c_fc.weight[:f]]))
        ml.fn.uv_scale.weight.copy_(torch.cat([a.suv[f:], a.suv[:f]]))
        ml.fn.fc_out.weight.copy_(a.mlp_c_proj.weight)
        ml.eigen_lr.weight.copy_(a.mlp_alpha)


def authors_pair(seed: int = 0, perturb: bool = True):
    torch.manual_seed(seed)
    gpt = AuthorsGPT(V_NGPT, D_NGPT, H_NGPT, L).double()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in gpt.parameters():
            # the matrices, and with `perturb` every learned scale away from its init (some
            # negative: |alpha|)
            if p.dim() == 2 or perturb:
                p.normal_(0.0, 1.0 / math.sqrt(D_NGPT), generator=gen)
        normalize_matrices(gpt)
    model = build_model(make_model_config(vocab_size=V_NGPT, d_model=D_NGPT, n_heads=H_NGPT,
                                          n_blocks=L, max_seq_len=16, **NGPT_KW)).double()
    copy_authors_into_normlab(gpt, model)
    return gpt, model


@pytest.mark.parametrize("perturb", [False, True])
def test_ngpt_matches_the_authors_model(perturb):
    """Weights of the authors' model (model.py, `GPT`/`Block` with `use_nGPT == 1`) copied into
    normlab's ngpt give the same logits."""
    gpt, model = authors_pair(perturb=perturb)
    idx = tokens(t=7)
    with torch.no_grad():
        ours = model(idx).logits
        theirs = gpt(idx)
    # (normlab's RoPE tables are float32, the reference's float64, as in test_placements.py)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    if perturb:  # the scales matter: one eigen learning rate moved changes the logits
        with torch.no_grad():
            model.blocks[1].mlp.eigen_lr.weight.mul_(2.0)
            assert_differs(model(idx).logits, theirs)


def test_ngpt_default_init_matches_the_authors_init_scales():
    """At init every scale has the authors' effective value (0.05, 1, sqrt(d), 1) and every
    matrix is unit-norm along d (train.py calls `normalize_matrices()` before the first step)."""
    model = build_model(make_model_config(vocab_size=V_NGPT, d_model=D_NGPT, n_heads=H_NGPT,
                                          n_blocks=L, max_seq_len=16, **NGPT_KW))
    d = D_NGPT
    blk = model.blocks[0]
    torch.testing.assert_close(blk.attn.eigen_lr(), torch.full((d,), 0.05))
    torch.testing.assert_close(blk.mlp.eigen_lr(), torch.full((d,), 0.05))
    torch.testing.assert_close(blk.attn.eigen_lr.weight, torch.full((d,), d ** -0.5))
    torch.testing.assert_close(blk.attn.fn.qk_scale(), torch.ones(d))
    torch.testing.assert_close(blk.mlp.fn.uv_scale(), torch.full((8 * d,), d ** 0.5))
    torch.testing.assert_close(model.logit_scale(), torch.ones(V_NGPT))
    assert_unit_norm(model)


def assert_unit_norm(model: nn.Module) -> None:
    named = {id(p): n for n, p in model.named_parameters()}
    matrices = sphere_matrices(model)
    assert len(matrices) == 2 + 4 * len(model.blocks)  # embedding, head, 4 per block
    for w, dim in matrices:
        norms = w.detach().double().norm(dim=dim)
        torch.testing.assert_close(norms, torch.ones_like(norms), rtol=0, atol=1e-5,
                                   msg=lambda m, w=w: f"{named[id(w)]}: {m}")


def test_ngpt_renormalizes_every_matrix_after_each_optimizer_step():
    """The AdamW of `normlab.train.optim.adamw` (single runs, groups, fine-tuning, probes) puts
    each matrix back on the sphere after `step()`: rows of the embedding, head, QKV and first
    MLP map, columns of the output projection and the second MLP map."""
    model = build_model(make_model_config(vocab_size=V_NGPT, d_model=D_NGPT, n_heads=H_NGPT,
                                          n_blocks=L, max_seq_len=16, **NGPT_KW))
    opt = adamw(model, TrainConfig(lr=0.05, weight_decay=0.0))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for step in range(2):
        opt.zero_grad()
        model(tokens(seed=step), tokens(seed=step + 10)).loss.backward()
        opt.step()
        assert_unit_norm(model)
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert "blocks.0.attn.fn.qkv.weight" in moved and "blocks.2.mlp.eigen_lr.weight" in moved
    # another placement's AdamW has no hook and its matrices keep their norms
    pre = build_model(make_model_config(vocab_size=V_NGPT, d_model=D_NGPT, n_heads=H_NGPT,
                                        n_blocks=L, max_seq_len=16))
    assert sphere_matrices(pre) == []
    assert not adamw(pre, TrainConfig())._optimizer_step_post_hooks


def test_ngpt_trains_a_few_steps_on_cpu(tmp_path):
    from normlab.train import train_run
    from normlab.train.logging import read_metrics

    cfg = load_run_config(None, [
        "model.placement=ngpt", "model.n_blocks=2", "model.d_model=32", "model.n_heads=2",
        "model.max_seq_len=32", "model.mlp=swiglu", "data.seq_len=32", "train.batch_size=8",
        "train.eval_batches=1", "train.log_every=1", "train.device=cpu", "train.steps=15",
        "train.lr=1e-2", "train.weight_decay=0", "train.eval_every=0"])
    s = train_run(cfg, tmp_path, progress=False)
    assert s["outcome"] in ("completed", "stalled"), s
    rows = read_metrics(tmp_path / s["run_id"] / "metrics.jsonl")
    assert all(math.isfinite(r["train_loss"]) for r in rows)
    assert rows[-1]["train_loss"] < rows[0]["train_loss"] - 0.3, (rows[0], rows[-1])


def test_ngpt_is_refused_from_stacking_and_names_its_conflicts():
    cfg = load_run_config(None, ["model.placement=ngpt"])
    assert "ngpt" in run_unstackable_reason(cfg)
    with pytest.raises(ConfigError, match="qk_norm"):
        make_model_config(placement="ngpt", qk_norm=True)
    with pytest.raises(ConfigError, match="depth_param"):
        make_model_config(placement="ngpt", depth_param="completep")


def test_normlab_plan_prints_ngpt():
    from normlab.cli import app

    r = CliRunner().invoke(app, ["plan", "--placement", "ngpt"])
    assert r.exit_code == 0, r.output
    assert "x = L2(x + a*(L2(Attn[s_qk*L2(Q), s_qk*L2(K)](x)) - L2(x)))" in r.output


# --- SiameseNorm: the authors' model, re-implemented from Qwen-Applications/SiameseNorm ---

class AuthorsSiameseAttention(nn.Module):
    """`Attention` of deit-model-siamesenorm.py with `qkv_bias=True` (the `VisionTransformer`
    default) and no dropout; `causal` adds the mask of a decoder (the authors' ViT has none)."""

    def __init__(self, dim: int, num_heads: int, causal: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)
        self.causal = causal

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(
            2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q @ k.transpose(-2, -1)) * self.scale
        if self.causal:
            attn = attn.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class AuthorsSiameseMlp(nn.Module):
    """timm's `Mlp` as the block builds it: fc1, exact GELU, fc2 (dropout 0)."""

    def __init__(self, in_features: int, hidden_features: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class AuthorsSiameseBlock(nn.Module):
    """`Block` of deit-model-siamesenorm.py, line for line (drop_path 0): `x` is the
    Post-Norm-like stream, `y` the Pre-Norm-like one."""

    def __init__(self, dim: int, num_heads: int, index: int, causal: bool, eps: float) -> None:
        super().__init__()
        norm_layer = partial(nn.LayerNorm, eps=eps)
        self.pre_norm1 = norm_layer(dim)
        self.post_norm1 = norm_layer(dim)
        self.attn = AuthorsSiameseAttention(dim, num_heads, causal)
        self.pre_norm2 = norm_layer(dim)
        self.post_norm2 = norm_layer(dim)
        self.input_norm1 = norm_layer(dim)
        self.input_norm2 = norm_layer(dim)
        self.index = index
        self.mlp = AuthorsSiameseMlp(dim, 4 * dim)

    def forward(self, x, y):
        c = ((self.index + 1) * 2) ** 0.5
        x = self.post_norm1(x)
        z = self.input_norm1(x + self.pre_norm1(y))
        z = self.attn(z)
        x, y = x + z / c, y + z
        x = self.post_norm2(x)
        z = self.input_norm2(x + self.pre_norm2(y))
        z = self.mlp(z)
        x, y = x + z / c, y + z
        return x, y


class AuthorsSiameseModel(nn.Module):
    """`VisionTransformer.forward_features` of the same file, token and position embeddings in
    place of the patch embedding and class token: `y = x.clone()`, the blocks, then
    `self.final_norm(self.pre_norm(x) + self.post_norm(y))`."""

    def __init__(self, vocab: int, dim: int, heads: int, depth: int, seq: int, causal: bool,
                 eps: float) -> None:
        super().__init__()
        norm_layer = partial(nn.LayerNorm, eps=eps)
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(AuthorsSiameseBlock(dim, heads, i, causal, eps)
                                    for i in range(depth))
        self.pre_norm = norm_layer(dim)
        self.post_norm = norm_layer(dim)
        self.final_norm = norm_layer(dim)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
        y = x.clone()
        for blk in self.blocks:
            x, y = blk(x, y)
        x = (self.pre_norm(x) + self.post_norm(y))
        return self.final_norm(x)


@torch.no_grad()
def copy_normlab_into_authors(model: nn.Module, theirs: AuthorsSiameseModel) -> None:
    """normlab's weights into the authors' layout: a sublayer's `in_norm` is their `post_norm`,
    `dual_in_norm` their `pre_norm`, `mix_norm` their `input_norm`; the model's `stream_norm`,
    `dual_norm` and `norm` under `final` are their `pre_norm`, `post_norm` and `final_norm`."""
    theirs.wte.weight.copy_(model.tok_emb.weight)
    theirs.wpe.weight.copy_(model.pos_emb.weight)
    pairs = [(theirs.pre_norm, model.final.stream_norm), (theirs.post_norm, model.final.dual_norm),
             (theirs.final_norm, model.final.norm)]
    for a, b in zip(theirs.blocks, model.blocks, strict=True):
        pairs += [(a.attn.qkv, b.attn.fn.qkv), (a.attn.proj, b.attn.fn.proj),
                  (a.mlp.fc1, b.mlp.fn.fc_in), (a.mlp.fc2, b.mlp.fn.fc_out),
                  (a.post_norm1, b.attn.in_norm), (a.pre_norm1, b.attn.dual_in_norm),
                  (a.input_norm1, b.attn.mix_norm), (a.post_norm2, b.mlp.in_norm),
                  (a.pre_norm2, b.mlp.dual_in_norm), (a.input_norm2, b.mlp.mix_norm)]
    for a, b in pairs:
        a.load_state_dict(b.state_dict())


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_siamese_matches_the_authors_model(kind):
    """normlab's weights (every norm gain and bias moved off its init) copied into the authors'
    block and model (deit-model-siamesenorm.py, re-implemented above) give the same final stream
    and logits. A one-off run of that file itself (its `Block` and `forward_features` as
    released, timm 1.0.31's `Mlp`; a bidirectional 4-block model of width 32, float64) agreed
    with normlab's `kind: encoder` to 2.2e-15 over the final stream."""
    model = make_model(placement="siamese", kind=kind, norm_eps=1e-6)
    theirs = AuthorsSiameseModel(V, model.cfg.d_model, model.cfg.n_heads, L,
                                 model.cfg.max_seq_len, kind == "decoder", 1e-6).double()
    copy_normlab_into_authors(model, theirs)
    idx = tokens(t=T)
    with torch.no_grad():
        ref = theirs(idx)
        torch.testing.assert_close(model.stream(idx), ref, **TOL)
        if kind == "decoder":
            torch.testing.assert_close(model(idx).logits, ref @ model.lm_head.weight.T, **TOL)
        # each of a sublayer's three norms is where the authors put it: swap two and it shows
        blk = model.blocks[1].mlp
        gains = blk.dual_in_norm.weight.clone()
        blk.dual_in_norm.weight.copy_(blk.mix_norm.weight)
        blk.mix_norm.weight.copy_(gains)
        assert_differs(model.stream(idx), ref)


def test_siamese_streams_at_init():
    """Both streams start at the embedding, and block l's branch enters the first stream times
    1/sqrt(2l) and the second whole (taps `branch_added`, `stream_in`, `stream_out`)."""
    model = build_model(make_cfg(placement="siamese", n_blocks=3), seed=0).double()
    idx = tokens()
    taps = ["blocks.*.*.branch_added", "blocks.*.*.stream_in", "blocks.*.*.stream_out"]
    with torch.no_grad(), capture(model, taps) as cap:
        model(idx)
    for i, blk in enumerate(model.blocks):
        for kind in ("attn", "mlp"):
            sub, at = getattr(blk, kind), f"blocks.{i}.{kind}"
            h = sub.in_norm(cap[f"{at}.stream_in"])
            want = h + cap[f"{at}.branch_added"] / math.sqrt(2 * (i + 1))
            torch.testing.assert_close(cap[f"{at}.stream_out"], want, **TOL)
    assert model.plan.dual_stream and model.plan.dual_out_norm == "layernorm"
    assert model.plan.init == "normal" and model.plan.final_norm == "layernorm"


def test_siamese_trains_a_few_steps_on_cpu(tmp_path):
    from normlab.train import train_run
    from normlab.train.logging import read_metrics

    cfg = load_run_config(None, [
        "model.placement=siamese", "model.n_blocks=2", "model.d_model=32", "model.n_heads=2",
        "model.max_seq_len=32", "data.seq_len=32", "train.batch_size=8", "train.eval_batches=1",
        "train.log_every=1", "train.device=cpu", "train.steps=15", "train.lr=1e-2",
        "train.eval_every=0"])
    assert run_unstackable_reason(cfg) is None  # it stacks (tests/train/test_batched.py)
    s = train_run(cfg, tmp_path, progress=False)
    assert s["outcome"] in ("completed", "stalled"), s
    rows = read_metrics(tmp_path / s["run_id"] / "metrics.jsonl")
    assert all(math.isfinite(r["train_loss"]) for r in rows)
    assert rows[-1]["train_loss"] < rows[0]["train_loss"] - 0.3, (rows[0], rows[-1])


def test_siamese_runs_every_probe():
    """Every probe runs; the logit lens reads block l through the model's own output rule, so
    at the last block its normed reading is the model's loss; `dual_norm` is the second
    stream's."""
    from normlab.probe import text_batches
    from normlab.probe.metrics import PROBES
    from normlab.probe.suite import probe_model

    model = build_model(make_model_config(placement="siamese", n_blocks=3, d_model=16,
                                          n_heads=2, max_seq_len=32), seed=0)
    batches = text_batches(n_batches=1, batch_size=2, seq_len=8)
    res = probe_model(model, batches, PROBES, update_steps=2)
    pb = res["per_block"]
    assert len(pb["dual_norm"]) == 3 and all(v > 0 for v in pb["dual_norm"])
    assert pb["lens_normed"][-1] == pytest.approx(res["summary"]["loss"], rel=1e-5)
    assert len(pb["drop_dloss"]) == 3 and len(pb["skip_effect"]) == 3


def test_normlab_plan_prints_siamese():
    from normlab.cli import app

    r = CliRunner().invoke(app, ["plan", "--placement", "siamese", "--blocks", "2"])
    assert r.exit_code == 0, r.output
    assert "h = LN(a);  y = Attn(LN(h + LN(d)));  a = h + 0.5*y;  d = d + y" in r.output
    assert "out = LN(LN(a) + LN(d))" in r.output


# --- ProRes ---

@pytest.mark.parametrize(("steps", "n_blocks"), [(100, 4), (10, 3), (7, 1), (3, 5), (1000, 12)])
def test_prores_ramps_are_the_authors_linear_schedule(steps, n_blocks):
    """torchrun_main.py: `np.clip(update_step / np.linspace(T // L, T, L), 0, 1)`; a block with
    T_l = 0 (T < L) has no warmup (the authors' code would compute 0/0 at step 0)."""
    ends = np.linspace(steps // n_blocks, steps, n_blocks)
    for t in range(0, steps + 3):
        with np.errstate(divide="ignore", invalid="ignore"):
            want = np.clip(t / ends, 0.0, 1.0)
        want = np.where(ends == 0, 1.0, want)
        assert prores_ramps(steps, n_blocks, t) == pytest.approx(list(want), abs=1e-15)
    assert prores_ramps(steps, n_blocks, 0)[-1] == 0.0
    assert prores_ramps(steps, n_blocks, steps) == [1.0] * n_blocks


@pytest.mark.parametrize("placement", ["pre", "post", "sandwich"])
def test_prores_scales_each_blocks_branches(placement):
    """`x = x + r_l * F(Norm(x))` (pre), `x = Norm(x + r_l * F(x))` (post), the branch as
    added scaled (sandwich: after its output norm), as the authors' decoder layers multiply
    `hidden_states * self.alpha` (modeling_llama.py, `*_prores`)."""
    model = make_model(placement=placement)
    idx = tokens()
    ramps = [0.0, 0.3, 0.8]
    set_branch_ramps(model, ramps)
    cfg = model.cfg
    x = model.tok_emb.weight[idx] + model.pos_emb.weight[: idx.shape[1]]
    for r, blk in zip(ramps, model.blocks, strict=True):
        for sub in (blk.attn, blk.mlp):
            h = ref_norm(x, sub.in_norm, cfg) if sub.in_norm is not None else x
            y = (ref_attn(sub.fn, h, cfg=cfg)[0] if sub.plan.kind == "attn"
                 else ref_mlp(sub.fn, h, cfg=cfg))
            if sub.out_norm is not None:
                y = ref_norm(y, sub.out_norm, cfg)
            x = x + r * y
            if sub.post_norm is not None:
                x = ref_norm(x, sub.post_norm, cfg)
    if model.final.norm is not None:
        x = ref_norm(x, model.final.norm, cfg)
    with torch.no_grad():
        torch.testing.assert_close(model.stream(idx), x, **TOL)
        set_branch_ramps(model, None)  # removed: the model as built
        assert_differs(model.stream(idx), x)


def test_prores_on_ngpt_ramps_its_eigen_learning_rates():
    model = make_model(placement="ngpt")
    idx = tokens()
    with torch.no_grad():
        set_branch_ramps(model, [0.0] * L)  # no step at all: the embedding on the sphere
        out = model.stream(idx)
    x = model.tok_emb.weight[idx] + model.pos_emb.weight[: idx.shape[1]]
    torch.testing.assert_close(out, x / x.norm(dim=-1, keepdim=True), **TOL)


TINY = ["model.n_blocks=3", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=8", "train.eval_batches=2", "train.log_every=1",
        "train.device=cpu"]


def test_prores_run_resumes_bit_exact(tmp_path):
    """The factors are a function of the step counter: a run interrupted mid-warmup and resumed
    records every loss, lr, grad norm and val loss of the uninterrupted run."""
    from normlab.train import train_run
    from normlab.train.logging import read_metrics

    args = TINY + ["train.steps=10", "train.prores_steps=8", "train.eval_every=3",
                   "train.block_stats_every=4"]

    def losses(run_dir):
        return [{k: v for k, v in r.items() if k not in ("time_s", "tokens_per_s")}
                for r in read_metrics(run_dir / "metrics.jsonl")]

    full = train_run(load_run_config(None, args), tmp_path / "a", progress=False)
    part = train_run(load_run_config(None, args), tmp_path / "b", progress=False,
                     interrupt_at=4)
    assert part["outcome"] == "interrupted" and part["step"] == 4
    resumed = train_run(load_run_config(None, args), tmp_path / "b", progress=False)
    assert resumed["outcome"] == full["outcome"]
    a, b = losses(tmp_path / "a" / full["run_id"]), losses(tmp_path / "b" / part["run_id"])
    assert len(a) == len(b) == 10 and a == b
    plain = train_run(load_run_config(None, TINY + ["train.steps=10", "train.eval_every=3",
                                                    "train.block_stats_every=4"]),
                      tmp_path / "c", progress=False)
    c = losses(tmp_path / "c" / plain["run_id"])
    assert c[0]["train_loss"] != a[0]["train_loss"]  # step 0: every branch off


def test_new_options_keep_existing_run_ids_and_refuse_stacking():
    base = load_run_config(None, [])
    assert base.run_id() == "pre-L6-d256-b018512572e8"  # the id it had before these options
    same = load_run_config(None, ["train.prores_steps=0", "model.depth_param=standard"])
    assert same.run_id() == base.run_id()
    prores = load_run_config(None, ["train.prores_steps=100"])
    completep = load_run_config(None, ["model.depth_param=completep"])
    assert len({base.run_id(), prores.run_id(), completep.run_id()}) == 3
    assert run_unstackable_reason(base) is None
    assert "ProRes" in run_unstackable_reason(prores)
    assert "CompleteP" in run_unstackable_reason(completep)


# --- CompleteP ---

@pytest.mark.parametrize(("n", "base", "alpha", "mult", "lr", "eps"), [
    (8, 2, 1.0, 0.25, 1.0, 0.25),      # CompleteP: m_L = 4, branch 1/4, lr m_L^0, eps 1/4
    (8, 2, 0.5, 0.5, 0.5, 0.5),        # alpha = 1/2: branch 1/2, lr 4^-1/2, eps 4^-1/2
    (6, 1, 1.0, 1 / 6, 1.0, 1 / 6),    # L_base = 1: the 1/L of the paper's abstract
    (4, 4, 1.0, 1.0, 1.0, 1.0),        # at the base depth nothing changes
])
def test_completep_constants_by_hand(n, base, alpha, mult, lr, eps):
    """Table 1 of arXiv 2505.01618 with m_L = L/L_base and no width multiplier: branch
    m_L^-alpha, block lr m_L^(alpha-1), AdamW eps m_L^-alpha."""
    assert completep_multiplier(n, base, alpha) == pytest.approx(mult, rel=1e-15)
    assert completep_lr_scale(n, base, alpha) == pytest.approx(lr, rel=1e-15)
    assert completep_eps_scale(n, base, alpha) == pytest.approx(eps, rel=1e-15)


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_completep_scales_every_branch(placement):
    model = make_model(placement=placement, n_blocks=4, depth_param="completep", depth_base=2)
    ref = make_model(placement=placement, n_blocks=4)  # the same weights (same seeds)
    idx = tokens()
    with torch.no_grad():
        set_branch_ramps(ref, [0.5] * 4)  # the branch scaled by 1/2 = (2/4)^1, as ProRes would
        torch.testing.assert_close(model.stream(idx), ref.stream(idx), **TOL)
    assert "x = x + 0.5*Attn(LN(x))" in build_plan(model.cfg).describe() or placement == "post"


def test_completep_optimizer_groups():
    """Every parameter inside the blocks in groups of lr `lr_scale * lr` (set_lr keeps the
    factor), the rest at lr; eps times m_L^-alpha; decay on matrices as before."""
    model = build_model(make_cfg(n_blocks=8, depth_param="completep", depth_base=2,
                                 depth_alpha=0.5))
    tc = TrainConfig(lr=1e-3, eps=1e-8, weight_decay=0.1)
    opt = adamw(model, tc)
    names = {id(p): n for n, p in model.named_parameters()}
    set_lr(opt, 2e-3)
    for g in opt.param_groups:
        inside = {names[id(p)].startswith("blocks.") for p in g["params"]}
        assert len(inside) == 1
        assert g["lr"] == pytest.approx(2e-3 * (0.5 if inside.pop() else 1.0), rel=1e-15)
        assert g["eps"] == pytest.approx(1e-8 * 0.5, rel=1e-15)
    decayed = {names[id(p)] for g in opt.param_groups if g["weight_decay"] for p in g["params"]}
    assert "blocks.0.attn.fn.qkv.weight" in decayed and "tok_emb.weight" not in decayed
    standard = adamw(build_model(make_cfg(n_blocks=8)), tc)
    assert len(standard.param_groups) == 2
    assert all("lr_scale" not in g and g["eps"] == 1e-8 for g in standard.param_groups)


def test_completep_config_checks():
    with pytest.raises(ConfigError, match="depth_base"):
        make_model_config(depth_base=2)
    assert make_model_config(depth_param="completep", depth_base=2).depth_base == 2
