"""`normlab advise`: the placement guidance of the seed documents for one intended shape, each
rule shown with what normlab measures at that shape in a few minutes.

Rules (seed guidance; docs/reference.md section 2):
1. Large LMs past about 12 blocks without a long warmup: Pre-Norm (it trains without warmup;
   Post-Norm's gradients at init grow toward the output and its early updates are large).
2. Shallow models, or fine-tuning a Post-Norm checkpoint: Post-Norm (it ends better when it
   trains and keeps every block's weight).
3. Pre-Norm needs a final norm before the head.
4. Intermediate heads (early exits, logit lens) under Pre-Norm need a norm at every extraction
   point.

Measured at the user's shape: the init gradient profile and stream growth of pre and post
(full width), and a short learning-rate x warmup stability check at reduced width and the
user's depth. The advice follows the check: when one placement is at least as good in every
cell and better in one, and the rules chose the other, the advice takes the measured one and
says that it overrides the rule and why (`recommend`).

Other placements (`also`: olmo2, keel, deepnorm, a placement of one's own ...) are measured
beside them, at init with their own default init and in every cell of the check, and each is
compared cell by cell with the recommended placement. The rules speak of pre and post only, so
another placement is never the recommendation: one that was at least as good in every cell is
named as worth a longer comparison.

Without measuring (`measure=False`, `--no-measure`) the rules of thumb are not given as advice:
the recorded studies (docs/results/study_*/study.json, `normlab.study.recorded`) contradict the
shallow one at the shape they trained (6 blocks, width 64: Post-LN did not end better, C9, and
needed warmup, C6a/C6b). The advice then says what those studies found at the shape, or that
nothing was measured there and what to run to measure it, and picks a placement only where the
record does (C9 supported at the shape: post); otherwise it is `undecided`.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.config import ModelConfig, load_run_config, parse_config
from normlab.probe import probe_model, text_batches
from normlab.study.recorded import Recorded, recorded_at
from normlab.train.trainer import train_run_raising_interrupt

DEEP = 12  # "pre-norm past about 12 blocks"


@dataclass
class Advice:
    recommendation: str           # what the measurements support (see `recommend`)
    reasons: list[str] = field(default_factory=list)
    rules: list[dict[str, Any]] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)
    rule_recommendation: str = ""  # the rules of thumb alone
    recorded: Recorded | None = None  # what the recorded studies found here (without measuring)


PAIR = ("pre", "post")  # the placements the rules of thumb speak of


def measure_init(blocks: int, width: int, heads: int, seq_len: int = 64,
                 also: tuple[str, ...] = (), device: str = "cpu") -> dict[str, Any]:
    """Gradient profile and stream growth of pre and post at the full shape, at init (both
    Xavier, so that the placement alone differs), and of each placement of `also` under its
    own default init (DeepNorm's, Sub-LN's or nGPT's init is part of the method); measured on
    `device`."""
    from normlab.nn import build_model
    from normlab.probe import on_device

    batches = text_batches("shakespeare", n_batches=1, batch_size=4, seq_len=seq_len)
    out: dict[str, Any] = {}
    for placement in (*PAIR, *also):
        own = {} if placement in also else {"init": "xavier"}
        cfg = parse_config(ModelConfig, {"placement": placement, "n_blocks": blocks,
                                         "d_model": width, "n_heads": heads,
                                         "max_seq_len": seq_len, **own})
        res = probe_model(*on_device(build_model(cfg, seed=0), batches, device),
                          ("stream", "grads"))
        g = [math.hypot(a, m) for a, m in zip(res["per_block"]["attn_grad"],
                                               res["per_block"]["mlp_grad"], strict=True)]
        out[placement] = {
            "grad_last_over_first": g[-1] / g[0] if g[0] > 0 else math.inf,
            "growth_exponent": res["summary"].get("growth_exponent"),
            "last_norm": res["summary"].get("last_norm"),
            "block_grads": g,
        }
    return out


def stability_check(blocks: int, width: int, steps: int, lrs: tuple[float, ...],
                    warmups: tuple[int, ...], root: Path,
                    progress: Callable[[str], None] | None = None, device: str = "cpu",
                    placements: tuple[str, ...] = PAIR) -> list[dict[str, Any]]:
    """`placements` at the user's depth and a reduced width, trained on `device` (cpu or cuda,
    as `normlab study --device` resolves it): outcome of each lr x warmup
    (`progress` is told each run before it trains, with its count)."""
    heads = max(1, width // 64)
    rows = []
    total = len(placements) * len(lrs) * len(warmups)
    for placement in placements:
        for lr in lrs:
            for warmup in warmups:
                if progress is not None:
                    progress(f"stability check {len(rows) + 1}/{total}: {placement}, lr {lr:g}, "
                             f"warmup {warmup}, {steps} steps at width {width}")
                cfg = load_run_config(None, [
                    f"model.placement={placement}", f"model.n_blocks={blocks}",
                    f"model.d_model={width}", f"model.n_heads={heads}", "model.max_seq_len=64",
                    "data.seq_len=64", "train.batch_size=8", f"train.steps={steps}",
                    f"train.lr={lr}", f"train.warmup={warmup}", "train.eval_every=0",
                    "train.eval_batches=2", "train.schedule=constant", f"train.device={device}"])
                s = train_run_raising_interrupt(cfg, root, progress=False)
                rows.append({"placement": placement, "lr": lr, "warmup": warmup,
                             "outcome": s["outcome"], "reason": s.get("reason"),
                             "step": s.get("step"), "val_loss": s.get("val_loss")})
    return rows


def advise(blocks: int, width: int, heads: int | None = None, *, finetune: bool = False,
           warmup_budget: int | None = None, intermediate_heads: bool = False,
           check_width: int = 64, check_steps: int = 60, measure: bool = True,
           root: Path | None = None, progress: Callable[[str], None] | None = None,
           results: Path | None = None, device: str = "cpu", also: tuple[str, ...] = ()
           ) -> Advice:
    """Measure at the shape, then `recommend`; `progress` is told each step of the measurement
    as it starts; the measurement at init and the stability check run on `device` (cpu or
    cuda). `also`: placements
    measured beside pre and post (the module docstring). With `measure` False, what the
    recorded studies found at the shape stands in for the measurement (`results`: their folder;
    default the repository's docs/results)."""
    heads = heads or max(1, width // 64)
    also = tuple(dict.fromkeys(p for p in also if p not in PAIR))
    measured: dict[str, Any] = {}
    if measure:
        if progress is not None:
            names = (*PAIR, *also)
            listed = ", ".join(names[:-1]) + " and " + names[-1]
            progress(f"gradients and stream of {listed} at init, {blocks} blocks, width {width}")
        measured["init"] = measure_init(blocks, width, heads, also=also, device=device)
        with tempfile.TemporaryDirectory() as tmp:
            measured["stability"] = stability_check(
                blocks, min(width, check_width), check_steps, (1e-3, 3e-3),
                (0, max(1, check_steps // 3)), root or Path(tmp), progress=progress,
                device=device, placements=(*PAIR, *also))
        measured["also"] = list(also)
        measured["check_width"] = min(width, check_width)
        measured["check_steps"] = check_steps
    claims = ("C6a", "C6b", "C9", "C11", "C12", *(("C10",) if finetune else ()),
              *(("C13",) if intermediate_heads else ()))  # the ones this question turns on
    recorded = None if measure else recorded_at(blocks, width, results, claims)
    return recommend(blocks, finetune=finetune, warmup_budget=warmup_budget,
                     intermediate_heads=intermediate_heads, measured=measured, recorded=recorded)


TIE_NATS = 0.01  # final validation losses closer than this count as a tie in the check


@dataclass
class CheckVerdict:
    """What the stability check says about one placement against another (pre against post,
    unless asked), cell by cell (lr x warmup)."""
    winner: str | None            # the one that is at or better in every cell
    better: dict[str, int]        # per placement: cells where it completed and the other did
    ties: int                     # not, or where it lost less
    text: str


def compare_check(rows: list[dict[str, Any]], tie: float = TIE_NATS,
                  pair: tuple[str, str] = PAIR) -> CheckVerdict:
    """The two placements of `pair` in each cell of the stability check: a run that completes
    beats one that does not; between two that complete, the lower final validation loss wins
    unless the two are within `tie` nats. A placement wins the check when it is at least as good
    in every cell and better in at least one; otherwise there is no winner."""
    a, b = pair
    cells: dict[tuple[float, int], dict[str, dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["lr"], r["warmup"]), {})[r["placement"]] = r
    better = {a: 0, b: 0}
    ties = 0
    details = []
    for (lr, warmup), cell in cells.items():
        if not {a, b} <= set(cell):
            continue
        ok = {p: cell[p]["outcome"] == "completed" and cell[p]["val_loss"] is not None
              for p in pair}
        if ok[a] != ok[b]:
            win = a if ok[a] else b
        elif ok[a]:
            diff = cell[a]["val_loss"] - cell[b]["val_loss"]
            win = None if abs(diff) < tie else (a if diff < 0 else b)
        else:
            win = None
        if win is None:
            ties += 1
        else:
            better[win] += 1
        details.append(f"lr {lr:g} warmup {warmup}: {_cell_text(cell[a])} vs "
                       f"{_cell_text(cell[b])}")
    winner = None
    for x, y in (pair, pair[::-1]):
        if better[x] and not better[y]:
            winner = x
    n = better[a] + better[b] + ties
    text = (f"{a} better in {better[a]}, {b} better in {better[b]}, tied (within "
            f"{tie:g} nats, or both failed) in {ties} of {n} cells ({a} vs {b}: "
            + "; ".join(details) + ")")
    return CheckVerdict(winner, better, ties, text)


def _cell_text(r: dict[str, Any]) -> str:
    if r["outcome"] == "completed" and r["val_loss"] is not None:
        return f"{r['val_loss']:.3f}"
    return f"{r['outcome']} at step {r.get('step')}"


def recommend(blocks: int, *, finetune: bool = False, warmup_budget: int | None = None,
              intermediate_heads: bool = False, measured: dict[str, Any] | None = None,
              recorded: Recorded | None = None) -> Advice:
    """The rules of thumb for this shape, then what the measurements (`advise`'s, or none) say.
    The stability check decides when it has a winner (at least as good in every cell) that
    differs from the rule's choice; the advice then says it overrides the rule, and why. It
    does not override the fine-tuning rule: a check trained from scratch says nothing about
    which placement a checkpoint should keep. Without measurements, `recorded` (what the
    recorded studies found at the shape) replaces the rules of thumb (`from_record`); with
    neither, the rules decide."""
    measured = measured or {}
    long_warmup = warmup_budget is not None and warmup_budget >= 1000
    deep = blocks > DEEP
    rules = [
        {"rule": f"past about {DEEP} blocks, without a long warmup, use Pre-Norm",
         "applies": deep and not long_warmup and not finetune},
        {"rule": "shallow models, or fine-tuning a Post-Norm checkpoint: Post-Norm",
         "applies": (not deep) or finetune},
        {"rule": "Pre-Norm needs a final norm before the head", "applies": True},
        {"rule": "intermediate heads under Pre-Norm need a norm at every extraction point",
         "applies": intermediate_heads},
    ]
    if finetune:
        rec, why = "post", "you fine-tune, so keep a Post-Norm checkpoint's placement"
    elif deep and not long_warmup:
        rec, why = "pre", f"{blocks} blocks > {DEEP} and no long warmup budget: pre"
    elif deep:
        rec, why = "pre", (f"{blocks} blocks > {DEEP}: even with a long warmup Post-Norm is at "
                           "risk; consider deepnorm or lns if you need Post-Norm's depth use")
    else:
        rec, why = "post", f"{blocks} blocks <= {DEEP}: Post-Norm trains and tends to end better"
    reasons = [f"rule of thumb: {why}"]
    rule_rec = rec
    if recorded is not None and not measured and not finetune:
        rec, reasons = from_record(recorded, rule_rec, why)

    init = measured.get("init")
    if init:
        reasons.append(
            f"at init, post's last/first block gradient ratio is "
            f"{init['post']['grad_last_over_first']:.3g} (pre: "
            f"{init['pre']['grad_last_over_first']:.3g}); pre's stream grows with exponent "
            f"{init['pre']['growth_exponent']:.2f} (post: {init['post']['growth_exponent']:.2f})")
    rows = measured.get("stability")
    if rows:
        verdict = compare_check(rows)
        where = (f"width {measured['check_width']}, {measured['check_steps']} steps"
                 if "check_width" in measured else "reduced width")
        reasons.append(f"stability check ({where}): {verdict.text}")
        if verdict.winner is None:
            reasons.append(f"the check has no winner, so the rule of thumb stands: {rule_rec}")
        elif verdict.winner == rule_rec:
            reasons.append(f"the check agrees with the rule of thumb: {rule_rec}")
        elif finetune:
            reasons.append(f"the check favours {verdict.winner}, trained from scratch; for "
                           "fine-tuning the checkpoint's placement stands")
        else:
            rec = verdict.winner
            reasons.append(
                f"overrides the rule of thumb ({rule_rec}): at this shape {rec} was at least as "
                f"good as {rule_rec} in every cell of the check and better in "
                f"{verdict.better[rec]}. The rule summarises larger "
                "models trained far longer; a short check at reduced width is weaker evidence "
                "about the end of a long run, so re-check with more --check-steps if it "
                "matters")
    reasons += _also_measured(measured, rec)
    if rec in ("pre", UNDECIDED):
        when = "" if rec == "pre" else "with pre: "
        reasons.append(f"{when}use a final norm (final_norm=auto does it for pre)")
        if intermediate_heads:
            reasons.append(f"{when}put a norm at every extraction point of an intermediate head")
    return Advice(recommendation=rec, reasons=reasons, rules=rules, measured=measured,
                  rule_recommendation=rule_rec, recorded=recorded)


UNDECIDED = "undecided"


def _also_measured(measured: dict[str, Any], rec: str) -> list[str]:
    """What the measurements say of each other placement (`advise`'s `also`): at init, and in the
    check against the recommended placement. One at least as good in every cell is named as
    worth a longer comparison, never recommended: the rules speak of pre and post only."""
    reasons = []
    init, rows = measured.get("init") or {}, measured.get("stability") or []
    for other in measured.get("also", []):
        if other in init:
            m = init[other]
            reasons.append(f"also measured, {other} at init (its own init): last/first block "
                           f"gradient ratio {m['grad_last_over_first']:.3g}, stream growth "
                           f"exponent {m['growth_exponent']:.2f}")
        if rows and rec in PAIR:
            verdict = compare_check(rows, pair=(other, rec))
            reasons.append(f"also measured, {other} in the check: {verdict.text}")
            if verdict.winner == other:
                reasons.append(
                    f"{other} was at least as good as {rec} in every cell of the check and "
                    f"better in {verdict.better[other]}: worth a longer comparison with {rec} "
                    "before you choose (a sweep of model.placement x train.lr at your shape, "
                    "docs/sweeps.md); the rules of thumb do not speak of it")
    return reasons


def from_record(recorded: Recorded, rule_rec: str, rule_text: str) -> tuple[str, list[str]]:
    """(recommendation, reasons) from what the recorded studies found at the shape, in place of
    the rule of thumb (`rule_rec`, because `rule_text`): post where C9 (Post-LN ends better when
    it trains) was supported by every study that trained the shape; otherwise `undecided`,
    saying what was found, or that nothing was measured here, and what to run to measure it."""
    b, w = recorded.blocks, recorded.width
    shape = f"{b} blocks, width {w}"
    rule = f"the rule of thumb ({rule_rec}: {rule_text})"
    measure = (f"to measure at this shape: `normlab advise --blocks {b} --width {w}` (without "
               "--no-measure: pre and post at init at this shape, then a short lr x warmup "
               "stability check at your depth, a few minutes), or for runs as long as yours a "
               "sweep of model.placement x train.lr x train.warmup at this shape "
               "(docs/sweeps.md)")
    if recorded.where is None:
        return UNDECIDED, [
            "the recorded studies (docs/results/study_*/study.json) are not available here: they "
            "are kept in normlab's repository, not in an installed package, so nothing recorded "
            f"can be said about {shape}", f"{rule} is unchecked here", measure]
    if not recorded.studies:
        return UNDECIDED, [f"no recorded study could be read under {recorded.where}",
                           *recorded.problems, f"{rule} is unchecked here", measure]
    reasons = [*recorded.problems]
    if not recorded.measured_here:
        names = ", ".join(st.name for st in recorded.studies)
        reasons += [f"nothing was measured at {shape} by the recorded studies ({names}); they "
                    f"trained {recorded.shapes_text()}",
                    f"{rule} is unchecked at this shape", measure]
        return UNDECIDED, reasons
    studies = ", ".join(dict.fromkeys(r["study"] for r in recorded.rows))
    c9 = [(r["study"], r["verdict"]) for r in recorded.rows if r["claim"] == "C9"]
    reasons.append(f"the recorded studies ({studies}) trained at {shape}: what they found is "
                   "in the table above")
    if c9 and all(v == "supported" for _, v in c9):
        reasons.append("C9 (Post-LN ends better when it trains) was supported by every study "
                       "that trained this shape: post")
        return "post", [*reasons, measure]
    found = ("; ".join(f"{v} ({st})" for st, v in c9) if c9 else
             "not measured at this shape (no study trained both placements to compare here)")
    then = (f"so {rule} is not given, and nothing recorded picks a placement" if rule_rec == "post"
            else f"nothing recorded picks a placement, and {rule} is unchecked here")
    reasons.append(f"C9 (Post-LN ends better when it trains): {found}. The record does not show "
                   f"Post-Norm ending better here, {then}")
    return UNDECIDED, [*reasons, measure]
