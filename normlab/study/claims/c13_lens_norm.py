"""C13: under Pre-LN a head read at an intermediate block needs a norm at the extraction point
(the placement guidance; logit lens).

The guidance asks for "explicit normalization at each extraction point", not for the model's
trained final norm: the deciding reading puts a norm without parameters (the kind of the
model's own, on the statistics of the block's own stream: `lens_free`) at the extraction point.
Reading the raw stream against the stream through the *trained* final norm also removes a
trained gain and bias, which can hardly fail to cost (as C11's ablation): reported only. Post's
same gap is reported beside pre's: its block outputs end in a norm already.
"""

from __future__ import annotations

from collections.abc import Mapping

from normlab.probe import figures as probe_figures
from normlab.probe.fits import mean_ci
from normlab.study.claims.common import (
    NO_SIZE,
    _rel,
    _seed_mean_curves,
    _trained,
    claim_result,
    probed_deep,
)
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import StudyContext
from normlab.study.schema import ClaimResult

_GUIDANCE = ("the placement guidance (docs/reference.md, section 2: 'you may need to add "
             "explicit normalization at each extraction point'): " + NO_SIZE)

CLAIM = Claim(
    id="C13", title="Intermediate heads need a norm under Pre-LN",
    statement="Post-LN's block outputs are normalized already; Pre-LN's are not, so a head read "
              "at an intermediate block without a norm at the extraction point does much worse.",
    source="Seed guidance (logit lens)",
    quote="you may need to add explicit normalization at each extraction point",
    setting="any Pre-LN model whose intermediate streams are read by a head",
    paper="No published number; the seed guidance says 'you may need' a norm at each "
          "extraction point.",
    trains=(("pre", True), ("post", True)),
    predictions=(
        PredictionSpec(
            "pre", "mean lens loss raw - through a norm without parameters, blocks 1..L-1 "
                   "(nats)",
            "seed guidance: with pre-norm you may need a norm at each extraction point",
            Rule("direction", ">", 0.0, origin=_GUIDANCE)),
        # removing the trained final norm's gain and bias can hardly fail to cost
        PredictionSpec(
            "pre, trained final norm", "mean lens loss raw - through the trained final norm, "
                                       "blocks 1..L-1 (nats)",
            "the first editions' reading: the norm the model was trained with",
            Rule("direction", ">", 0.0, origin=_GUIDANCE), role="diagnostic"),
        PredictionSpec(
            "pre vs post", "gap without parameters: pre - post, per seed (nats)",
            "Post-LN's block outputs are normalized already; Pre-LN's are not",
            Rule("direction", ">", 0.0, origin=_GUIDANCE), role="diagnostic"),
    ),
)


def lens_gap(per_block: Mapping[str, list[float]], normed: str = "lens_normed") -> float:
    """Mean over blocks 1..L-1 of the lens loss raw minus through the norm of `normed`
    (`lens_normed`: the trained final norm; `lens_free`: a norm without parameters)."""
    raw, through = per_block["lens_raw"], per_block[normed]
    diffs = [r - n for r, n in zip(raw[:-1], through[:-1], strict=True)] or [0.0]
    return sum(diffs) / len(diffs)


def measure(ctx: StudyContext) -> ClaimResult:
    tp, missing = _trained(ctx, CLAIM.id, CLAIM.title)
    if missing:
        return missing
    places = ("pre", "post")
    gaps = {p: [lens_gap(s.per_block) for s in tp.seeds[p]] for p in places}
    # probes recorded before `lens_free` existed have none: the claim is then not measured
    measured = all("lens_free" in s.per_block for p in places for s in tp.seeds[p])
    free = {p: [lens_gap(s.per_block, "lens_free") for s in tp.seeds[p]] if measured else []
            for p in places}
    predictions = [
        CLAIM.predict("pre", free["pre"]),
        CLAIM.predict("pre, trained final norm", gaps["pre"]),
        CLAIM.predict("pre vs post", [a - b for a, b in zip(free["pre"], free["post"],
                                                              strict=True)])]
    curves = _seed_mean_curves(ctx, tp, ("lens_raw", "lens_normed")
                               + (("lens_free",) if measured else ()))
    figs = _rel(ctx, probe_figures.plot_per_block(curves, "lens_raw",
                                                  ctx.fig_dir / "c13_lens_raw.svg"))
    figs += _rel(ctx, probe_figures.plot_per_block(curves, "lens_normed",
                                                   ctx.fig_dir / "c13_lens_normed.svg"))
    if measured:
        figs += _rel(ctx, probe_figures.plot_per_block(curves, "lens_free",
                                                       ctx.fig_dir / "c13_lens_free.svg"))
    note = tp.pair.note()
    if not measured:
        note = (note + " " if note else "") + (
            "These checkpoints' probes have no lens through a norm without parameters "
            "(lens_free): they were probed before it was measured; probe them again to decide.")
    return claim_result(
        CLAIM,
        "Logit lens on trained pre and post checkpoints at matched loss: the LM head's loss on "
        "each block's stream (all but the last), raw and through a norm without parameters "
        "(the model's norm kind, gain 1 and bias 0, on the stream's own statistics); per "
        "seed, pre's mean gap must exceed 0 (the guidance gives no size; the size is "
        "reported). Reported only: the gap through the trained final norm (it also removes a "
        "trained gain and bias), and pre's gap minus post's (post's block outputs end in a "
        "norm, so its gap is about 0 by construction).",
        predictions, {"lens_gap_free": {p: mean_ci(v) for p, v in free.items()},
                      "lens_gap": {p: mean_ci(v) for p, v in gaps.items()},
                      "matched_pair": tp.pair.to_json()},
        figs, note=note)


CLAIM = CLAIM.bind(measure, deep_grids=probed_deep)
