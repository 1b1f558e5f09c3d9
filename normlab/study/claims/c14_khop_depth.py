"""C14: effective depth as function: a Pre-LN model solves fewer hops of the k-hop task
----------------------------------------------------------------------------------------

The seed's central claim is that an L-block Pre-LN model acts like a shallower one (its stream
grows, so when t is large consecutive blocks merge into width). C2 and C3 measure that through
representations; this claim measures it as what a model can compute, on a task whose depth
requirement is known: the k-hop induction heads task (`normlab.data.khop`, docs/data.md) of
Sanford, Hsu and Telgarsky 2024 (arXiv 2402.09268): "depth L = Θ(log k) is necessary and
sufficient for efficient transformer representation. An accompanying empirical investigation
reveals that transformers trained on the task obey the same threshold".

Design (docs/study.md, C14; the size is the smallest at which depth visibly mattered in the
feasibility search, `scripts/khop_feasibility.py`, docs/results/khop_feasibility): each placement
of `profile.khop_placements` at each depth of `profile.khop_depths`, tuned on its own lr grid
(`StudyContext.khop_tuned`: extended at an edge that wins, scored by validation loss), paired
seeds. Per run, the final validation accuracy per hop count; per seed its *hop score*, the mean
accuracy over hop counts 1..K, and the *hops solved*, the largest k such that every hop count up
to k is answered with accuracy >= 0.9 (reported with its interval).

Predictions (`CLAIM`), written before the runs:

- premise *large t* (a setting, about scale): the seed's argument is about large t; the deepest
  depth measured must have its deeper half past block 6, as in C2 and C3. At the depths this
  machine can train on the task (2-3 blocks) it fails, and the claim is "not tested at this
  scale": the seed predicts nothing there, so a difference would not support it and none would
  not refute it. Everything below is still measured and reported.
- premise *calibration* (about scale): the source's relation must appear for the placement it
  trained (GPT-2's Pre-LN): pre's hop score at the deepest depth minus at the shallowest > 0 per
  seed. Sanford et al.'s numbers are printed beside ours.
- claim, per depth: hop score post - pre > 0 (each at its tuned lr, per seed).
- diagnostics, per depth: each successor (DeepNorm, Mix-LN, LayerNorm Scaling) - pre.

In the long profile (2-3 blocks) the large-t premise fails by construction, so C14 is a pilot
there: it decides nothing and reports the numbers a deciding design needs (docs/study.md, C14,
and the design review of the long profile).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from normlab.probe.fits import mean_ci
from normlab.study import figures
from normlab.study.claims.common import (
    SHALLOW_BLOCKS,
    _bracket_note,
    _rel,
    claim_result,
    first_late_block,
    large_t_premise,
    not_decided,
)
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import StudyContext, TunedGrid
from normlab.study.schema import ClaimResult

SOLVED = 0.9  # a hop count is solved at this validation accuracy
_SANFORD = "Sanford, Hsu and Telgarsky 2024 (2402.09268)"
# The authors' released per-hop errors (github.com/chsanford/hop-induction-heads,
# local/errors.json; GPT-2 of width 128 with 4 heads, 100 tokens over 4 letters, hops 0-16,
# 100,000 steps of 32 fresh sequences): the largest k with every hop count up to it at error
# <= 0.1, per depth.
PAPER_SOLVED = {2: 1, 3: 3, 4: 6, 5: 9, 6: 16}
_PAPER = ("Sanford et al.'s released errors (GPT-2, width 128, 4 heads, 100 tokens over 4 "
          "letters, hops 0-16, 100k steps of 32): hops solved at accuracy >= 0.9 by depth "
          + ", ".join(f"{d}: {k}" for d, k in PAPER_SOLVED.items())
          + " (16: every hop count tried); the seed gives no number.")

CLAIM = Claim(
    id="C14", title="Pre-LN is effectively shallower: it solves fewer hops at equal depth",
    statement="At equal depth and training budget, a Pre-LN decoder solves fewer hops of the "
              "k-hop induction heads task than a Post-LN one (an L-block Pre-LN acts like a "
              "shallower model).",
    source="Seed argument (effective depth); " + _SANFORD + " for the task and its depth law",
    quote="depth L = Θ(log k) is necessary and sufficient for efficient transformer "
          "representation. An accompanying empirical investigation reveals that transformers "
          "trained on the task obey the same threshold (Sanford et al.); when t is large, "
          "x_{t+1} and x_t are very close (the seed)",
    setting="Sanford et al.: GPT-2 (Pre-LN) decoders of depth 2-6, width 128, 4 heads, "
            "sequences of 100 tokens over 4 letters, hop counts 0-16, 100,000 steps of 32 "
            "(the released configs); the seed: deep Pre-LN models, no size",
    paper=_PAPER,
    needs=(f"k-hop models of {2 * SHALLOW_BLOCKS} blocks or more (the deeper half past block "
           f"{SHALLOW_BLOCKS}) on hop counts that such a depth needs (by Sanford et al.'s "
           "relation, hops of 16 and more, sequences of 100 tokens or more), each placement "
           "tuned on its own grid"),
    predictions=(
        large_t_premise("of the deepest k-hop models"),
        PredictionSpec("calibration", "hop score of pre: deepest - shallowest depth",
                       "Sanford et al.: the hops a trained transformer solves grow with its "
                       "depth (the relation, in the placement they trained)",
                       Rule("direction", ">", 0.0,
                            origin=_SANFORD + ": the relation's direction; its sizes hold at "
                                              "its own scale only: 0"),
                       role="premise", scale=True),
        PredictionSpec("post vs pre, {blocks} blocks",
                       "hop score (mean accuracy over hop counts) post - pre",
                       "the seed: an L-block Pre-LN acts like a shallower model, so it solves "
                       "fewer hops than Post-LN at the same depth",
                       Rule("direction", ">", 0.0, origin="the seed gives no size: 0")),
        PredictionSpec("{placement} vs pre, {blocks} blocks",
                       "hop score (mean accuracy over hop counts) successor - pre",
                       "the seed's successors aim to use Pre-LN's deep blocks better "
                       "(reported)", Rule("direction", ">", 0.0, origin="no size: 0"),
                       role="diagnostic"),
    ),
)


def hops_solved(acc: Mapping[int, float], level: float = SOLVED) -> int:
    """The largest k such that every hop count 1..k has accuracy >= `level` (0: none)."""
    k = 0
    for hop in sorted(acc):
        if not acc[hop] >= level:  # nan counts as unsolved
            break
        k = hop
    return k


def hop_score(acc: Mapping[int, float]) -> float:
    """Mean accuracy over the hop counts (nan if any is missing)."""
    values = list(acc.values())
    return sum(values) / len(values) if values else math.nan


def measure(ctx: StudyContext) -> ClaimResult:
    p = ctx.profile
    method = ("The k-hop induction heads task (normlab.data.khop): each placement at each "
              "depth tuned on its own lr grid, paired seeds; per run the final validation "
              "accuracy per hop count; per seed the hop score (mean accuracy over hop counts) "
              f"and the hops solved (every hop count up to k at accuracy >= {SOLVED}).")
    if not p.khop_depths:
        return not_decided(CLAIM, method, "not run",
                           "This profile trains no k-hop models; the long profile does.")
    depths = sorted(p.khop_depths)
    grids: dict[tuple[str, int], TunedGrid] = {
        (pl, d): ctx.khop_tuned(pl, d) for pl in p.khop_placements for d in depths}
    acc = {key: ctx.khop_accuracy(g.best) for key, g in grids.items()}
    score = {key: [hop_score(a) for a in runs] for key, runs in acc.items()}
    solved = {key: [float(hops_solved(a)) for a in runs] for key, runs in acc.items()}

    def diff(a: Sequence[float], b: Sequence[float]) -> list[float]:
        return [y - x for x, y in zip(a, b, strict=True)]

    predictions = [CLAIM.predict("large t", [first_late_block(depths[-1])])]
    if "pre" in p.khop_placements and len(depths) > 1:
        predictions.append(CLAIM.predict("calibration", diff(score["pre", depths[0]],
                                                             score["pre", depths[-1]]),
                                         subject=f"calibration: pre, {depths[-1]} - "
                                                 f"{depths[0]} blocks"))
    for d in depths:
        if {"pre", "post"} <= set(p.khop_placements):
            predictions.append(CLAIM.predict(
                "post vs pre, {blocks} blocks", diff(score["pre", d], score["post", d]),
                subject=f"post vs pre, {d} blocks"))
        for pl in p.khop_placements:
            if pl not in ("pre", "post"):
                predictions.append(CLAIM.predict(
                    "{placement} vs pre, {blocks} blocks", diff(score["pre", d], score[pl, d]),
                    subject=f"{pl} vs pre, {d} blocks"))
    hops = range(1, p.khop_max_hops + 1)
    numbers: dict[str, Any] = {
        "task": {"alphabet": p.khop_alphabet, "hops": [1, p.khop_max_hops],
                 "seq_len": p.khop_seq_len, "width": p.khop_width, "steps": p.khop_steps,
                 "seeds": p.khop_seeds, "solved_at": SOLVED},
        "paper_hops_solved": {str(d): k for d, k in PAPER_SOLVED.items()},
        "by_placement": {
            pl: {str(d): {"lr": grids[pl, d].best_lr, "bracketed": grids[pl, d].bracketed,
                          "hop_score": mean_ci(score[pl, d]),
                          "hops_solved": mean_ci(solved[pl, d]),
                          "hops_solved_per_seed": solved[pl, d],
                          "accuracy_by_hop": {str(k): mean_ci([a[k] for a in acc[pl, d]])
                                              for k in hops}}
                 for d in depths}
            for pl in p.khop_placements},
        # each cell's outcomes, per lr, are in the tuning records
        "tuning": {f"{pl}, {d} blocks": g.numbers() for (pl, d), g in grids.items()}}
    bars = {f"{pl}, {d} blocks": mean_ci(score[pl, d]) for d in depths
            for pl in p.khop_placements}
    fig = figures.plot_bars(bars, ctx.fig_dir / "c14_khop.svg",
                            ylabel=f"hop score (mean accuracy, hops 1-{p.khop_max_hops})",
                            title=f"k-hop task, each at its tuned lr, {p.khop_seeds} seeds")
    # only the compared placements' failure leaves the claim undecided
    stalled = sorted({pl for (pl, _d), g in grids.items() if g.all_stalled
                      and pl in ("pre", "post")})
    return claim_result(CLAIM, method, predictions, numbers, _rel(ctx, fig), stalled=stalled,
                        note=_bracket_note(*grids.values()))


CLAIM = CLAIM.bind(measure)
