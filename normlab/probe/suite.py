"""Run a chosen set of probes on one model and gather every number in one dictionary.

    result = probe_model(model, batches, probes=("stream", "grads", "drop"))
    result["per_block"]["norm"]        # one value per block
    result["summary"]["effective_depth"]

`per_block` holds lists indexed by block (the merge test's by pair t = (t, t+1), so one shorter);
`summary` holds one number per metric (with `<name>_std`, the spread over batches, where there is
one); `notes` says what was skipped or substituted and why. Which probes exist, which functions
they run and where each number goes is read from the table of metrics, `normlab.probe.metrics`;
the functions below run the model for each probe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from normlab.config import ConfigError
from normlab.probe import metrics
from normlab.probe.depth import effective_depth
from normlab.probe.grads import stream_and_grad_stats
from normlab.probe.interventions import layer_drop, merge_test, skip_effect
from normlab.probe.lens import logit_lens
from normlab.probe.sensitivity import perturbation_sensitivity, update_size

Batch = tuple[torch.Tensor, torch.Tensor]

PROBES: tuple[str, ...] = metrics.PROBES  # stream, grads, merge, drop, skip, lens, perturb, update
DEFAULT_PROBES: tuple[str, ...] = metrics.DEFAULT_PROBES  # all but skip and update


@dataclass
class ProbeRun:
    """What a probe function reads: the model, the batches and the options of one `probe_model`
    call; `notes` collects what a probe skipped or substituted."""

    model: nn.Module
    batches: Sequence[Batch]
    probes: tuple[str, ...]
    train_batches: Sequence[Batch] | None = None
    perturb_eps: float = 0.01
    perturb_draws: int = 2
    update_steps: int = 30
    update_lr: float = 1e-3
    update_warmup: int = 0
    drop_threshold: float = 0.01
    seed: int = 0
    notes: list[str] = field(default_factory=list)


def parse_probes(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """`"stream,grads"` -> ("stream", "grads"); `None` or "default" -> DEFAULT_PROBES; "all"."""
    if text is None:
        return DEFAULT_PROBES
    items = text.split(",") if isinstance(text, str) else list(text)
    items = [s.strip() for s in items if s.strip()]
    if items == ["default"]:
        return DEFAULT_PROBES
    if items == ["all"]:
        return PROBES
    unknown = [s for s in items if s not in PROBES]
    if unknown or not items:
        raise ConfigError(f"--probes: unknown probe(s) {unknown or items}; choose from "
                          f"{', '.join(PROBES)} (or default, all)")
    return tuple(dict.fromkeys(items))


def describe_model(model: nn.Module) -> dict[str, object]:
    cfg, plan = model.cfg, model.plan
    return {"placement": cfg.placement, "kind": cfg.kind, "n_blocks": cfg.n_blocks,
            "d_model": cfg.d_model, "n_heads": cfg.n_heads, "norm": cfg.norm, "init": plan.init,
            "final_norm": plan.final_norm, "params": sum(p.numel() for p in model.parameters())}


def probe_model(model: nn.Module, batches: Sequence[Batch],
                probes: Sequence[str] = DEFAULT_PROBES, *,
                train_batches: Sequence[Batch] | None = None, perturb_eps: float = 0.01,
                perturb_draws: int = 2, update_steps: int = 30, update_lr: float = 1e-3,
                update_warmup: int = 0, drop_threshold: float = 0.01, seed: int = 0
                ) -> dict[str, object]:
    """Run `probes` (names from `PROBES`) on `model` with `batches` of `(idx, targets)`."""
    probes = parse_probes(list(probes))
    if not batches:
        raise ConfigError("probes need at least one batch")
    run = ProbeRun(model, batches, probes, train_batches, perturb_eps=perturb_eps,
                   perturb_draws=perturb_draws, update_steps=update_steps, update_lr=update_lr,
                   update_warmup=update_warmup, drop_threshold=drop_threshold, seed=seed)
    raw: dict[str, object] = {}
    for compute in metrics.probe_functions(probes):
        raw.update(compute(run))
    if model.cfg.kind == "encoder" and any(p in probes for p in ("grads", "merge", "drop")):
        run.notes.append("encoder: losses use synthetic labels (sum of bytes mod n_classes) "
                         "unless the batches carry real ones; the KL numbers need no labels")
    return organize(model, probes, raw, run.notes)


# --- the probes: each takes a ProbeRun and returns its metrics (rows of normlab.probe.metrics)

def stream_probe(run: ProbeRun) -> dict[str, object]:
    """`stream` and `grads`: one forward (and backward, with `grads`) per batch."""
    return stream_and_grad_stats(run.model, run.batches, stream="stream" in run.probes,
                                 grads="grads" in run.probes)


def merge_probe(run: ProbeRun) -> dict[str, object]:
    if len(run.model.blocks) < 2:
        run.notes.append("merge: needs at least 2 blocks; skipped")
        return {}
    return merge_test(run.model, run.batches)


def drop_probe(run: ProbeRun) -> dict[str, object]:
    """Layer drop, and the effective depth of its costs."""
    out = layer_drop(run.model, run.batches)
    out.update(effective_depth(out, threshold=run.drop_threshold))
    return out


def skip_probe(run: ProbeRun) -> dict[str, object]:
    """Skip effects (Csordás et al. 2025): each block skipped, the change of every later block's
    contribution and of the output; each block's contribution relative to its stream."""
    return skip_effect(run.model, run.batches)


def lens_probe(run: ProbeRun) -> dict[str, object]:
    if run.model.cfg.kind != "decoder":
        run.notes.append("lens: decoder only (an encoder's head reads a pooled stream); skipped")
        return {}
    out = logit_lens(run.model, run.batches)
    run.notes.append(f"lens: norm at the extraction points is {out['lens_norm']}")
    return out


def perturb_probe(run: ProbeRun) -> dict[str, object]:
    return perturbation_sensitivity(run.model, run.batches, eps=run.perturb_eps,
                                    draws=run.perturb_draws, seed=run.seed)


def update_probe(run: ProbeRun) -> dict[str, object]:
    tb = run.train_batches if run.train_batches else run.batches
    if not run.train_batches:
        run.notes.append("update: no training batches given; trained on the probe batches")
    return update_size(run.model, tb, run.batches[0], steps=run.update_steps, lr=run.update_lr,
                       warmup=run.update_warmup, seed=run.seed)


def organize(model: nn.Module, probes: Sequence[str], raw: dict[str, object],
             notes: list[str]) -> dict[str, object]:
    """Sort a flat dict of probe outputs into per_block / series / per_batch / summary, as the
    table of metrics places each key (a key it has no row for is an error), then add the
    metrics computed from others."""
    parts: dict[str, dict[str, object]] = {
        metrics.PER_BLOCK: {}, metrics.SERIES: {}, metrics.PER_BATCH: {}, metrics.SUMMARY: {}}
    for key, value in raw.items():
        parts[metrics.place(key)][key] = value
    per_block, series = parts[metrics.PER_BLOCK], parts[metrics.SERIES]
    summary = parts[metrics.SUMMARY]
    measured = {**per_block, **series}
    for m in metrics.of_metrics(metrics.NORMLAB):
        if all(k in measured for k in m.inputs):
            summary[m.name] = m.compute(*(measured[k] for k in m.inputs))
    return {"model": describe_model(model), "probes": list(probes), "summary": summary,
            "per_block": per_block, "series": series, "per_batch": parts[metrics.PER_BATCH],
            "notes": notes}


def finite_or_none(obj: object) -> object:
    """A copy of `obj` that JSON can hold strictly: NaN and inf become None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj
