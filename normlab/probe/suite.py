"""Run a chosen set of probes on one model and gather every number in one dictionary.

    result = probe_model(model, batches, probes=("stream", "grads", "drop"))
    result["per_block"]["norm"]        # one value per block
    result["summary"]["effective_depth"]

`per_block` holds lists indexed by block (the merge test's by pair t = (t, t+1), so one shorter);
`summary` holds one number per metric (with `<name>_std`, the spread over batches, where there is
one); `notes` says what was skipped or substituted and why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from normlab.config import ConfigError
from normlab.probe.depth import effective_depth
from normlab.probe.grads import stream_and_grad_stats
from normlab.probe.interventions import layer_drop, merge_test
from normlab.probe.lens import logit_lens
from normlab.probe.sensitivity import perturbation_sensitivity, update_size

Batch = tuple[torch.Tensor, torch.Tensor]

PROBES: tuple[str, ...] = ("stream", "grads", "merge", "drop", "lens", "perturb", "update")
DEFAULT_PROBES: tuple[str, ...] = ("stream", "grads", "merge", "drop", "lens", "perturb")
PER_BLOCK_KEYS = (
    "norm", "norm_attn", "rel_update", "cos_prev", "ang_prev", "cos_last", "ang_last",
    "branch_attn", "branch_mlp", "dual_norm", "attn_grad", "mlp_grad", "stream_grad",
    "merge_dloss", "merge_kl", "drop_dloss", "drop_kl", "lens_normed", "lens_raw",
)
SERIES_KEYS = ("update_size", "update_loss")  # per optimizer step, not per block


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
    raw: dict[str, object] = {}
    notes: list[str] = []
    if "stream" in probes or "grads" in probes:
        raw.update(stream_and_grad_stats(model, batches, stream="stream" in probes,
                                         grads="grads" in probes))
    if "merge" in probes:
        if len(model.blocks) < 2:
            notes.append("merge: needs at least 2 blocks; skipped")
        else:
            raw.update(merge_test(model, batches))
    if "drop" in probes:
        raw.update(layer_drop(model, batches))
        raw.update(effective_depth(raw, threshold=drop_threshold))
    if "lens" in probes:
        if model.cfg.kind != "decoder":
            notes.append("lens: decoder only (an encoder's head reads a pooled stream); skipped")
        else:
            raw.update(logit_lens(model, batches))
            notes.append(f"lens: norm at the extraction points is {raw['lens_norm']}")
    if "perturb" in probes:
        raw.update(perturbation_sensitivity(model, batches, eps=perturb_eps,
                                            draws=perturb_draws, seed=seed))
    if "update" in probes:
        tb = train_batches if train_batches else batches
        if not train_batches:
            notes.append("update: no training batches given; trained on the probe batches")
        raw.update(update_size(model, tb, batches[0], steps=update_steps, lr=update_lr,
                               warmup=update_warmup, seed=seed))
    if model.cfg.kind == "encoder" and any(p in probes for p in ("grads", "merge", "drop")):
        notes.append("encoder: losses use synthetic labels (sum of bytes mod n_classes) unless "
                     "the batches carry real ones; the KL numbers need no labels")
    return organize(model, probes, raw, notes)


def organize(model: nn.Module, probes: Sequence[str], raw: dict[str, object],
             notes: list[str]) -> dict[str, object]:
    """Sort a flat dict of probe outputs into per_block / series / per_batch / summary."""
    per_block, series, per_batch, summary = {}, {}, {}, {}
    for key, value in raw.items():
        if key in PER_BLOCK_KEYS:
            per_block[key] = value
        elif key in SERIES_KEYS:
            series[key] = value
        elif key.endswith("_per_batch"):
            per_batch[key] = value
        else:
            summary[key] = value
    if "norm" in per_block:
        summary["last_norm"] = per_block["norm"][-1]
        summary["mean_ang_prev"] = sum(per_block["ang_prev"]) / len(per_block["ang_prev"])
    if "update_size" in series:
        summary["update_size_final"] = series["update_size"][-1]
    return {"model": describe_model(model), "probes": list(probes), "summary": summary,
            "per_block": per_block, "series": series, "per_batch": per_batch, "notes": notes}


def finite_or_none(obj: object) -> object:
    """A copy of `obj` that JSON can hold strictly: NaN and inf become None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj
