"""Depth sweeps at initialization: every metric against depth, with log-log fits (C1, C4, C8).

For each placement, depth L and seed, a model is built from the base config (`build_model(cfg,
seed=s)`) and probed on the same batches. Per placement, each positive per-model number in
`LOGLOG_METRICS` is fitted as `log(metric) = a + b log(L)` over all seeds and depths
(`normlab.probe.fits.loglog_fit`: slope with a 95% t-interval and a bootstrap interval over
seeds). Xiong et al. 2020 (Theorem 1) predict the slope of `last_fc_out_grad`: ~0 for post,
~-0.5 for pre at Xavier init. Numbers that are exponents already (`growth_exponent`, the slope of
log stream norm against log block index within one model) are reported per depth as a mean with
a 95% t-interval over seeds (`mean_ci`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from normlab.config import ConfigError, ModelConfig, parse_config
from normlab.nn import build_model
from normlab.probe.fits import loglog_fit, mean_ci
from normlab.probe.suite import DEFAULT_PROBES, probe_model

Batch = tuple[torch.Tensor, torch.Tensor]

LOGLOG_METRICS = ("last_fc_out_grad", "last_norm", "total_grad", "perturb_change",
                  "effective_depth", "effective_depth_kl", "update_size_final")
LINEAR_METRICS = ("growth_exponent", "mean_ang_prev", "loss")


def sweep_config(base: ModelConfig, placement: str, n_blocks: int) -> ModelConfig:
    """`base` with another placement and depth, validated (errors name the field). A placement
    of your own is found as a config finds it: in base's `placement_file`, else registered."""
    data = base.to_dict()
    data.update(placement=placement, n_blocks=n_blocks, placement_file=base.placement_file)
    if placement != base.placement:
        data["placement_def"] = None
    if placement != "custom":
        data["block_placements"] = None
    return parse_config(ModelConfig, data)


def depth_sweep(base: ModelConfig, placements: Sequence[str], depths: Sequence[int],
                seeds: Sequence[int], batches: Sequence[Batch],
                probes: Sequence[str] = DEFAULT_PROBES, *,
                progress: Callable[[str], None] | None = None, parts: Path | None = None,
                inputs: object = None, **options: object) -> dict[str, object]:
    """Probe every (placement, depth, seed) model at init; fit each metric against depth.

    With `parts`, each model's result is written there as it finishes (one JSON file named by a
    hash of the model's config, its seed, the probes, the options and `inputs`, a description
    of the batches), and a result already there is read instead of probed again: a sweep that
    was stopped finishes only what was left. `progress` is told each model, with its count.

    Returns `{"runs": [...], "fits": {placement: {metric: fit}}, "by_depth": {placement:
    {metric: {L: mean_ci}}}, "per_block_mean": {placement: {L: {metric: [...]}}}}`."""
    if not placements or not depths or not seeds:
        raise ConfigError("a depth sweep needs at least one placement, depth and seed")
    configs = {(p, L): sweep_config(base, p, L) for p in placements for L in depths}
    total, runs = len(configs) * len(seeds), []
    for (p, L), cfg in configs.items():
        for s in seeds:
            key = _part_key(cfg, s, probes, options, inputs)
            part = None if parts is None else parts / f"{key}.json"
            if part is not None and part.is_file():
                res = json.loads(part.read_text())
                said = "already probed"
            else:
                if progress is not None:
                    progress(f"{p} L={L} seed={s} ({len(runs) + 1}/{total})")
                model = build_model(cfg, seed=s)
                res = probe_model(model, batches, probes, seed=s, **options)
                del model
                if part is not None:
                    part.parent.mkdir(parents=True, exist_ok=True)
                    tmp = part.with_suffix(".tmp")
                    tmp.write_text(json.dumps(res))
                    tmp.replace(part)
                said = ""
            if said and progress is not None:
                progress(f"{p} L={L} seed={s} ({len(runs) + 1}/{total}): {said} ({part})")
            runs.append({"placement": p, "n_blocks": L, "seed": s, "result": res})
    return {"runs": runs, **summarize(runs)}


def _part_key(cfg: ModelConfig, seed: int, probes: Sequence[str], options: dict[str, object],
              inputs: object) -> str:
    """The name of one model's result in a sweep's parts folder: what decides the result."""
    settings = {k: v for k, v in options.items() if k != "train_batches"}  # from `inputs`
    what = json.dumps({"model": cfg.to_dict(), "seed": seed, "probes": list(probes),
                       "options": settings, "inputs": inputs}, sort_keys=True, default=str)
    return f"{cfg.placement}-L{cfg.n_blocks}-s{seed}-" + hashlib.sha256(
        what.encode()).hexdigest()[:12]


def summarize(runs: Sequence[dict[str, object]]) -> dict[str, object]:
    """Fits against depth, per-depth means with intervals, and per-block means over seeds."""
    fits: dict[str, dict] = {}
    by_depth: dict[str, dict] = {}
    per_block_mean: dict[str, dict] = {}
    placements = list(dict.fromkeys(r["placement"] for r in runs))
    for p in placements:
        mine = [r for r in runs if r["placement"] == p]
        fits[p], by_depth[p], per_block_mean[p] = {}, {}, {}
        for metric in LOGLOG_METRICS + LINEAR_METRICS:
            pts = [(r["n_blocks"], r["result"]["summary"].get(metric), r["seed"]) for r in mine]
            pts = [q for q in pts if isinstance(q[1], (int, float))]
            if not pts:
                continue
            if metric in LOGLOG_METRICS:
                fits[p][metric] = loglog_fit(pts)
            by_depth[p][metric] = {str(L): mean_ci([y for x, y, _ in pts if x == L])
                                   for L in sorted({x for x, _, _ in pts})}
        for L in sorted({r["n_blocks"] for r in mine}):
            same = [r["result"]["per_block"] for r in mine if r["n_blocks"] == L]
            per_block_mean[p][str(L)] = {
                k: torch.tensor([pb[k] for pb in same], dtype=torch.float64).mean(0).tolist()
                for k in same[0] if all(k in pb for pb in same)}
    return {"fits": fits, "by_depth": by_depth, "per_block_mean": per_block_mean}
