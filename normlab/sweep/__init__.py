"""Sweeps: a YAML spec (base config + axes, conditional axes) expanded into validated runs,
executed on local processes or a Ray cluster, resumable; one table of outcomes; stability maps,
in the placement styles that every figure of normlab shares (`normlab.sweep.plotting`).

    plan = plan_sweep("examples/sweeps/warmup_pre_post.yaml")   # validates every run
    result = run_sweep(plan, "runs/sweeps/warmup_pre_post", workers=2)
    table = collect(result.root)                                # rows: axes + outcome + losses
    stability_map(table, "map.png", x="train.warmup", y="train.lr", panel="model.placement")

Names are imported on first use, so `normlab.cli.sweep` (the CLI) loads without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ExecutorError": "executors",
    "MapError": "maps", "loss_curves": "maps", "stability_map": "maps",
    "SweepResult": "runner", "run_sweep": "runner",
    "PlannedRun": "spec", "SpecError": "spec", "SweepPlan": "spec", "load_spec": "spec",
    "plan_sweep": "spec",
    "SummaryError": "summarize", "SweepTable": "summarize", "collect": "summarize",
    "to_csv": "summarize",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'normlab.sweep' has no attribute {name!r}")
    return getattr(importlib.import_module(f"normlab.sweep.{module}"), name)
