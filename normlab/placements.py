"""The named placements as data: one entry each, the one list the rest of normlab reads.

An entry says what the config and the docs need to know of a placement: its name, the defaults
it decides (the init when `init` is null, its paper's; whether `final_norm: auto` puts a norm
before the head, because its blocks leave the stream unnormalized; whether `embed_norm: null`
normalizes the embedding output), whether it describes one block on its own (usable in
`block_placements`), and the paper it comes from. How its blocks are built, the sublayer plans,
is `normlab.nn.plan.PLACEMENT_PLANS`, keyed by the same names (a test checks the two agree).

This module imports nothing heavy, so that `normlab.config` validates against it:
`ModelConfig.placement` and `block_placements` allow the names below and no others. Adding a
placement is one entry here, one in `PLACEMENT_PLANS`, and its reference formula in
tests/nn/test_placements.py (docs/design.md, "Adding a placement").

A placement of a user's own needs none of that: a `PlacementDef` (below) says, in the fields of
`normlab.nn.plan.SublayerPlan`, where the norms of each block go, and is given in a placements
file (`ModelConfig.placement_file`), registered from Python (`register_placement`), or written
in the config itself (`ModelConfig.placement_def`). The config records the definition in
`placement_def`, so a run is a function of its config.yaml alone and its id hashes the
definition, not only the name (docs/reference.md, "Placements of your own").
"""

from __future__ import annotations

import re
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from normlab.userinput import ConfigError, YamlLoader, did_you_mean, read_yaml_file

# The init schemes (`model.init`); each placement's default is one of them (ENTRIES).
InitScheme = Literal["normal", "gpt2_scaled", "xavier", "deepnorm", "admin", "ds_init",
                     "subln"]


@dataclass(frozen=True)
class PlacementEntry:
    name: str
    default_init: str  # the init scheme when `init` is null: the one of the placement's paper
    final_norm: bool  # its blocks leave the stream unnormalized: `final_norm: auto` adds a norm
    per_block: bool  # one block on its own, usable in `block_placements` (placement=custom)
    paper: str  # authors, year and title of the paper it comes from ("" for custom)
    arxiv: str = ""  # the paper's arXiv id (docs/reference.md section 1 names it)
    embed_norm: bool = False  # `embed_norm: null` normalizes the embedding output


# In the order normlab lists placements (the config's allowed values, plot colours, tables).
ENTRIES: tuple[PlacementEntry, ...] = (
    PlacementEntry("post", "xavier", final_norm=False, per_block=True,  # fairseq baselines
                   paper="Vaswani et al. 2017, Attention Is All You Need", arxiv="1706.03762"),
    PlacementEntry("pre", "gpt2_scaled", final_norm=True, per_block=True,  # GPT-2
                   paper="Xiong et al. 2020, On Layer Normalization in the Transformer "
                   "Architecture", arxiv="2002.04745"),
    PlacementEntry("sandwich", "normal", final_norm=True, per_block=True,
                   paper="Ding et al. 2021, CogView: Mastering Text-to-Image Generation via "
                   "Transformers", arxiv="2105.13290"),
    PlacementEntry("peri", "normal", final_norm=True, per_block=False,  # sandwich blocks
                   paper="Kim et al. 2025, Peri-LN: Revisiting Normalization Layer in the "
                   "Transformer Architecture", arxiv="2502.02732", embed_norm=True),
    PlacementEntry("deepnorm", "deepnorm", final_norm=False, per_block=True,
                   paper="Wang et al. 2022, DeepNet: Scaling Transformers to 1,000 Layers",
                   arxiv="2203.00555"),
    PlacementEntry("admin", "admin", final_norm=False, per_block=True,
                   paper="Liu et al. 2020, Understanding the Difficulty of Training "
                   "Transformers", arxiv="2004.08249"),
    PlacementEntry("resi_dual", "xavier", final_norm=True, per_block=False,  # fairseq-based;
                   # its second stream runs through the whole model, so not one block on its own
                   paper="Xie et al. 2023, ResiDual: Transformer with Dual Residual Connections",
                   arxiv="2304.14802"),
    PlacementEntry("b2t", "xavier", final_norm=False, per_block=True,  # fairseq-based
                   paper="Takase et al. 2022, B2T Connection: Serving Stability and Performance "
                   "in Deep Transformers", arxiv="2206.00330"),
    PlacementEntry("mix", "normal", final_norm=False, per_block=False,  # LLaMA-style code base;
                   # post blocks then pre blocks: the final norm follows from its pre blocks
                   paper="Li et al. 2024, Mix-LN: Unleashing the Power of Deeper Layers by "
                   "Combining Pre-LN and Post-LN", arxiv="2412.13795"),
    PlacementEntry("lns", "normal", final_norm=True, per_block=True,  # LLaMA-style code base;
                   # not gpt2_scaled, which the Curse of Depth found worse with LNS
                   paper="Sun et al. 2025, The Curse of Depth in Large Language Models",
                   arxiv="2502.05795"),
    PlacementEntry("hybrid", "gpt2_scaled", final_norm=True, per_block=True,  # the released
                   # config's Megatron init (normlab.nn.plan._hybrid)
                   paper="Zhuo et al. 2025, HybridNorm: Towards Stable and Efficient "
                   "Transformer Training via Hybrid Normalization", arxiv="2503.04598"),
    PlacementEntry("hybrid_star", "gpt2_scaled", final_norm=True, per_block=False,  # HybridNorm*:
                   # a pre-norm first block, then hybrid blocks
                   paper="Zhuo et al. 2025, HybridNorm: Towards Stable and Efficient "
                   "Transformer Training via Hybrid Normalization", arxiv="2503.04598"),
    PlacementEntry("rezero", "xavier", final_norm=False, per_block=True,
                   paper="Bachlechner et al. 2020, ReZero is All You Need: Fast Convergence at "
                   "Large Depth", arxiv="2003.04887"),
    PlacementEntry("skipinit", "xavier", final_norm=False, per_block=True,
                   paper="De and Smith 2020, Batch Normalization Biases Residual Blocks Towards "
                   "the Identity Function in Deep Networks", arxiv="2002.10444"),
    PlacementEntry("olmo2", "normal", final_norm=True, per_block=True,  # OLMo 2's init:
                   # every weight from N(0, 0.02)
                   paper="Team OLMo 2024, 2 OLMo 2 Furious", arxiv="2501.00656"),
    PlacementEntry("keel", "normal", final_norm=False, per_block=True,  # no init of its own
                   paper="Chen and Wei 2026, Post-LayerNorm Is Back: Stable, ExpressivE, and "
                   "Deep", arxiv="2601.19895"),
    PlacementEntry("subln", "subln", final_norm=True, per_block=True,  # torchscale (Magneto)
                   paper="Wang et al. 2022, Foundation Transformers", arxiv="2210.06423"),
    PlacementEntry("normformer", "xavier", final_norm=True, per_block=True,  # fairseq-based
                   paper="Shleifer et al. 2021, NormFormer: Improved Transformer Pretraining "
                   "with Extra Normalization", arxiv="2110.09456"),
    PlacementEntry("ngpt", "normal", final_norm=False, per_block=False,  # on the unit sphere:
                   # its stream is normalized by every sublayer, its matrices after every step
                   paper="Loshchilov et al. 2024, nGPT: Normalized Transformer with "
                   "Representation Learning on the Hypersphere", arxiv="2410.01131"),
    PlacementEntry("siamese", "normal", final_norm=True, per_block=False,  # the authors' DeiT
                   # code draws every linear map from N(0, 0.02), truncated; its second stream
                   # runs through the whole model, so not one block on its own
                   paper="Li et al. 2026, SiameseNorm: Breaking the Barrier to Reconciling "
                   "Pre/Post-Norm", arxiv="2602.08064"),
    PlacementEntry("custom", "normal", final_norm=False, per_block=False,  # block by block:
                   # the final norm follows from its blocks
                   paper=""),
)

REGISTRY: dict[str, PlacementEntry] = {e.name: e for e in ENTRIES}
PLACEMENTS: tuple[str, ...] = tuple(REGISTRY)
# The placements that describe one block on their own, usable in `block_placements`.
BLOCK_PLACEMENTS: tuple[str, ...] = tuple(e.name for e in ENTRIES if e.per_block)
# The init of each placement when `init` is null.
DEFAULT_INIT: dict[str, str] = {e.name: e.default_init for e in ENTRIES}
# Placements whose blocks leave the stream unnormalized: `final_norm: auto` adds a norm before the
# head to these, and to a model with a block of one of them (mix's pre blocks, custom's).
NEEDS_FINAL_NORM: tuple[str, ...] = tuple(e.name for e in ENTRIES if e.final_norm)
# Placements whose embedding output is normalized unless `embed_norm` says otherwise.
EMBED_NORM: tuple[str, ...] = tuple(e.name for e in ENTRIES if e.embed_norm)


def default_init_text() -> str:
    """The default inits in words, `gpt2_scaled for pre, hybrid, ...; xavier for post, ...`,
    grouped by scheme in the order the schemes first appear."""
    by_init: dict[str, list[str]] = {}
    for e in ENTRIES:
        by_init.setdefault(e.default_init, []).append(e.name)
    return "; ".join(f"{init} for {', '.join(names)}" for init, names in by_init.items())


# --- placements of your own -----------------------------------------------------------------

# A name a run id starts with and a folder is named after: lower case, digits and underscores.
USER_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class PlacementError(ValueError):
    """A placement definition that cannot be used; the message names the field (and the file's
    line) and the valid choices. (`normlab.config` reports it as a `ConfigError`.)"""


class _Def(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @model_serializer(mode="wrap")
    def _given_fields(self, handler: Any) -> dict[str, Any]:
        """Only the fields away from their default: config.yaml shows a definition as it is
        written (`attn: {in_norm: true}`), and one definition dumps, and hashes, one way."""
        fields = type(self).model_fields
        return {k: v for k, v in handler(self).items() if getattr(self, k) != fields[k].default}


class SublayerDef(_Def):
    """One residual sublayer of a placement of your own: the fields of
    `normlab.nn.plan.SublayerPlan`, each norm position a switch (true: a norm of the model's
    `norm` kind sits there; `out_norm` is of the config's `out_norm` kind, as in sandwich)."""

    in_norm: bool = Field(False, description="norm on the sublayer input, x + F(Norm(x)) (pre)")
    in_scale: float = Field(1.0, gt=0.0, description="factor on the input norm's output")
    out_norm: bool = Field(False, description="norm on the branch output before the add")
    post_norm: bool = Field(False, description="norm after the add, Norm(x + F(x)) (post)")
    skip_scale: float = Field(1.0, gt=0.0, description="factor on the skip (DeepNorm's alpha); "
                              "with skip_learned, its initial value")
    skip_learned: bool = Field(False, description="the skip factor is learned per dimension")
    gate_init: float | None = Field(None, ge=0.0, description="a learned scalar on the branch, "
                                    "starting here (ReZero); the config's gate_init overrides")
    add_block_input: bool = Field(False, description="mlp only: the block input joins the sum")
    qkv_norm: bool = Field(False, description="attn only: Q, K, V normalized per head")
    skip_normed: bool = Field(False, description="the residual is taken after in_norm")
    inner_norm: bool = Field(False, description="a norm inside the branch, before its output "
                             "map: attn before the output projection, mlp after the activation "
                             "(Sub-LN; NormFormer's mlp)")
    head_scale: bool = Field(False, description="attn only: a learned scale per head on the "
                             "attention output, starting at 1 (NormFormer)")
    qk_norm: bool = Field(False, description="attn only: Q and K normalized over the full width "
                          "after projection (OLMo 2)")


class _Sublayers(_Def):
    """A block's two sublayers, attention then MLP, each holding only what applies to it."""

    attn: SublayerDef = SublayerDef()
    mlp: SublayerDef = SublayerDef()

    @field_validator("attn")
    @classmethod
    def _attn(cls, value: SublayerDef) -> SublayerDef:
        if value.add_block_input:
            raise ValueError("add_block_input: B2T's skip from the block input joins the mlp "
                             "sublayer's sum; set it under mlp")
        return _sublayer_check(value)

    @field_validator("mlp")
    @classmethod
    def _mlp(cls, value: SublayerDef) -> SublayerDef:
        if value.qkv_norm:
            raise ValueError("qkv_norm: Q, K and V are the attention's; set it under attn")
        if value.qk_norm:
            raise ValueError("qk_norm: Q and K are the attention's; set it under attn")
        if value.head_scale:
            raise ValueError("head_scale: the heads are the attention's; set it under attn")
        return _sublayer_check(value)


class BlockDef(_Sublayers):
    """The blocks at some depths: `count` of them (the last entry of `blocks` may leave it out
    and take every block after the ones before it)."""

    count: int | None = Field(None, ge=1)


def _sublayer_check(value: SublayerDef) -> SublayerDef:
    if value.skip_normed and not value.in_norm:
        raise ValueError("skip_normed: takes the residual after in_norm; set in_norm: true")
    return value


class PlacementDef(_Sublayers):
    """A placement of your own. Its blocks: `attn` and `mlp` for the same block at every depth,
    or `blocks`, a list of blocks by depth, each with a `count`. The defaults a built-in
    placement takes from its paper are its own: `init` (when the config's `init` is null),
    `final_norm` (whether `final_norm: auto` puts a norm before the head; left out, it does when
    the last block's mlp ends without a post_norm) and `embed_norm` (when the config's is null).
    `doc` says what it is; `normlab plan` prints it, and the run id leaves it out."""

    doc: str = ""
    init: str = "normal"
    final_norm: bool | None = None
    embed_norm: bool = False
    blocks: tuple[BlockDef, ...] | None = Field(None, min_length=1)

    @field_validator("init")
    @classmethod
    def _init(cls, value: str) -> str:
        schemes = typing.get_args(InitScheme)
        if value not in schemes:
            raise ValueError(f"{value!r} is not an init scheme{did_you_mean(value, list(schemes))}"
                             f"; choose from {', '.join(schemes)}")
        return value

    @field_validator("blocks")
    @classmethod
    def _blocks(cls, value: tuple[BlockDef, ...] | None) -> tuple[BlockDef, ...] | None:
        for i, b in enumerate((value or ())[:-1]):
            if b.count is None:
                raise ValueError(f"entry {i} has no count; every entry but the last needs one "
                                 "(the last may leave it out to take the blocks left)")
        return value

    @model_validator(mode="after")
    def _one_form(self) -> PlacementDef:
        if self.blocks is not None and (self.attn != SublayerDef() or self.mlp != SublayerDef()):
            raise ValueError("attn, mlp and blocks: give the block at every depth (attn, mlp) "
                             "or the blocks by depth (blocks), not both")
        return self

    def block_defs(self, n_blocks: int) -> list[_Sublayers]:
        """The block at each depth of a model of `n_blocks` (see `count_problem`)."""
        if self.blocks is None:
            return [self] * n_blocks
        out: list[_Sublayers] = [b for b in self.blocks for _ in range(b.count or 0)]
        last = self.blocks[-1]
        return out + [last] * (n_blocks - len(out)) if last.count is None else out

    def count_problem(self, n_blocks: int) -> str | None:
        """Why the `blocks` of this placement do not fit a model of `n_blocks`, or None."""
        if self.blocks is None:
            return None
        counted = sum(b.count or 0 for b in self.blocks)
        if self.blocks[-1].count is None and counted <= n_blocks:
            return None
        if counted == n_blocks:
            return None
        return (f"blocks: the counts add up to {counted} blocks, the model has n_blocks="
                f"{n_blocks}; set n_blocks={counted}, or leave out the last entry's count so "
                "that it takes the blocks left")

    def needs_final_norm(self, n_blocks: int) -> bool:
        """Whether `final_norm: auto` puts a norm before the head."""
        if self.final_norm is not None:
            return self.final_norm
        defs = self.block_defs(n_blocks)
        return not (defs and defs[-1].mlp.post_norm)

    def setting_problems(self, norm: str, out_norm: str | None, attention: str) -> list[str]:
        """The model settings this placement cannot be built with, each with what to choose."""
        problems = []
        subs = [s for b in (self.blocks or (self,)) for s in (b.attn, b.mlp)]
        if any(s.qkv_norm for s in subs):
            if norm in ("dyt", "derf", "batchnorm"):
                problems.append(f"norm: placement_def normalizes Q, K and V per head (qkv_norm), "
                                f"which {norm} does not support; use layernorm or rmsnorm")
            if attention != "softmax":
                problems.append("attention: placement_def normalizes Q and K inside softmax "
                                "attention (qkv_norm); use attention: softmax")
        if any(s.qk_norm for s in subs):
            if norm not in ("layernorm", "rmsnorm", "identity"):
                problems.append(f"norm: placement_def normalizes Q and K (qk_norm), which {norm} "
                                "does not support; use layernorm or rmsnorm")
            if attention != "softmax":
                problems.append("attention: placement_def normalizes Q and K inside softmax "
                                "attention (qk_norm); use attention: softmax")
        if attention == "none" and any(s.add_block_input for s in subs):
            problems.append("attention: placement_def's add_block_input is a skip around the "
                            "attention sublayer; use attention: softmax or uniform")
        return problems


_DEF_SECTIONS: dict[str, type[BaseModel]] = {"attn": SublayerDef, "mlp": SublayerDef,
                                             "blocks": BlockDef}


def parse_definition(raw: Any, where: str,
                     line_of: Callable[[tuple[Any, ...]], int | None] | None = None
                     ) -> PlacementDef:
    """`raw` (a mapping of definition fields) as a `PlacementDef`, or `PlacementError` naming
    each problem by its field under `where` (and its line, where `line_of` knows it) with the
    valid choices."""
    if isinstance(raw, PlacementDef):
        return raw
    if not isinstance(raw, Mapping):
        raise PlacementError(f"{where}: expected a mapping of definition fields ("
                             f"{', '.join(PlacementDef.model_fields)}), got {type(raw).__name__}")
    try:
        return PlacementDef.model_validate(dict(raw))
    except ValidationError as e:
        lines = []
        for item in e.errors():
            loc = tuple(item["loc"])
            msg = str(item["msg"]).removeprefix("Value error, ")
            if item["type"] == "extra_forbidden":
                cls: type[BaseModel] = PlacementDef
                for part in loc[:-1]:
                    cls = _DEF_SECTIONS.get(part, cls) if isinstance(part, str) else cls
                known = list(cls.model_fields)
                msg = (f"unknown key{did_you_mean(str(loc[-1]), known)}; valid keys are: "
                       f"{', '.join(known)}")
            line = line_of(loc) if line_of is not None else None
            path = ".".join(str(p) for p in (where, *loc))
            lines.append(f"{path}{f' (line {line})' if line else ''}: {msg}")
        raise PlacementError("\n".join(lines)) from None


def _line_of(node: Any, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the deepest key of `loc` found under a composed YAML `node`."""
    import yaml

    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            hit = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if hit is None:
                break
            line, node = hit[0].start_mark.line + 1, hit[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(
                node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def read_placements_file(path: str | Path) -> dict[str, PlacementDef]:
    """The placements a file defines, `placements: {name: definition}`. `ConfigError` names
    the file, and each problem by its line and field with the valid choices: an unknown key, a
    name that is not lower-case letters, digits and `_`, a built-in placement's name, a field
    outside the definition's."""
    import yaml

    source = f"placements file {path}"
    data = read_yaml_file(Path(path), "placements file")
    root = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=YamlLoader)
    if not isinstance(data, dict) or not isinstance(data.get("placements"), dict):
        raise ConfigError(f"{source}: expected `placements:`, a mapping of names to "
                          "definitions, e.g. placements: {mypre: {attn: {in_norm: true}, "
                          "mlp: {in_norm: true}}}")
    problems = [f"{key} (line {_line_of(root, (key,))}): unknown key"
                f"{did_you_mean(str(key), ['placements'])}; the file has one key, placements"
                for key in data if key != "placements"]
    out: dict[str, PlacementDef] = {}
    for name, raw in data["placements"].items():
        where = f"placements.{name} (line {_line_of(root, ('placements', name))})"
        if not isinstance(name, str) or not USER_NAME.match(name):
            problems.append(f"{where}: the name {name!r} is not lower-case letters, digits and "
                            "_, starting with a letter; rename it")
        elif name in REGISTRY:
            problems.append(f"{where}: {name!r} is a built-in placement; give yours another "
                            f"name (built in: {', '.join(PLACEMENTS)})")
        else:
            try:
                out[name] = parse_definition(
                    raw, f"placements.{name}",
                    lambda loc, name=name: _line_of(root, ("placements", name, *loc)))
            except PlacementError as e:
                problems.extend(str(e).splitlines())
    problems.sort(key=_line_number)  # in the order of the file
    if problems:
        raise ConfigError(f"{source}:\n  " + "\n  ".join(problems))
    if not out:
        raise ConfigError(f"{source}: defines no placement; give at least one under placements")
    return out


def _line_number(problem: str) -> int:
    found = re.search(r"\(line (\d+)\)", problem)
    return int(found.group(1)) if found else 0


@dataclass(frozen=True)
class UserPlacement:
    definition: PlacementDef
    source: str  # where it was registered, for `normlab plan`


# The placements registered in this process (`register_placement`), by name.
USER: dict[str, UserPlacement] = {}


def register_placement(name: str, *, replace: bool = False, **fields: Any) -> PlacementDef:
    """Add a placement of your own, usable as `ModelConfig(placement=name)` in this process.

    `fields` are those of a placements file's definition (`PlacementDef`): `attn` and `mlp`
    (mappings of `SublayerDef` fields) or `blocks`, and `init`, `final_norm`, `embed_norm`,
    `doc`. Registering the same definition again does nothing; another definition under a
    registered name needs `replace=True`. A config built with it records the definition
    (`placement_def`), so its runs train, resume and stack in other processes too.

        normlab.register_placement("mypre", attn={"in_norm": True}, mlp={"in_norm": True},
                                   init="gpt2_scaled", doc="Pre-Norm, re-declared")
    """
    if not isinstance(name, str) or not USER_NAME.match(name):
        raise ConfigError(f"register_placement: name {name!r}: use lower-case letters, digits "
                          "and _, starting with a letter")
    if name in REGISTRY:
        raise ConfigError(f"register_placement: {name!r} is a built-in placement; give yours "
                          f"another name (built in: {', '.join(PLACEMENTS)})")
    try:
        definition = parse_definition(fields, name)
    except PlacementError as e:
        raise ConfigError(f"register_placement({name!r}):\n  "
                          + "\n  ".join(str(e).splitlines())) from None
    old = USER.get(name)
    if old is not None and old.definition != definition and not replace:
        raise ConfigError(f"register_placement: {name!r} is registered already ({old.source}) "
                          "with another definition; pass replace=True to change it")
    caller = sys._getframe(1)
    USER[name] = UserPlacement(definition, f"registered by register_placement "
                                           f"({Path(caller.f_code.co_filename).name}:"
                                           f"{caller.f_lineno})")
    return definition


class _UserName(str):
    """A placement name that `resolve_user_placement` found a definition for: the config's
    check of `placement` lets it through."""


def resolve_user_placement(data: Any) -> Any:
    """The fields of a `ModelConfig` with the definition of a placement of your own put in
    `placement_def`: the one the config gives, else its `placement_file`'s, else the one
    registered in this process. A name none defines is left for the config's check of
    `placement` to refuse, with the choices."""
    if not isinstance(data, dict):
        return data
    name, given, file = data.get("placement"), data.get("placement_def"), data.get(
        "placement_file")
    from_file = read_placements_file(file).get(name) if isinstance(file, str | Path) else None
    if not isinstance(name, str) or name in REGISTRY:
        if given is not None and isinstance(name, str):
            raise PlacementError(f"placement_def: defines a placement of your own, but "
                                 f"placement is the built-in {name!r}; remove placement_def or "
                                 "name your placement")
        return data
    if given is not None:
        definition = parse_definition(given, "placement_def")
        if from_file is not None and from_file != definition:
            raise PlacementError(f"placement_def and placement_file {file} define {name!r} "
                                 "differently; give one of them")
    elif from_file is not None:
        definition = from_file
    elif name in USER:
        definition = USER[name].definition
    elif file is not None:
        defined = sorted(read_placements_file(file))
        raise PlacementError(f"placement: {name!r} is not built in and not defined in "
                             f"placement_file {file}{did_you_mean(name, defined)}; it defines "
                             f"{', '.join(defined)}")
    else:
        return data
    return {**data, "placement": _UserName(name), "placement_def": definition}


def check_placement_name(value: Any, handler: Callable[[Any], Any]) -> Any:
    """`ModelConfig.placement`: a built-in name (`handler`, the Literal's check) or one that
    `resolve_user_placement` found a definition for; any other is refused with the choices."""
    if isinstance(value, _UserName):
        return str(value)
    try:
        return handler(value)
    except ValidationError:
        if not isinstance(value, str):
            raise
        yours = f" (registered: {', '.join(USER)})" if USER else ""
        raise ValueError(
            f"got {value!r}{did_you_mean(value, [*PLACEMENTS, *USER])}; a placement is a "
            f"built-in one ({', '.join(map(repr, PLACEMENTS))}) or one of your own, defined in "
            f"placement_file, by normlab.register_placement{yours} or in placement_def"
        ) from None


def user_origin(name: str, definition: PlacementDef | None, placement_file: str | None) -> str:
    """Where the definition of placement `name` comes from, in words ("" for a built-in)."""
    if definition is None:
        return ""
    if placement_file is not None and read_placements_file(placement_file).get(
            name) == definition:
        where = f"defined in {placement_file}"
    elif name in USER and USER[name].definition == definition:
        where = USER[name].source
    else:
        where = "defined in the config (placement_def)"
    return f"yours, {where}" + (f": {definition.doc}" if definition.doc else "")
