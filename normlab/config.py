"""Validated, frozen, serializable configs.

A config is the whole description of what is built: the model is a pure function of its
`ModelConfig` (plus the seed). Unknown keys, contradictory options and out-of-range values are
rejected with one message per problem naming the field and the allowed values (`ConfigError`).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from normlab import placements
from normlab.placements import InitScheme
from normlab.userinput import (
    ConfigError,
    did_you_mean,
    parse_yaml_text,
    read_yaml,
    read_yaml_file,
    write_yaml,
)

NormKind = Literal["layernorm", "rmsnorm", "dyt", "derf", "identity", "batchnorm"]
# The allowed placements are the registry's names (normlab.placements), in its order; those that
# describe one block on their own are usable in a per-block list (`custom`). The Literals are
# built from the registry, which type checkers cannot follow: to them the fields are strings.
if TYPE_CHECKING:
    Placement = str
    BlockPlacement = str
else:
    Placement = Literal[placements.PLACEMENTS]
    BlockPlacement = Literal[placements.BLOCK_PLACEMENTS]
DeepNormArch = Literal["encoder", "decoder", "encdec_encoder", "encdec_decoder"]

MAX_BLOCKS = 4096
PLACEMENTS: tuple[str, ...] = placements.PLACEMENTS


class _Frozen(BaseModel):
    # allow_inf_nan=False: an inf or nan setting (`lr: .inf`) is rejected by name here, not
    # filed as a divergence at step 1 and then written to config.yaml as null.
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True,
                              allow_inf_nan=False)


class ModelConfig(_Frozen):
    """One Transformer; the normalization placement is a setting, not a code fork."""

    kind: Literal["decoder", "encoder"] = Field(
        "decoder", description="decoder: causal LM head; encoder: bidirectional + classifier"
    )
    vocab_size: int = Field(256, ge=2, description="token ids; normlab's byte data needs 256")
    n_blocks: int = Field(6, ge=1, le=MAX_BLOCKS, description="Transformer blocks L (depth)")
    d_model: int = Field(256, ge=2, description="width d of the residual stream")
    n_heads: int = Field(4, ge=1, description="attention heads; must divide d_model")
    d_ff: int | None = Field(None, ge=1, description="MLP hidden width; default 4*d (8/3*d SwiGLU)")
    max_seq_len: int = Field(256, ge=1, description="longest sequence (learned positions)")
    positions: Literal["learned", "rope"] = Field(
        "learned", description="learned absolute position embeddings, or rotary (RoPE)")
    rope_base: float = Field(10000.0, gt=1.0, description="RoPE frequency base")
    mlp: Literal["gelu", "swiglu", "relu"] = Field(
        "gelu", description="MLP activation: gelu, swiglu (gated), or relu (Vaswani et al. 2017; "
        "the FFN of Xiong et al.'s analysis, with d_ff = d_model)"
    )
    attention: Literal["softmax", "uniform", "none"] = Field(
        "softmax", description="softmax: scaled dot-product attention; uniform: every allowed "
        "position weighted equally, as with W^Q = W^K = 0 (the setting Xiong et al. 2020 "
        "analyse); none: no attention sublayer (FFN-only blocks)"
    )
    embedding: Literal["normal", "unit", "fairseq"] = Field(
        "normal", description="normal: token and position tables N(0, init_std) (GPT-2); unit: "
        "tables of variance 1/2 each, so x_0 ~ N(0, I_d) (Xiong et al.'s Lemma 2); fairseq: "
        "tokens N(0, d^-1/2) times sqrt(d) at the input and an untied head N(0, d^-1/2) "
        "(fairseq's embed_scale and output projection)"
    )
    gelu_approx: Literal["none", "tanh"] = Field(
        "none", description="GELU of the gelu MLP: exact (none) or the tanh approximation (GPT-2)"
    )
    bias: bool = Field(True, description="biases on the linear maps")
    tie_embeddings: bool = Field(True, description="output head shares the token embedding")
    dropout: float = Field(0.0, ge=0.0, lt=1.0,
                           description="dropout on attention weights and branch outputs")
    n_classes: int = Field(3, ge=2, description="classifier outputs (encoder only)")
    pooling: Literal["mean", "first"] = Field(
        "mean", description="classifier pooling over positions (encoder only)")

    norm: NormKind = Field("layernorm", description="kind of every norm the placement puts in")
    norm_bias: bool = Field(True, description="LayerNorm with a bias (beta) or without")
    norm_eps: float = Field(1e-5, gt=0.0, description="epsilon of LayerNorm and RMSNorm")
    dyt_alpha: float = Field(0.5, gt=0.0, description="initial alpha of DyT")
    out_norm: NormKind | None = Field(
        None, description="kind of the branch-output norm of sandwich/peri, olmo2 and "
        "normformer's attention (default: norm)"
    )

    placement: Placement = Field(
        "pre", description="where the norms go relative to the residual (`normlab plan`); or "
        "a placement of your own, defined in placement_file, placement_def or by "
        "`normlab.register_placement` (docs/reference.md, \"Placements of your own\")")
    placement_file: str | None = Field(
        None, exclude=True, description="YAML file of placements of your own, `placements: "
        "{name: definition}`, that placement may name (a path from the working directory); "
        "the definition is recorded in placement_def, and the path is neither recorded nor "
        "hashed")
    placement_def: placements.PlacementDef | None = Field(
        None, description="the definition of a placement of your own (filled in from "
        "placement_file or the registration; its doc is not hashed); null for a built-in one")
    block_placements: tuple[BlockPlacement, ...] | None = Field(
        None, description="one placement per block (placement=custom)"
    )
    final_norm: Literal["auto", "on", "off"] = Field(
        "auto", description="norm before the head; auto: on where the placement leaves the "
        f"stream unnormalized ({', '.join(placements.NEEDS_FINAL_NORM)}, and mix or custom "
        "with a block of one of them)")
    embed_norm: bool | None = Field(
        None, description="norm on the embedding output "
        f"({', '.join(f'{p}: on' for p in placements.EMBED_NORM)})")
    residual_attention: bool = Field(False, description="RealFormer residual attention scores")
    qk_norm: bool = Field(
        False, description="Q and K each normalized over the full width d after their "
        "projection, before the split into heads and RoPE, by a norm of the norm kind (OLMo 2; "
        "with any placement)")

    init: InitScheme | None = Field(
        None, description="init scheme; null: the placement's paper's "
        f"({placements.default_init_text()}; `normlab plan` prints it)")
    init_std: float = Field(0.02, gt=0.0, description="std of the normal-based inits")
    deepnorm_arch: DeepNormArch | None = Field(
        None, description="which DeepNet table row sets alpha/beta (default from kind)"
    )
    deepnorm_alpha: float | None = Field(
        None, gt=0.0, description="DeepNorm residual scale; default from the DeepNet table")
    deepnorm_beta: float | None = Field(
        None, gt=0.0, description="DeepNorm init gain; default from the DeepNet table")
    deepnorm_other_blocks: int | None = Field(
        None, ge=1, description="decoder blocks M (encdec_encoder) or encoder blocks N"
    )
    admin_omega: Literal["closed_form", "profile", "o1"] | float = Field(
        "closed_form", description="Admin's omega: closed_form (admin-torch's default O(log n) "
        "output change, omega^2 = (n+1)/ln(n+1) - 1), o1 (admin-torch's O(1) setting, "
        "omega^2 = n), profile (Liu et al.'s profiling pass), or a number; n = residual "
        "sublayers"
    )
    mix_switch: int | float = Field(
        0.25, description="Mix-LN: blocks before the switch are post; an int count or a ratio"
    )
    gate_init: float | None = Field(
        None, ge=0.0, description="ReZero/SkipInit gate init (rezero: 0, skipinit: 1/sqrt(L))"
    )
    depth_param: Literal["standard", "completep"] = Field(
        "standard", description="depth parameterization: standard, or completep (Dey et al. "
        "2025, arXiv 2505.01618): every residual branch times (depth_base/n_blocks)^depth_alpha, "
        "the lr of every block parameter times (n_blocks/depth_base)^(depth_alpha-1) and AdamW's "
        "eps times (n_blocks/depth_base)^-depth_alpha")
    depth_base: int = Field(
        1, ge=1, description="completep: the base depth L_base the multipliers are relative to")
    depth_alpha: float = Field(
        1.0, ge=0.5, le=1.0, description="completep: the depth exponent alpha (1: CompleteP; "
        "0.5: the 1/sqrt(L) branch scaling it is compared with)")

    @model_validator(mode="before")
    @classmethod
    def _user_placement(cls, data: Any) -> Any:
        return placements.resolve_user_placement(data)

    @field_validator("placement", mode="wrap")
    @classmethod
    def _placement_name(cls, value: Any, handler: Any) -> Any:
        return placements.check_placement_name(value, handler)

    @field_validator("final_norm", mode="before")
    @classmethod
    def _on_off(cls, value: Any) -> Any:
        # `final_norm: off` in a YAML file arrives as False (YAML 1.1 booleans)
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        problems: list[str] = []
        if self.d_model % self.n_heads:
            problems.append(
                f"n_heads: {self.n_heads} does not divide d_model={self.d_model}; "
                "choose n_heads among the divisors of d_model"
            )
        elif self.positions == "rope" and (self.d_model // self.n_heads) % 2:
            problems.append("positions: rope needs an even head width d_model/n_heads")
        if self.kind == "decoder" and "batchnorm" in (self.norm, self.out_norm):
            problems.append(
                "norm: batchnorm is rejected for kind=decoder (batch statistics leak future "
                "tokens); use it with kind=encoder, or pick layernorm|rmsnorm|dyt|derf|identity"
            )
        if self.qk_norm and self.norm not in ("layernorm", "rmsnorm", "identity"):
            problems.append(f"qk_norm: normalizes Q and K (OLMo 2), which {self.norm} does not "
                            "support; use layernorm or rmsnorm")
        if self.placement in ("hybrid", "hybrid_star") and self.norm in ("dyt", "derf",
                                                                          "batchnorm"):
            problems.append(
                f"norm: {self.placement} normalizes Q, K and V per head (HybridNorm), which "
                f"{self.norm} does not support; use layernorm or rmsnorm"
            )
        if self.placement == "custom":
            if self.block_placements is None:
                problems.append("block_placements: required with placement=custom")
            elif len(self.block_placements) != self.n_blocks:
                problems.append(
                    f"block_placements: {len(self.block_placements)} entries for "
                    f"n_blocks={self.n_blocks}; give one placement per block"
                )
        elif self.block_placements is not None:
            problems.append("block_placements: only used with placement=custom")
        if self.placement_def is not None:
            problems += self.placement_def.setting_problems(self.norm, self.out_norm,
                                                            self.attention)
            blocks = self.placement_def.count_problem(self.n_blocks)
            problems += [f"placement_def.{blocks}"] if blocks else []
        if self.depth_param == "standard" and (self.depth_base != 1 or self.depth_alpha != 1.0):
            problems.append("depth_base, depth_alpha: used with depth_param: completep only; "
                            "set depth_param: completep or remove them")
        if self.placement == "ngpt":
            if self.qk_norm:
                problems.append("qk_norm: ngpt normalizes Q and K itself (scaled by s_qk); "
                                "remove qk_norm")
            if self.depth_param != "standard":
                problems.append("depth_param: ngpt's eigen learning rates set each sublayer's "
                                "step on the sphere, not a residual sum that CompleteP could "
                                "scale; use depth_param: standard")
        if self.placement == "resi_dual" and self.final_norm == "off":
            problems.append(
                "final_norm: resi_dual's output is a_L + Norm(d_L), so its final norm cannot "
                "be off; use auto or on"
            )
        problems += self._source_setting_problems()
        if isinstance(self.mix_switch, float) and not 0.0 <= self.mix_switch <= 1.0:
            problems.append(f"mix_switch: ratio {self.mix_switch} outside [0, 1]")
        if isinstance(self.mix_switch, int) and not 0 <= self.mix_switch <= self.n_blocks:
            problems.append(f"mix_switch: count {self.mix_switch} outside [0, n_blocks]")
        if isinstance(self.admin_omega, float) and self.admin_omega <= 0:
            problems.append("admin_omega: must be > 0, closed_form or profile")
        if self.deepnorm_arch in ("encdec_encoder", "encdec_decoder") and (
            self.deepnorm_other_blocks is None
        ):
            problems.append(
                "deepnorm_other_blocks: the encoder-decoder DeepNorm constants need the "
                "other stack's depth"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _source_setting_problems(self) -> list[str]:
        """Combinations of the analysed-setting options (attention, relu, embedding) that mean
        nothing, each named with what to choose instead."""
        problems = []
        if self.attention != "softmax":
            if self.residual_attention:
                problems.append(f"residual_attention: RealFormer adds softmax scores, which "
                                f"attention={self.attention} does not compute; use "
                                "attention: softmax")
            if self.placement in ("hybrid", "hybrid_star"):
                problems.append(f"attention: {self.placement} normalizes Q and K inside softmax "
                                "attention; use attention: softmax")
            if self.qk_norm:
                problems.append(f"qk_norm: normalizes Q and K inside softmax attention, which "
                                f"attention={self.attention} does not compute; use attention: "
                                "softmax")
            if self.positions == "rope":
                problems.append(f"positions: rope rotates queries and keys, which "
                                f"attention={self.attention} does not use; use positions: "
                                "learned")
        if self.attention == "none" and self.placement == "b2t":
            problems.append("attention: b2t's skip is defined around the attention sublayer; "
                            "use attention: softmax or uniform")
        if self.mlp != "gelu" and self.gelu_approx != "none":
            problems.append(f"gelu_approx: {self.gelu_approx} applies to mlp=gelu only (mlp is "
                            f"{self.mlp}); remove it")
        return problems

    # -- derived values ------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def causal(self) -> bool:
        return self.kind == "decoder"

    @property
    def ff_width(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        if self.mlp == "swiglu":  # keep parameter count of a 4d GELU MLP (LLaMA)
            return max(1, int(8 * self.d_model / 3 + 0.5))
        return 4 * self.d_model

    @property
    def mix_switch_block(self) -> int:
        """Mix-LN's k: blocks [0, k) are post-norm, [k, L) pre-norm (floor(a*L) for a ratio)."""
        if isinstance(self.mix_switch, int):
            return self.mix_switch
        return int(self.mix_switch * self.n_blocks)

    # -- serialization --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())


def load_yaml(text_or_path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping from a path or a string; errors name the file."""
    is_text = isinstance(text_or_path, str) and "\n" in text_or_path
    path = None if is_text else Path(text_or_path)
    if path is not None and (path.exists() or isinstance(text_or_path, Path)):
        source, data = str(path), read_yaml_file(path)
    else:
        source = "<string>"
        data = parse_yaml_text(str(text_or_path), source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ConfigError(f"{source}: expected a mapping of config fields, got {kind}")
    return data


def parse_config(cls: type[BaseModel], data: dict[str, Any]) -> Any:
    """Build a config, turning pydantic's report into one readable `ConfigError`."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(cls, e)) from None


# The last part of an error location that names a member of a union (`admin_omega.float`), not a
# field: the errors of one field's members are reported together, under the field's name.
_UNION_MEMBER = re.compile(r"^(int|float|str|bool|none|literal\[.*\]|tuple\[.*\]|list\[.*\])$")


def format_validation_error(cls: type[BaseModel], err: ValidationError) -> str:
    by_loc: dict[str, list[str]] = {}
    for item in err.errors():
        parts = list(item["loc"])
        while len(parts) > 1 and isinstance(parts[-1], str) and _UNION_MEMBER.match(parts[-1]):
            parts.pop()
        loc = ".".join(str(p) for p in parts)
        msg = item["msg"]
        if item["type"] == "extra_forbidden":
            section = _section_class(cls, item["loc"][:-1])
            known = sorted(section.model_fields)
            name = str(item["loc"][-1])
            # a near miss inside a section is named by its full path, as --set takes it
            within = "".join(f"{part}." for part in item["loc"][:-1])
            hint = _in_a_section(section, name) or did_you_mean(
                name, known, [within + k for k in known])
            msg = f"unknown field{hint}; known fields are: {', '.join(known)}"
        elif item["type"] == "literal_error":
            got = item.get("input")
            valid = re.findall(r"'([^']*)'", str(item.get("ctx", {}).get("expected", "")))
            hint = did_you_mean(got, valid) if isinstance(got, str) else ""
            msg = f"{msg}, got {got!r}{hint}"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        by_loc.setdefault(loc, []).append(msg)
    lines = [f"{loc}: {'; or '.join(dict.fromkeys(msgs))}" if loc else "; ".join(msgs)
             for loc, msgs in by_loc.items()]
    return f"invalid {cls.__name__}:\n  " + "\n  ".join(lines)


def _in_a_section(cls: type[BaseModel], name: str) -> str:
    """`" (did you mean 'model.placement'?)"` when `name` is not a field of `cls` but is one of
    its sections' (a run config's `placement` given without `model.`), or the closest such."""
    dotted = []
    for section, field in cls.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            dotted += [f"{section}.{f}" for f in sub.model_fields]
    exact = [d for d in dotted if d.split(".", 1)[1] == name]
    if exact:
        return f" (did you mean {exact[0]!r}?)"
    near = difflib.get_close_matches(name, [d.split(".", 1)[1] for d in dotted], n=1,
                                     cutoff=0.8)
    return next((f" (did you mean {d!r}?)" for d in dotted if near and d.endswith("." + near[0])),
                "")


def _section_class(cls: type[BaseModel], loc: tuple) -> type[BaseModel]:
    """The config class at a nested location, e.g. ("train",) -> TrainConfig."""
    for part in loc:
        field = cls.model_fields.get(str(part))
        sub = field.annotation if field is not None else None
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            break
        cls = sub
    return cls


def make_model_config(**fields: Any) -> ModelConfig:
    """Keyword shortcut for `ModelConfig` with `ConfigError` on bad input."""
    return parse_config(ModelConfig, fields)


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """`["model.placement=post", "train.lr=1e-3"]` -> nested dict; values are read as YAML."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. model.placement=post")
        try:
            value = read_yaml(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        if isinstance(value, bool) and raw.strip().lower() not in ("true", "false"):
            value = raw.strip()  # YAML 1.1 reads on/off/yes/no as booleans; keep the word
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part} is set both as a value and a section")
        node[parts[-1]] = value
    return out


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


TASKS = ("khop",)
# The fields of the synthetic tasks (`task` and its settings), and those that only text reads.
KHOP_FIELDS = ("khop_alphabet", "khop_min_hops", "khop_max_hops")
DATA_TASK_FIELDS = ("task", *KHOP_FIELDS)
# Task fields added after the task's run ids were first issued (hashed only when set, below).
KHOP_OPTIONS = ("khop_unanswered",)
TEXT_FIELDS = ("source", "val_fraction", "split_seed", "tokenizer", "text_field")
# Fields added after run ids were first issued: hashed only when set away from their default,
# so every run recorded before they existed keeps its id (and its folder).
DATA_HASHED_WHEN_SET = ("tokenizer", "text_field", *KHOP_OPTIONS)


class DataConfig(_Frozen):
    """Which text, how it is split, and the context length; or a synthetic task (`task`)."""

    source: str | tuple[str, ...] = Field(
        "shakespeare", description="shakespeare, a .txt, .jsonl or .parquet file, a folder of "
        "them, a list of these, or a folder of token files (train.bin, val.bin; docs/data.md)"
    )
    tokenizer: str = Field(
        "byte", description="byte (every byte a token), bpe:N (a byte-level BPE of N tokens "
        "trained on the training split), or a path to a tokenizer.json or a Hugging Face "
        "tokenizer folder; model.vocab_size follows it when left out")
    text_field: str = Field(
        "text", min_length=1, description="the field of a .jsonl/.parquet record that holds its "
        "text")
    val_fraction: float = Field(0.1, gt=0.0, le=0.5, description="bytes held out as whole works")
    split_seed: int = Field(0, ge=0, description="seed of the choice of held-out works")
    seq_len: int = Field(128, ge=2, description="tokens per training sequence")
    task: Literal["khop"] | None = Field(
        None, description="a synthetic task instead of text: khop, the k-hop induction heads "
        "task of Sanford, Hsu and Telgarsky 2024 (docs/data.md); null: next-byte prediction on "
        "`source`")
    khop_alphabet: int = Field(
        4, ge=3, description="khop: letters of the alphabet (no letter follows itself, so 2 "
        "letters could only alternate)")
    khop_min_hops: int = Field(
        1, ge=0, description="khop: the fewest hops k of a sequence (0: copy the letter read)")
    khop_max_hops: int = Field(
        4, ge=1, description="khop: the most hops k; each training sequence draws k uniformly "
        "from khop_min_hops..khop_max_hops and starts with a token naming it")
    khop_unanswered: Literal["ignore", "token"] = Field(
        "ignore", description="khop: a position without an answer (and the hop token's) is left "
        "out of the loss (ignore), or has a target token of its own, as in Sanford et al.'s "
        "generator (token: 'does not exist' and 'blank', two more tokens); the accuracy counts "
        "the answered positions either way")

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, value: str) -> str:
        if value == "byte":  # (the default, checked without importing the data package)
            return value
        from normlab.data.tokenizer import spec_problem  # (lazy: the data package imports torch)

        problem = spec_problem(value)
        if problem:
            raise ValueError(problem)
        return value.strip()

    @model_validator(mode="after")
    def _check(self) -> DataConfig:
        problems: list[str] = []
        fields = type(self).model_fields
        if self.task is None:
            for name in (*KHOP_FIELDS, *KHOP_OPTIONS):
                if getattr(self, name) != fields[name].default:
                    problems.append(f"{name}: only used with task=khop; set task: khop, or "
                                    "remove it")
        else:
            for name in TEXT_FIELDS:
                if getattr(self, name) != fields[name].default:
                    problems.append(f"{name}: not used with task={self.task}, whose sequences "
                                    "are generated, not read; remove it")
            lo, hi = self.khop_min_hops, self.khop_max_hops
            if lo > hi:
                problems.append(f"khop_min_hops: {lo} exceeds khop_max_hops={hi}; give "
                                "khop_min_hops <= khop_max_hops")
            elif self.seq_len < hi + 3:
                problems.append(
                    f"seq_len: {self.seq_len} is too short for khop_max_hops={hi}: a sequence "
                    f"holds the hop token and seq_len - 1 letters, and a {hi}-hop answer needs "
                    f"at least {hi + 2} letters; use seq_len >= {hi + 3} (a few times more, so "
                    "that most positions have an answer)")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def task_vocab_size(self) -> int | None:
        """The token count of the task (its letters, then one token per hop count), or None for
        text (bytes: `normlab.data.tokens.VOCAB_SIZE`)."""
        if self.task is None:
            return None
        targets = 2 if self.khop_unanswered == "token" else 0  # 'does not exist', 'blank'
        return self.khop_alphabet + self.khop_max_hops - self.khop_min_hops + 1 + targets


MAX_NAME = 80
TAG = re.compile(rf"[A-Za-z0-9_.:/-]{{1,{MAX_NAME}}}")


class RunExtension(_Frozen):
    """Where an extended run (`normlab train --resume RUN --set train.steps=N`) starts: the
    final checkpoint of a finished run, whose weights, optimizer, RNG and spike-detector states
    it continues from; batches are a function of the step, so its data continue too."""

    run: str = Field(min_length=1, description="the id of the finished run it continues (a "
                     "folder beside its own, under the same root)")
    step: int = Field(ge=1, description="that run's last step, where this one starts")


class TrainConfig(_Frozen):
    """Optimizer, schedule, divergence detection, logging and checkpointing of one run."""

    steps: int = Field(200, ge=1, description="optimizer steps")
    batch_size: int = Field(16, ge=1, description="sequences per step (all processes together)")
    grad_accum: int = Field(1, ge=1, description="micro-batches accumulated per step")
    lr: float = Field(1e-3, gt=0.0, description="peak learning rate (AdamW's, and Muon's "
                      "with optimizer: muon)")
    optimizer: Literal["adamw", "muon"] = Field(
        "adamw", description="adamw (Loshchilov & Hutter 2019), or muon: torch.optim.Muon (K. "
        "Jordan et al. 2024) for the 2-D weight matrices inside the blocks (the attention and "
        "MLP projections) and AdamW with the settings below for the rest (embeddings, head, "
        "norms, biases, gates), as Muon's authors recommend. Muon's step is scaled to AdamW's "
        "update RMS (adjust_lr_fn='match_rms_adamw', Liu et al. 2025, arXiv 2502.16982: lr * "
        "0.2 * sqrt(max(out, in))), so that lr, its schedule and weight_decay (decoupled, as "
        "AdamW's) mean the same for both and one lr axis compares the two; Muon's momentum "
        "0.95 (Nesterov) and 5 Newton-Schulz steps are torch's defaults, the authors'. Trains "
        "alone, never in a stacked group")
    schedule: Literal["constant", "cosine", "linear", "inv_sqrt", "wsd"] = Field(
        "cosine", description="lr after warmup: constant, cosine or linear decay to the floor, "
        "lr * sqrt(warmup/step), or wsd (warmup-stable-decay: constant at lr, then a linear "
        "decay to 0 over the last decay_frac of the steps)")
    warmup: int = Field(0, ge=0, description="linear warmup steps (0 allowed)")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="decay floor, as a share of lr")
    decay_frac: float = Field(
        0.2, gt=0.0, le=1.0, description="wsd: the share of the steps over which the lr decays "
        "linearly to 0 at the end (10-20% in the literature: Hu et al. 2024, MiniCPM; Hagele et "
        "al. 2024)")
    weight_decay: float = Field(
        0.1, ge=0.0, description="decoupled decay of weight matrices (not norms, biases, "
        "embeddings): AdamW's, and Muon's with optimizer: muon")
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1")
    beta2: float = Field(0.95, ge=0.0, lt=1.0, description="AdamW beta2")
    eps: float = Field(1e-8, gt=0.0, description="AdamW epsilon")
    grad_clip: float | None = Field(1.0, gt=0.0, description="max grad norm; null disables")
    eval_every: int = Field(50, ge=0, description="steps between evaluations; 0: only at the end")
    eval_batches: int = Field(8, ge=1, description="held-out batches per evaluation")
    log_every: int = Field(10, ge=1, description="steps between metrics.jsonl records")
    block_stats_every: int | None = Field(
        None, ge=0, description="per-block grad/stream norms every N steps; null: on logged "
        "steps, at most every 10th; 0: off")
    checkpoint_every: int = Field(0, ge=0, description="steps between checkpoints; 0: only at "
                                  "the end and on a signal")
    keep_checkpoints: bool = Field(
        False, description="also keep each periodic checkpoint's weights as "
        "checkpoints/step_N.safetensors (a training trajectory to probe)")
    spike_factor: float = Field(1.5, gt=1.0, description="loss above factor x running mean...")
    spike_patience: int = Field(10, ge=1, description="...for this many steps: loss_spike")
    # A model that has not beaten the unigram predictor by a tenth of a nat has learned no
    # context: the plug-in bigram entropy of Shakespeare bytes is 0.85 nats below the unigram
    # entropy (2.475 vs 3.323 on the validation split), so the first step of context use
    # already clears 0.1 by far, while a run stuck on the plateau ends within 0.01 of it.
    stall_margin: float = Field(
        0.1, ge=0.0, description="a run that ends with val loss above the unigram entropy of its "
        "training bytes minus this (nats) is `stalled`: it learned no context")
    device: Literal["auto", "cpu", "cuda", "mps"] = Field(
        "auto", description="where to train; auto: cuda, then mps, then cpu")
    precision: Literal["fp32", "bf16", "auto"] = Field(
        "fp32", description="bf16: autocast matrix work to bfloat16, fp32 master weights; auto: "
        "decided when the run starts, bf16 on a GPU that supports it, on a CPU the faster of the "
        "two by a measured bf16/fp32 matrix product (fp32 where bf16 is emulated), fp32 on MPS; "
        "the choice is recorded in config.yaml's meta and the summary, and a resume keeps it")
    seed: int = Field(0, ge=0, description="seed of the init, the batches and dropout")
    compile: bool = Field(False, description="torch.compile the model (first steps pay for it)")
    deterministic: bool = Field(
        False, description="deterministic algorithms (torch.use_deterministic_algorithms: an "
        "operation without one is an error), cuBLAS's fixed workspace and the math attention "
        "kernel, so that two runs of one config on a GPU agree bit for bit; slower. Recorded in "
        "config.yaml's meta")
    activation_checkpointing: bool = Field(
        False, description="recompute each block in the backward pass: memory of one block's "
        "activations instead of all, for about one extra forward")
    name: str | None = Field(
        None, min_length=1, max_length=MAX_NAME, description="the run's name, shown by `normlab "
        "runs`, reports and summary.json; a label, not part of the run id")
    tags: tuple[str, ...] = Field(
        (), description="labels for the run (letters, digits and - _ . : /), shown with its name; "
        "not part of the run id")
    prores_steps: int = Field(
        0, ge=0, description="ProRes residual warmup (Chen et al. 2026, arXiv 2603.05369): "
        "block l's residual branches times min(t/T_l, 1) at step t, T_l = linspace(floor(T/L), T, "
        "L)[l] with T this many steps (deeper blocks warm up longer); 0: off")
    extends: RunExtension | None = Field(
        None, description="set by `normlab train --resume RUN --set train.steps=N`: {run: the "
        "finished run's id, step: its last step}; this run starts from that run's final "
        "checkpoint and trains the steps after it, with the lr schedule of an N-step run "
        "(docs/reliability.md); null: a run from step 0")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and (value != value.strip() or not value.isprintable()):
            raise ValueError("a name is one line of printable text, without leading or trailing "
                             "spaces")
        return value

    @field_validator("tags", mode="before")
    @classmethod
    def _tags(cls, value: Any) -> Any:
        if isinstance(value, str):  # `--set train.tags=baseline`: one tag
            value = (value,)
        if isinstance(value, (list, tuple)):
            for tag in value:
                if not isinstance(tag, str) or not TAG.fullmatch(tag):
                    raise ValueError(f"tag {tag!r}: use 1 to {MAX_NAME} letters, digits and "
                                     "- _ . : / (e.g. baseline, lr-sweep)")
            if len(set(value)) < len(value):
                raise ValueError("a tag is given twice; give each once")
        return value

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.schedule == "inv_sqrt" and self.warmup == 0:
            raise ValueError("warmup: inv_sqrt (lr * sqrt(warmup/step)) needs warmup >= 1")
        if self.extends is not None and self.steps <= self.extends.step:
            raise ValueError(f"steps: {self.steps} does not extend run {self.extends.run}, "
                             f"which ended at step {self.extends.step}; give steps > "
                             f"{self.extends.step}")
        return self


EXECUTION_OPTIONS = ("compile", "activation_checkpointing", "deterministic")
# A run's name and tags label it; they say nothing about what is computed.
LABELS = ("name", "tags")
# Train fields added after run ids were first issued: hashed only when set away from their
# default, so every run recorded before they existed keeps its id (and its folder).
HASHED_WHEN_SET = ("stall_margin", "keep_checkpoints", "extends", "decay_frac",
                   "prores_steps", "optimizer")
# The same for model fields added later (the analysed settings of the theory claims).
MODEL_HASHED_WHEN_SET = ("attention", "embedding", "placement_def", "qk_norm", "depth_param",
                         "depth_base", "depth_alpha")


def byte_vocab_problem(model: ModelConfig, field: str = "vocab_size") -> str | None:
    """Why `model` cannot read byte-tokenized text (normlab's data), or None: token ids run to
    255, so a smaller vocabulary would fail at the first batch with an index error."""
    from normlab.data.tokens import VOCAB_SIZE  # (lazy: the data package imports torch)

    if model.vocab_size >= VOCAB_SIZE:
        return None
    return (f"{field}: {model.vocab_size} is smaller than the byte tokenizer's {VOCAB_SIZE} "
            f"tokens; use at least {VOCAB_SIZE}")


def text_vocab_problem(model: ModelConfig, data: DataConfig) -> str | None:
    """Why `model` cannot read the text of `data`, as far as the config tells: bytes need 256
    tokens, ``bpe:N`` needs N. A folder of token files, a tokenizer file and a source that is
    not there (a recorded run's) are checked when the data is read."""
    from normlab.data.tokenfiles import is_token_folder
    from normlab.data.tokenizer import bpe_size

    n = bpe_size(data.tokenizer)
    if n is not None:
        if model.vocab_size >= n:
            return None
        return (f"model.vocab_size: {model.vocab_size} is smaller than the {n} tokens of "
                f"data.tokenizer={data.tokenizer}; set model.vocab_size: {n} (or leave it out)")
    if data.tokenizer != "byte":
        return None
    sources = (data.source,) if isinstance(data.source, str) else data.source
    if any(s != "shakespeare" and not Path(s).expanduser().exists() for s in sources) or (
            isinstance(data.source, str) and is_token_folder(data.source)):
        return None
    return byte_vocab_problem(model, "model.vocab_size")


def task_model_problems(model: ModelConfig, data: DataConfig) -> list[str]:
    """Why `model` cannot learn the synthetic task of `data` (empty when it can): the task
    labels every position, so it needs a decoder, and its vocabulary is the task's."""
    problems = []
    if model.kind != "decoder":
        problems.append(f"model.kind: data.task={data.task} gives an answer at every position; "
                        "use kind: decoder")
    vocab = data.task_vocab_size
    if model.vocab_size != vocab:
        hops = data.khop_max_hops - data.khop_min_hops + 1
        problems.append(
            f"model.vocab_size: {model.vocab_size} does not match data.task={data.task}, which "
            f"has {vocab} tokens ({data.khop_alphabet} letters and {hops} hop-count token"
            f"{'s' if hops > 1 else ''} for k = {data.khop_min_hops}..{data.khop_max_hops}"
            f"{', and 2 target tokens' if data.khop_unanswered == 'token' else ''}); "
            f"set model.vocab_size: {vocab}")
    return problems


class RunConfig(_Frozen):
    """Everything a training run is a function of."""

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()

    @model_validator(mode="before")
    @classmethod
    def _vocab_follows_tokenizer(cls, data: Any) -> Any:
        """A text run that leaves `model.vocab_size` out gets its tokenizer's vocabulary (or the
        one its token files state); a config that gives it keeps it (config.yaml always does)."""
        if not isinstance(data, dict):
            return data
        model, text = data.get("model", {}), data.get("data", {})
        if not isinstance(model, dict) or not isinstance(text, dict) or "vocab_size" in model:
            return data
        if text.get("task") is not None:
            return data
        from normlab.data.tokenfiles import declared_vocab

        vocab = declared_vocab(text.get("source", "shakespeare"), text.get("tokenizer", "byte"))
        return data if vocab is None else {**data, "model": {**model, "vocab_size": vocab}}

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        problems = []
        if self.data.seq_len > self.model.max_seq_len:
            problems.append(
                f"data.seq_len: {self.data.seq_len} exceeds model.max_seq_len="
                f"{self.model.max_seq_len}; raise model.max_seq_len or lower data.seq_len"
            )
        if self.data.task is None:
            # (token files and tokenizer files are checked when the run reads them)
            vocab = text_vocab_problem(self.model, self.data)
            if vocab:
                problems.append(vocab)
        else:
            problems += task_model_problems(self.model, self.data)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def to_dict(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())

    def to_yaml(self) -> str:
        return write_yaml(self.to_dict())

    def run_id(self) -> str:
        """Readable prefix plus a hash of the resolved config: same config, same folder.

        The execution options (`EXECUTION_OPTIONS`) change how a run is computed, not what, so
        they are left out: a run started with them can be resumed without, and the other way.
        So are its name and tags (`LABELS`): the same config under another name is the same run.
        The fields of `HASHED_WHEN_SET`, `MODEL_HASHED_WHEN_SET` and `DATA_HASHED_WHEN_SET` count
        only when they differ from their default; those of a synthetic task (`DATA_TASK_FIELDS`)
        only in a run that sets `data.task`, so a text run hashes the config it hashed before they
        existed.
        """
        data = self.to_dict()
        if data["data"]["task"] is None:
            for key in DATA_TASK_FIELDS:
                del data["data"][key]
        for key in DATA_HASHED_WHEN_SET:
            if data["data"][key] == DataConfig.model_fields[key].default:
                del data["data"][key]
        for key in EXECUTION_OPTIONS + LABELS:
            data["train"].pop(key, None)
        for key in HASHED_WHEN_SET:
            if data["train"][key] == TrainConfig.model_fields[key].default:
                del data["train"][key]
        for key in MODEL_HASHED_WHEN_SET:
            if data["model"][key] == ModelConfig.model_fields[key].default:
                del data["model"][key]
        if "placement_def" in data["model"]:  # its doc says what it is, not what is computed
            data["model"]["placement_def"].pop("doc", None)
        digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
        m = self.model
        return f"{m.placement}-L{m.n_blocks}-d{m.d_model}-{digest}"


def load_run_config(path: str | Path | None = None, overrides: list[str] | None = None
                    ) -> RunConfig:
    """A run config from an optional YAML file plus dotted `--set` overrides. A run's own
    config.yaml may be given: its `meta` section (what the run recorded of how it ran) is
    dropped, with a note."""
    data = load_yaml(Path(path)) if path is not None else {}
    if "meta" in data:
        import warnings

        from normlab.warnings import NormlabNote

        data = {k: v for k, v in data.items() if k != "meta"}
        warnings.warn(f"{path}: its meta section (what a run recorded of how it ran) is ignored",
                      NormlabNote, stacklevel=2)
    data = deep_merge(data, parse_overrides(overrides))
    return parse_config(RunConfig, data)


def load_model_config(path: str | Path | None = None, overrides: list[str] | None = None,
                      fields: dict[str, Any] | None = None) -> ModelConfig:
    """A model config from an optional YAML file (its `model:` section, if it is a run config),
    then `fields` (those that are not None), then `overrides` (`d_model=128` or
    `model.d_model=128`)."""
    data = load_yaml(Path(path)) if path is not None else {}
    data = data.get("model", data)
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: model: expected a mapping of model fields, got "
                          f"{type(data).__name__}")
    data = deep_merge(data, {k: v for k, v in (fields or {}).items() if v is not None})
    return parse_config(ModelConfig, deep_merge(data, model_overrides(overrides)))


def model_overrides(overrides: list[str] | None) -> dict[str, Any]:
    """The model fields of `--set` items given as `FIELD=VALUE` or `model.FIELD=VALUE` alike (in
    the order given); a run config's other sections (`train.lr=...`) are refused, by name."""
    out: dict[str, Any] = {}
    for item in overrides or []:
        parsed = parse_overrides([item])
        section = next(iter(parsed))
        if section in RunConfig.model_fields and section != "model":
            key = item.partition("=")[0].strip()
            raise ConfigError(
                f"--set {key}: a {section} setting, which only a run has (`normlab train --set "
                f"{key}=...`); here --set takes model fields, as FIELD=VALUE or model.FIELD=VALUE")
        nested = section == "model" and isinstance(parsed["model"], dict)
        out = deep_merge(out, parsed["model"] if nested else parsed)
    return out
