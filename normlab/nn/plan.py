"""Placements as data: each named placement resolves to a list of per-block plans.

A `SublayerPlan` says, for one residual sublayer (attention or MLP), which norms sit where and
which scales apply; the one `Block` executes it. The sublayer computes

    h = in_norm(x) * in_scale
    y = gate * out_norm(F(h))                       (branch as added)
    r = h if skip_normed else x                     (HybridNorm's FFN: the residual is h)
    x = post_norm(skip_scale * r + y [+ x_block])  (x_block: B2T's skip from the block input)
    d = d + y                                       (ResiDual's second stream, when `dual`)

SiameseNorm's sublayer (`dual_in_norm`, Li et al. 2026, arXiv 2602.08064) has the branch read
both streams and adds its output to each, scaled on the first: `h = in_norm(x)`, `y = F(
mix_norm(h + dual_in_norm(d)))`, `x = h + stream_scale * y`, `d = d + y`.

nGPT's sublayer (`hypersphere`, Loshchilov et al. 2024, arXiv 2410.01131) replaces the sum: the
stream stays on the unit sphere, `x = L2(x + a*(L2(F(x)) - L2(x)))` with `L2(v) = v/||v||` and
`a` a learned vector per channel (its eigen learning rate), and its branch F scales Q, K (`s_qk`)
and the MLP's `u`, `v` (`s_uv`) (`normlab.nn.sphere`). `branch_scale` multiplies the branch as
added, `y` above: CompleteP's depth multiplier (`ModelConfig.depth_param`, `completep_multiplier`).

and inside the branch F (`normlab.nn.layers`): `qkv_norm` (Q, K, V each normalized per head,
HybridNorm) and `qk_norm` (Q and K each normalized over the full width, OLMo 2) after the QKV
projection; `inner_norm` before the branch's output map (attention: on the concatenated heads
before the output projection; MLP: on the activation before `fc_out`; Sub-LN, NormFormer);
`head_scale` a learned scale per head on the attention output (NormFormer).

Every builder below cites its paper; `normlab plan` prints the resolved formulas. The placements
themselves are listed once, in `normlab.placements` (name, default init, final norm, paper);
`PLACEMENT_PLANS` below says how each one's blocks are built, keyed by the same names. A
placement of your own (`ModelConfig.placement_def`) says the same in its definition, which
`_user_block` turns into the same `SublayerPlan`s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from normlab.config import ModelConfig, RunConfig
from normlab.placements import (
    DEFAULT_INIT,
    EMBED_NORM,
    NEEDS_FINAL_NORM,
    SublayerDef,
    user_origin,
)

NORM_SYMBOL = {"layernorm": "LN", "rmsnorm": "RMS", "dyt": "DyT", "derf": "Derf",
               "identity": "Id", "batchnorm": "BN"}


@dataclass(frozen=True)
class SublayerPlan:
    kind: str  # "attn" or "mlp"
    in_norm: str | None = None
    in_scale: float = 1.0  # LNS: 1/sqrt(l) on the norm output
    out_norm: str | None = None  # sandwich / Peri-LN: norm on the branch output before the add
    post_norm: str | None = None  # norm after the add (post, deepnorm, admin, ...)
    skip_scale: float = 1.0  # DeepNorm alpha; Admin omega (initial value)
    skip_learned: bool = False  # Admin: omega is a learned per-dimension vector
    gate_init: float | None = None  # ReZero / SkipInit: learned scalar on the branch
    add_block_input: bool = False  # B2T: the block input joins the MLP's residual sum
    dual: bool = False  # ResiDual: the branch also accumulates into the second stream
    qkv_norm: str | None = None  # HybridNorm: Q, K, V normalized per head after projection
    skip_normed: bool = False  # HybridNorm's FFN: the residual is taken after in_norm, not before
    absent: bool = False  # attention: none: the sublayer adds nothing and has no norms
    # Inside the branch (normlab.nn.layers); a placement of your own sets them too (SublayerDef).
    inner_norm: str | None = None  # Sub-LN / NormFormer: norm before the branch's output map
    head_scale: bool = False  # NormFormer: a learned scale per head on the attention output
    qk_norm: str | None = None  # OLMo 2: Q and K normalized over the full width after projection
    # nGPT: the stream on the unit sphere, x = L2(x + a*(L2(F(x)) - L2(x))), with F's own scales
    hypersphere: bool = False
    branch_scale: float = 1.0  # CompleteP: (L_base/L)^alpha on the branch as added
    # SiameseNorm: the branch reads mix_norm(h + dual_in_norm(d)), both streams, and the stream
    # x takes its output times stream_scale (d takes it whole)
    dual_in_norm: str | None = None
    mix_norm: str | None = None
    stream_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.skip_normed and (self.in_norm is None or (self.dual and not self.dual_in_norm)):
            raise ValueError("skip_normed takes the residual after in_norm: it needs an in_norm, "
                             "and with a second stream (dual) a branch that reads both "
                             "(dual_in_norm)")
        if (self.dual_in_norm or self.mix_norm or self.stream_scale != 1.0) and not self.dual:
            raise ValueError("dual_in_norm, mix_norm and stream_scale (SiameseNorm) join the "
                             "second stream to the branch: they need dual")
        if self.mix_norm and not self.dual_in_norm:
            raise ValueError("mix_norm normalizes the sum of both streams the branch reads: it "
                             "needs dual_in_norm")
        if self.kind != "attn" and (self.qkv_norm or self.qk_norm or self.head_scale):
            raise ValueError("qkv_norm, qk_norm and head_scale act on the attention's queries, "
                             "keys, values and heads: an attn sublayer's only")
        if self.hypersphere and (self.in_norm or self.out_norm or self.post_norm or self.dual
                                 or self.skip_learned or self.skip_scale != 1.0
                                 or self.gate_init is not None or self.add_block_input
                                 or self.skip_normed or self.qkv_norm or self.qk_norm
                                 or self.inner_norm or self.head_scale or self.dual_in_norm
                                 or self.mix_norm or self.stream_scale != 1.0):
            raise ValueError("hypersphere (nGPT) normalizes the stream and the branch itself: "
                             "it takes no other norm, skip, gate or second stream")

    def formula(self) -> str:
        """The sublayer as a readable formula, e.g. `x = LN(1.861*x + Attn(x))`, or with the
        residual taken after the input norm `h = LN(x);  x = h + MLP(h)`."""
        v = "a" if self.dual else "x"
        sub = "Attn" if self.kind == "attn" else "MLP"
        inside = []
        if self.qkv_norm:
            inside.append(f"QKV-{NORM_SYMBOL[self.qkv_norm]}")
        if self.qk_norm:
            inside.append(f"QK-{NORM_SYMBOL[self.qk_norm]}")
        if self.inner_norm:
            inside.append(f"inner-{NORM_SYMBOL[self.inner_norm]}")
        if self.head_scale:
            inside.append("head-scale")
        if self.hypersphere:
            inside.append("s_qk*L2(Q), s_qk*L2(K)" if self.kind == "attn" else "s_uv")
        if inside:
            sub += f"[{', '.join(inside)}]"
        if self.hypersphere:
            return (f"x = L2(x + a*(L2({sub}(x)) - L2(x)))   [a learned per dim, "
                    f"a0={NGPT_ALPHA_INIT:.4g}]")
        h = f"{NORM_SYMBOL[self.in_norm]}({v})" if self.in_norm else v
        if self.in_scale != 1.0:
            h = f"{h}*{self.in_scale:.4g}"
        prefix = ""
        if self.skip_normed:  # name the normalized input once: it is both branch input and skip
            prefix, h = f"h = {h};  ", "h"
        read = h
        if self.dual_in_norm:
            read = f"{h} + {NORM_SYMBOL[self.dual_in_norm]}(d)"
            if self.mix_norm:
                read = f"{NORM_SYMBOL[self.mix_norm]}({read})"
        y = f"{sub}({read})"
        if self.out_norm:
            y = f"{NORM_SYMBOL[self.out_norm]}({y})"
        if self.gate_init is not None:
            y = f"g*{y}"
        if self.branch_scale != 1.0:
            y = f"{self.branch_scale:.4g}*{y}"
        y_d = y  # as added to the second stream
        if self.stream_scale != 1.0:  # name the branch once: the two streams take it differently
            prefix, y_d = f"{prefix}y = {y};  ", "y"
            y = f"{self.stream_scale:.4g}*y"
        r = h if self.skip_normed else v
        if self.skip_learned:
            skip = f"w*{r}"
        elif self.skip_scale != 1.0:
            skip = f"{self.skip_scale:.4g}*{r}"
        else:
            skip = r
        total = f"{skip} + {y}" + (" + x_block" if self.add_block_input else "")
        if self.post_norm:
            total = f"{NORM_SYMBOL[self.post_norm]}({total})"
        out = f"{prefix}{v} = {total}" + (f";  d = d + {y_d}" if self.dual else "")
        extras = []
        if self.gate_init is not None:
            extras.append(f"g0={self.gate_init:.4g}")
        if self.skip_learned:
            extras.append(f"w learned per dim, w0={self.skip_scale:.4g}")
        return out + (f"   [{', '.join(extras)}]" if extras else "")


# A block's two sublayer plans, attention then MLP.
Sublayers = tuple[SublayerPlan, SublayerPlan]


@dataclass(frozen=True)
class BlockPlan:
    index: int  # 0-based
    placement: str
    attn: SublayerPlan
    mlp: SublayerPlan

    @property
    def sublayers(self) -> Sublayers:
        return (self.attn, self.mlp)


@dataclass(frozen=True)
class ModelPlan:
    placement: str
    blocks: tuple[BlockPlan, ...]
    embed_norm: str | None
    final_norm: str | None
    dual_stream: bool
    init: str
    constants: dict[str, float] = field(default_factory=dict)
    setting: tuple[str, ...] = ()  # non-default attention, MLP and embedding, in words
    origin: str = ""  # a placement of your own: where it is defined, and its doc
    # SiameseNorm: each stream normalized by a norm of this kind before the final norm reads
    # their sum, out = Norm(Norm(a) + Norm(d)); None: ResiDual's out = a + Norm(d)
    dual_out_norm: str | None = None

    @property
    def hypersphere(self) -> bool:
        """Whether the model is nGPT's: its stream and matrices kept on the unit sphere."""
        return any(s.hypersphere for b in self.blocks for s in b.sublayers)

    def __str__(self) -> str:
        """`print(plan)` shows the readable `describe()`; `repr(plan)` keeps the fields."""
        return self.describe()

    def describe(self) -> str:
        lines = [f"placement {self.placement}, {len(self.blocks)} blocks, init {self.init}"]
        if self.origin:
            lines.append(f"{self.placement}: {self.origin}")
        if self.constants:
            consts = ", ".join(f"{k}={v:.6g}" for k, v in self.constants.items())
            lines.append(f"constants: {consts}")
        lines.extend(self.setting)
        x0 = "x = Emb(tokens)"
        if self.embed_norm:
            x0 = f"x = {NORM_SYMBOL[self.embed_norm]}(Emb(tokens))"
        lines.append(x0 + (";  a = x;  d = x" if self.dual_stream else ""))
        for b in self.blocks:
            for s in b.sublayers:
                if s.absent:
                    continue
                lines.append(f"block {b.index:>3} {s.kind:<4} [{b.placement}]  {s.formula()}")
        if self.dual_out_norm:
            n = NORM_SYMBOL[self.dual_out_norm]
            merged = f"{n}(a) + {n}(d)"
            lines.append(f"out = {NORM_SYMBOL[self.final_norm]}({merged})" if self.final_norm
                         else f"out = {merged}")
        elif self.dual_stream:
            lines.append(f"out = a + {NORM_SYMBOL[self.final_norm or 'identity']}(d)")
        elif self.final_norm:
            lines.append(f"out = {NORM_SYMBOL[self.final_norm]}(x)")
        else:
            lines.append("out = x")
        if self.hypersphere:
            lines.append("logits = s_z * head(out); L2(v) = v/||v||; after every step the "
                         "embedding, head and block matrices are renormalized along d")
        return "\n".join(lines)


# --- constants ------------------------------------------------------------------------------

def deepnorm_constants(arch: str, n_blocks: int, other_blocks: int | None = None
                       ) -> tuple[float, float]:
    """(alpha, beta) of DeepNet, Wang et al. 2022 (arXiv 2203.00555), Table/Fig. 2.

    encoder-only (N blocks) and decoder-only (M blocks): alpha=(2N)^(1/4), beta=(8N)^(-1/4);
    encoder of an encoder-decoder: alpha=0.81 (N^4 M)^(1/16), beta=0.87 (N^4 M)^(-1/16);
    decoder of an encoder-decoder: alpha=(3M)^(1/4), beta=(12M)^(-1/4).
    """
    n = n_blocks
    if arch in ("encoder", "decoder"):
        return (2 * n) ** 0.25, (8 * n) ** -0.25
    if arch == "encdec_encoder":
        if other_blocks is None:
            raise ValueError("encdec_encoder needs the decoder depth M")
        m = other_blocks
        return 0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)
    if arch == "encdec_decoder":
        return (3 * n) ** 0.25, (12 * n) ** -0.25
    raise ValueError(f"unknown DeepNorm architecture {arch!r}")


def admin_closed_form_omega(n_residual_sublayers: int) -> float:
    """Admin's omega without profiling, `sqrt((n+1)/ln(n+1) - 1)` (admin-torch; Liu et al. 2020,
    "Understanding the Difficulty of Training Transformers", arXiv 2004.08249)."""
    n = n_residual_sublayers
    return math.sqrt((n + 1) / math.log(n + 1) - 1)


def keel_alpha(n_residual_sublayers: int) -> float:
    """Keel's skip factor, the number of residual sublayers of the whole model (`2L`; `L` with
    `attention: none`): Chen and Wei 2026, "Post-LayerNorm Is Back" (arXiv 2601.19895), alpha
    "= L (the total number of sub-layers)", as normlab reads it (`_keel`, unconfirmed)."""
    return float(n_residual_sublayers)


def subln_gain(n_blocks: int) -> float:
    """Sub-LN's init gain `sqrt(log(2L))` on V, the attention output projection and both MLP
    maps of an encoder-only or decoder-only model of `L` blocks: Wang et al. 2022, "Foundation
    Transformers" (arXiv 2210.06423), as torchscale computes it (`torchscale/architecture/
    decoder.py`, `Decoder.__init__`, the `if args.subln:` branch: `init_scale =
    math.sqrt(math.log(args.decoder_layers * 2))`, multiplied into every parameter named
    `fc1`, `fc2`, `out_proj` or `v_proj`; `encoder.py` the same with `encoder_layers`)."""
    return math.sqrt(math.log(2 * n_blocks))


# nGPT's eigen learning rates start at 0.05 (the authors' `attn_alpha_init_value`,
# `mlp_alpha_init_value` in model.py's `Block.__init__`; normlab.nn.sphere has the other scales).
NGPT_ALPHA_INIT = 0.05


def completep_multiplier(n_blocks: int, base_blocks: int, alpha: float) -> float:
    """CompleteP's branch multiplier `m_L^-alpha`, `m_L = L / L_base`: Dey et al. 2025, "Don't be
    lazy: CompleteP enables compute-efficient deep transformers" (arXiv 2505.01618), Table 1, as
    the authors' code computes it (github EleutherAI/nanoGPT-mup, branch completep, model.py,
    `Block.__init__`: `self.residual_scaling = 1/(config.depth_multiplier **
    config.depth_alpha_exp)`, `depth_multiplier = depth / base_depth`). alpha = 1 is CompleteP,
    `L_base / L`."""
    return 1 / ((n_blocks / base_blocks) ** alpha)


def completep_lr_scale(n_blocks: int, base_blocks: int, alpha: float) -> float:
    """The factor on the learning rate of every parameter inside the blocks (hidden weights,
    their biases, the blocks' norms), `m_L^(alpha-1)`: 1 for CompleteP (alpha = 1); the authors'
    `configure_optimizers` (`depth_lr_scaling`), same file."""
    return (n_blocks / base_blocks) ** (alpha - 1)


def completep_eps_scale(n_blocks: int, base_blocks: int, alpha: float) -> float:
    """The factor on AdamW's epsilon, `m_L^-alpha`: the authors' `configure_optimizers`,
    `adam_eps *= (1 / mup_width_multiplier) * (depth_multiplier ** (-1 * depth_alpha_exp))`
    (normlab has no width multiplier: 1), applied to every parameter group."""
    return (n_blocks / base_blocks) ** (-alpha)


def admin_o1_omega(n_residual_sublayers: int) -> float:
    """Admin's omega for an O(1) output change, `sqrt(n)` (admin-torch's
    `output_change_scale='O(1)'`; Liu et al. 2020, arXiv 2004.08249)."""
    return math.sqrt(n_residual_sublayers)


# Pairings reported as harmful, with the reason shown in the warning.
HARMFUL_INIT = {
    ("lns", "gpt2_scaled"): "Curse of Depth (arXiv 2502.05795) found LNS with scaled init worse",
    ("lns", "ds_init"): "LNS already scales by depth; Curse of Depth found depth-scaled init worse",
}


# --- per-block builders ---------------------------------------------------------------------

@dataclass(frozen=True)
class BlockSettings:
    """What a block builder reads: the norm kinds and the constants `build_plan` resolved."""

    norm: str  # the kind of every norm the placement puts in
    out_norm: str  # sandwich / peri's branch-output norm
    alpha: float | None  # DeepNorm's skip scale (None where no block and no init uses it)
    omega: float  # Admin's initial skip scale
    rezero_gate: float
    skipinit_gate: float
    keel_alpha: float = 1.0  # Keel's skip factor (`keel_alpha`)


def _post(n: str) -> Sublayers:
    """Post-LN, `x = Norm(x + F(x))`: Vaswani et al. 2017, "Attention Is All You Need"
    (arXiv 1706.03762)."""
    return SublayerPlan("attn", post_norm=n), SublayerPlan("mlp", post_norm=n)


def _pre(n: str) -> Sublayers:
    """Pre-LN, `x = x + F(Norm(x))`: Xiong et al. 2020, "On Layer Normalization in the
    Transformer Architecture" (arXiv 2002.04745); GPT-2; LLaMA."""
    return SublayerPlan("attn", in_norm=n), SublayerPlan("mlp", in_norm=n)


def _sandwich(n: str, out: str) -> Sublayers:
    """Sandwich-LN, `x = x + Norm_out(F(Norm_in(x)))`: CogView (arXiv 2105.13290); the same
    sublayer as Peri-LN (arXiv 2502.02732)."""
    return (SublayerPlan("attn", in_norm=n, out_norm=out),
            SublayerPlan("mlp", in_norm=n, out_norm=out))


def _deepnorm(n: str, alpha: float) -> Sublayers:
    """DeepNorm, `x = Norm(alpha*x + F(x))`: DeepNet, Wang et al. 2022 (arXiv 2203.00555)."""
    return (SublayerPlan("attn", post_norm=n, skip_scale=alpha),
            SublayerPlan("mlp", post_norm=n, skip_scale=alpha))


def _admin(n: str, omega: float) -> Sublayers:
    """Admin, `x = Norm(w*x + F(x))` with w a learned per-dimension vector: Liu et al. 2020,
    "Understanding the Difficulty of Training Transformers" (arXiv 2004.08249)."""
    return (SublayerPlan("attn", post_norm=n, skip_scale=omega, skip_learned=True),
            SublayerPlan("mlp", post_norm=n, skip_scale=omega, skip_learned=True))


def _b2t(n: str) -> Sublayers:
    """B2T connection, `h = Norm(x + Attn(x))`, `out = Norm(h + MLP(h) + x)`: Takase et al. 2022,
    "On Layer Normalizations and Residual Connections in Transformers" (arXiv 2206.00330)."""
    return SublayerPlan("attn", post_norm=n), SublayerPlan("mlp", post_norm=n, add_block_input=True)


def _lns(n: str, block_1based: int) -> Sublayers:
    """LayerNorm Scaling, pre-LN with each norm output divided by sqrt(l): Sun et al. 2025,
    "The Curse of Depth in Large Language Models" (arXiv 2502.05795)."""
    s = 1.0 / math.sqrt(block_1based)
    return SublayerPlan("attn", in_norm=n, in_scale=s), SublayerPlan("mlp", in_norm=n, in_scale=s)


def _hybrid(n: str) -> Sublayers:
    """HybridNorm, Zhuo et al. 2025, "HybridNorm: Towards Stable and Efficient Transformer
    Training via Hybrid Normalization" (arXiv 2503.04598), wired as the authors' released code
    (github BryceZhuo/HybridNorm, `dense_model/olmo/model.py`, `OLMoSequentialBlock.forward`,
    with `configs/exps/1.2B-dense-HybriedNorm.yaml`: `attn_norm: false`, `ffn_norm: true`,
    `ffn_residual_after_norm: true`, `use_query_norm/use_key_norm/use_value_norm: true`):

        x = x + Attn[QKV-Norm](x)      Q, K, V normalized per head (size d/heads); no input norm
        h = Norm(x);  x = h + MLP(h)   the residual carries the normalized stream
        ... out = Norm(x)              the model's final `ln_f`

    Default init `gpt2_scaled`: the released config's `init_fn: full_megatron` draws every matrix
    from N(0, init_std) and the two output projections from N(0, init_std/sqrt(2L)), which is
    `gpt2_scaled` (it also truncates at 3 std, which changes the spread by ~1%; normlab does not).
    Its `init_std` 0.014 at d=2048 is sqrt(2/(5d)); normlab keeps the one `init_std` every
    placement shares (0.02), so that comparing placements changes one thing; set `init_std` to
    reproduce the released value.
    """
    return SublayerPlan("attn", qkv_norm=n), SublayerPlan("mlp", in_norm=n, skip_normed=True)


def _hybrid_star_first(n: str) -> Sublayers:
    """HybridNorm*'s first block (arXiv 2503.04598): a Pre-Norm block that keeps the QKV norms,
    `x = x + Attn[QKV-Norm](Norm(x))`, `x = x + MLP(Norm(x))`. The released code's
    `norm_pos_special_config="_{0:{'attn_norm':True,'ffn_residual':False}}_"` (README of
    BryceZhuo/HybridNorm) turns block 0's `attn_norm` on with `attn_residual_after_norm` still
    false (the input norm feeds the attention, the residual stays un-normalized) and its
    `ffn_residual` off (the MLP's residual is taken before `ff_norm`): Pre-Norm in both."""
    return SublayerPlan("attn", in_norm=n, qkv_norm=n), SublayerPlan("mlp", in_norm=n)


def _olmo2(n: str, out: str) -> Sublayers:
    """OLMo 2's output-only norm, `h = x + Norm(Attn(x))`, `x = h + Norm(MLP(h))`: Team OLMo
    2024, "2 OLMo 2 Furious" (arXiv 2501.00656), Sec. 3.2 ("reordered norm"), wired as Hugging
    Face transformers' `Olmo2DecoderLayer.forward` (`post_attention_layernorm` on the attention
    output, `post_feedforward_layernorm` on the MLP output, each before the residual add; no
    input norm) with the model's final `norm` before the head. OLMo 2 also normalizes Q and K
    (`Olmo2Attention.q_norm`/`k_norm`), which normlab leaves to the `qk_norm` switch of every
    placement; tests/nn/test_placements_2025.py copies a random `transformers` Olmo2 model into
    `olmo2` with `qk_norm`, RMSNorm, SwiGLU, RoPE and no biases and matches its logits."""
    return SublayerPlan("attn", out_norm=out), SublayerPlan("mlp", out_norm=out)


def _keel(n: str, alpha: float) -> Sublayers:
    """Keel, `x_{l+1} = Norm(alpha*x_l + F(Norm(x_l)))`: Chen and Wei 2026, "Post-LayerNorm Is
    Back: Stable, ExpressivE, and Deep" (arXiv 2601.19895), a Post-LN whose skip is scaled
    ("Highway-style") and whose branch reads a normalized input. Published summaries of the paper
    give its alpha as "alpha = L (the total number of sub-layers)", others as "the total number of
    layers L"; normlab takes the residual sublayers of the whole model, 2 per block
    (`keel_alpha`). No code was found released with the paper: **unconfirmed**
    (docs/reference.md section 1). Another alpha is a placement of your own: `in_norm`,
    `post_norm` and `skip_scale` in each sublayer."""
    return (SublayerPlan("attn", in_norm=n, post_norm=n, skip_scale=alpha),
            SublayerPlan("mlp", in_norm=n, post_norm=n, skip_scale=alpha))


def _subln(n: str) -> Sublayers:
    """Sub-LN (Magneto), Wang et al. 2022, "Foundation Transformers" (arXiv 2210.06423): Pre-LN
    with a second norm inside each sublayer, before its output map, wired as torchscale's
    `subln=True` (github microsoft/torchscale):

        x = x + Attn[inner-Norm](Norm(x))  `DecoderLayer.forward` (decoder.py) normalizes the
                                           input (`self_attn_layer_norm`, normalize_before is
                                           forced on by subln in config.py); `MultiheadAttention
                                           .forward` (component/multihead_attention.py) applies
                                           `inner_attn_ln` to the concatenated heads before
                                           `out_proj`
        x = x + MLP[inner-Norm](Norm(x))   `final_layer_norm` on the input; `FeedForwardNetwork
                                           .forward` (component/feedforward_network.py) applies
                                           `ffn_layernorm` after the activation, before `fc2`
        ... out = Norm(x)                  the decoder's `layer_norm` (normalize_before)

    Default init `subln` (`normlab.nn.init`): the gain `subln_gain` on V, the output projection
    and both MLP maps."""
    return (SublayerPlan("attn", in_norm=n, inner_norm=n),
            SublayerPlan("mlp", in_norm=n, inner_norm=n))


def _normformer(n: str, out: str) -> Sublayers:
    """NormFormer, Shleifer et al. 2021, "NormFormer: Improved Transformer Pretraining with Extra
    Normalization" (arXiv 2110.09456): Pre-LN plus a norm on the attention output, a learned
    scale per head, and a norm after the MLP's activation, wired as fairseq's
    `TransformerDecoderLayerBase` (fairseq/modules/transformer_layer.py) with the flags of the
    paper's NormFormer (`--scale-attn --scale-fc --scale-heads`, examples/normformer/README.md;
    not `--scale-resids`):

        x = x + Norm(c * Attn(Norm(x)))    `c_attn`, ones of size heads, multiplies the output of
                                           `self_attn` viewed as [heads, head_dim]
                                           (`torch.einsum("tbhd,h->tbhd", x, self.c_attn)`), then
                                           `attn_ln`, before dropout and the residual add
        x = x + MLP[inner-Norm](Norm(x))   `ffn_layernorm` after `activation_fn(fc1(x))`, before
                                           `fc2`
        ... out = Norm(x)                  the decoder's final `layer_norm` (normalize_before)

    The paper's HeadScaleMHA scales each head before W^O; fairseq's `self_attn` returns the output
    after its `out_proj`, so `c` scales the projected output in head_dim-wide slices (the end of
    the paper's Sec. 2 notes the move, fairseq issue #3973). normlab computes fairseq's."""
    return (SublayerPlan("attn", in_norm=n, out_norm=out, head_scale=True),
            SublayerPlan("mlp", in_norm=n, inner_norm=n))


def _ngpt() -> Sublayers:
    """nGPT, Loshchilov et al. 2024, "nGPT: Normalized Transformer with Representation Learning on
    the Hypersphere" (arXiv 2410.01131), wired as the authors' code (github NVIDIA/ngpt,
    model.py, `Block.forward` and `GPT.forward` with `use_nGPT == 1`):

        x = L2(x + a_A*(L2(Attn(x)) - L2(x)))   `res = A_norm + lr * (B_norm - A_norm)`,
                                               `h = justnorm(res)`, `lr = |attn_alpha * (0.05 /
                                               base_scale)|` (a per-channel eigen learning rate)
          Attn: after RoPE, q = s_qk*L2(q), k = s_qk*L2(k) per head, softmax scale
                sqrt(d_head) (`sqk`, `softmax_scale = sqrt_head_dim`)
        x = L2(x + a_M*(L2(MLP(x)) - L2(x)))   the same with `mlp_alpha`
          MLP: its first map's output times s_uv*sqrt(d) (`suv`) before the activation
        logits = s_z * (x W_head^T)            `sz`; no final norm

    where L2(v) = v/||v|| over the width and every learned scale `s` is stored as in the authors'
    code, a parameter starting at `s_scale` and used as `param * (s_init/s_scale)`
    (`normlab.nn.sphere`). After every optimizer step the embedding, the head and every matrix of
    the blocks are renormalized along the width d (`train.py`, `normalize_matrices`):
    `normlab.train.optim.adamw` adds it as a post-step hook. The authors' recipe trains without
    weight decay and without warmup (`train.py`: `weight_decay = 0.0`, `warmup_iters = 0`); set
    `train.weight_decay: 0` to follow it (normlab's warmup is 0 by default)."""
    return SublayerPlan("attn", hypersphere=True), SublayerPlan("mlp", hypersphere=True)


def _gated(gate: float) -> Sublayers:
    """`x = x + g*F(x)`, no norm. ReZero (Bachlechner et al. 2020, arXiv 2003.04887) starts g at 0;
    SkipInit (De & Smith 2020, arXiv 2002.10444) at a small value, 1/sqrt(L) by default."""
    return SublayerPlan("attn", gate_init=gate), SublayerPlan("mlp", gate_init=gate)


def _resi_dual(n: str) -> Sublayers:
    """ResiDual: post-norm stream `a = Norm(a + F(a))` plus an un-normalized stream `d = d + F(a)`
    started at the embedding; output `a_L + Norm(d_L)`. Xie et al. 2023 (arXiv 2304.14802)."""
    return (SublayerPlan("attn", post_norm=n, dual=True),
            SublayerPlan("mlp", post_norm=n, dual=True))


def siamese_stream_scale(block: int) -> float:
    """SiameseNorm's factor on the branch as added to its Post-Norm-like stream in block `block`
    (0-based), `1/sqrt(2(l+1))`: the authors' `c = ((self.index+1)*2)**0.5` and `x + z/c`
    (github Qwen-Applications/SiameseNorm, deit-model-siamesenorm.py, `Block.forward`; the same
    `c` in dit-model-siamesenorm.py's `DiTBlock.forward` and OLMo_model_hybrid_pre.py's
    `OLMoSequentialBlock.forward`)."""
    return 1.0 / math.sqrt(2 * (block + 1))


def _siamese(n: str, block: int) -> Sublayers:
    """SiameseNorm, Li et al. 2026, "SiameseNorm: Breaking the Barrier to Reconciling
    Pre/Post-Norm" (arXiv 2602.08064): a Post-Norm-like stream `a` and a Pre-Norm-like stream
    `d`, both started at the embedding, coupled through shared residual blocks. Wired as the
    authors' code (github Qwen-Applications/SiameseNorm at 70efa00, deit-model-siamesenorm.py;
    `x` there is `a`, `y` is `d`):

        h = Norm(a)                    `x = self.post_norm1(x)`
        y = F(Norm(h + Norm(d)))       `z = self.input_norm1(x + self.pre_norm1(y))`, the block
        a = h + y/sqrt(2(l+1))         `x, y = x + z/c, y + z`, `c = ((self.index+1)*2)**0.5`,
                                       `l` the 0-based block (`siamese_stream_scale`)
        d = d + y
        ... (the same with post_norm2, pre_norm2, input_norm2 around the MLP)
        out = Norm(Norm(a_L) + Norm(d_L))  `VisionTransformer.forward_features`:
                                           `self.final_norm(self.pre_norm(x) + self.post_norm(y))`

    Each sublayer has three norms of its own (the stream's, the second stream's and the one on
    their sum), the model three at the output (`ModelPlan.dual_out_norm` and the final norm)."""
    c = siamese_stream_scale(block)
    return tuple(SublayerPlan(kind, in_norm=n, skip_normed=True, dual=True, dual_in_norm=n,
                              mix_norm=n, stream_scale=c)
                 for kind in ("attn", "mlp"))  # type: ignore[return-value]


# --- the registry ---------------------------------------------------------------------------

def _custom_blocks(cfg: ModelConfig) -> list[str]:
    assert cfg.block_placements is not None  # the config requires them with placement=custom
    return list(cfg.block_placements)


def _mix_blocks(cfg: ModelConfig) -> list[str]:
    """Mix-LN: post for blocks [0, k), pre for [k, L) (`ModelConfig.mix_switch_block`)."""
    k = cfg.mix_switch_block
    return ["post"] * k + ["pre"] * (cfg.n_blocks - k)


def _hybrid_star_blocks(cfg: ModelConfig) -> list[str]:
    """HybridNorm*: its own (pre-norm) block first, hybrid blocks after it."""
    return ["hybrid_star"] + ["hybrid"] * (cfg.n_blocks - 1)


@dataclass(frozen=True)
class PlacementPlans:
    """How the blocks of one placement are built (its name, the defaults it decides and its paper
    are its entry in `normlab.placements`).

    `block` gives the sublayer plans of a block named after the placement, from the resolved
    settings and the block's 0-based index; `blocks` names the block at each depth (default: the
    placement's own block at every depth), so that a placement may be built of other placements'
    blocks (peri of sandwich blocks, mix of post and pre). A placement usable in
    `block_placements` has its own block and the default `blocks`."""

    block: Callable[[BlockSettings, int], Sublayers] | None = None
    blocks: Callable[[ModelConfig], list[str]] | None = None
    dual_stream: bool = False  # a second, un-normalized stream (ResiDual, SiameseNorm)
    dual_out_norm: bool = False  # SiameseNorm: both streams normalized before their sum


PLACEMENT_PLANS: dict[str, PlacementPlans] = {
    "post": PlacementPlans(lambda s, i: _post(s.norm)),
    "pre": PlacementPlans(lambda s, i: _pre(s.norm)),
    "sandwich": PlacementPlans(lambda s, i: _sandwich(s.norm, s.out_norm)),
    "peri": PlacementPlans(blocks=lambda cfg: ["sandwich"] * cfg.n_blocks),
    "deepnorm": PlacementPlans(lambda s, i: _deepnorm(s.norm, s.alpha)),  # type: ignore[arg-type]
    "admin": PlacementPlans(lambda s, i: _admin(s.norm, s.omega)),
    "resi_dual": PlacementPlans(lambda s, i: _resi_dual(s.norm), dual_stream=True),
    "b2t": PlacementPlans(lambda s, i: _b2t(s.norm)),
    "mix": PlacementPlans(blocks=_mix_blocks),
    "lns": PlacementPlans(lambda s, i: _lns(s.norm, i + 1)),
    "hybrid": PlacementPlans(lambda s, i: _hybrid(s.norm)),
    "hybrid_star": PlacementPlans(lambda s, i: _hybrid_star_first(s.norm),
                                  blocks=_hybrid_star_blocks),
    "rezero": PlacementPlans(lambda s, i: _gated(s.rezero_gate)),
    "skipinit": PlacementPlans(lambda s, i: _gated(s.skipinit_gate)),
    "olmo2": PlacementPlans(lambda s, i: _olmo2(s.norm, s.out_norm)),
    "keel": PlacementPlans(lambda s, i: _keel(s.norm, s.keel_alpha)),
    "subln": PlacementPlans(lambda s, i: _subln(s.norm)),
    "normformer": PlacementPlans(lambda s, i: _normformer(s.norm, s.out_norm)),
    "ngpt": PlacementPlans(lambda s, i: _ngpt()),
    "siamese": PlacementPlans(lambda s, i: _siamese(s.norm, i), dual_stream=True,
                              dual_out_norm=True),
    "custom": PlacementPlans(blocks=_custom_blocks),
}


def _user_sublayer(kind: str, d: SublayerDef, s: BlockSettings, gate_init: float | None
                   ) -> SublayerPlan:
    """A sublayer of a placement of your own: each norm switched on is of the model's norm kind
    (`out_norm`, of the config's `out_norm` kind, as sandwich's); the config's `gate_init`, when
    set, overrides the definition's, as it does rezero's."""
    return SublayerPlan(
        kind, in_norm=s.norm if d.in_norm else None, in_scale=d.in_scale,
        out_norm=s.out_norm if d.out_norm else None, post_norm=s.norm if d.post_norm else None,
        skip_scale=d.skip_scale, skip_learned=d.skip_learned,
        gate_init=gate_init if gate_init is not None and d.gate_init is not None else d.gate_init,
        add_block_input=d.add_block_input, qkv_norm=s.norm if d.qkv_norm else None,
        skip_normed=d.skip_normed, inner_norm=s.norm if d.inner_norm else None,
        head_scale=d.head_scale, qk_norm=s.norm if d.qk_norm else None)


def _user_blocks(cfg: ModelConfig, s: BlockSettings) -> list[Sublayers]:
    """The sublayer plans of each block of a placement of your own (`cfg.placement_def`)."""
    assert cfg.placement_def is not None
    return [(_user_sublayer("attn", b.attn, s, cfg.gate_init),
             _user_sublayer("mlp", b.mlp, s, cfg.gate_init))
            for b in cfg.placement_def.block_defs(cfg.n_blocks)]


def block_names(cfg: ModelConfig) -> list[str]:
    """The placement of each block of `cfg`, in depth order (`BlockPlan.placement`)."""
    if cfg.placement_def is not None:  # a placement of your own: its name at every depth
        return [cfg.placement] * cfg.n_blocks
    plans = PLACEMENT_PLANS[cfg.placement]
    return plans.blocks(cfg) if plans.blocks is not None else [cfg.placement] * cfg.n_blocks


def _block_builder(name: str) -> Callable[[BlockSettings, int], Sublayers]:
    """The sublayer plans of a block of placement `name` (the config admits only names with a
    block of their own in `block_placements`; this names the problem past its check)."""
    if name not in PLACEMENT_PLANS:
        raise ValueError(f"unknown placement {name!r}")
    build = PLACEMENT_PLANS[name].block
    if build is None:
        raise ValueError(f"placement {name!r} has no block of its own; its blocks are "
                         "other placements'")
    return build


def build_plan(cfg: ModelConfig) -> ModelPlan:
    """Resolve `cfg.placement` into one `BlockPlan` per block."""
    n, L = cfg.norm, cfg.n_blocks
    constants: dict[str, float] = {}
    if cfg.placement == "mix":
        constants["mix_switch_block"] = cfg.mix_switch_block
    names = block_names(cfg)
    user = cfg.placement_def
    dual_stream = user is None and PLACEMENT_PLANS[cfg.placement].dual_stream
    dual_out_norm = user is None and PLACEMENT_PLANS[cfg.placement].dual_out_norm

    init = cfg.init or (user.init if user is not None else DEFAULT_INIT[cfg.placement])
    alpha = beta = None
    if "deepnorm" in names or init == "deepnorm":
        arch = cfg.deepnorm_arch or cfg.kind
        a, b = deepnorm_constants(arch, L, cfg.deepnorm_other_blocks)
        alpha = cfg.deepnorm_alpha if cfg.deepnorm_alpha is not None else a
        beta = cfg.deepnorm_beta if cfg.deepnorm_beta is not None else b
        constants["deepnorm_alpha"], constants["deepnorm_beta"] = alpha, beta
    omega = 1.0
    n_residual = (1 if cfg.attention == "none" else 2) * L  # residual sublayers in use
    if "admin" in names:
        if cfg.admin_omega == "closed_form":
            omega = admin_closed_form_omega(n_residual)
        elif cfg.admin_omega == "o1":
            omega = admin_o1_omega(n_residual)
        elif isinstance(cfg.admin_omega, float):
            omega = cfg.admin_omega
        constants["admin_omega"] = omega  # "profile": 1.0 until the profiling pass sets it
    alpha_keel = keel_alpha(n_residual)
    if "keel" in names:
        constants["keel_alpha"] = alpha_keel
    if init == "subln":
        constants["subln_gain"] = subln_gain(L)
    if "ngpt" in names:
        constants["ngpt_alpha_init"] = NGPT_ALPHA_INIT
    branch_scale = 1.0
    if cfg.depth_param == "completep":
        branch_scale = completep_multiplier(L, cfg.depth_base, cfg.depth_alpha)
        constants["completep_multiplier"] = branch_scale
        constants["completep_lr_scale"] = completep_lr_scale(L, cfg.depth_base, cfg.depth_alpha)
    settings = BlockSettings(
        norm=n, out_norm=cfg.out_norm or n, alpha=alpha, omega=omega,
        rezero_gate=cfg.gate_init if cfg.gate_init is not None else 0.0,
        skipinit_gate=cfg.gate_init if cfg.gate_init is not None else 1.0 / math.sqrt(L),
        keel_alpha=alpha_keel)

    blocks = []
    own = _user_blocks(cfg, settings) if user is not None else None
    for i, name in enumerate(names):
        subs = own[i] if own is not None else _block_builder(name)(settings, i)
        if cfg.attention == "none":
            subs = (SublayerPlan("attn", absent=True), subs[1])
        elif cfg.qk_norm:  # OLMo 2's QK-norm, with any placement (a norm of the model's kind)
            subs = (replace(subs[0], qk_norm=n), subs[1])
        if branch_scale != 1.0:  # CompleteP: every branch as added times (L_base/L)^alpha
            subs = tuple(replace(s, branch_scale=branch_scale) for s in subs)  # type: ignore
        blocks.append(BlockPlan(i, name, *subs))

    if cfg.final_norm == "on":
        final = n
    elif cfg.final_norm == "off":
        final = None
    elif user is not None:
        final = n if user.needs_final_norm(L) else None
    else:
        needs = cfg.placement in NEEDS_FINAL_NORM or any(b in NEEDS_FINAL_NORM for b in names)
        final = n if needs else None
    embed_norm = cfg.embed_norm if cfg.embed_norm is not None else (
        user.embed_norm if user is not None else cfg.placement in EMBED_NORM)
    return ModelPlan(
        placement=cfg.placement,
        blocks=tuple(blocks),
        embed_norm=n if embed_norm else None,
        final_norm=final,
        dual_stream=dual_stream,
        init=init,
        constants=constants,
        setting=setting_lines(cfg),
        origin=user_origin(cfg.placement, user, cfg.placement_file),
        dual_out_norm=n if dual_out_norm else None,
    )


def setting_lines(cfg: ModelConfig) -> tuple[str, ...]:
    """The attention, MLP and embedding of `cfg` in words, where they are not the defaults."""
    lines = []
    if cfg.attention == "uniform":
        lines.append("attention: uniform (every allowed position weighted equally, as with "
                     "W^Q = W^K = 0)")
    elif cfg.attention == "none":
        lines.append("attention: none (each block is its MLP sublayer only)")
    if cfg.mlp != "gelu" or cfg.d_ff is not None:
        lines.append(f"MLP: {cfg.mlp}, width {cfg.ff_width}")
    if cfg.embedding == "unit":
        lines.append("embedding: unit (token and position tables of variance 1/2: "
                     "x_0 ~ N(0, I_d))")
    elif cfg.embedding == "fairseq":
        lines.append("embedding: fairseq (tokens N(0, d^-1/2) times sqrt(d); an untied head "
                     "N(0, d^-1/2))")
    if cfg.kind == "decoder" and not cfg.tie_embeddings:
        lines.append("head: untied")
    return tuple(lines)


# --- what a run is, resolved ----------------------------------------------------------------

def resolved_settings(cfg: ModelConfig, plan: ModelPlan | None = None) -> dict[str, object]:
    """The model fields whose default the placement decides (`init`, `final_norm`, `embed_norm`,
    `out_norm`, `d_ff`, the DeepNorm, Admin, Mix-LN and gate constants), as the plan resolved
    them: never `auto` or null for a setting that is in use. A constant the placement does not
    use is None. Listings, reports and TensorBoard's hparams show these, so that Pre's GPT-2
    scaled init and Post's Xavier init are seen where the config only says `init: null`."""
    plan = plan if plan is not None else build_plan(cfg)
    subs = [s for b in plan.blocks for s in b.sublayers]
    c = plan.constants
    gates = [s.gate_init for s in subs if s.gate_init is not None]
    admin = "admin_omega" in c
    return {
        "init": plan.init,
        "final_norm": "on" if plan.final_norm else "off",
        "embed_norm": plan.embed_norm is not None,
        "out_norm": (cfg.out_norm or cfg.norm) if any(s.out_norm for s in subs) else None,
        "d_ff": cfg.ff_width,
        "deepnorm_arch": (cfg.deepnorm_arch or cfg.kind) if "deepnorm_alpha" in c else None,
        "deepnorm_alpha": c.get("deepnorm_alpha"),
        "deepnorm_beta": c.get("deepnorm_beta"),
        # "profile" is resolved per sublayer from a batch when the model is built
        "admin_omega": (cfg.admin_omega if cfg.admin_omega == "profile" else c["admin_omega"])
        if admin else None,
        "mix_switch": c.get("mix_switch_block"),
        "gate_init": gates[0] if len(set(gates)) == 1 else None,
    }


def resolved_model_fields(cfg: ModelConfig) -> dict[str, object]:
    """Every field of `cfg` (its `to_dict()`), with `resolved_settings` in place of the fields
    the placement decides."""
    return cfg.to_dict() | resolved_settings(cfg)


def resolved_run_fields(cfg: RunConfig) -> dict[str, object]:
    """The run config as a mapping (`to_dict()`), its model section by `resolved_model_fields`."""
    return cfg.to_dict() | {"model": resolved_model_fields(cfg.model)}
