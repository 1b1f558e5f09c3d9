"""Divergence as data: the finite check and the loss-spike detector.

Both run before each optimizer step. A tripped check ends the run with outcome `diverged` and a
reason (`nonfinite_loss`, `nonfinite_grad`, `loss_spike`), never with an exception.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass
class SpikeDetector:
    """Loss above `factor` x its running mean for `patience` consecutive steps is a spike.

    The running mean (an EMA) is frozen while the loss is above the threshold, so a run that
    jumps to a high plateau cannot raise its own baseline and hide the spike.
    """

    factor: float = 1.5
    patience: int = 10
    decay: float = 0.9
    warm_steps: int = 5  # losses seen before the detector may fire
    mean: float | None = None
    seen: int = 0
    above: int = 0

    def update(self, loss: float) -> bool:
        """Feed one finite loss; True when the spike condition has held `patience` steps."""
        self.seen += 1
        if self.mean is not None and self.seen > self.warm_steps and loss > self.factor * self.mean:
            self.above += 1
            return self.above >= self.patience
        self.above = 0
        self.mean = loss if self.mean is None else self.decay * self.mean + (1 - self.decay) * loss
        return False

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict`; ValueError naming the field for anything malformed."""
        fields = self.state_dict()
        for key, value in state.items():
            if key not in fields:
                raise ValueError(f"unknown field {key!r}")
            nullable = key == "mean"
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (number or (nullable and value is None)):
                raise ValueError(f"{key} is {value!r}, not a number")
        for key, value in state.items():
            setattr(self, key, value)


def nonfinite_reason(loss: float, grad_norm: float) -> str | None:
    if not math.isfinite(loss):
        return "nonfinite_loss"
    if not math.isfinite(grad_norm):
        return "nonfinite_grad"
    return None


def divergence_reason(loss: float, grad_norm: float, spike: SpikeDetector) -> str | None:
    """Why a run stops as diverged at this step (before its update), or None: a non-finite loss
    or gradient, else a loss spike (which `spike` tracks)."""
    reason = nonfinite_reason(loss, grad_norm)
    if reason is None and spike.update(loss):
        reason = "loss_spike"
    return reason
