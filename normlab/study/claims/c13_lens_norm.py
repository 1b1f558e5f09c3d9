"""C13: under Pre-LN a head read at an intermediate block needs a norm at the extraction point
(the placement guidance; logit lens)."""

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
)
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import StudyContext
from normlab.study.schema import ClaimResult

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
            "pre", "mean lens loss raw - through the final norm, blocks 1..L-1 (nats)",
            "seed guidance: with pre-norm you may need a norm at each extraction point",
            Rule("direction", ">", 0.0,
                 origin="the placement guidance (docs/reference.md, section 2: 'you may need "
                        "to add explicit normalization at each extraction point'): " + NO_SIZE)),
    ),
)


def lens_gap(per_block: Mapping[str, list[float]]) -> float:
    """Mean over blocks 1..L-1 of the lens loss raw minus through the final norm."""
    raw, normed = per_block["lens_raw"], per_block["lens_normed"]
    diffs = [r - n for r, n in zip(raw[:-1], normed[:-1], strict=True)] or [0.0]
    return sum(diffs) / len(diffs)


def measure(ctx: StudyContext) -> ClaimResult:
    tp, missing = _trained(ctx, CLAIM.id, CLAIM.title)
    if missing:
        return missing
    gaps = {p: [lens_gap(s.per_block) for s in tp.seeds[p]] for p in ("pre", "post")}
    predictions = [CLAIM.predict("pre", gaps["pre"])]
    curves = _seed_mean_curves(ctx, tp, ("lens_raw", "lens_normed"))
    figs = _rel(ctx, probe_figures.plot_per_block(curves, "lens_raw",
                                                  ctx.fig_dir / "c13_lens_raw.svg"))
    figs += _rel(ctx, probe_figures.plot_per_block(curves, "lens_normed",
                                                   ctx.fig_dir / "c13_lens_normed.svg"))
    return claim_result(
        CLAIM,
        "Logit lens on trained pre checkpoints at matched loss: the LM head's loss on each "
        "block's stream (all but the last), raw and through the final norm; per seed, the mean "
        "gap must exceed 0 (the guidance gives no size; the size is reported). Post's gap is "
        "reported only: its block outputs end in a norm, "
        "so it is about 0 by construction.",
        predictions, {"lens_gap": {p: mean_ci(v) for p, v in gaps.items()},
                      "matched_pair": tp.pair.to_json()},
        figs, note=tp.pair.note())


CLAIM = CLAIM.bind(measure)
