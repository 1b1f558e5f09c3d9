"""C1: Pre-Norm's stream grows with depth; Post-Norm's stays constant (Xiong et al. 2020,
Lemma 2), calibrated in the lemma's setting and traced along Xiong's ladder."""

from __future__ import annotations

import math
from typing import Any

from normlab.probe.fits import loglog_fit, mean_ci
from normlab.study.claims.common import SCALE, probed_deep, slope_over_depth
from normlab.study.claims.ladder import _at_depth, ladder_claim, xiong_sweep, xiong_work
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import ProbedRun, StudyContext
from normlab.study.ladders import Rung
from normlab.study.schema import ClaimResult
from normlab.study.verdict import Prediction

# Half the smallest per-block difference Lemma 2 separates: Pre-LN adds at least d/2 per block,
# Post-LN's norm input stays at 3d/2, so agreement with an equality is judged to within d/4.
LEMMA2_RESOLUTION = 0.25

_RES = "+- half the smallest difference Lemma 2 separates (d/4)"

CLAIM = Claim(
    id="C1", title="Pre-Norm's stream grows with depth; Post-Norm's stays constant",
    statement="Xiong et al.'s Lemma 2: at init, for Pre-LN, (1 + l/2)d <= E||x_l||^2 <= "
              "(1 + 3l/2)d; for Post-LN, E||x^post_l||^2 = 3d/2. Curse of Depth: trained models "
              "grow faster.",
    source="Xiong et al. 2020 (2002.04745), Sec. 3.3, Lemma 2 (setting: Xavier N(0, 1/d), "
           "x_0 ~ N(0, I_d), a ReLU FFN of width d, and in one reading a single head with "
           "W^Q = W^K = 0); Sun et al. 2025 (2502.05795)",
    quote="For the Pre-LN Transformer, (1 + l/2)d <= E(||x^pre_l||^2) <= (1 + 3l/2)d; for the "
          "Post-LN Transformer, E(||x^post_l||^2) = 3d/2 (Lemma 2)",
    setting="at initialization; W^Q = W^K = 0 (uniform attention, one head); Xavier N(0, 1/d) "
            "weights; x_0 ~ N(0, I_d); a ReLU FFN of width d",
    paper="Xiong Lemma 2: per block E||x_l||^2 grows by 0.5d to 1.5d under Pre-LN; 3d/2 at "
          "Post-LN's norm. Curse of Depth: the last layer's variance ~175 in a trained 130M "
          "model.",
    ladder="xiong",
    trains=(("pre", True), ("post", True)),  # the trained stream (Curse of Depth): diagnostic
    predictions=(
        PredictionSpec(
            "pre (FFN only)", "per-block increment of E||x_l||^2, in units of d",
            "Lemma 2 read without attention: each ReLU FFN of width d adds E||ReLU(z)||^2 = d/2 "
            "(Lemma 1), so E||x_l||^2 = (1 + l/2)d: the lower bound, attained",
            Rule("band", low=0.5 - LEMMA2_RESOLUTION, high=0.5 + LEMMA2_RESOLUTION,
                 origin="Lemma 1's d/2 per FFN, " + _RES),
            derivation="only on the FFN-only source rung"),
        PredictionSpec(
            "pre", "per-block increment of E||x_l||^2, in units of d",
            "Lemma 2: (1 + l/2)d <= E||x_l||^2 <= (1 + 3l/2)d, so each block adds between 0.5d "
            "and 1.5d (bounds, not a law)",
            Rule("band", low=0.5, high=1.5, origin="Lemma 2's bounds"),
            derivation="on the uniform-attention source rung"),
        PredictionSpec(
            "pre (mechanism)", "increment of E||x_l||^2 over the model / the sum of its "
            "branches' E||attn||^2 + E||MLP||^2",
            "Lemma 2's mechanism: at init the cross terms vanish, so each block adds its own "
            "branches' energy: the increment equals their sum",
            Rule("band", low=1 - 2 * LEMMA2_RESOLUTION, high=1 + 2 * LEMMA2_RESOLUTION,
                 origin="the lemma's mechanism (ratio 1), to the source rung's resolution d/4 "
                        "relative to its increment d/2 (+- 0.5)"),
            derivation="off the source rungs: the rung's own branch energies, measured through "
                       "the taps at init"),
        PredictionSpec(
            "pre grows linearly", "log-log exponent of E||x_l||^2 - E||x_0||^2 against l = 1..L",
            "Lemma 2: bounds linear in l, which allow an exponent of 1 +- ln 3 / ln L",
            Rule("band", origin="Lemma 2's bounds (1 + l/2)d and (1 + 3l/2)d: 1 +- ln 3 / ln L "
                                "at the deepest L"),
            derivation="the same range on every rung (each block adds about the same energy)"),
        PredictionSpec(
            "post", "E||x + FFN(x)||^2 / d at Post-LN's FFN norm input (mean over blocks)",
            "Lemma 2: E||x^post||^2 = 3d/2 at every layer",
            Rule("band", origin="Lemma 2's 3d/2 (source rungs) or its mechanism 1 + "
                                "E||FFN(z)||^2 / d (other rungs), " + _RES),
            derivation="source rungs: 3/2; every other rung: 1 + that rung's own E||FFN(z)||^2 "
                       "/ d with z the normalized stream (cross term vanishing), measured "
                       "through the taps"),
        PredictionSpec(
            "post flat", "slope of E||x + FFN(x)||^2 / d over relative depth",
            "Lemma 2: the same 3d/2 at every layer",
            Rule("band", low=-LEMMA2_RESOLUTION, high=LEMMA2_RESOLUTION,
                 origin="Lemma 2's 'at every layer': slope 0, " + _RES),
            derivation="the same on every rung"),
        PredictionSpec(
            "pre trained grows faster", "log(||x_L|| / ||x_1||) trained - the same run at init",
            "Curse of Depth: trained Pre-LN models' variance grows faster with depth than at "
            "init (Theta(L) <= var(x_L) <= Theta(exp L))",
            Rule("direction", ">", 0.0, origin="Curse of Depth gives bounds, no size: 0"),
            role="diagnostic",
            derivation="on normlab's block only: the matched-loss checkpoints and their own "
                       "models at step 0"),
    ),
)


def per_block_increment(stats: dict[str, Any]) -> float:
    """(E||x_L||^2 - E||x_0||^2) / (L d): Lemma 2's per-block growth in units of d."""
    s = stats["summary"]
    return (stats["per_block"]["sq_norm"][-1] - s["embed_sq"]) / (s["n_blocks"] * s["d_model"])


def norm_input_over_d(stats: dict[str, Any]) -> float:
    """Mean over blocks of E||x + MLP(x)||^2 / d: Post-LN's norm input (Lemma 2: 3/2)."""
    v = stats["per_block"]["mlp_norm_input_sq"]
    return sum(v) / len(v) / stats["summary"]["d_model"]


def growth_exponent_sq(stats: dict[str, Any]) -> float:
    """Log-log slope of E||x_l||^2 - E||x_0||^2 against l = 1..L (reported, not tested)."""
    e0 = stats["summary"]["embed_sq"]
    pts = [(i + 1, v - e0, 0) for i, v in enumerate(stats["per_block"]["sq_norm"]) if v > e0]
    return loglog_fit(pts, n_boot=0)["slope"] if len(pts) >= 2 else math.nan


def increment_over_branches(stats: dict[str, Any]) -> float:
    """(E||x_L||^2 - E||x_0||^2) / sum over blocks of E||attn_l||^2 + E||MLP_l||^2: 1 when the
    cross terms vanish, as the lemma's mechanism has it at init."""
    pb = stats["per_block"]
    added = sum(pb["attn_branch_sq"]) + sum(pb["mlp_branch_sq"])
    total = pb["sq_norm"][-1] - stats["summary"]["embed_sq"]
    return total / added if added > 0 else math.nan


def post_mechanism(stats: dict[str, Any]) -> float:
    """Mean over blocks of (E||z||^2 + E||FFN(z)||^2) / d, z the stream entering the FFN (the
    normalized stream under Post-LN, E||z||^2 = d): what the lemma's mechanism gives for the
    norm input on this block's FFN and init."""
    pb, d = stats["per_block"], stats["summary"]["d_model"]
    v = [(a + b) / d for a, b in zip(pb["mlp_in_sq"], pb["mlp_branch_sq"], strict=True)]
    return sum(v) / len(v)


def trained_growth(ctx: StudyContext) -> list[float]:
    """Per seed, log(||x_L|| / ||x_1||) of the matched-loss pre checkpoint minus the same of its
    own model at step 0 (empty when no pair trained)."""
    tp, at_init = ctx.trained_probes(), ctx.init_probes()
    if not tp.found or not at_init.found:
        return []

    def growth(entry: ProbedRun) -> float:
        norm = entry.per_block["norm"]
        return math.log(norm[-1] / norm[0]) if norm[0] > 0 and norm[-1] > 0 else math.nan

    return [growth(a) - growth(b) for a, b in zip(tp.seeds["pre"], at_init.seeds["pre"],
                                                  strict=True)]


def measure(ctx: StudyContext) -> ClaimResult:
    rungs, data = xiong_sweep(ctx)
    L = max(ctx.profile.init_depths)

    def at_deepest(rung: Rung, placement: str) -> list[dict[str, Any]]:
        rows = [r for r in data[rung.key][placement] if r["n_blocks"] <= L]
        return [r["stats"] for r in _at_depth(rows)]

    allowed = [1 - math.log(3) / math.log(L), 1 + math.log(3) / math.log(L)]

    def predict(rung: Rung) -> list[Prediction]:
        pre_stats, post_stats = at_deepest(rung, "pre"), at_deepest(rung, "post")
        post = [norm_input_over_d(s) for s in post_stats]
        flat = [slope_over_depth([v / s["summary"]["d_model"]
                                  for v in s["per_block"]["mlp_norm_input_sq"]])
                for s in post_stats]
        growth = [growth_exponent_sq(s) for s in pre_stats]
        if rung.calibration:
            # no attention: each ReLU FFN adds exactly d/2 (Lemma 1)
            key = "pre (FFN only)" if rung.key == "source_a" else "pre"
            first = CLAIM.predict(key, [per_block_increment(s) for s in pre_stats],
                                  subject="pre")
            post_pred = CLAIM.predict("post", post, low=1.5 - LEMMA2_RESOLUTION,
                                      high=1.5 + LEMMA2_RESOLUTION,
                                      derivation="the source rung: Lemma 2's 3/2")
        else:
            first = CLAIM.predict("pre (mechanism)",
                                  [increment_over_branches(s) for s in pre_stats])
            expected = [post_mechanism(s) for s in post_stats]
            post_pred = CLAIM.predict(
                "post", [a - b + 1.5 for a, b in zip(post, expected, strict=True)],
                subject="post (mechanism)",
                quantity="E||x + FFN(x)||^2 / d - (1 + E||FFN(z)||^2 / d) + 3/2, mean over "
                         "blocks", low=1.5 - LEMMA2_RESOLUTION, high=1.5 + LEMMA2_RESOLUTION,
                derivation="1 + this rung's own E||FFN(z)||^2 / d = "
                           f"{sum(expected) / max(1, len(expected)):.3g} (mean over seeds), "
                           "shifted to the lemma's 3/2 so that the band reads as its own")
        preds = [first, CLAIM.predict("pre grows linearly", growth, low=allowed[0],
                                      high=allowed[1]),
                 post_pred, CLAIM.predict("post flat", flat)]
        if rung is rungs[-1]:
            preds.append(CLAIM.predict("pre trained grows faster", trained_growth(ctx)))
        return preds

    exponents = {r.label: mean_ci([growth_exponent_sq(s) for s in at_deepest(r, "pre")])
                 for r in rungs}
    numbers = {"growth_exponent_of_E_x_sq_at_init": exponents,
               "exponent_range_the_bounds_allow": allowed,
               "post_mechanism_1_plus_ffn_energy": {
                   r.label: mean_ci([post_mechanism(s) for s in at_deepest(r, "post")])
                   for r in rungs},
               "pre_increment_over_branch_energies": {
                   r.label: mean_ci([increment_over_branches(s) for s in at_deepest(r, "pre")])
                   for r in rungs}}
    return ladder_claim(
        ctx, CLAIM,
        f"At init, deepest model (L = {L}), per seed. In the lemma's setting (both readings): "
        "Pre-LN's per-block increment (E||x_L||^2 - E||x_0||^2) / (L d) against the lemma's "
        "bounds 0.5-1.5 (d/2 +- d/4 without attention), Post-LN's FFN norm input "
        "E||x + FFN(x)||^2 / d against 3/2 +- 0.25. On every other rung, the lemma's mechanism "
        "with that rung's own branch energies (through the taps): pre's increment over the sum "
        "of its branches' E||attn||^2 + E||MLP||^2 at 1 +- 0.5, post's norm input at 1 + "
        "E||FFN(z)||^2 / d +- 0.25. On every rung: pre's growth exponent within the range the "
        "bounds allow, post's norm input flat over blocks (slope 0 +- 0.25). Reported: trained "
        "pre's stream against its own model at init (Curse of Depth).",
        rungs, predict, numbers, [], {"pre": "pre: increment / d", "post": "post: norm input / d"},
        caveat=SCALE + " The squared-norm growth exponent is reported only: bounds that differ "
                       f"by a factor 3 allow any exponent in [{allowed[0]:.2f}, "
                       f"{allowed[1]:.2f}] at L = {L}.")


CLAIM = CLAIM.bind(measure, work=xiong_work, deep_grids=probed_deep)
