"""C5: at init the FFN gradients grow toward the output under Post-LN and stay level under
Pre-LN (Xiong et al. 2020, Fig. 3), calibrated at the figure's depth and traced along Xiong's
ladder.

"The scale almost keeps the same for different layers in the Pre-LN Transformer" is a flatness
claim, so it is an equivalence of pre's own trend with 0 at a margin stated here, not an order
of post's trend above pre's: that order also holds when pre's gradient falls toward the output,
which is not "the same". The models at the figure's depth have seeds of their own
(`Settings.c5_seeds`): one seed's trend spreads by about 0.27, more than the margin.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import Any

from normlab.probe.fits import mean_ci
from normlab.study.claims.common import slope_over_depth
from normlab.study.claims.ladder import (
    CACHE_VERSION,
    FIG3_DEPTH,
    _at_depth,
    ladder_claim,
    xiong_sweep,
    xiong_work,
)
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import StudyContext
from normlab.study.ladders import Rung, with_depth_rung
from normlab.study.schema import ClaimResult
from normlab.study.verdict import Prediction

_NO_SIZE = "Fig. 3 gives no size: 0, the size reported"
# "almost keeps the same": Fig. 3 gives no size. The trend is the change of log ||grad W^2|| from
# the bottom block to the top one; the study resolves Xiong's gradient laws to +- 0.25 in the log
# gradient (half the gap between Theorem 1's exponents 0 and -1/2: C4's band), so flat is a
# top block's gradient within e^+-0.25 (0.78 to 1.28 times) of the bottom one's.
FLAT_MARGIN = 0.25
_FLAT = ("Fig. 3 gives no size for 'almost': +- 0.25 in the log gradient over the model, the "
         "study's resolution of Xiong's gradient laws (half the gap between Theorem 1's "
         "exponents 0 and -1/2, as in C4): the top block within 0.78-1.28 times the bottom's")



@dataclass(frozen=True)
class Settings:
    """C5's own sizes."""

    # the 6-block models at init, seeds of their own: one seed's gradient trend spreads by
    # about 0.27, and pre's flatness is an equivalence at margin 0.25, so the interval must be
    # narrower than a seed's spread (a model at init takes a fraction of a second)
    c5_seeds: int = 60


# each profile's (the others: the defaults)
SETTINGS = {"tiny": Settings(c5_seeds=2)}

CLAIM = Claim(
    id="C5", title="Per-layer gradients at init: Post grows toward the output, Pre is flat",
    statement="At init the gradient norm of the FFN sublayers grows with the layer index under "
              "Post-LN and almost keeps the same under Pre-LN.",
    source="Xiong et al. 2020 (2002.04745), Sec. 3.4 and Fig. 3 (a 6-layer model at init)",
    quote="the scale of the expected gradients grows along with the layer index for the "
          "Post-LN Transformer ... the scale almost keeps the same for different layers in the "
          "Pre-LN Transformer",
    setting="a 6-layer model at initialization (Fig. 3)",
    paper="Xiong Fig. 3 (6 layers, at init): post's gradient norm rises toward the top layers; "
          "pre's stays about level.",
    ladder="xiong",
    settings_class=Settings, per_profile=SETTINGS,
    predictions=(
        PredictionSpec(
            "post", "trend of log ||grad W^2|| over relative depth",
            "Fig. 3: 'the scale of the expected gradients grows along with the layer index for "
            "the Post-LN Transformer'", Rule("direction", ">", 0.0, origin=_NO_SIZE),
            derivation="the figure's direction on every rung"),
        PredictionSpec(
            "pre flat", "trend of log ||grad W^2|| over relative depth",
            "Fig. 3: 'the scale almost keeps the same for different layers in the Pre-LN "
            "Transformer'", Rule("equivalence", margin=FLAT_MARGIN, origin=_FLAT),
            derivation="the same margin on every rung"),
        # the first editions' test: it also passes when pre's gradient falls, so it decides
        # nothing now that pre's flatness is tested as such
        PredictionSpec(
            "post vs pre", "trend(post) - trend(pre)",
            "Fig. 3: post's gradients grow toward the output, pre's do not",
            Rule("direction", ">", 0.0, origin=_NO_SIZE), role="diagnostic",
            derivation="the figure's direction on every rung"),
    ),
)


def gradient_trend(stats: dict[str, Any]) -> float:
    """Slope of log ||grad W^2|| of each block against relative depth l/(L-1)."""
    return slope_over_depth([math.log(max(v, 1e-30)) for v in stats["per_block"]["fc_out_grad"]])


def figure_depth_ladder(ctx: StudyContext, rungs: list[Rung]) -> dict[str, Any]:
    """Xiong's ladder at the figure's depth only, over `c5_seeds` seeds (seed s is the
    shared ladder's seed s: the first seeds are the same models)."""
    n = CLAIM.settings(ctx.profile).c5_seeds
    at = copy.copy(ctx)  # the same study, asked for its own seed count
    at.profile = replace(ctx.profile, init_seeds=n)
    return at.init_ladder(f"ladder_xiong_fig3_{CACHE_VERSION}_{n}seeds", rungs, ["pre", "post"],
                          [FIG3_DEPTH])


def measure(ctx: StudyContext) -> ClaimResult:
    base, data = xiong_sweep(ctx)
    at_fig3 = figure_depth_ladder(ctx, base)
    deepest = max(ctx.profile.init_depths)
    rungs = with_depth_rung(base, FIG3_DEPTH, deepest)

    def trends(rung: Rung, placement: str) -> list[float]:
        if rung.depth == "source":
            rows = _at_depth(at_fig3[rung.data_key][placement], FIG3_DEPTH)
        else:  # the deep rung, reported only: the shared ladder's seeds
            rows = _at_depth(data[rung.data_key][placement], deepest)
        return [gradient_trend(r["stats"]) for r in rows]

    def predict(rung: Rung) -> list[Prediction]:
        post, pre = trends(rung, "post"), trends(rung, "pre")
        return [CLAIM.predict("post", post), CLAIM.predict("pre flat", pre),
                CLAIM.predict("post vs pre", [a - b for a, b in zip(post, pre, strict=True)])]

    numbers = {"pre_trend": {r.label: mean_ci(trends(r, "pre")) for r in rungs},
               "post_trend": {r.label: mean_ci(trends(r, "post")) for r in rungs}}
    return ladder_claim(
        ctx, CLAIM,
        f"Gradient norm of each block's W^2 at init in {FIG3_DEPTH}-block models (the "
        f"figure's depth), {CLAIM.settings(ctx.profile).c5_seeds} seeds; trend = slope of log "
        "gradient norm "
        "against relative depth l/(L-1), per seed. Post's trend > 0 (the figure gives no size; "
        f"decided at 0) and pre's trend within +-{FLAT_MARGIN:g} (equivalence: 'almost keeps "
        "the same'); post's trend minus pre's is reported only. The verdict is read on "
        f"normlab's block at the figure's depth; the last rung, at {deepest} blocks "
        f"({ctx.profile.init_seeds} seeds), is beyond what the figure covers and is reported "
        "only.",
        rungs, predict, numbers, [],
        {"post": "post: trend", "pre flat": "pre: trend",
         "post vs pre": "trend(post) - trend(pre)"}, verdict_rung=-2)


CLAIM = CLAIM.bind(measure, work=xiong_work)
