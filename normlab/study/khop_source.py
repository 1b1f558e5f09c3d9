"""Sanford, Hsu and Telgarsky's released k-hop results (C14's calibration rung).

The authors released the error of every model their paper's Section 5 and Appendix G plot
(github.com/chsanford/hop-induction-heads at commit 5735bca, `local/errors.json`, written by
`src/error_plots.ipynb`): per depth 2-6, width 128 (4 heads) or 256 (8 heads) and hop count
0-16, the token-wise error at step 100,000 over the positions whose target is a letter. The
fresh-sample runs of that file are copied, value for value, into `data/sanford_khop.json` beside
this module, with where they came from and the setting of the released configs
(`load_table`). C14's calibration rung reads from it, for each hop count, the smallest depth
that solves it (`solved_depths`), and asks normlab's pre placement, trained in that setting, for
the same depths (docs/study.md, C14).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

TABLE_FILE = "sanford_khop.json"  # package data of normlab.study (data/)
SOLVED_ERROR = 0.1  # a hop count is solved at error <= 0.1 (accuracy >= 0.9, C14's level)


@dataclass(frozen=True)
class SourceTable:
    """The released errors: `errors[width][depth][k]` for k = 0..max_hops, with the file's
    `source`, `metric` and `setting` records."""

    errors: Mapping[int, Mapping[int, tuple[float, ...]]]
    source: Mapping[str, Any]
    metric: str
    setting: Mapping[str, Any]

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(sorted(self.errors))

    def depths(self, width: int) -> tuple[int, ...]:
        return tuple(sorted(self.errors[width]))

    def error(self, width: int) -> dict[int, dict[int, float]]:
        """Per depth, the error per hop count k (0..max_hops) at `width`."""
        return {d: dict(enumerate(row)) for d, row in self.errors[width].items()}

    def where(self) -> str:
        s = self.source
        return f"{s['repository']} at {s['commit'][:7]}, {s['file']}"


@cache
def load_table() -> SourceTable:
    """The table shipped with the package (`data/sanford_khop.json`)."""
    text = resources.files("normlab.study").joinpath("data", TABLE_FILE).read_text()
    raw = json.loads(text)
    errors = {int(w): {int(d): tuple(float(v) for v in row) for d, row in by_depth.items()}
              for w, by_depth in raw["errors"].items()}
    return SourceTable(errors, raw["source"], raw["metric"], raw["setting"])


def solved_depths(error: Mapping[int, Mapping[int, float]], hops: Any,
                  level: float = SOLVED_ERROR) -> dict[int, int | None]:
    """For each hop count k of `hops`, the smallest depth d of `error` (depth -> k -> error)
    whose error on k is at most `level`; None where no depth reaches it (nan counts as not
    reaching it)."""
    out: dict[int, int | None] = {}
    for k in hops:
        out[k] = next((d for d in sorted(error) if error[d].get(k, math.nan) <= level), None)
    return out


def hops_solved_by_depth(error: Mapping[int, Mapping[int, float]], hops: Any,
                         level: float = SOLVED_ERROR) -> dict[int, int]:
    """Per depth, the largest k of `hops` (in order) such that every hop count up to it has
    error at most `level` (0: none)."""
    out = {}
    for d in sorted(error):
        k = 0
        for h in hops:
            if not error[d].get(h, math.nan) <= level:
                break
            k = h
        out[d] = k
    return out


# -- their setting, as normlab runs it (C14's calibration rung) --------------------------------
WIDTH = 128  # the configs without "width8": the paper's main figure
HEADS = 4
LETTERS = 4
MIN_HOPS, MAX_HOPS = 0, 16
SEQ_LEN = 99  # their seq_len 100: the hop token and 98 letters (they drop the last two)
BATCH = 32


def calibration_sets(blocks: int, seed: int, steps: int, lr: float, warmup: int,
                     eval_batches: int) -> list[str]:
    """The `--set` items of one calibration run: normlab's pre at `blocks` blocks in their
    setting (the released configs; `data/sanford_khop.json`, "setting"), as far as normlab's
    model and trainer reach it: width 128, 4 heads, 99 tokens over 4 letters, hop counts 0-16
    with their targets (`data.khop_unanswered: token`), batch 32, GPT-2's dropout 0.1 and tanh
    GELU under pre's GPT-2 init, AdamW with betas (0.9, 0.999), weight decay 0.01 and no
    clipping, a linear warmup over `warmup` steps then a linear decay to 0. What differs is
    listed in docs/study.md (C14, calibration rung): the budget (`steps`, `lr`), an untied
    head where theirs reads the final norm's output as logits, no dropout on the embedding, and
    weight decay on the weight matrices only."""
    vocab = LETTERS + (MAX_HOPS - MIN_HOPS + 1) + 2
    return [
        "model.placement=pre", f"model.n_blocks={blocks}", f"model.d_model={WIDTH}",
        f"model.n_heads={HEADS}", f"model.max_seq_len={SEQ_LEN}", f"model.vocab_size={vocab}",
        "model.dropout=0.1", "model.gelu_approx=tanh", "model.tie_embeddings=false",
        "data.task=khop", f"data.khop_alphabet={LETTERS}", f"data.khop_min_hops={MIN_HOPS}",
        f"data.khop_max_hops={MAX_HOPS}", "data.khop_unanswered=token", f"data.seq_len={SEQ_LEN}",
        f"train.steps={steps}", f"train.batch_size={BATCH}", f"train.lr={lr}",
        f"train.warmup={warmup}", "train.schedule=linear", "train.min_lr_ratio=0",
        "train.weight_decay=0.01", "train.beta2=0.999", "train.grad_clip=null",
        f"train.seed={seed}", f"train.eval_every={max(1, steps // 4)}",
        f"train.eval_batches={eval_batches}", f"train.log_every={max(1, steps // 50)}"]
