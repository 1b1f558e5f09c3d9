"""Learning-rate schedules: the lr at each optimizer step (0-based) for a `TrainConfig`.

- `constant`: linear warmup, then lr.
- `cosine` / `linear`: linear warmup, then decay to `min_lr_ratio * lr` at the last step.
- `inv_sqrt`: the original Transformer's, linear warmup then `lr * sqrt(warmup / step)`
  (Vaswani et al. 2017, eq. 3, with lr the peak).
- `wsd` (warmup-stable-decay): linear warmup, then constant at lr, then a linear decay to 0 over
  the last `decay_frac` of the steps (`D = max(1, round(decay_frac * steps))` steps; the lr of
  1-based step n in the decay is `lr * (steps - n) / D`, 0 at the last step). The decay is the
  final anneal of MiniCPM's WSD (Hu et al. 2024, arXiv 2404.06395: about the last 10% of
  training) and of Hagele et al. 2024's constant lr with cooldown (arXiv 2405.18392: a linear
  cooldown of 10-20% of the steps matches cosine); normlab's default `decay_frac` is 0.2.
  `stable_end(cfg)` is the number of steps trained before the decay begins: the loss there is
  the loss of the stable phase, before the anneal lowers it.

An extended run (`train.extends`: a finished run of S steps continued to N) follows the
schedule of an N-step run, `lr_at(step, cfg)` with its own `steps = N`, from step S on:

- `constant` and `inv_sqrt` (and every warmup) do not depend on the total, so they continue
  unchanged: the extension's lrs are those of an N-step run from scratch, and on the CPU it
  ends with that run's weights bit for bit.
- `cosine`, `linear` and `wsd` decay is recomputed for N: the lr at step S jumps from the old
  schedule's (its floor, where the S-step run ended) to the N-step schedule's value at S, then
  decays to the floor at N.

`extension_lr` states the rule and the two lrs; the extension records them in its config.yaml's
`meta.extends`.
"""

from __future__ import annotations

import math
from typing import Any

from normlab.config import TrainConfig

# the schedules whose lr at a step does not depend on the run's total steps
TOTAL_FREE = ("constant", "inv_sqrt")


def lr_at(step: int, cfg: TrainConfig) -> float:
    peak, warmup = cfg.lr, cfg.warmup
    n = step + 1  # the first step already takes a warmup increment, so warmup=0 starts at peak
    if cfg.schedule == "wsd":
        decay = decay_steps(cfg)
        ramp = n / warmup if n <= warmup else 1.0
        return peak * max(0.0, min(ramp, 1.0, (cfg.steps - n) / decay))
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


def decay_steps(cfg: TrainConfig) -> int:
    """`wsd`: the steps of the final linear decay, `max(1, round(decay_frac * steps))`."""
    return max(1, round(cfg.decay_frac * cfg.steps))


def stable_end(cfg: TrainConfig) -> int:
    """`wsd`: the steps trained before the decay begins (the last of them at the peak lr, once
    the warmup is over); an evaluation at this step reads the end of the stable phase."""
    if cfg.schedule != "wsd":
        raise ValueError(f"stable_end: schedule {cfg.schedule!r} has no stable phase (wsd)")
    return cfg.steps - decay_steps(cfg)


def extension_lr(cfg: TrainConfig) -> dict[str, Any]:
    """What the schedule does where an extended run (`cfg.extends` set) begins: the run it
    extends, its last step S, the rule (`continued` or `recomputed for N steps`, see the module
    docstring), the lr of the old run's last step (S - 1, 0-based) and of this run's first (S)."""
    ext = cfg.extends
    if ext is None:
        raise ValueError("extension_lr: the config extends no run (train.extends is null)")
    old = cfg.model_copy(update={"steps": ext.step, "extends": None})
    rule = ("continued" if cfg.schedule in TOTAL_FREE else
            f"recomputed for {cfg.steps} steps ({cfg.schedule} decay to "
            f"{'0' if cfg.schedule == 'wsd' else 'the floor'} at step {cfg.steps}, not "
            f"{ext.step})")
    return {"run": ext.run, "step": ext.step, "schedule": cfg.schedule, "rule": rule,
            "lr_before": lr_at(ext.step - 1, old), "lr_after": lr_at(ext.step, cfg)}
