"""Effective depth: how many blocks a model really uses, in one number with its spread.

From the layer-drop costs of one batch, `c_t = max(0, loss(block t skipped) - loss)`:

    participation ratio   PR = (sum_t c_t)^2 / sum_t c_t^2, in [1, L]

PR is L when every block costs the same and 1 when one block carries all the cost; it is 0 when no
block costs anything. It is a scale-free count of the blocks that matter (the participation ratio
of localization physics, applied to the drop costs). Next to it,

    n_costly              the number of blocks whose removal costs more than `threshold` nats

(absolute, so it also says whether any block matters at all). Both are computed per batch and
reported as mean and standard deviation over batches. The same two numbers are computed from the
KL(original || dropped) costs (`*_kl`), which need no labels and are never negative.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def participation_ratio(costs: Sequence[float]) -> float:
    """`(sum c)^2 / sum c^2` of the costs clamped at 0 (0 when every cost is 0)."""
    c = torch.tensor(list(costs), dtype=torch.float64).clamp_min(0.0)
    sq = c.square().sum()
    return (c.sum().square() / sq).item() if sq > 0 else 0.0


def n_costly(costs: Sequence[float], threshold: float) -> int:
    """How many blocks cost more than `threshold` when removed."""
    return sum(1 for c in costs if c > threshold)


def _mean_std(values: list[float]) -> tuple[float, float]:
    t = torch.tensor(values, dtype=torch.float64)
    return t.mean().item(), (t.std().item() if len(values) > 1 else 0.0)


def effective_depth(drop: dict[str, object], threshold: float = 0.01,
                    kl_threshold: float = 0.01) -> dict[str, object]:
    """Effective-depth summary from `layer_drop`'s result (which keeps the per-batch rows)."""
    out: dict[str, object] = {"threshold": threshold, "kl_threshold": kl_threshold}
    for suffix, key, thr in (("", "drop_dloss_per_batch", threshold),
                             ("_kl", "drop_kl_per_batch", kl_threshold)):
        rows = drop[key]
        pr = [participation_ratio(r) for r in rows]
        nc = [float(n_costly(r, thr)) for r in rows]
        out[f"effective_depth{suffix}"], out[f"effective_depth{suffix}_std"] = _mean_std(pr)
        out[f"n_costly{suffix}"], out[f"n_costly{suffix}_std"] = _mean_std(nc)
    return out
