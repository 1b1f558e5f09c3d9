"""Each theory claim's source setting, and the ladder of single changes from it to normlab's block.

A rung is a model setting (`ModelConfig` fields, placement aside). The first rung(s) are the
source's own analysed setting, where the claim's prediction must hold (the calibration); each later
rung changes one thing toward the block the study trains, so a departure from the source is
attributed to the rung where it appears. The last rung is normlab's block: softmax attention over
the profile's heads, a 4d GELU MLP, a head tied to an N(0, 0.02) embedding, each placement's own
default init.

- `xiong_ladder` (C1, C4, C5): Xiong et al. 2020 (arXiv 2002.04745) analyse Pre-LN and Post-LN
  Transformers at Xavier init with `x_0 ~ N(0, I_d)`, a ReLU FFN of width d and, in one reading of
  Sec. 3.3, a single head with `W^Q = W^K = 0` (uniform attention); Theorem 1 adds fairseq's
  embedding and an untied output projection. Both readings of the block are built: uniform
  attention (reading B) and no attention at all (reading A, the FFN only).
- `fairseq_ladder` (C7, C8): the fairseq Transformer of DeepNet's and Admin's experiments:
  softmax attention, a 4d ReLU FFN, fairseq's embedding and untied head, Xavier init.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Rung:
    key: str  # short name, used in cache keys and figure labels
    label: str  # what the rung is, in words
    change: str  # the one change from the previous rung ("" for a source rung)
    fields: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields (cumulative)
    calibration: bool = False  # the source's own setting
    own_init: bool = False  # each placement's default init instead of the source's Xavier
    depth: str = "profile"  # "profile": the profile's depths; "source": the source's depth
    measured_as: str = ""  # the key of the rung whose measurements this one reads (a depth rung)

    @property
    def data_key(self) -> str:
        return self.measured_as or self.key

    def model_fields(self, placement: str, source_init: str | None = "xavier") -> dict[str, Any]:
        """This rung's fields for `placement`: the source's init (Xavier for pre and post;
        Admin and DeepNorm keep theirs) until the rung that restores each placement's own."""
        init = None if self.own_init or placement not in ("pre", "post") else source_init
        return {**self.fields, "placement": placement, "init": init}


def _chain(width: int, steps: list[tuple[str, str, str, dict[str, Any], dict[str, Any]]]
           ) -> list[Rung]:
    """Rungs from (key, label, change, fields set, flags), each adding its fields to the last."""
    out: list[Rung] = []
    current: dict[str, Any] = {"d_model": width}
    for key, lbl, change, fields, flags in steps:
        current = {**current, **fields}
        out.append(Rung(key, lbl, change, dict(current), **flags))
    return out


def _toward_normlab(heads: int, width: int) -> list[tuple[str, str, str, dict, dict]]:
    """The common rungs from a source block to normlab's: heads, MLP, embedding, init."""
    return [
        ("heads", f"{heads} heads", f"{heads} heads instead of 1", {"n_heads": heads}, {}),
        ("gelu", "4d GELU MLP", "a 4d GELU MLP instead of the ReLU FFN",
         {"mlp": "gelu", "d_ff": None}, {}),
        ("tied", "tied head, N(0, 0.02) embedding",
         "normlab's embedding: a head tied to an N(0, 0.02) table, no sqrt(d) scale",
         {"embedding": "normal", "tie_embeddings": True}, {}),
        ("init", "normlab's block (own inits)",
         "each placement's own default init (pre: GPT-2 scaled; post: Xavier)", {},
         {"own_init": True}),
    ]


XIONG_SOURCE = {"attention": "uniform", "n_heads": 1, "mlp": "relu", "embedding": "fairseq",
                "tie_embeddings": False}


def xiong_ladder(width: int, heads: int) -> list[Rung]:
    """C1, C4, C5: reading A (FFN only) and reading B (uniform attention) of Xiong's block, then
    one change at a time to normlab's block."""
    source = {**XIONG_SOURCE, "d_ff": width}
    reading_a = Rung("source_a", "source, reading A: FFN only",
                     "", {"d_model": width, **source, "attention": "none"}, calibration=True)
    rest = _chain(width, [
        ("source_b", "source, reading B: uniform attention",
         "uniform attention added to reading A's FFN-only block", source,
         {"calibration": True}),
        ("softmax", "softmax attention", "softmax attention (Xavier W^Q, W^K) instead of "
         "uniform", {"attention": "softmax"}, {}),
        *_toward_normlab(heads, width)])
    return [reading_a, *rest]


def fairseq_ladder(width: int, heads: int) -> list[Rung]:
    """C7, C8: the fairseq Transformer (4d ReLU FFN, fairseq embedding, untied head, Xavier),
    then normlab's GELU MLP, embedding and inits."""
    source = {"attention": "softmax", "n_heads": heads, "mlp": "relu", "d_ff": 4 * width,
              "embedding": "fairseq", "tie_embeddings": False}
    steps = _toward_normlab(heads, width)[1:]  # the fairseq block has the profile's heads
    return _chain(width, [("source", "source: fairseq Transformer", "", source,
                           {"calibration": True}), *steps])


def with_depth_rung(rungs: list[Rung], source_depth: int, deepest: int) -> list[Rung]:
    """Rungs measured at the source's depth (`depth="source"`), then the last one again at the
    profile's deepest model: the depth range is a rung of its own (C5: a 6-layer figure)."""
    at_source = [Rung(r.key, r.label, r.change, r.fields, r.calibration, r.own_init, "source")
                 for r in rungs]
    last = rungs[-1]
    deep = Rung("deep", f"normlab's block at {deepest} blocks",
                f"{deepest} blocks instead of the source's {source_depth}", last.fields,
                False, last.own_init, "profile", measured_as=last.key)
    return [*at_source, deep]
