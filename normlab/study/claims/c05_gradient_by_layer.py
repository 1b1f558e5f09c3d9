"""C5: at init the FFN gradients grow toward the output under Post-LN and stay level under
Pre-LN (Xiong et al. 2020, Fig. 3), calibrated at the figure's depth and traced along Xiong's
ladder."""

from __future__ import annotations

import math
from typing import Any

from normlab.probe.fits import mean_ci
from normlab.study.claims.common import slope_over_depth
from normlab.study.claims.ladder import FIG3_DEPTH, _at_depth, ladder_claim, xiong_sweep
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import StudyContext
from normlab.study.ladders import Rung, with_depth_rung
from normlab.study.schema import ClaimResult
from normlab.study.verdict import Prediction

_NO_SIZE = "Fig. 3 gives no size: 0, the size reported"

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
    predictions=(
        PredictionSpec(
            "post", "trend of log ||grad W^2|| over relative depth",
            "Fig. 3: 'the scale of the expected gradients grows along with the layer index for "
            "the Post-LN Transformer'", Rule("direction", ">", 0.0, origin=_NO_SIZE),
            derivation="the figure's direction on every rung"),
        PredictionSpec(
            "post vs pre", "trend(post) - trend(pre)",
            "Fig. 3: 'the scale almost keeps the same for different layers in the Pre-LN "
            "Transformer'", Rule("direction", ">", 0.0, origin=_NO_SIZE),
            derivation="the figure's direction on every rung"),
    ),
)


def gradient_trend(stats: dict[str, Any]) -> float:
    """Slope of log ||grad W^2|| of each block against relative depth l/(L-1)."""
    return slope_over_depth([math.log(max(v, 1e-30)) for v in stats["per_block"]["fc_out_grad"]])


def measure(ctx: StudyContext) -> ClaimResult:
    base, data = xiong_sweep(ctx)
    deepest = max(ctx.profile.init_depths)
    rungs = with_depth_rung(base, FIG3_DEPTH, deepest)

    def trends(rung: Rung, placement: str) -> list[float]:
        depth = FIG3_DEPTH if rung.depth == "source" else deepest
        return [gradient_trend(r["stats"])
                for r in _at_depth(data[rung.data_key][placement], depth)]

    def predict(rung: Rung) -> list[Prediction]:
        post, pre = trends(rung, "post"), trends(rung, "pre")
        return [CLAIM.predict("post", post),
                CLAIM.predict("post vs pre", [a - b for a, b in zip(post, pre, strict=True)])]

    numbers = {"pre_trend": {r.label: mean_ci(trends(r, "pre")) for r in rungs},
               "post_trend": {r.label: mean_ci(trends(r, "post")) for r in rungs}}
    return ladder_claim(
        ctx, CLAIM,
        f"Gradient norm of each block's W^2 at init in {FIG3_DEPTH}-block models (the "
        "figure's depth); trend = slope of log gradient norm against relative depth l/(L-1), "
        "per seed. Post's trend > 0 and post's trend above pre's, each decided at 0 (the "
        f"figure gives no size). The verdict is read on normlab's block at the figure's depth; "
        f"the last rung, at {deepest} blocks, is beyond what the figure covers and is reported "
        "only.",
        rungs, predict, numbers, [],
        {"post": "post: trend", "post vs pre": "trend(post) - trend(pre)"}, verdict_rung=-2)


CLAIM = CLAIM.bind(measure)
