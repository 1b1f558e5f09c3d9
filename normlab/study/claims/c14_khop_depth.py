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
of `khop_placements` at each depth of `khop_depths`, tuned on its own lr grid
(`khop_tuned`: extended at an edge that wins, scored by validation loss), paired
seeds. Per run, the final validation accuracy per hop count; per seed its *hop score*, the mean
accuracy over hop counts 1..K, and the *hops solved*, the largest k such that every hop count up
to k is answered with accuracy >= 0.9 (reported with its interval).

Predictions (`CLAIM`), written before the runs:

- premise *calibration* (measured, about scale): the task must separate the depths studied for
  the placement the source trained (GPT-2's Pre-LN): pre's hop score at the deepest depth minus
  at the shallowest > 0 per seed. Sanford et al.'s numbers are printed beside ours.
- no premise about depth (since the seventh round): a fixed "large t" setting (the deeper half
  past block 6) failed at every depth the k-hop task trains here, by construction. The seed's
  mechanism is graded (a relative update falling like 1/sqrt(t)), so it predicts a gap at every
  depth, smaller at small depth, and the statement is at equal depth *and training budget*:
  the hop gap is decided at the depths and budget measured.
- premise *trained to a plateau* (measured, about scale; fifth edition, the design review's
  proposal): the k-hop runs train under the wsd schedule, and at every depth compared the
  validation loss of pre and of post fell by less than the study's comparable-loss margin (0.02
  nats) over the quarter of the run that ends where the decay begins, as C9's convergence
  premise reads it; otherwise a gap may be learning speed, not depth.
- claim, per depth: hop score post - pre > 0 (each at its tuned lr, per seed).
- diagnostics, per depth: each successor (DeepNorm, Mix-LN, LayerNorm Scaling) - pre; with
  `khop_control`, post - pre at 1 block, where there are no consecutive blocks to merge, so a
  gap there is a placement offset the seed's mechanism does not predict.
- the result in blocks (reported, not decided): each placement's *pre-equivalent depth*, its
  hop score placed on pre's ladder of seed-mean hop scores by depth (linear between the depths
  measured); the seed's "effectively shallower" puts post's above its own depth.

In the long profile (2-3 blocks) a gap is decided at the small depths the seed's graded
mechanism makes it small at; docs/study.md (C14) says what that scale cannot show.

Calibration rung (`khop_calibration`; docs/study.md, C14; fixed before any of its runs):
before the placements are compared, pre is trained in Sanford et al.'s own setting (their
released configs, `normlab.study.khop_source`) at depths 2-6, and for each hop count 1-16 the
smallest depth whose seed-mean error is at most 0.1 is compared with the same depth read from
their released errors (`CAL_TOLERANCE`: within one block, every hop count). A calibration that
fails makes C14 "calibration failed", as a theory claim's does: our task, model or trainer does
not reproduce the source's table, and no verdict is given on the placements; one that cannot be
read (a depth without a measured run) leaves a decided claim inconclusive.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from normlab.config import RunConfig, TrainConfig
from normlab.probe.fits import mean_ci
from normlab.study import figures
from normlab.study.claims.common import (
    COMPARABLE,
    _bracket_note,
    _rel,
    claim_result,
    not_decided,
)
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import RunRecord, StudyContext, TunedGrid, WorkPlan
from normlab.study.experiments import Grid, StudyFolder, late_improvement, record
from normlab.study.khop_source import (
    MAX_HOPS,
    SOLVED_ERROR,
    WIDTH,
    hops_solved_by_depth,
    load_table,
    solved_depths,
)
from normlab.study.schema import ClaimResult
from normlab.train.schedules import stable_end

SOLVED = 0.9  # a hop count is solved at this validation accuracy
# the plateau premise's window: a quarter of the run, ending where the wsd decay begins (C9's)
PLATEAU_FRAC = 0.25
CONTROL_DEPTH = 1  # no consecutive blocks to merge
assert math.isclose(SOLVED, 1 - SOLVED_ERROR)  # the calibration rung's level is the same
_SANFORD = "Sanford, Hsu and Telgarsky 2024 (2402.09268)"
# The authors' released per-hop errors (github.com/chsanford/hop-induction-heads at 5735bca,
# local/errors.json, copied into normlab/study/data/sanford_khop.json; GPT-2 of width 128 with
# 4 heads, 100 tokens over 4 letters, hops 0-16, 100,000 steps of 32 fresh sequences): the
# largest k with every hop count up to it at error <= 0.1, per depth ({2: 1, 3: 3, 4: 6, 5: 9,
# 6: 16}).
CAL_HOPS = tuple(range(1, MAX_HOPS + 1))  # hop 0 (copying the letter read) is not in question
PAPER_SOLVED = hops_solved_by_depth(load_table().error(WIDTH), CAL_HOPS)
# The calibration rung passes when, for every hop count, the smallest depth at which normlab's
# pre solves it is within this many blocks of Sanford et al.'s (docs/study.md, C14, for why).
CAL_TOLERANCE = 1
_PAPER = ("Sanford et al.'s released errors (GPT-2, width 128, 4 heads, 100 tokens over 4 "
          "letters, hops 0-16, 100k steps of 32): hops solved at accuracy >= 0.9 by depth "
          + ", ".join(f"{d}: {k}" for d, k in PAPER_SOLVED.items())
          + " (16: every hop count tried); the seed gives no number.")



@dataclass(frozen=True)
class Settings:
    """C14's own sizes: the k-hop models (data.task: khop), each placement at each depth tuned
    on its own lr grid; the size is the smallest at which depth mattered in the feasibility
    search (docs/study.md, C14). No depths: C14 not run."""

    khop_depths: tuple[int, ...] = ()
    khop_placements: tuple[str, ...] = ("pre", "post", "deepnorm", "mix", "lns")
    khop_width: int = 64
    khop_heads: int = 4
    khop_seq_len: int = 32
    khop_alphabet: int = 4
    khop_max_hops: int = 3
    khop_steps: int = 1200
    khop_batch_size: int = 32
    khop_lrs: tuple[float, ...] = (1.5e-3, 3e-3, 6e-3)
    khop_warmup: int = 100
    khop_seeds: int = 3
    khop_eval_batches: int = 8
    # pre and post also at 1 block (where no consecutive blocks can merge): a gap there is a
    # placement offset; pre's 1-block score extends its ladder for the pre-equivalent depth
    khop_control: bool = False
    # the calibration rung (docs/study.md, C14): before the placements are compared, pre is
    # trained in Sanford et al.'s own setting (their released configs: width 128, 4 heads,
    # depths 2-6, 99 tokens over 4 letters, hops 0-16, batch 32, their targets and optimizer;
    # normlab.study.khop_source) for `khop_cal_steps` steps at the fixed lr `khop_cal_lr`, and
    # the smallest depth that solves each hop count is compared with theirs. Off: not run.
    khop_calibration: bool = False
    khop_cal_steps: int = 10_000  # a tenth of their 100,000
    khop_cal_lr: float = 1e-3  # ten times their 1e-4: the same lr x steps
    khop_cal_warmup: int = 100  # their 1000 of 100,000 steps: 1%
    # one run per depth, as their table has: their dropout (0.1) keeps runs from being stacked,
    # so each seed costs a full run per depth
    khop_cal_seeds: int = 1
    khop_cal_eval_batches: int = 54  # 1728 sequences: at least 100 per hop count, as theirs


# each profile's (the others: the defaults, no k-hop models)
SETTINGS = {
    "tiny": Settings(khop_depths=(1, 2), khop_placements=("pre", "post"), khop_width=16,
                     khop_heads=2, khop_seq_len=12, khop_max_hops=2, khop_steps=8,
                     khop_batch_size=8, khop_lrs=(3e-3,), khop_warmup=2, khop_seeds=2,
                     khop_eval_batches=1),
    "long": Settings(khop_depths=(2, 3), khop_control=True),
    # designed before any of its runs (docs/study.md, "The gpu profile")
    "gpu": Settings(khop_depths=(2, 3, 4, 6), khop_placements=("pre", "post"), khop_width=128,
                    khop_heads=4, khop_seq_len=64, khop_max_hops=8, khop_steps=3000,
                    khop_batch_size=32, khop_lrs=(1e-3, 3e-3), khop_warmup=150, khop_seeds=4,
                    khop_calibration=True, khop_control=True),
}

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
    settings_class=Settings, per_profile=SETTINGS,
    needs=("k-hop models at depths the task separates (pre's hop score rising from the "
           "shallowest depth to the deepest), on hop counts those depths need (by Sanford et "
           "al.'s relation), each placement tuned on its own grid and trained to a plateau "
           f"(its validation loss falling by less than {COMPARABLE:g} nats over a quarter of "
           "the run before the wsd decay)"),
    predictions=(
        PredictionSpec("calibration", "hop score of pre: deepest - shallowest depth",
                       "Sanford et al.: the hops a trained transformer solves grow with its "
                       "depth (the relation, in the placement they trained)",
                       Rule("direction", ">", 0.0,
                            origin=_SANFORD + ": the relation's direction; its sizes hold at "
                                              "its own scale only: 0"),
                       role="premise", scale=True),
        PredictionSpec("trained to a plateau",
                       "val loss fall over a quarter of the run at the constant peak lr, "
                       "ending where the wsd decay begins, the worst of pre and post over the "
                       "depths compared (per seed)",
                       "the design review (before the pilot's runs): at small depth and a "
                       "short budget a gap may be learning speed, not depth; the seed's "
                       "'effectively shallower' is about trained models",
                       Rule("direction", "<", COMPARABLE,
                            origin="C9's convergence premise, the same window and margin: the "
                                   f"loss no longer falls by {COMPARABLE:g} nats (the study's "
                                   "comparable-loss margin) over a quarter of the run, read "
                                   "at the end of the stable phase (before the anneal)"),
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
        PredictionSpec("post vs pre, 1 block (control)",
                       "hop score (mean accuracy over hop counts) post - pre at 1 block",
                       "the control: one block has no consecutive blocks to merge, so the "
                       "seed's mechanism predicts no gap there; a gap is a placement offset "
                       "the gaps at depth are to be read against (reported)",
                       Rule("direction", ">", 0.0, origin="no size: 0"), role="diagnostic"),
    ),
)


# -- C14's own measurements, run on the study's folder (`StudyContext.own`) -------------------
def khop_config(folder: StudyFolder, placement: str, lr: float, seed: int, blocks: int
                ) -> RunConfig:
    """One k-hop run (`data.task: khop`) at the profile's k-hop size: letters
    `khop_alphabet`, hop counts 1..`khop_max_hops`, each placement's own default init, under
    the wsd schedule with an evaluation every tenth of the run (the plateau premise reads the
    end of the stable phase)."""
    p = CLAIM.settings(folder.profile)
    steps = p.khop_steps
    return folder.placed([
        f"model.placement={placement}", f"model.n_blocks={blocks}",
        f"model.d_model={p.khop_width}", f"model.n_heads={p.khop_heads}",
        f"model.max_seq_len={p.khop_seq_len}",
        f"model.vocab_size={p.khop_alphabet + p.khop_max_hops}",
        "data.task=khop", f"data.khop_alphabet={p.khop_alphabet}", "data.khop_min_hops=1",
        f"data.khop_max_hops={p.khop_max_hops}", f"data.seq_len={p.khop_seq_len}",
        f"train.steps={steps}", f"train.batch_size={p.khop_batch_size}", f"train.lr={lr}",
        f"train.warmup={p.khop_warmup}", f"train.seed={seed}", "train.schedule=wsd",
        f"train.eval_every={max(1, steps // 10)}",
        f"train.eval_batches={p.khop_eval_batches}",
        f"train.log_every={max(1, steps // 10)}"])


def khop_cells(p: Settings) -> list[tuple[str, int]]:
    """The (placement, depth) cells C14 trains: every placement at every depth, and with
    `khop_control` pre and post at `CONTROL_DEPTH` too."""
    cells = [(pl, d) for pl in p.khop_placements for d in p.khop_depths]
    if p.khop_control and p.khop_depths and CONTROL_DEPTH not in p.khop_depths:
        cells += [(pl, CONTROL_DEPTH) for pl in ("pre", "post") if pl in p.khop_placements]
    return cells


def khop_tuned(folder: StudyFolder, placement: str, blocks: int) -> TunedGrid:
    """`placement` at `blocks` blocks on the k-hop task, over its own lr grid (`_tuning`,
    scored by validation loss over the answered positions), `khop_seeds` seeds. Every
    placement and depth of the profile not yet tuned is tuned with it (`tune_together`):
    their first grids, and then each round of their extensions, train in one go."""
    p = CLAIM.settings(folder.profile)
    key = f"khop:{placement}:{blocks}"
    if key in folder.memo:
        return folder.memo[key]
    cells = [(pl, d) for pl, d in khop_cells(p) if f"khop:{pl}:{d}" not in folder.memo]
    if (placement, blocks) not in cells:
        cells.append((placement, blocks))
    seeds = range(p.khop_seeds)

    def grid(pl: str, depth: int) -> Grid:
        def configs(lrs: list[float]) -> list[RunConfig]:
            return [khop_config(folder, pl, lr, s, depth) for lr in lrs for s in seeds]

        def read(lrs: list[float]) -> dict[float, list[RunRecord]]:
            cfgs = configs(lrs)  # in the order of (lr, seed) below
            out: dict[float, list[RunRecord]] = {lr: [] for lr in lrs}
            for (lr, s), cfg, summary in zip(((lr, s) for lr in lrs for s in seeds), cfgs,
                                             folder.train(cfgs), strict=True):
                out[lr].append(record(cfg, summary, lr=lr, warmup=p.khop_warmup, seed=s))
            return out

        return Grid(f"khop {pl}, {depth} blocks", p.khop_warmup, p.khop_lrs, configs, read)

    folder.memo.update(folder.tune_together(
        {f"khop:{pl}:{d}": grid(pl, d) for pl, d in cells}))
    return folder.memo[key]


def khop_calibration_config(folder: StudyFolder, seed: int, blocks: int) -> RunConfig:
    """One run of C14's calibration rung: pre at `blocks` blocks in Sanford et al.'s setting
    (`normlab.study.khop_source.calibration_sets`) at the profile's calibration budget."""
    from normlab.study.khop_source import calibration_sets

    p = CLAIM.settings(folder.profile)
    return folder.placed(calibration_sets(blocks, seed, p.khop_cal_steps, p.khop_cal_lr,
                                        p.khop_cal_warmup, p.khop_cal_eval_batches))


def khop_calibration(folder: StudyFolder) -> dict[int, list[RunRecord]]:
    """C14's calibration rung: pre at each depth of Sanford et al.'s table, `khop_cal_seeds`
    seeds at the fixed lr `khop_cal_lr`, all trained in one go; per depth, the records in
    the order of the seeds."""
    from normlab.study.khop_source import WIDTH, load_table

    if "khop_calibration" in folder.memo:
        return folder.memo["khop_calibration"]
    p = CLAIM.settings(folder.profile)
    cells = [(d, s) for d in load_table().depths(WIDTH) for s in range(p.khop_cal_seeds)]
    cfgs = [khop_calibration_config(folder, s, d) for d, s in cells]
    out: dict[int, list[RunRecord]] = {d: [] for d, _s in cells}
    for (d, s), cfg, summary in zip(cells, cfgs, folder.train(cfgs), strict=True):
        out[d].append(record(cfg, summary, lr=p.khop_cal_lr, warmup=p.khop_cal_warmup,
                             seed=s))
    folder.memo["khop_calibration"] = out
    return out


def khop_accuracy(folder: StudyFolder, records: Sequence[RunRecord],
                  hops: Sequence[int] | None = None) -> list[dict[int, float]]:
    """Per run, the final validation accuracy per hop count (`val_acc_hop{k}` of its
    summary; nan for a hop count it did not record), for `hops` (default: 1 to the
    profile's `khop_max_hops`)."""
    from normlab.train import read_summary

    hops = range(1, CLAIM.settings(folder.profile).khop_max_hops + 1) if hops is None else hops
    out = []
    for r in records:
        summary = read_summary(folder.runs_root / r.run_id) or {}
        out.append({k: float(summary.get(f"val_acc_hop{k}", math.nan)) for k in hops})
    return out


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


def place_on_ladder(ladder: Mapping[int, float], score: float) -> tuple[float | None, str]:
    """Where a hop score lies on pre's ladder (depth -> pre's seed-mean hop score), in blocks:
    linear between the two measured depths whose scores enclose it. `(None, why)` when it
    cannot be placed: `below` or `beyond` the ladder's ends, `ladder not rising` (a ladder
    that does not rise strictly with depth places a score at more than one depth), or `not
    measured` (nan)."""
    depths = sorted(ladder)
    values = [ladder[d] for d in depths]
    if len(depths) < 2 or math.isnan(score) or any(math.isnan(v) for v in values):
        return None, "not measured"
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        return None, "ladder not rising"
    if score < values[0]:
        return None, "below"
    if score > values[-1]:
        return None, "beyond"
    for d0, d1, v0, v1 in zip(depths, depths[1:], values, values[1:], strict=False):
        if score <= v1:
            return d0 + (score - v0) / (v1 - v0) * (d1 - d0), ""
    raise AssertionError("unreachable: the score lies within the ladder")


def pre_equivalent_depths(scores: Mapping[tuple[str, int], Sequence[float]]
                          ) -> dict[str, dict[str, Any]]:
    """Each non-pre placement's *pre-equivalent depth* at each depth (C14's result in
    blocks): per seed, its hop score placed on pre's ladder of seed-mean hop scores over
    every depth pre was trained at (`place_on_ladder`), with the mean and interval over the
    seeds placed and how many were not, and why."""
    ladder = {d: sum(v) / len(v) for (pl, d), v in scores.items() if pl == "pre" and v}
    out: dict[str, dict[str, Any]] = {}
    for (pl, d), values in sorted(scores.items()):
        if pl == "pre":
            continue
        placed = [place_on_ladder(ladder, v) for v in values]
        why = [w for _x, w in placed if w]
        out.setdefault(pl, {})[str(d)] = {
            **mean_ci([x for x, _w in placed if x is not None]),
            "per_seed": [x for x, _w in placed], "not_placed": {w: why.count(w)
                                                                for w in sorted(set(why))}}
    return out


def equivalent_words(equiv: Mapping[str, Mapping[str, Any]], ladder: Sequence[int]) -> str:
    """Post's pre-equivalent depths in one sentence, for the claim's note."""
    parts = []
    for d, e in sorted(equiv.get("post", {}).items(), key=lambda kv: int(kv[0])):
        lo, hi = e["ci95"]
        value = ("not placed" if e["n"] == 0 else f"{e['mean']:.2f}" if e["n"] == 1
                 else f"{e['mean']:.2f} [{lo:.2f}, {hi:.2f}]")
        left = ", ".join(f"{n} {w}" for w, n in e["not_placed"].items())
        where = f"at {d} blocks" if d != str(CONTROL_DEPTH) else "at 1 block (the control)"
        parts.append(f"{where} {value}" + (f" ({left})" if left else ""))
    return ("Post's pre-equivalent depth (its hop score on pre's ladder over "
            f"{', '.join(map(str, ladder))} blocks; above its own depth if pre is effectively "
            f"shallower): {'; '.join(parts)}.") if parts else ""


def calibration_decision(ours: Mapping[int, Mapping[int, float]],
                         theirs: Mapping[int, Mapping[int, float]],
                         hops: Sequence[int] = CAL_HOPS, tolerance: int = CAL_TOLERANCE
                         ) -> dict[str, Any]:
    """The calibration rung's decision from the error per depth and hop count (depth -> k ->
    error) of normlab's pre (`ours`, seed means; nan: not measured) and of the source
    (`theirs`): per hop count the smallest depth at error <= `SOLVED_ERROR` on each side, a hop
    count solved at no depth tried counting as one block past the deepest (the least it can
    be); `passed` when every hop count's depths are within `tolerance` blocks, `failed` when
    one is not, `inconclusive` when a depth has no measured error."""
    mine, source = solved_depths(ours, hops), solved_depths(theirs, hops)
    past = max(theirs) + 1

    def depth(d: int | None) -> int:
        return past if d is None else d

    gaps = {k: depth(mine[k]) - depth(source[k]) for k in hops}
    missing = sorted(d for d in ours if any(math.isnan(ours[d].get(k, math.nan)) for k in hops))
    misses = [k for k in hops if abs(gaps[k]) > tolerance]
    status = "inconclusive" if missing else ("failed" if misses else "passed")
    return {"status": status, "ours": {str(k): mine[k] for k in hops},
            "theirs": {str(k): source[k] for k in hops}, "gap_blocks": {str(k): gaps[k]
                                                                          for k in hops},
            "misses": misses, "unmeasured_depths": missing}


def calibration_rung(ctx: StudyContext) -> dict[str, Any]:
    """Train (or read) pre in Sanford et al.'s setting (`khop_calibration`) and decide the
    rung against their released errors; its numbers for the claim's result."""
    p = CLAIM.settings(ctx.profile)
    table = load_table()
    runs: dict[int, list[RunRecord]] = ctx.own(khop_calibration)
    acc = {d: ctx.own(khop_accuracy, recs, CAL_HOPS) for d, recs in runs.items()}

    def mean_error(per_seed: list[dict[int, float]], k: int) -> float:
        values = [a[k] for a in per_seed if not math.isnan(a[k])]
        return 1.0 - sum(values) / len(values) if values else math.nan

    ours = {d: {k: mean_error(a, k) for k in CAL_HOPS} for d, a in acc.items()}
    decision = calibration_decision(ours, table.error(WIDTH))
    return {**decision,
            "source": table.where(), "source_commit": table.source["commit"],
            "setting": {"width": WIDTH, "depths": sorted(runs), "hops": [0, MAX_HOPS],
                        "steps": p.khop_cal_steps, "their_steps": table.setting["steps"],
                        "lr": p.khop_cal_lr, "warmup": p.khop_cal_warmup,
                        "seeds": p.khop_cal_seeds},
            "solved_at_error": SOLVED_ERROR, "tolerance_blocks": CAL_TOLERANCE,
            "accuracy_by_depth": {str(d): {str(k): mean_ci([x[k] for x in a]) for k in CAL_HOPS}
                                  for d, a in acc.items()},
            "stalled_or_failed": {str(d): [r.seed for r in recs if r.failed]
                                  for d, recs in runs.items()}}


def calibration_words(cal: Mapping[str, Any]) -> str:
    """The rung in one sentence, for the claim's note."""
    pairs = ", ".join(f"{k}: {cal['ours'][k]} vs {cal['theirs'][k]}" for k in cal["ours"])
    head = {"passed": "Calibration passed", "failed": "Calibration failed",
            "inconclusive": "Calibration inconclusive"}[cal["status"]]
    why = {"passed": "every hop count is solved within "
                     f"{cal['tolerance_blocks']} block of the depth Sanford et al.'s released "
                     "errors give",
           "failed": f"hop count(s) {', '.join(map(str, cal['misses']))} are solved more than "
                     f"{cal['tolerance_blocks']} block away from the depth Sanford et al.'s "
                     "released errors give, so our task, model or trainer does not reproduce "
                     "the source's table in its own setting, and no verdict is given on the "
                     "placements",
           "inconclusive": "depth(s) "
                           f"{', '.join(map(str, cal['unmeasured_depths']))} have no measured "
                           "run, so the rung cannot be read"}[cal["status"]]
    return (f"{head} (pre in Sanford et al.'s setting, {cal['setting']['steps']} steps): {why}; "
            f"smallest depth solving each hop count at error <= {cal['solved_at_error']}, "
            f"ours vs theirs (None: no depth tried): {pairs}.")


def measure(ctx: StudyContext) -> ClaimResult:
    p = CLAIM.settings(ctx.profile)
    method = ("The k-hop induction heads task (normlab.data.khop): each placement at each "
              "depth tuned on its own lr grid, paired seeds; per run the final validation "
              "accuracy per hop count; per seed the hop score (mean accuracy over hop counts) "
              f"and the hops solved (every hop count up to k at accuracy >= {SOLVED}).")
    if not p.khop_depths:
        return not_decided(CLAIM, method, "not run",
                           "This profile trains no k-hop models; the long profile does.")
    depths = sorted(p.khop_depths)
    # the calibration rung first: the source's table in its own setting
    cal = calibration_rung(ctx) if p.khop_calibration else None
    grids: dict[tuple[str, int], TunedGrid] = {
        (pl, d): ctx.own(khop_tuned, pl, d) for pl, d in khop_cells(p)}
    acc = {key: ctx.own(khop_accuracy, g.best) for key, g in grids.items()}
    score = {key: [hop_score(a) for a in runs] for key, runs in acc.items()}
    solved = {key: [float(hops_solved(a)) for a in runs] for key, runs in acc.items()}

    def diff(a: Sequence[float], b: Sequence[float]) -> list[float]:
        return [y - x for x, y in zip(a, b, strict=True)]

    predictions = []
    compared = {"pre", "post"} <= set(p.khop_placements)
    if "pre" in p.khop_placements and len(depths) > 1:
        predictions.append(CLAIM.predict("calibration", diff(score["pre", depths[0]],
                                                             score["pre", depths[-1]]),
                                         subject=f"calibration: pre, {depths[-1]} - "
                                                 f"{depths[0]} blocks"))
    end = stable_end(TrainConfig(steps=p.khop_steps, schedule="wsd"))
    if compared:
        falls = [ctx.own(late_improvement, grids[pl, d].best, PLATEAU_FRAC, end, p.khop_steps)
                 for pl in ("pre", "post") for d in depths]
        predictions.append(CLAIM.predict("trained to a plateau", [
            math.nan if any(math.isnan(x) for x in seed) else max(seed)
            for seed in zip(*falls, strict=True)]))
    if compared and ("post", CONTROL_DEPTH) in grids and CONTROL_DEPTH not in depths:
        predictions.append(CLAIM.predict(
            "post vs pre, 1 block (control)",
            diff(score["pre", CONTROL_DEPTH], score["post", CONTROL_DEPTH])))
    for d in depths:
        if compared:
            predictions.append(CLAIM.predict(
                "post vs pre, {blocks} blocks", diff(score["pre", d], score["post", d]),
                subject=f"post vs pre, {d} blocks"))
        for pl in p.khop_placements:
            if pl not in ("pre", "post"):
                predictions.append(CLAIM.predict(
                    "{placement} vs pre, {blocks} blocks", diff(score["pre", d], score[pl, d]),
                    subject=f"{pl} vs pre, {d} blocks"))
    hops = range(1, p.khop_max_hops + 1)
    trained = sorted({d for _pl, d in grids})
    ladder = sorted(d for pl, d in grids if pl == "pre")
    equivalent = pre_equivalent_depths(score)
    numbers: dict[str, Any] = {
        "task": {"alphabet": p.khop_alphabet, "hops": [1, p.khop_max_hops],
                 "seq_len": p.khop_seq_len, "width": p.khop_width, "steps": p.khop_steps,
                 "seeds": p.khop_seeds, "solved_at": SOLVED, "schedule": "wsd",
                 "plateau_window": [end - PLATEAU_FRAC * p.khop_steps, end]},
        "pre_equivalent_depth": {"ladder_depths": ladder, "by_placement": equivalent},
        "paper_hops_solved": {str(d): k for d, k in PAPER_SOLVED.items()},
        "by_placement": {
            pl: {str(d): {"lr": grids[pl, d].best_lr, "bracketed": grids[pl, d].bracketed,
                          "hop_score": mean_ci(score[pl, d]),
                          "hops_solved": mean_ci(solved[pl, d]),
                          "hops_solved_per_seed": solved[pl, d],
                          "accuracy_by_hop": {str(k): mean_ci([a[k] for a in acc[pl, d]])
                                              for k in hops}}
                 for d in trained if (pl, d) in grids}
            for pl in p.khop_placements},
        # each cell's outcomes, per lr, are in the tuning records
        "tuning": {f"{pl}, {d} blocks": g.numbers() for (pl, d), g in grids.items()}}
    if cal is not None:
        numbers["calibration"] = cal
    bars = {f"{pl}, {d} blocks": mean_ci(score[pl, d]) for d in trained
            for pl in p.khop_placements if (pl, d) in grids}
    fig = figures.plot_bars(bars, ctx.fig_dir / "c14_khop.svg",
                            ylabel=f"hop score (mean accuracy, hops 1-{p.khop_max_hops})",
                            title=f"k-hop task, each at its tuned lr, {p.khop_seeds} seeds")
    # only the compared placements' failure leaves the claim undecided
    stalled = sorted({pl for (pl, _d), g in grids.items() if g.all_stalled
                      and pl in ("pre", "post")})
    note = " ".join(x for x in (_bracket_note(*grids.values()),
                                equivalent_words(equivalent, ladder)) if x)
    result = claim_result(CLAIM, method, predictions, numbers, _rel(ctx, fig), stalled=stalled,
                          note=note,
                          calibration=None if cal is None else cal["status"])
    if cal is None:
        return result
    words = calibration_words(cal)
    if cal["status"] == "failed":
        result.verdict = "calibration failed"
        result.note = words + (" " + result.note if result.note else "")
    elif cal["status"] == "inconclusive" and result.verdict in ("supported", "not supported"):
        result.verdict = "inconclusive"
        result.note = words + (" " + result.note if result.note else "")
    else:
        result.note = (result.note + " " if result.note else "") + words
    return result


def work(plan: WorkPlan) -> None:
    """C14's runs: each placement at each depth over its own lr grid on the k-hop task, and
    the calibration rung's runs where the profile has it."""
    own = CLAIM.settings(plan.profile)
    if not own.khop_depths:
        return
    for pl, d in khop_cells(own):
        plan.grid(f"khop {pl}, {d} blocks", own.khop_warmup, own.khop_lrs,
                  lambda lr, pl=pl, d=d: [khop_config(plan.folder, pl, lr, s, d)
                                          for s in range(own.khop_seeds)])
    if own.khop_calibration:  # pre in Sanford et al.'s setting
        plan.runs([khop_calibration_config(plan.folder, s, d)
                   for d in load_table().depths(WIDTH) for s in range(own.khop_cal_seeds)])


CLAIM = CLAIM.bind(measure, work=work)
