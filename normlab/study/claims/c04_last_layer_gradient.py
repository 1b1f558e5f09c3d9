"""C4: Xiong et al.'s Theorem 1, the last layer's gradient against depth at init, calibrated in
the theorem's setting and traced along Xiong's ladder."""

from __future__ import annotations

from typing import Any

from normlab.probe.fits import mean_ci
from normlab.study.claims.ladder import Rows, _slopes, ladder_claim, xiong_sweep, xiong_work
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import StudyContext
from normlab.study.ladders import Rung
from normlab.study.schema import ClaimResult
from normlab.study.verdict import Prediction

# Half the gap between Theorem 1's two exponents (post 0, pre -1/2).
THEOREM1_RESOLUTION = 0.25
_GAP = "half the gap between Theorem 1's exponents (0 and -1/2)"

CLAIM = Claim(
    id="C4", title="Xiong Theorem 1: the last layer's gradient vs depth",
    statement="Theorem 1 (upper bounds at init): Post-LN's gradient of the last FFN weight is "
              "O(d sqrt(ln d)), independent of L; Pre-LN's is O(d sqrt(ln d / L)).",
    source="Xiong et al. 2020 (2002.04745), Sec. 3.3, Theorem 1 (Lemma 2's setting, with "
           "fairseq's embedding and an untied output projection: logits of order 1)",
    quote="for the Post-LN Transformer ... ||dL/dW^{2,L}||_F <= O(d sqrt(ln d)); for the "
          "Pre-LN Transformer ... ||dL/dW^{2,L}||_F <= O(d sqrt(ln d / L)) (Theorem 1)",
    setting="at initialization, Lemma 2's block (uniform attention, ReLU FFN of width d, "
            "Xavier), logits of order 1",
    paper="Xiong Theorem 1: post flat in L, pre falls like 1/sqrt(L).",
    ladder="xiong",
    predictions=(
        PredictionSpec(
            "post", "log-log slope of ||grad W^2_L|| against L",
            "Theorem 1: O(d sqrt(ln d)), independent of L (slope 0)",
            Rule("band", low=-THEOREM1_RESOLUTION, high=THEOREM1_RESOLUTION,
                 origin="Theorem 1's exponent 0, +- " + _GAP),
            derivation="the bound's exponent 0 on every rung"),
        PredictionSpec(
            "pre", "slope of ||grad W^2_L|| + 1/2 slope of E||x_L||^2 against L",
            "Theorem 1's mechanism: the final norm's Jacobian sqrt(d)/||x_L|| makes pre's "
            "slope -1/2 that of E||x_L||^2 (-0.5 as L grows)",
            Rule("band", low=-THEOREM1_RESOLUTION, high=THEOREM1_RESOLUTION,
                 origin="the final norm's Jacobian, +- " + _GAP),
            derivation="on every rung from that rung's own measured E||x_L||^2 slope"),
        PredictionSpec(
            "pre vs post", "slope(pre) - slope(post) - the gap the mechanism predicts",
            "Theorem 1: pre's bound falls with L like L^-1/2, post's does not: a gap of -1/2",
            Rule("band", low=-THEOREM1_RESOLUTION, high=THEOREM1_RESOLUTION,
                 origin="Theorem 1's gap between its exponents, +- " + _GAP),
            derivation="source rungs: the theorem's gap -1/2; every other rung: -1/2 the slope "
                       "of that rung's own measured E||x_L||^2 (the final norm's Jacobian)"),
    ),
)


def measure(ctx: StudyContext) -> ClaimResult:
    rungs, data = xiong_sweep(ctx)
    depths = list(ctx.profile.init_depths)

    def rows(rung: Rung, placement: str) -> Rows:
        return [r for r in data[rung.key][placement] if r["n_blocks"] in depths]

    def grad(r: dict[str, Any]) -> float:
        return r["stats"]["summary"]["last_fc_out_grad"]

    def stream_sq(r: dict[str, Any]) -> float:
        return r["stats"]["summary"]["final_in_sq"]

    def predict(rung: Rung) -> list[Prediction]:
        s_pre, s_post = _slopes(rows(rung, "pre"), grad), _slopes(rows(rung, "post"), grad)
        s_norm = _slopes(rows(rung, "pre"), stream_sq)
        mechanism = [a + 0.5 * b for a, b in zip(s_pre, s_norm, strict=True)]
        # the gap the theorem states in its own setting; elsewhere its mechanism on the rung
        gaps = [-0.5] * len(s_norm) if rung.calibration else [-0.5 * b for b in s_norm]
        contrast = [a - b - g for a, b, g in zip(s_pre, s_post, gaps, strict=True)]
        how = ("the theorem's gap -1/2" if rung.calibration else
               "-1/2 x this rung's slope of E||x_L||^2: "
               f"{sum(gaps) / max(1, len(gaps)):+.3g} (mean over seeds)")
        return [CLAIM.predict("post", s_post), CLAIM.predict("pre", mechanism),
                CLAIM.predict("pre vs post", contrast, derivation=how)]

    slopes = {r.label: {"pre": mean_ci(_slopes(rows(r, "pre"), grad)),
                        "post": mean_ci(_slopes(rows(r, "post"), grad)),
                        "pre E||x_L||^2": mean_ci(_slopes(rows(r, "pre"), stream_sq))}
              for r in rungs}
    return ladder_claim(
        ctx, CLAIM,
        f"Frobenius norm of the gradient of the last block's W^2 at init over depths {depths}; "
        "per seed, log-log slopes against L. Post: 0 +- 0.25 (half the gap between the "
        "theorem's exponents). Pre: the bound's mechanism predicts -1/2 the slope of "
        "E||x_L||^2 measured on the same models, tested to +- 0.25. Pre vs post: the gap "
        "between the slopes at the theorem's -1/2 on the source rungs, and at -1/2 the rung's "
        "own E||x_L||^2 slope elsewhere, to +- 0.25.",
        rungs, predict, {"slopes": slopes}, [],
        {"post": "post: slope", "pre": "pre: slope + slope(E||x_L||^2)/2",
         "pre vs post": "slope(pre) - slope(post)"})


CLAIM = CLAIM.bind(measure, work=xiong_work)
