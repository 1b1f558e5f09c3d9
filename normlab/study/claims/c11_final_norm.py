"""C11: Pre-LN needs a final norm before the head (Xiong et al. 2020; GPT-2)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from normlab.probe.fits import mean_ci
from normlab.study import figures
from normlab.study.claims.common import (
    NO_SIZE,
    _bracket_note,
    _per_seed,
    _rel,
    _stalled,
    _val,
    claim_result,
)
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import RunRecord, StudyContext
from normlab.study.experiments import StudyFolder, model_at_init
from normlab.study.profiles import Profile
from normlab.study.schema import PRE_POST, ClaimResult
from normlab.train import load_trained_model

_SRC = "Xiong et al. / GPT-2 (the final norm): " + NO_SIZE



@dataclass(frozen=True)
class Settings:
    """C11's own settings."""

    # also tune pre without a final norm on its own grid (else the ablation alone decides)
    c11_trained_without: bool = True
    # the depth at which pre with and without a final norm are compared (None: the profile's
    # train_blocks; its deep_blocks: the deep runs, tuned at that depth)
    c11_blocks: int | None = None


# each profile's (the others: the defaults)
SETTINGS = {"quick": Settings(c11_trained_without=False), "long": Settings(c11_blocks=12),
            "gpu": Settings(c11_blocks=24)}

CLAIM = Claim(
    id="C11", title="Pre-LN needs a final norm",
    statement="Without a final norm before the head, a Pre-LN model's output scale grows with "
              "depth and its loss is worse.",
    source="Xiong et al. 2020 (2002.04745); GPT-2",
    quote="an additional layer normalization was added after the final self-attention block "
          "(GPT-2)",
    setting="Pre-LN language models (GPT-2: 12-48 blocks)",
    paper="GPT-2 added the final norm; no published loss gap at this size.",
    trains=(("pre", True), ("post", True), ("pre_nofinal", True)),
    settings_class=Settings, per_profile=SETTINGS,
    predictions=(
        PredictionSpec("pre, trained without vs with",
                       "val loss(no final norm, tuned) - val loss(final norm, tuned)",
                       "GPT-2 / Xiong: pre needs the final norm",
                       Rule("direction", ">", 0.0, origin=_SRC)),
        # removing a trained part cannot fail to cost: reported, never deciding
        PredictionSpec("pre, {blocks} blocks",
                       "val loss with the final norm replaced by identity - with it",
                       "without it the head reads a stream whose scale grows with depth",
                       Rule("direction", ">", 0.0, origin=_SRC), role="diagnostic"),
        PredictionSpec("pre, {deep} vs {blocks} blocks",
                       "cost of dropping the final norm, deep - shallow (per seed)",
                       "the output scale grows with depth, so the norm matters more in the "
                       "deeper model", Rule("direction", ">", 0.0, origin=_SRC),
                       role="diagnostic"),
        # the depth clause measured directly: the scale of what the head would read
        PredictionSpec("pre, {deep} vs {blocks} blocks, raw final stream",
                       "ln(RMS of the raw final stream, deep / shallow) (per seed, trained)",
                       "without a final norm the output scale grows with depth",
                       Rule("direction", ">", 0.0, origin=_SRC), role="diagnostic"),
        PredictionSpec("pre, {deep} vs {blocks} blocks, raw final stream at init",
                       "ln(RMS of the raw final stream, deep / shallow) (per seed, the same "
                       "runs' models at step 0)",
                       "a growth already there at init is architectural, not learned",
                       Rule("direction", ">", 0.0, origin=_SRC), role="diagnostic"),
    ),
)


# -- C11's own measurements, run on the study's folder (`StudyContext.own`) -------------------
def final_norm_measures(folder: StudyFolder, records: Sequence[RunRecord]
                        ) -> list[dict[str, float]]:
    """Per run (one per seed), on the study's probe batches (C11): `cost`, the validation loss
    with the final norm replaced by the identity minus the loss with it; `stream_rms`, the
    RMS of the raw final stream the norm reads, trained, and `stream_rms_init`, the same on
    the run's own model at step 0 (`run_final_norm`)."""
    batches = folder.probe_batches(seq_len=min(folder.profile.probe_seq_len,
                                               folder.profile.seq_len))
    return [folder.cached(f"final_norm_{r.run_id}",
                          lambda r=r: run_final_norm(folder.runs_root / r.run_id, batches,
                                                     folder.device))
            for r in records if not r.failed]


def final_stream_rms(model: Any, batches: list) -> float:
    """The RMS of the raw final stream (what the final norm, or the head where there is none,
    reads) over `batches`' tokens, averaged over the batches."""
    import torch

    seq = model.cfg.max_seq_len
    seen: list[float] = []
    handle = model.final.input.register_forward_hook(
        lambda _m, _i, out: seen.append(out.float().pow(2).mean().sqrt().item()))
    try:
        with torch.no_grad():
            for x, _y in batches:
                model(x[:, :seq])
    finally:
        handle.remove()
    return sum(seen) / len(seen)


def run_final_norm(run_dir: Path, batches: list, device: str = "cpu") -> dict[str, float]:
    """Loss of a trained model on `batches` with its final norm, and with that norm replaced by
    the identity (the head reads the raw stream), and the difference (`cost`); the raw final
    stream's RMS of the trained model and of its model at step 0 (`model_at_init`); measured
    on `device`."""
    import torch

    from normlab.probe.inputs import on_device

    cfg, model = load_trained_model(run_dir)
    model, batches = on_device(model, batches, device)
    seq = cfg.model.max_seq_len

    def loss() -> float:
        with torch.no_grad():
            return sum(model(x[:, :seq], y[:, :seq]).loss.item()
                       for x, y in batches) / len(batches)

    model.eval()
    with_norm = loss()
    rms = final_stream_rms(model, batches)
    model.final.norm = None  # no norm (as a model without one has)
    without = loss()
    at_init = model_at_init(run_dir).to(device).eval()
    return {"with": with_norm, "without": without, "cost": without - with_norm,
            "stream_rms": rms, "stream_rms_init": final_stream_rms(at_init, batches)}


def grids(profile: Profile) -> tuple[tuple[str, bool], ...]:
    """The grids C11 tunes at the profile's depth: pre without a final norm only where it is
    trained (`c11_trained_without`) and not at the deep models' depth (`c11_blocks`)."""
    own = CLAIM.settings(profile)
    return tuple(g for g in CLAIM.trains if g[0] != "pre_nofinal"
                 or (own.c11_trained_without and not own.c11_blocks))


def deep_families(profile: Profile) -> tuple[str, ...]:
    """The families C11 reads at the deep models' depth: pre (its diagnostic at depth), trained
    with post as every deep family is, and pre without a final norm where C11 decides there."""
    own = CLAIM.settings(profile)
    deep = bool(profile.deep_blocks) and own.c11_blocks == profile.deep_blocks
    return PRE_POST + (("pre_nofinal",) if deep and own.c11_trained_without else ())


def measure(ctx: StudyContext) -> ClaimResult:
    p, own = ctx.profile, CLAIM.settings(ctx.profile)
    # the depth the trained comparison is made at: the 6-block runs, or (c11_blocks) the deep
    # runs, each family tuned at that depth
    blocks = own.c11_blocks or p.train_blocks
    at = {"blocks": own.c11_blocks} if own.c11_blocks else {}
    if own.c11_blocks:
        ctx.prefetch_deep()  # its deep runs and C12's, trained in one go
    on = ctx.tuned("pre", **at)
    off = ctx.tuned("pre_nofinal", **at) if own.c11_trained_without else None
    predictions = []
    if off is not None:
        where = {"subject": f"pre, trained without vs with, {blocks} blocks"} \
            if own.c11_blocks else {}
        predictions.append(CLAIM.predict("pre, trained without vs with",
                                         _per_seed(off.best, on.best), **where))
    shallow_grid = ctx.tuned("pre") if own.c11_blocks else on
    shallow_measures = ctx.own(final_norm_measures, shallow_grid.best)
    shallow = [m["cost"] for m in shallow_measures]
    predictions.append(CLAIM.predict("pre, {blocks} blocks", shallow,
                                     subject=f"pre, {p.train_blocks} blocks"))
    tuned = [on] if off is None else [on, off]
    numbers: dict[str, Any] = {
        **({"blocks": blocks} if own.c11_blocks else {}),
        "tuning": {"with": on.numbers()} | ({} if off is None else {"without": off.numbers()}),
        f"final_norm_dropped_{p.train_blocks}_blocks": mean_ci(shallow)}
    note = _bracket_note(*tuned)
    if off is None:
        note = ("This profile does not train pre without a final norm on its own grid (the "
                "standard profile does), so the claim is not run: the ablation of the "
                "trained norm is a diagnostic (removing a trained part cannot fail to cost). "
                + note).strip()
    if ctx.claims is None or "C12" in ctx.claims:
        ctx.prefetch_deep()  # C12 reads the same deep runs: both placements in one go
    deep = on if own.c11_blocks == p.deep_blocks and own.c11_blocks else ctx.deep_grid("pre")
    deep_measures = ctx.own(final_norm_measures, deep.best) if deep is not None else []
    deep_cost = [m["cost"] for m in deep_measures]
    if deep_cost:
        n = min(len(deep_cost), len(shallow))
        predictions.append(CLAIM.predict(
            "pre, {deep} vs {blocks} blocks",
            [a - b for a, b in zip(deep_cost[:n], shallow[:n], strict=True)],
            subject=f"pre, {p.deep_blocks} vs {p.train_blocks} blocks"))
        numbers[f"final_norm_dropped_{p.deep_blocks}_blocks"] = mean_ci(deep_cost)
        numbers["deep_lr"] = deep.best_lr  # type: ignore[union-attr]
        for when, key in (("", "stream_rms"), (" at init", "stream_rms_init")):
            predictions.append(CLAIM.predict(
                "pre, {deep} vs {blocks} blocks, raw final stream" + when,
                [math.log(d[key] / s[key])
                 for d, s in zip(deep_measures[:n], shallow_measures[:n], strict=True)],
                subject=f"pre, {p.deep_blocks} vs {p.train_blocks} blocks, raw final "
                        f"stream{when}"))
        numbers["final_stream_rms"] = {
            f"{blocks_}_blocks": {"trained": mean_ci([m["stream_rms"] for m in ms]),
                                  "init": mean_ci([m["stream_rms_init"] for m in ms])}
            for blocks_, ms in ((p.train_blocks, shallow_measures),
                                (p.deep_blocks, deep_measures))}
    else:
        why = ("No deeper model in this profile" if not p.deep_blocks else
               f"No {p.deep_blocks}-block pre model trained")
        note = (note + " " if note else "") + (
            f"{why}: the cost of dropping the final norm is measured at {p.train_blocks} blocks "
            "only (the standard profile adds 12 blocks).")
    bars = {"with final norm": mean_ci(_val(on.best))} | (
        {} if off is None else {"without final norm": mean_ci(_val(off.best))})
    fig = figures.plot_bars(bars, ctx.fig_dir / "c11_final_norm.svg",
                            ylabel="final validation loss (nats)",
                            title=f"pre, {blocks} blocks, each at its tuned lr, {p.seeds} seeds")
    result = claim_result(
        CLAIM,
        f"Final validation loss of pre with and without the final norm, each at its own tuned "
        f"lr (bracketed grids), {blocks} blocks, decides; reported as diagnostics, the "
        "mechanism: the loss of the "
        "trained pre models with their final norm replaced by the identity minus their loss, at "
        f"{p.train_blocks} blocks and (where the profile trains them) at {p.deep_blocks or '-'} "
        "blocks, per seed; and the depth clause, the log ratio of the raw final stream's RMS "
        "(what the head would read without the norm) deep over shallow, trained and at init.",
        predictions, numbers, _rel(ctx, fig), stalled=_stalled(*tuned), note=note)
    if off is None:  # the deciding experiment is not in this profile: its diagnostics only
        result.verdict = "not run"
    return result


CLAIM = CLAIM.bind(measure, grids=grids, deep_grids=deep_families)
