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
"""

from __future__ import annotations

from dataclasses import dataclass


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
