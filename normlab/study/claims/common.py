"""What the claims share: a claim's result from its predictions, the verdict's deciding
prediction, and the helpers every trained claim reads its runs with (seeds paired by index,
tuned grids, matched pairs, a slope over depth)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from normlab.probe.fits import mean_ci
from normlab.study.claims.spec import PredictionSpec, Rule
from normlab.study.context import MatchedPair, ProbedPair, RunRecord, StudyContext, TunedGrid
from normlab.study.schema import PRE_POST, ClaimResult, Pretrained
from normlab.study.verdict import NOT_TESTED, Prediction, combine

SCALE = ("Measured on small byte-level models on a CPU; effects reported at scale (hundreds of "
         "millions of parameters, long training) may not show at this size.")


def make_claim(cid: str, title: str, statement: str, source: str, method: str,
               predictions: Sequence[Prediction], paper: str, numbers: dict[str, Any],
               figures: list[str], caveat: str = SCALE, stalled: Sequence[str] = (),
               note: str = "", calibration: str | None = None, needs: str = "") -> ClaimResult:
    """A claim's result: the verdict combines its predictions by role (`verdict.combine`); a
    side that stalled or diverged everywhere is reported, never compared, and leaves the claim
    inconclusive, as does a premise of the test that does not hold; a premise about scale
    that fails makes it "not tested at this scale", with `needs`, the smallest setting that
    could test it."""
    verdict = combine(predictions)
    failed = [p.subject for p in predictions if p.role == "premise" and p.verdict != "supported"]
    if verdict == NOT_TESTED and not stalled:
        short = [p.subject for p in predictions if p.role == "premise" and p.scale
                 and p.verdict == "not supported"]
        note = (note + " " if note else "") + not_tested_note(
            short, needs, measured=any(p.role == "claim" for p in predictions))
    elif failed:
        broken = [p.subject for p in predictions if p.role == "premise"
                  and p.verdict == "not supported"]
        open_ = [x for x in failed if x not in broken]
        why = "; ".join([*(f"{x} does not hold" for x in broken),
                         *(f"{x} is not decided" for x in open_)])
        note = (note + " " if note else "") + (
            f"Not decided: a premise of the test fails ({why}), so the claim's own predictions "
            "are reported, not decided.")
    if stalled:
        verdict = "inconclusive"
        note = (note + " " if note else "") + (
            f"Not compared: {', '.join(stalled)} stalled or diverged at every setting tried, so "
            "the claim's premise (a model that trains) does not hold here.")
    diagnosis = "; ".join(f"{p.subject}: {p.diagnosis}" for p in predictions if p.diagnosis)
    rule_parts = [f"{p.subject}{'' if p.role == 'claim' else ' (' + p.role + ')'}: {p.rule}"
                  for p in predictions if p.role != "diagnostic"]
    return ClaimResult(
        id=cid, title=title, statement=statement, source=source, method=method,
        verdict=verdict,  # type: ignore[arg-type]
        rule="; ".join([*(rule_parts or ["no claim prediction was measured"]),
                        "the claim is supported when every claim prediction is, not supported "
                        "when any is not, and a premise that does not hold leaves it undecided "
                        "(diagnostics are reported only)"]),
        effect=deciding(predictions, verdict).effect if predictions else None,
        numbers=numbers, figures=figures, caveat=caveat, note=note,
        predictions=[p.to_dict() for p in predictions], paper=paper, diagnosis=diagnosis,
        stalled=list(stalled), calibration=calibration, needs=needs if verdict == NOT_TESTED
        else "")


def not_tested_note(short: Sequence[str], needs: str, measured: bool = True) -> str:
    """What a claim says when premises about scale (`short`) do not hold, and what it needs;
    `measured`: the claim's own predictions were measured (else none was)."""
    return (f"Not tested at this scale: {'; '.join(short)} does not hold here, so the claim's "
            + ("own predictions are reported, not decided." if measured else
               "own predictions are not measured.")
            + (f" It needs {needs}." if needs else ""))


def deciding(predictions: Sequence[Prediction], verdict: str) -> Prediction:
    """The prediction a claim's verdict rests on: the first claim prediction that is not
    supported (of a refuted claim), the first scale premise that fails (of a claim not tested
    at this scale), the first premise or claim prediction that is not decided (of an
    inconclusive one), else the first claim prediction."""
    tests = [p for p in predictions if p.role == "claim"]
    if verdict == "not supported":
        return next(p for p in tests if p.verdict == "not supported")
    if verdict == NOT_TESTED:
        return next(p for p in predictions if p.role == "premise" and p.scale
                    and p.verdict == "not supported")
    if verdict == "inconclusive":
        undecided = [p for p in predictions if p.role == "premise" and p.verdict != "supported"]
        undecided += [p for p in tests if p.verdict != "supported"]
        if undecided:
            return undecided[0]
    return tests[0] if tests else predictions[0]


def _rel(ctx: StudyContext, path) -> list[str]:
    return [str(path.relative_to(ctx.out))] if path is not None else []


# -- claims on trained models --------------------------------------------------------------------

def _val(records: Sequence[RunRecord]) -> list[float]:
    return [r.score for r in records]


def _stalled(*tuned: TunedGrid) -> list[str]:
    return [t.family for t in tuned if t.all_stalled]


def _bracket_note(*tuned: TunedGrid) -> str:
    """Says which family's best lr still lies at an edge once the grid's extensions ran out."""
    edge = [f"{t.family} (best lr {t.best_lr:g} of {list(t.lrs)})"
            for t in tuned if not t.bracketed and not t.all_stalled]
    if not edge:
        return ""
    return ("Not bracketed: " + "; ".join(edge) + " sits at an edge of its grid after the "
            "profile's extensions, so its tuned loss may be lower still.")


NO_SIZE = "the source gives no size: decided at 0, the size reported"
# "Comparable" / "at least as good" in final validation loss: within 0.02 nats, about 1% of the
# 2.0-2.5 nats these models reach (docs/study.md, "Margins", fixed before this edition's runs).
COMPARABLE = 0.02
COMPARABLE_WHY = ("no margin given: 0.02 nats, about 1% of the loss these models reach "
                  "(docs/study.md, Margins)")
XIONG = "Xiong et al. 2020 (2002.04745), Sec. 3.1 and Fig. 1"


# "When t is large, x_{t+1} and x_t are very close" (the seed argument): the seed gives no
# depth. Until the seventh round a fixed setting read it (the deeper half past block 6, B2T's
# shallow models), which decided C2, C3, C12 and C14 by construction at every depth a profile
# trains. Now a premise measures what a claim needs of it (docs/study.md, "large t, measured"):
# C3 and C12 are consequences of near-identical consecutive blocks, and are decided only where
# pre's deeper half is near-identical, below Curse of Depth's level for deep layers of pre-LN
# LLMs; C2's directions and C14's hop gap are graded predictions of the mechanism (a relative
# update falling like 1/sqrt(t)) and need no depth premise.
NEAR_IDENTICAL = 0.2
NEAR_IDENTICAL_WHY = ("Curse of Depth (2502.05795): the angular distance of deep consecutive "
                      "layers of pre-LN LLMs falls below 0.2; the seed's 'very close' gives no "
                      "number")
NEAR_IDENTICAL_NEEDS = ("trained pre models deep enough that the consecutive blocks of their "
                        f"deeper half are near-identical (angular distance below "
                        f"{NEAR_IDENTICAL:g}, Curse of Depth's level), with post at matched loss")


def near_identical_premise(reads: str) -> PredictionSpec:
    """The measured premise about scale of a claim that follows from near-identical deep
    blocks (`reads`: the models it reads): pre's deeper half below `NEAR_IDENTICAL`."""
    return PredictionSpec(
        "near-identical blocks", "pre's mean angular distance between consecutive blocks over "
        f"the deeper half {reads}, per seed",
        "the seed: 'when t is large, x_{t+1} and x_t are very close'; Curse of Depth: below "
        f"{NEAR_IDENTICAL:g} in deep layers of pre-LN LLMs",
        Rule("direction", "<", NEAR_IDENTICAL, origin=NEAR_IDENTICAL_WHY),
        role="premise", scale=True)


def late_angle(per_block: Mapping[str, Any]) -> float:
    """Mean angular distance between consecutive blocks over the deeper half of a probed model
    (`ang_prev` of its blocks 2..L: block 1 is compared with the embedding)."""
    return _late_mean(per_block["ang_prev"][1:])


MATCHED = PredictionSpec(
    "matched loss", "|val loss(post) - val loss(pre)| of the probed checkpoints, per seed",
    "the comparison is of models trained to the same loss, seed by seed (seeds are the units)",
    Rule("setting", "<=", origin="the design: checkpoints count as trained to the same loss "
                                 "within the profile's match_tolerance, in every seed"),
    role="premise")


SAME_LR_WHY = ("a pair that compares placements, not lrs or training stages: both trained at "
               "one lr where both train, read at the same (last) step; reported beside the "
               "matched-loss pair, never deciding")


def same_lr_words(pair: MatchedPair) -> str:
    """The same-lr, same-step pair (`StudyContext.same_lr_probes`) in one sentence, for a
    claim's note."""
    if not pair.found or pair.gap is None:
        return f"No same-lr pair: {pair.reason}." if pair.reason else ""
    where = f"{pair.blocks}-block " if pair.blocks else ""
    return (f"Same lr and step (a diagnostic): {where}pre and post both at lr "
            f"{pair.pre_lr:g}, their last step (val {pair.pre_val_loss:.3f} and "
            f"{pair.post_val_loss:.3f}: gap {pair.gap:+.3f} nats).")


def matched_gap(pair: MatchedPair) -> list[float]:
    """The matched pair's loss gaps as a setting's values, one per seed (the cells' mean gap
    where the pair records none; nan when no pair was found)."""
    if pair.seed_gaps:
        return [abs(g) for g in pair.seed_gaps]
    return [abs(pair.gap) if pair.gap is not None else math.nan]


def _per_seed(a: Sequence[RunRecord], b: Sequence[RunRecord]) -> list[float]:
    """Per seed, score(a) - score(b) (seeds paired by index)."""
    return [x - y for x, y in zip(_val(a), _val(b), strict=True)]


def _trains(records: Sequence[RunRecord]) -> bool:
    return bool(records) and not any(r.failed for r in records)


def _seed_mean_curves(ctx: StudyContext, tp: ProbedPair, metrics: Sequence[str]
                      ) -> dict[str, Any]:
    """Per-block curves of the trained probes, one list per seed, shaped for plot_per_block
    (drawn as the mean over seeds with a min-max band)."""
    return {p: {str(ctx.profile.train_blocks): {
        m: [s.per_block[m] for s in tp.seeds[p]] for m in metrics}}
        for p in ("pre", "post")}


def _late_mean(values: list[float]) -> float:
    half = values[len(values) // 2:]
    return sum(half) / len(half)


def _trained(ctx: StudyContext, cid: str, title: str) -> tuple[ProbedPair | None,
                                                                ClaimResult | None]:
    tp = ctx.trained_probes()
    if not tp.found:
        return None, ClaimResult(
            id=cid, title=title, statement="", source="", method="", verdict="inconclusive",
            rule="", stalled=["pre" if "pre" in tp.pair.reason else "post"],
            note=f"No checkpoints to compare: {tp.pair.reason}.")
    return tp, None


def slope_over_depth(values: Sequence[float]) -> float:
    """Least-squares slope of `values` (one per block) against relative depth l/(L-1)."""
    n = len(values)
    xs = [i / max(1, n - 1) for i in range(n)]
    mx, my = sum(xs) / n, sum(values) / n
    sxx = sum((x - mx) ** 2 for x in xs) or math.nan
    return sum((x - mx) * (y - my) for x, y in zip(xs, values, strict=True)) / sxx


TRAINED = ("completed",)


# -- pairing by seed at matched loss --------------------------------------------------------------

def matched_pairs(checkpoints: Sequence[Pretrained], tolerance: float
                  ) -> tuple[dict[int, dict[str, Pretrained]], list[str]]:
    """Pre/post pairs by seed whose validation losses lie within ``tolerance`` and whose runs
    both trained; with the reasons each left-out seed was left out. The study hands C10 and C12
    their checkpoints (C10's ``c10_checkpoints``, ``ctx.c12_checkpoints()``, or
    ``checkpoints=``); one pre and one post checkpoint of the same seed (same data order) is one
    unit, and a pair beyond the tolerance (``profile.match_tolerance``) or with a side that
    stalled or diverged is reported and left out."""
    by_seed: dict[int, dict[str, Pretrained]] = {}
    for c in checkpoints:
        if c.placement not in PRE_POST:
            raise ValueError(f"checkpoint placement must be one of {PRE_POST}, got "
                             f"{c.placement!r} ({c.run_dir})")
        by_seed.setdefault(c.seed, {})[c.placement] = c
    pairs, left_out = {}, []
    for seed, sides in sorted(by_seed.items()):
        missing = [p for p in PRE_POST if p not in sides]
        if missing:
            left_out.append(f"seed {seed}: no {' or '.join(missing)} checkpoint")
            continue
        bad = [f"{p} {sides[p].outcome}" for p in PRE_POST if sides[p].outcome not in TRAINED]
        if bad:
            left_out.append(f"seed {seed}: {', '.join(bad)}")
            continue
        gap = sides["post"].val_loss - sides["pre"].val_loss
        if not math.isfinite(gap) or abs(gap) > tolerance:
            left_out.append(f"seed {seed}: validation loss pre {sides['pre'].val_loss:.3f}, "
                            f"post {sides['post'].val_loss:.3f}, not within {tolerance:g}")
            continue
        pairs[seed] = sides
    return pairs, left_out


def _interval(values: Sequence[float]) -> dict[str, Any]:
    ci = mean_ci(list(values))
    return {"mean": ci["mean"], "ci95": list(ci["ci95"]), "n": ci["n"]}


def _above(ci: Mapping[str, Any], threshold: float = 0.0, strict: bool = True) -> bool:
    low = ci["ci95"][0]
    return ci["n"] >= 2 and math.isfinite(low) and (low > threshold if strict
                                                    else low >= threshold)


def _below(ci: Mapping[str, Any], threshold: float = 0.0, strict: bool = True) -> bool:
    high = ci["ci95"][1]
    return ci["n"] >= 2 and math.isfinite(high) and (high < threshold if strict
                                                     else high <= threshold)


def _detectable(ci: Mapping[str, Any]) -> float | None:
    """The smallest effect this many units could have told from 0: the interval's half-width."""
    low, high = ci["ci95"]
    return (high - low) / 2 if ci["n"] >= 2 and math.isfinite(high - low) else None


def claim_result(claim: Any, method: str, predictions: Sequence[Prediction],
                 numbers: dict[str, Any], figures: list[str], **kw: Any) -> ClaimResult:
    """`make_claim` with the claim's words (id, title, statement, source, paper) read from its
    spec (`normlab.study.claims.spec.Claim`)."""
    return make_claim(claim.id, claim.title, claim.statement, claim.source, method,
                      predictions, claim.paper, numbers, figures, needs=claim.needs, **kw)


def not_decided(claim: Any, method: str, verdict: str, note: str, **kw: Any) -> ClaimResult:
    """A claim's result when its experiment has nothing to decide on (not run, no pair)."""
    return ClaimResult(id=claim.id, title=claim.title, statement=claim.statement,
                       source=claim.source, method=method, verdict=verdict,  # type: ignore
                       rule="", note=note, **kw)


def probed_deep(profile: Any) -> tuple[str, ...]:
    """The families a claim that probes the matched pair (C1's trained diagnostic, C2, C3,
    C13) reads at `deep_blocks`: pre and post where the profile probes the deep models'
    trajectory pairs (`probe_deep`), none where it probes the 6-block cells."""
    return PRE_POST if profile.probe_deep else ()
