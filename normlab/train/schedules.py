"""Learning-rate schedules: the lr at each optimizer step (0-based) for a `TrainConfig`.

- `constant`: linear warmup, then lr.
- `cosine` / `linear`: linear warmup, then decay to `min_lr_ratio * lr` at the last step.
- `inv_sqrt`: the original Transformer's, linear warmup then `lr * sqrt(warmup / step)`
  (Vaswani et al. 2017, eq. 3, with lr the peak).
"""

from __future__ import annotations

import math

from normlab.config import TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    peak, warmup = cfg.lr, cfg.warmup
    n = step + 1  # the first step already takes a warmup increment, so warmup=0 starts at peak
    if n <= warmup:
        return peak * n / warmup
    if cfg.schedule == "constant":
        return peak
    if cfg.schedule == "inv_sqrt":
        return peak * math.sqrt(warmup / n)
    floor = peak * cfg.min_lr_ratio
    span = max(1, cfg.steps - warmup)
    progress = min(1.0, (n - warmup) / span)
    if cfg.schedule == "cosine":
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak - (peak - floor) * progress  # linear
