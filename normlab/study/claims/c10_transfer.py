"""C10: Post-LN transfers better after fine-tuning
-----------------------------------------------

Prediction: fine-tuned on the genre task (:mod:`normlab.data.genre`), a post checkpoint reaches
a higher test accuracy than the pre checkpoint of the same seed and the same pretraining loss.

Design: passages of ``Settings.finetune_passage_bytes`` (at least 256) bytes, read in windows of
the pretraining context when they are longer (:class:`normlab.finetune.SequenceClassifier`);
all weights trained, mean pooling. The fine-tuning lr is tuned per placement on a validation
split cut from the end of each play's training region (never on the test passages): the grid
``Settings.finetune_lrs`` (default 3e-5 to 3e-3, about x3 apart), extended x3 beyond an edge
that wins (at most ``Settings.finetune_lr_extensions`` times, default 2; recorded); the lr with
the best mean validation accuracy over seeds is the placement's, and each seed's test accuracy
at that lr is its result. The character-trigram naive Bayes on the same training and test
passages is the baseline.

Transfer baseline: the same architecture fine-tuned from random init (the run's seed) with the
same steps, batch and lr grid. Predictions (:func:`c10_predictions`), 95% t-intervals over
seeds: a *premise about scale* per placement, pretraining helps (pretrained - from init > 0);
and the claim, fine-tuned accuracy post - pre > 0. A premise that is not supported makes the
claim ``not tested at this scale`` (with the setting it needs), an undecided one (or one whose
values do not vary: an interval of zero width) ``inconclusive``. Whether the model from init
learns the task (its test accuracy at least 5 points above the majority class's share, the best
constant predictor) is a diagnostic: the source does not presume it, and as a premise it blocked
a result either way. A fine-tuning arm whose best lr sits at an edge of its grid after the
extensions leaves the claim ``inconclusive`` (:func:`unbracketed_is_inconclusive`); the trigram
baseline is context.

Checkpoints come as :class:`Pretrained` records, paired by seed at matched loss
(:func:`normlab.study.claims.common.matched_pairs`, whose doc states the pairing). Where they
come from is the claim's ``c10_pairs`` (``Settings``): the tuned cells whose mean losses are
closest, or (the long profile) each placement trained again at its own tuned lr keeping its
weights along the way, each seed's pair the most trained kept checkpoints within the tolerance
(:func:`c10_checkpoints`); a pretrained checkpoint kept along a run is fine-tuned from
that step.

The frozen linear probe (``Settings.finetune_probe``, on in the long profile): each matched
checkpoint's body frozen, a linear head trained on its standardized pooled stream with the
fine-tuning's steps, batch and warmup (:func:`normlab.finetune.finetune_model` with
``freeze=True``), and the same architecture at random init (the run's seed), frozen, as the
probe's from-scratch baseline. Its lr is tuned like the fine-tuning's, per placement and arm, on
the same validation passages, over ``Settings.finetune_probe_lrs`` (default 1e-3, 1e-2, 1e-1: a
head on unit-scale features) with the same extensions; the body's features are computed once per
checkpoint and every lr the tuning may reach is trained on them (:func:`lr_candidates`). Reported:
each arm's test accuracy and three diagnostics, written before any run: the probe's transfer per
placement (frozen pretrained - frozen at init > 0) and post vs pre on the probe (> 0).

Why diagnostics, and neither a claim prediction nor a premise. The source speaks of fine-tuning
("at roughly the same pretraining results, Post Norm's fine-tuning performance is noticeably
better"); a frozen probe measures what the pretrained stream holds, of which it says nothing.
- As a claim prediction, post below pre on the probe would refute a sentence about fine-tuning
  with a measurement of something else, and post above pre would add a condition the source
  never stated: a post model may fine-tune better because its weights adapt more easily from a
  stream that holds no more of the task than pre's.
- As the transfer premise, in place of the fine-tuning's: that premise (pretrained - from init >
  0 after the same fine-tuning) is the one that guards the claim. Fine-tuning long enough to
  wash the pretraining out (the model from init catching up, which 1000 steps may do) leaves post
  - pre comparing two models whose pretraining no longer matters, and only the fine-tuning's
  own transfer catches it; a frozen pretrained stream above a random one says nothing about it.
  Beside it, the probe's premise could only block decisions the source's words allow:
  pretraining that helps fine-tuning through the weights rather than through a richer stream is
  still transfer in the source's sense.
So the verdict rests on the fine-tuning, and can come out either way: supported when both
placements' models from init learn the task, pretraining helps both, and post's fine-tuned
accuracy lies above pre's; not supported when the premises hold and it lies below. The probe says
why: post's stream holding more of the task (probe post - pre > 0 beside a supported claim), or
post fine-tuning better from a stream that holds no more.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from normlab.probe.fits import mean_ci
from normlab.study import figures
from normlab.study.claims.common import claim_result, matched_pairs
from normlab.study.claims.spec import Claim, PredictionSpec, Rule
from normlab.study.context import RunRecord, StudyContext, WorkPlan
from normlab.study.experiments import StudyFolder, record
from normlab.study.profiles import Profile
from normlab.study.schema import PRE_POST, ClaimResult, Pretrained

_NONE = "the source gives no size: decided at 0, the size reported"
# "learns the task": at least this much accuracy above the best constant predictor
LEARNS_MARGIN = 0.05



@dataclass(frozen=True)
class Settings:
    """C10's own sizes: the fine-tuning, its pairs and the frozen probe (module doc)."""

    finetune_steps: int = 80
    finetune_batch_size: int = 16
    finetune_test_max: int | None = 768
    finetune_lrs: tuple[float, ...] = (3e-5, 1e-4, 3e-4, 1e-3, 3e-3)
    finetune_lr_extensions: int = 2
    finetune_passage_bytes: int = 256
    finetune_warmup: int | None = None  # None: a tenth of the fine-tuning steps
    finetune_val_fraction: float = 0.1  # of each play's training region, for tuning the lr
    finetune_val_max: int = 512  # validation passages scored per lr
    finetune_train_eval_max: int = 256  # training passages scored for the training accuracy
    finetune_standardize: int = 512  # passages whose features set the standardization
    # the pairs: "cells", the tuned cells of pre and post whose mean losses are closest (every
    # seed's pair must then lie within the tolerance); "trajectories", each placement trained
    # again at its own tuned lr keeping its weights `deep_evals` times, paired per seed along
    # the two trajectories as C12's deep pairs are (docs/study.md, C10)
    c10_pairs: Literal["cells", "trajectories"] = "cells"
    # the frozen linear probe: a head trained on the frozen pooled stream of each matched
    # checkpoint and of the same architecture at init, its lr tuned on its own grid (extended
    # like the fine-tuning grid); reported as diagnostics (docs/study.md, C10)
    finetune_probe: bool = False
    finetune_probe_lrs: tuple[float, ...] = (1e-3, 1e-2, 1e-1)


# each profile's
SETTINGS = {
    "tiny": Settings(finetune_steps=4, finetune_batch_size=8, finetune_test_max=64,
                     finetune_lrs=(1e-3,), finetune_lr_extensions=0),
    "quick": Settings(finetune_steps=60, finetune_batch_size=16, finetune_test_max=384,
                      finetune_lrs=(1e-3, 3e-3), finetune_lr_extensions=0),
    "standard": Settings(finetune_steps=150, finetune_batch_size=16, finetune_test_max=512,
                         finetune_lrs=(1e-4, 3e-4, 1e-3, 3e-3), finetune_lr_extensions=1),
    "long": Settings(finetune_steps=1000, finetune_batch_size=8, finetune_test_max=512,
                     finetune_lrs=(3e-5, 1e-4, 3e-4, 1e-3, 3e-3), finetune_lr_extensions=0,
                     finetune_probe=True, c10_pairs="trajectories"),
    "gpu": Settings(finetune_steps=1000, finetune_batch_size=16, finetune_test_max=512,
                    finetune_lr_extensions=1, finetune_probe=True, c10_pairs="trajectories"),
    "full": Settings(finetune_steps=1000, finetune_batch_size=64, finetune_test_max=None,
                     finetune_lrs=(1e-4, 3e-4, 1e-3)),
}

CLAIM = Claim(
    id="C10", title="Post-LN transfers better after fine-tuning",
    statement="Pretrained Post-LN models fine-tune to better downstream accuracy than Pre-LN "
              "ones, even when pretraining losses match.",
    source="Seed blog",
    quote="at roughly the same pretraining results, Post Norm's fine-tuning performance is "
          "noticeably better",
    setting="pretrained language models fine-tuned on downstream tasks (no size stated)",
    paper="The seed blog: at roughly the same pretraining results, Post Norm's fine-tuning "
          "performance is noticeably better (no number published).",
    trains=(("pre", True), ("post", True)),
    settings_class=Settings, per_profile=SETTINGS,
    needs=("pretraining long enough that a pretrained model fine-tunes better than the same "
           "architecture from init"),
    predictions=(
        # not in the source: whether a model from init learns the task says how hard the task
        # is at this budget, which the claim does not presume (transfer can show either way)
        PredictionSpec("{placement} from init", "test accuracy from init - majority-class share",
                       "not the source's words: fine-tuning long enough that a model from "
                       "init learns the task (beats the best constant predictor)",
                       Rule("direction", ">", LEARNS_MARGIN,
                            origin="the design: learning the task means beating the best "
                                   "constant predictor (the majority class) by 5 points"),
                       role="diagnostic"),
        PredictionSpec("{placement} transfer", "test accuracy pretrained - from init (same "
                       "budget)", "the claim presumes pretraining helps fine-tuning",
                       Rule("direction", ">", 0.0, origin="the design (any transfer): 0"),
                       role="premise", scale=True),
        PredictionSpec("post vs pre", "fine-tuned test accuracy post - pre",
                       "seed blog: Post Norm's fine-tuning performance is 'noticeably better' "
                       "at matched pretraining loss",
                       Rule("direction", ">", 0.0,
                            origin="the seed blog ('noticeably better'): " + _NONE)),
        # the frozen linear probe (`finetune_probe`): what the pretrained stream holds,
        # which the source does not speak of; reported, never deciding (module doc)
        PredictionSpec("{placement} transfer, frozen probe",
                       "frozen-probe test accuracy, pretrained - at init (same head budget)",
                       "not the source's words: the task the pretrained stream holds, read "
                       "by a linear head, beyond a random stream of the same architecture",
                       Rule("direction", ">", 0.0, origin="the design (any transfer): 0"),
                       role="diagnostic"),
        PredictionSpec("post vs pre, frozen probe", "frozen-probe test accuracy post - pre",
                       "not the source's words (it speaks of fine-tuning): whether post's "
                       "pretrained stream holds more of the task than pre's at matched loss",
                       Rule("direction", ">", 0.0,
                            origin="the seed blog speaks of fine-tuning, not of the "
                                   "stream: " + _NONE),
                       role="diagnostic"),
    ),
)


def _warmup(given: int | None, steps: int) -> int:
    return max(1, steps // 10) if given is None else given


def c10_settings(ctx: StudyContext) -> dict[str, Any]:
    """The fine-tuning settings C10 reads from its own (`Settings`) in the profile."""
    p = CLAIM.settings(ctx.profile)
    steps, passage = p.finetune_steps, p.finetune_passage_bytes
    if passage < 256:
        raise ValueError(f"C10's finetune_passage_bytes: C10 needs passages of at least 256 "
                         f"bytes, got {passage}")
    return {"steps": steps, "batch_size": p.finetune_batch_size,
            "warmup": _warmup(p.finetune_warmup, steps),
            "passage_bytes": passage, "test_max": p.finetune_test_max,
            "val_fraction": p.finetune_val_fraction, "val_max": p.finetune_val_max,
            "train_eval_max": p.finetune_train_eval_max, "standardize": p.finetune_standardize}


def tune_lr(score: Callable[[float], tuple[float, float]], grid: Sequence[float],
            extensions: int = 2, factor: float = 3.0) -> dict[str, Any]:
    """The grid lr with the best ``score(lr) = (mean validation accuracy, -mean validation
    loss)``; while the best lies at an edge, one more lr beyond it (x or / ``factor``), at most
    ``extensions`` times. Returns ``best``, ``scores`` (lr -> score), ``extended`` (the lrs
    added) and ``bracketed`` (the best lies inside the grid)."""
    lrs = sorted(float(v) for v in grid)
    scores: dict[float, tuple[float, float]] = {}
    extended: list[float] = []
    while True:
        for lr in lrs:
            if lr not in scores:
                scores[lr] = score(lr)
        best = max(lrs, key=lambda v: scores[v])
        if len(extended) >= extensions or len(lrs) < 2 or best not in (lrs[0], lrs[-1]):
            break
        new = best / factor if best == lrs[0] else best * factor
        extended.append(new)
        lrs = sorted([*lrs, new])
    return {"best": best, "scores": {f"{lr:g}": list(scores[lr]) for lr in lrs},
            "extended": extended, "bracketed": best not in (lrs[0], lrs[-1])}


def lr_candidates(grid: Sequence[float], extensions: int, factor: float = 3.0) -> list[float]:
    """Every lr `tune_lr` may ask for on `grid`: the grid and up to `extensions` lrs beyond each
    edge, computed as `tune_lr` computes them (the same floats)."""
    lrs = sorted(float(v) for v in grid)
    out = set(lrs)
    if len(lrs) >= 2:
        low, high = lrs[0], lrs[-1]
        for _ in range(extensions):
            low, high = low / factor, high * factor
            out |= {low, high}
    return sorted(out)


def _window(run_dir: Path, passage: int) -> int | None:
    """The window a pretrained run reads passages in (`normlab.finetune.finetune`'s default),
    given explicitly to the same architecture at init so both read the text alike."""
    from normlab.train import read_run_config

    cfg = read_run_config(run_dir)
    context = cfg.data.seq_len
    if cfg.model.positions == "learned" and passage > context and passage % context == 0:
        return context
    return None


# arm -> (from init, frozen): fine-tuning of every weight, and the frozen linear probe
FINETUNE_ARMS = {"pretrained": (False, False), "scratch": (True, False)}
PROBE_ARMS = {"probe_pretrained": (False, True), "probe_scratch": (True, True)}


def c10_finetune(ctx: StudyContext, checkpoints: Sequence[Pretrained], *,
                 tolerance: float | None = None) -> dict[str, Any]:
    """C10's measurements: every matched pre/post pair fine-tuned on the genre task, and the
    same architecture fine-tuned from random init (the run's seed) with the same budget, each
    with its lr tuned on validation passages (module doc); with ``Settings.finetune_probe``,
    also the frozen linear probe of both (arms ``probe_pretrained`` and ``probe_scratch``, on
    the grid ``Settings.finetune_probe_lrs``); the trigram baseline on the same passages as
    context. Fine-tuning results are cached in each run folder."""
    from normlab.data.genre import genre_task, naive_bayes_baseline
    from normlab.finetune import finetune, finetune_many

    tol = ctx.profile.match_tolerance if tolerance is None else tolerance
    s = c10_settings(ctx)
    pairs, left_out = matched_pairs(checkpoints, tol)
    seeds = sorted(pairs)
    own = CLAIM.settings(ctx.profile)
    probe = own.finetune_probe
    arms = FINETUNE_ARMS | (PROBE_ARMS if probe else {})
    runs: dict[str, dict[str, dict[str, dict[int, dict[str, Any]]]]] = {
        arm: {p: {} for p in PRE_POST} for arm in arms}

    def kwargs(arm: str, placement: str, lr: float, seed: int) -> dict[str, Any]:
        from_init, frozen = arms[arm]
        kw = {"task": "genre", "lr": lr, "seed": seed, "device": ctx.device, **s}
        if from_init:
            kw |= {"from_init": True,
                   "window": _window(pairs[seed][placement].run_dir, s["passage_bytes"])}
        elif pairs[seed][placement].step is not None:  # weights kept along the run
            kw["step"] = pairs[seed][placement].step
        if frozen:
            kw["freeze"] = True
        return kw

    def run(arm: str, placement: str, lr: float, seed: int) -> dict[str, Any]:
        res = finetune(pairs[seed][placement].run_dir, **kwargs(arm, placement, lr, seed))
        keep = ("test_accuracy", "val_accuracy", "val_loss", "train_accuracy", "outcome",
                "time_s", "settings")
        runs[arm][placement].setdefault(f"{lr:g}", {})[seed] = {k: res.get(k) for k in keep}
        return res

    def mean_score(arm: str, placement: str, lr: float) -> tuple[float, float]:
        what = "probing" if arms[arm][1] else "fine-tuning"
        ctx.log(f"C10: {what} {placement} ({arm}) at lr {lr:g} ({len(seeds)} seeds)")
        got = [run(arm, placement, lr, seed) for seed in seeds]
        acc = [r["val_accuracy"] for r in got]
        loss = [r["val_loss"] if isinstance(r["val_loss"], float) else math.inf for r in got]
        return sum(acc) / len(acc), -sum(loss) / len(loss)

    tuned: dict[str, dict[str, Any]] = {arm: {} for arm in arms}
    accuracy: dict[str, dict[str, list[float]]] = {arm: {} for arm in arms}
    if seeds:
        grids = {arm: own.finetune_probe_lrs if arms[arm][1] else own.finetune_lrs
                 for arm in arms}
        extensions = own.finetune_lr_extensions
        workers = ctx.profile.workers
        ctx.log(f"C10: fine-tuning {len(seeds)} pair(s), pretrained and from init, at lrs "
                f"{list(own.finetune_lrs)} on {workers} worker(s)")
        jobs = [(pairs[seed][p].run_dir, kwargs(arm, p, lr, seed)) for arm in FINETUNE_ARMS
                for p in PRE_POST for lr in grids[arm] for seed in seeds]
        if probe:
            # a head costs little once the frozen body's features exist: every lr the tuning
            # may reach (the grid and its extensions) is trained in one pass of the body
            reach = lr_candidates(own.finetune_probe_lrs, extensions)
            ctx.log(f"C10: frozen linear probe of the same {len(seeds)} pair(s) and of their "
                    f"architectures at init, at lrs {list(own.finetune_probe_lrs)} (and the "
                    f"extensions it may take: {[f'{v:g}' for v in reach]})")
            for arm in PROBE_ARMS:
                for p in PRE_POST:
                    for seed in seeds:
                        kw = kwargs(arm, p, reach[0], seed)
                        del kw["lr"]
                        jobs.append((pairs[seed][p].run_dir, kw | {"lrs": reach}))
        finetune_many(jobs, workers)
        for arm in arms:  # reads the results just computed; trains only grid extensions
            for p in PRE_POST:
                tuned[arm][p] = tune_lr(lambda lr, a=arm, p=p: mean_score(a, p, lr),
                                        grids[arm], extensions)
                chosen = runs[arm][p][f"{tuned[arm][p]['best']:g}"]
                accuracy[arm][p] = [chosen[seed]["test_accuracy"] for seed in seeds]
    task = genre_task("genre", passage_bytes=s["passage_bytes"], val_fraction=s["val_fraction"])
    baseline = ctx.cached(
        f"c10_baseline_{s['passage_bytes']}_{s['val_fraction']}_{s['test_max']}",
        lambda: naive_bayes_baseline(task, test_max=s["test_max"]))
    return {"settings": s, "seeds": seeds, "left_out": left_out, "tolerance": tol,
            "tuned_lr": tuned, "accuracy": accuracy, "runs": runs,
            "val_loss_pretrained": {p: [pairs[k][p].val_loss for k in seeds]
                                    for p in PRE_POST},
            "baseline": baseline, "chance": task.chance, "majority": task.majority}


def c10_predictions(accuracy: Mapping[str, Mapping[str, Sequence[float]]], majority: float
                    ) -> list[Any]:
    """C10's predictions on per-seed test accuracies (`accuracy[arm][placement]`, arms
    "pretrained" and "scratch", paired by seed). Premises: each placement's model from init
    learns the task (beats the majority class) and pretraining helps it (pretrained - from
    init > 0); the test: post's fine-tuned accuracy above pre's. With the frozen probe's arms
    ("probe_pretrained", "probe_scratch"), its diagnostics: the probe's transfer per placement
    (pretrained - at init > 0) and post's probe accuracy above pre's."""
    out = [CLAIM.predict("{placement} from init", [a - majority for a in accuracy["scratch"][p]],
                         subject=f"{p} from init") for p in PRE_POST]
    out += [CLAIM.predict("{placement} transfer",
                          [a - b for a, b in zip(accuracy["pretrained"][p], accuracy["scratch"][p],
                                                 strict=True)], subject=f"{p} transfer")
            for p in PRE_POST]
    out.append(CLAIM.predict("post vs pre", [b - a for a, b in zip(accuracy["pretrained"]["pre"],
                                                                    accuracy["pretrained"]["post"],
                                                                    strict=True)]))
    if "probe_pretrained" in accuracy:  # the frozen probe's diagnostics
        frozen, at_init = accuracy["probe_pretrained"], accuracy["probe_scratch"]
        out += [CLAIM.predict("{placement} transfer, frozen probe",
                              [a - b for a, b in zip(frozen[p], at_init[p], strict=True)],
                              subject=f"{p} transfer, frozen probe") for p in PRE_POST]
        out.append(CLAIM.predict("post vs pre, frozen probe",
                                 [b - a for a, b in zip(frozen["pre"], frozen["post"],
                                                        strict=True)]))
    return out


# -- C10's own measurements, run on the study's folder (`StudyContext.own`) -------------------
def c10_checkpoints(folder: StudyFolder) -> list[Pretrained]:
    """The pre and post checkpoints C10 fine-tunes, one per placement and seed: with
    `c10_pairs="cells"` the matched-loss cells (`matched_pair`); with
    "trajectories" the pairs along the runs of `c10_trajectory_runs` (`trajectory_pairs`),
    a pair inside the warmup marked as such (left out by C10)."""
    if CLAIM.settings(folder.profile).c10_pairs == "trajectories":
        return folder.trajectory_pairs(c10_trajectory_runs(folder), warmup=folder.profile.warmup)
    pair = folder.matched_pair()
    if not pair.found:
        return []
    out = []
    for pl in ("pre", "post"):
        for r in folder.tuned(pl).cell(pair.lr(pl)):  # type: ignore[arg-type]
            out.append(Pretrained(pl, r.seed, folder.runs_root / r.run_id,
                                  r.val_loss if r.val_loss is not None else math.nan,
                                  r.outcome))
    return out


def c10_trajectory_runs(folder: StudyFolder) -> dict[str, dict[int, RunRecord]]:
    """Pre and post at the profile's depth, each at its own tuned lr (`tuned`, with
    warmup), every seed trained again keeping its weights `deep_evals` times along the
    way (the same model, data and schedule as the tuned cell: only evaluations and kept
    weights differ). C10's pairs are taken along them (docs/study.md, C10)."""
    p = folder.profile
    configs = {(pl, s): folder.family_config(pl, folder.tuned(pl).best_lr, p.warmup, s,
                                           trajectory=True)
               for pl in PRE_POST for s in range(p.seeds)}
    summaries = folder.train(list(configs.values()))
    out: dict[str, dict[int, RunRecord]] = {pl: {} for pl in PRE_POST}
    for ((pl, s), cfg), summary in zip(configs.items(), summaries, strict=True):
        out[pl][s] = record(cfg, summary, lr=cfg.train.lr, warmup=p.warmup, seed=s)
    return out


def measure(ctx: StudyContext, checkpoints: Sequence[Pretrained] | None = None
            ) -> ClaimResult:
    title, statement, source = CLAIM.title, CLAIM.statement, CLAIM.source
    given = list(ctx.own(c10_checkpoints) if checkpoints is None else checkpoints)
    s = c10_settings(ctx)
    p = ctx.profile
    pairing = ("paired by seed" if CLAIM.settings(p).c10_pairs == "cells" else
               f"paired by seed along their trajectories (each placement trained at its own "
               f"tuned lr, its weights kept every {max(1, p.steps // p.deep_evals)} steps; "
               "per seed the most trained pair of kept checkpoints within the tolerance)")
    method = (f"Pre and post runs pretrained to matched validation loss (within "
              f"{p.match_tolerance:g} nats), {pairing}, "
              f"fine-tuned on the Shakespeare genre task (comedy/history/tragedy of a "
              f"{s['passage_bytes']}-byte passage, read in windows of the pretraining context; "
              f"speaker headings and stage directions stripped; per play: first 70% train, "
              f"next 10% validation, last 20% test), {s['steps']} AdamW steps, all weights, "
              "mean pooling, standardized features; the same architecture fine-tuned from "
              "random init with the same steps is the transfer baseline; every lr tuned per "
              "placement and arm on validation accuracy over the profile's grid, extended at an "
              "edge while extensions remain (whether each arm's best is bracketed is "
              "recorded; an arm whose best stays at an edge leaves the claim inconclusive). "
              "Decided only where pretraining helps both placements (a premise about scale: "
              "otherwise not tested at this scale); effect per seed: fine-tuned test accuracy "
              "post - pre. Reported, never deciding: whether the models from init learn the "
              "task (5 points above the majority class). A character-trigram naive Bayes on "
              "the same passages is context.")
    if CLAIM.settings(ctx.profile).finetune_probe:
        method += (" Diagnostics, never deciding: a frozen linear probe (the body fixed, a head "
                   f"trained on its standardized pooled stream for the same {s['steps']} steps, "
                   "its lr tuned per placement and arm on the same validation passages over "
                   f"the grid {list(CLAIM.settings(ctx.profile).finetune_probe_lrs)}) of each "
                   "checkpoint and of the same architecture at init: what the pretrained "
                   "stream holds for the task, which the source does not speak of.")
    if not given:
        return ClaimResult(id="C10", title=title, statement=statement, source=source,
                           method=method, verdict="not run", rule="",
                           note="the study provided no pretrained pre/post runs for C10")
    res = c10_finetune(ctx, given)
    base = res["baseline"]["test_accuracy"]
    numbers = {k: res[k] for k in ("settings", "seeds", "left_out", "tolerance", "tuned_lr",
                                   "accuracy", "runs", "val_loss_pretrained", "chance",
                                   "majority")}
    numbers["ngram_baseline_context"] = base
    caveat = ("Small byte-level models pretrained briefly on a CPU; the character-trigram "
              "baseline is context (it tests the task, not transfer).")
    if not res["seeds"]:
        return ClaimResult(id="C10", title=title, statement=statement, source=source,
                           method=method, verdict="inconclusive", rule="", numbers=numbers,
                           note="no matched pre/post pair: " + "; ".join(res["left_out"]),
                           caveat=caveat)
    bars = {f"{p} {arm}": mean_ci(v) for arm, acc in res["accuracy"].items()
            for p, v in acc.items()}
    bars["char-trigram naive Bayes"] = {"mean": base, "ci95": [base, base]}
    fig = figures.plot_bars(bars, ctx.fig_dir / "c10_transfer.svg", ylabel="genre test accuracy",
                    title=f"{s['passage_bytes']}-byte passages, majority {res['majority']:.2f}")
    result = claim_result(CLAIM, method, c10_predictions(res["accuracy"], res["majority"]),
                          numbers, [str(fig.relative_to(ctx.out))] if fig else [],
                          caveat=caveat)
    return unbracketed_is_inconclusive(result, res["tuned_lr"])


def unbracketed_is_inconclusive(result: ClaimResult, tuned: Mapping[str, Mapping[str, Any]]
                                ) -> ClaimResult:
    """A fine-tuning arm whose best lr still sits at an edge of its grid once the extensions
    ran out may fine-tune better at an lr not tried: the accuracies it decides on are not its
    tuned ones, so a decided claim becomes inconclusive, with the arms named (the frozen probe's
    arms, diagnostics, are named only)."""
    edge = [f"{placement} {arm} (best lr {t['best']:g} of {sorted(float(v) for v in t['scores'])})"
            for arm in FINETUNE_ARMS for placement, t in tuned.get(arm, {}).items()
            if not t["bracketed"]]
    if not edge:
        return result
    result.note = (result.note + " " if result.note else "") + (
        "Not bracketed: " + "; ".join(edge) + " sits at an edge of its grid after the "
        "profile's extensions, so the fine-tuned accuracy it decides on may not be its best.")
    if result.verdict in ("supported", "not supported"):
        result.verdict = "inconclusive"
    return result


def finetune_units(profile: Profile) -> tuple[int, float]:
    """C10's fine-tunings per matched seed (pretrained and from init, per placement and lr of
    the grid with one extension) and their cost in training steps of the profile's shape: a
    fine-tuning step is a batch of passages, each read as windows of `seq_len`; with the frozen
    probe, one pass of the frozen body over every passage per checkpoint."""
    p, own = profile, CLAIM.settings(profile)
    windows = max(1, own.finetune_passage_bytes // p.seq_len) * own.finetune_batch_size \
        / p.batch_size
    lrs = len(own.finetune_lrs) + min(1, own.finetune_lr_extensions)
    steps = 2 * 2 * lrs * own.finetune_steps * windows
    if own.finetune_probe:
        steps += 2 * 2 * 13_000 * windows / own.finetune_batch_size / 2
    return 2 * 2 * lrs, steps


def work(plan: WorkPlan) -> None:
    """C10's own work: with `c10_pairs="trajectories"` pre and post trained again at their
    tuned lrs; then the fine-tunings (`finetune_units`), for the seeds whose pre and post cells
    are matched once the grids have trained (every seed until then); those a run folder holds
    (`finetune/genre-*.json`) count as cached."""
    p, own = plan.profile, CLAIM.settings(plan.profile)
    pre, post = plan.tuned("pre", p.warmup), plan.tuned("post", p.warmup)
    if own.c10_pairs == "trajectories":
        plan.runs([plan.folder.family_config(pl, (g.best_lr if g else p.lrs[0]), p.warmup, s,
                                             trajectory=True)
                   for pl, g in (("pre", pre), ("post", post)) for s in range(p.seeds)])
    pairs = p.seeds
    if pre is not None and post is not None and own.c10_pairs == "cells":
        pairs = len(matched_pairs(c10_checkpoints(plan.folder), p.match_tolerance)[0])
    if not pairs:
        return
    per_seed, steps = finetune_units(p)
    units = per_seed * pairs
    cached = min(units, len(list(plan.folder.runs_root.glob("*/finetune/genre-*.json"))))
    plan.work("fine-tunings", units, cached, steps * (units - cached) / per_seed,
              parallel=True)


CLAIM = CLAIM.bind(measure, work=work)
