"""`normlab advise`: the placement guidance of the seed documents for one intended shape, each
rule shown with what normlab measures at that shape in a few minutes.

Rules (seed guidance; REFERENCE.md section 2):
1. Large LMs past about 12 blocks without a long warmup: Pre-Norm (it trains without warmup;
   Post-Norm's gradients at init grow toward the output and its early updates are large).
2. Shallow models, or fine-tuning a Post-Norm checkpoint: Post-Norm (it ends better when it
   trains and keeps every block's weight).
3. Pre-Norm needs a final norm before the head.
4. Intermediate heads (early exits, logit lens) under Pre-Norm need a norm at every extraction
   point.

Measured at the user's shape: the init gradient profile and stream growth of pre and post
(full width), and a short learning-rate x warmup stability check at reduced width and the
user's depth.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.config import ModelConfig, load_run_config, parse_config
from normlab.probe import probe_model, text_batches
from normlab.train.trainer import train_many_step

DEEP = 12  # "pre-norm past about 12 blocks"


@dataclass
class Advice:
    recommendation: str
    reasons: list[str] = field(default_factory=list)
    rules: list[dict[str, Any]] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)


def measure_init(blocks: int, width: int, heads: int, seq_len: int = 64) -> dict[str, Any]:
    """Gradient profile and stream growth of pre and post at the full shape, at init."""
    from normlab.nn import build_model

    batches = text_batches("shakespeare", n_batches=1, batch_size=4, seq_len=seq_len)
    out: dict[str, Any] = {}
    for placement in ("pre", "post"):
        cfg = parse_config(ModelConfig, {"placement": placement, "n_blocks": blocks,
                                         "d_model": width, "n_heads": heads,
                                         "max_seq_len": seq_len, "init": "xavier"})
        res = probe_model(build_model(cfg, seed=0), batches, ("stream", "grads"))
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
                    warmups: tuple[int, ...], root: Path) -> list[dict[str, Any]]:
    """pre and post at the user's depth and a reduced width: outcome of each lr x warmup."""
    heads = max(1, width // 64)
    rows = []
    for placement in ("pre", "post"):
        for lr in lrs:
            for warmup in warmups:
                cfg = load_run_config(None, [
                    f"model.placement={placement}", f"model.n_blocks={blocks}",
                    f"model.d_model={width}", f"model.n_heads={heads}", "model.max_seq_len=64",
                    "data.seq_len=64", "train.batch_size=8", f"train.steps={steps}",
                    f"train.lr={lr}", f"train.warmup={warmup}", "train.eval_every=0",
                    "train.eval_batches=2", "train.schedule=constant", "train.device=cpu"])
                s = train_many_step(cfg, root, progress=False)
                rows.append({"placement": placement, "lr": lr, "warmup": warmup,
                             "outcome": s["outcome"], "reason": s.get("reason"),
                             "step": s.get("step"), "val_loss": s.get("val_loss")})
    return rows


def advise(blocks: int, width: int, heads: int | None = None, *, finetune: bool = False,
           warmup_budget: int | None = None, intermediate_heads: bool = False,
           check_width: int = 64, check_steps: int = 60, measure: bool = True,
           root: Path | None = None) -> Advice:
    heads = heads or max(1, width // 64)
    measured: dict[str, Any] = {}
    if measure:
        measured["init"] = measure_init(blocks, width, heads)
        with tempfile.TemporaryDirectory() as tmp:
            measured["stability"] = stability_check(
                blocks, min(width, check_width), check_steps, (1e-3, 3e-3),
                (0, max(1, check_steps // 3)), root or Path(tmp))

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
    reasons = []
    if finetune:
        rec = "post"
        reasons.append("you fine-tune: the seed guidance keeps a Post-Norm checkpoint's placement")
    elif deep and not long_warmup:
        rec = "pre"
        reasons.append(f"{blocks} blocks > {DEEP} and no long warmup budget")
    elif deep:
        rec = "pre"
        reasons.append(f"{blocks} blocks > {DEEP}: even with a long warmup Post-Norm is at risk; "
                       "consider deepnorm or lns if you need Post-Norm's depth use")
    else:
        rec = "post"
        reasons.append(f"{blocks} blocks <= {DEEP}: Post-Norm trains and tends to end better")

    if measure:
        init = measured["init"]
        reasons.append(
            f"at init, post's last/first block gradient ratio is "
            f"{init['post']['grad_last_over_first']:.3g} (pre: "
            f"{init['pre']['grad_last_over_first']:.3g}); pre's stream grows with exponent "
            f"{init['pre']['growth_exponent']:.2f} (post: {init['post']['growth_exponent']:.2f})")
        bad = {p: [r for r in measured["stability"] if r["placement"] == p
                   and r["outcome"] != "completed"] for p in ("pre", "post")}
        no_warm_post = [r for r in measured["stability"] if r["placement"] == "post"
                        and r["warmup"] == 0]
        post_no_warm_loss = [r["val_loss"] for r in no_warm_post if r["val_loss"] is not None]
        reasons.append(
            f"short stability check at width {min(width, check_width)}: "
            f"{len(bad['pre'])} pre and {len(bad['post'])} post runs of "
            f"{len(measured['stability']) // 2} each did not complete"
            + (f"; post without warmup reached val loss "
               f"{min(post_no_warm_loss):.3f}" if post_no_warm_loss else ""))
        if rec == "post" and bad["post"] and not finetune:
            rec = "pre"
            reasons.append("post failed the stability check at this depth: recommending pre")
    if rec == "pre":
        reasons.append("use a final norm (final_norm=auto does it for pre)")
        if intermediate_heads:
            reasons.append("put a norm at every extraction point of an intermediate head")
    return Advice(recommendation=rec, reasons=reasons, rules=rules, measured=measured)
